"""PyTorch profiler (Kineto) traces, read in chunks within the memory budget: steps,
phases and collectives per rank (:mod:`ranksight.importer.kineto`); NCCL kernels merged
into the Flight Recorder's numbering where both are imported (:mod:`..merge`)."""

from __future__ import annotations

import os
import tempfile

from ranksight.ground.words import counted

from .. import kineto, merge
from .base import Format
from .flight_recorder import FlightRecorder


class Kineto(Format):
    """Kineto traces, one per rank."""

    kind = "kineto"
    one_per_rank = True

    def __init__(self, state) -> None:
        super().__init__(state)
        self.traces: list[kineto.KinetoRank] = []
        self._mark = 0
        self.names: dict[int, str] = {}
        """id(trace) -> how messages name its file (a trace failing at the end is named)."""

    @staticmethod
    def recognize(head: bytes, text: str) -> str | None:
        """JSON with a ``traceEvents`` list (or its header fields, when the events come
        after the first 64 KiB)."""
        if not text.lstrip().startswith("{"):
            return None
        if '"traceEvents"' in text:
            return ""
        if '"schemaVersion"' in text and (
            '"deviceProperties"' in text or '"distributedInfo"' in text
        ):
            return ""
        return None

    def read(self, path: str, rank: int | None) -> tuple[str, int | None]:
        """One rank's trace (its compute times spilled to the import's temporary folder)."""
        st = self.state
        fd, spill = tempfile.mkstemp(prefix="compute-", suffix=".f64", dir=st.tmp)
        os.close(fd)
        trace = kineto.read(
            path, rank, st.cfg.chunk_bytes, lambda n: st.progress(n, path), spill=spill
        )
        if trace.rank is None:
            raise ValueError("no rank in distributedInfo or the file name")
        self.traces.append(trace)
        self.names[id(trace)] = st.shown
        note = (
            f"{counted(trace.events, 'event')}, {counted(len(trace.steps), 'step')}, "
            f"{counted(len(trace.collectives), 'collective')}"
        )
        return (note + ": " + "; ".join(trace.problems)) if trace.problems else note, trace.rank

    def mark(self) -> None:
        """How many traces are held before the next read."""
        self._mark = len(self.traces)

    def forget_last(self) -> None:
        """Drop the trace the last read added, if it added one."""
        del self.traces[self._mark :]

    def finish(self, result) -> None:
        """Every trace's rows, one at a time (each let go once written), with the Flight
        Recorder's held collectives merged and written."""
        st = self.state
        fr = st.format("flight_recorder")
        held = fr.held if isinstance(fr, FlightRecorder) else []
        if self.traces:
            result.meta["comm_time_by_op"] = kineto.comm_time_by_op(self.traces)
            everyone = sorted({t.rank for t in self.traces if t.rank is not None})
            index = merge.fr_index(held)
            while self.traces:
                trace = self.traces.pop(0)
                try:
                    rows = kineto.rank_rows(trace, everyone)
                    rows.tables["collectives"] = merge.merge_kineto(
                        rows.tables.get("collectives", []), index
                    )
                except Exception as exc:  # noqa: BLE001 - named and left out, never fatal
                    result.refuse(self.names.get(id(trace), trace.path), f"kineto: {exc}")
                else:
                    st.rows.merge(rows)
                if trace.spill and os.path.exists(trace.spill):
                    os.remove(trace.spill)
                st.flush_if_full()
        st.rows.extend("collectives", held)
        held.clear()
