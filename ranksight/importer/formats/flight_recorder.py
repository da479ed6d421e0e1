"""PyTorch Flight Recorder dumps (pickle or JSON, schema 2.x, gzip or not): every rank's
ring of recent collectives -> ``collectives``, ``progress``, ``fr_dumps``, ``fr_entries``
(:mod:`ranksight.importer.fr`)."""

from __future__ import annotations

from ranksight.ground.words import counted

from .. import fr
from ..rows import Rows
from .base import Format


class FlightRecorder(Format):
    """Flight Recorder dumps; collectives held for the profiler merge when the import has
    Kineto traces (``state.hold_fr``)."""

    kind = "flight_recorder"
    one_per_rank = True

    def __init__(self, state) -> None:
        super().__init__(state)
        self.unknown = Rows()
        """Rows of groups whose members a dump does not list (``fr.fill_members``)."""
        self.held: list[dict] = []
        """Collective rows held until the end so that profiler kernels of the same
        collectives are merged into them (``formats/kineto.py``, :mod:`..merge`)."""
        self.ranks: set[int] = set()
        self._mark = 0
        self._unknown: dict[str, int] = {}

    @staticmethod
    def recognize(head: bytes, text: str) -> str | None:
        """A pickle (protocol byte 0x80), or JSON with ``entries`` or ``pg_config``."""
        if head[:1] == b"\x80":
            return ""
        if (
            text.lstrip().startswith("{")
            and '"traceEvents"' not in text
            and ('"entries"' in text or '"pg_config"' in text)
        ):
            return ""
        return None

    def read(self, path: str, rank: int | None) -> tuple[str, int | None]:
        """One rank's dump. Raises ValueError for a damaged or foreign pickle/JSON."""
        st = self.state
        dump = fr.read(path, rank, st.cfg.file_bytes, st.cfg.limit_why)
        if not dump.format:
            raise ValueError("; ".join(dump.problems))
        if not (dump.entries or dump.pg_config or dump.pg_status):
            # another pickle or JSON: counting it as a rank's dump would say the rank issued
            # nothing, and blame it for every collective of its groups
            why = "; ".join(dump.problems)
            raise ValueError(
                "not a Flight Recorder dump: no entries, pg_config or pg_status"
                + (f" ({why})" if why else "")
            )
        rows = fr.rows_of(dump, st.cfg.host, fr.dump_time(dump, st.ts_ns))
        cut = fr.damaged(dump)
        if cut and dump.rank is not None:  # its entries stop short: no progress from it
            rows.tables.pop("progress", None)
            st.partial[dump.rank] = cut
        for table in ("progress", "collectives"):  # members unknown: held for fill_members
            keep: list[dict] = []
            held = self.unknown.tables.setdefault(table, [])
            for r in rows.tables.get(table, []):
                (held if r.get("group_ranks") == "" else keep).append(r)
            rows.tables[table] = keep
        if st.hold_fr:
            self.held.extend(rows.tables.pop("collectives", []))
        st.rows.merge(rows)
        if dump.rank is not None:
            self.ranks.add(dump.rank)
        problems = "; ".join(dump.problems)
        if dump.rank is None:
            problems = (
                problems + "; " if problems else ""
            ) + "no rank in the file name: kept as rank -1"
        note = f"schema {dump.version or '?'}, {counted(len(dump.entries), 'entry', 'entries')}"
        return (f"{note}: {problems}" if problems else note), dump.rank

    def mark(self) -> None:
        """Where the next dump's held collectives and rows of unknown members start."""
        self._mark = len(self.held)
        self._unknown = {t: len(r) for t, r in self.unknown.tables.items()}

    def forget_last(self) -> None:
        """Drop the last dump's held collectives and rows of unknown members."""
        del self.held[self._mark :]
        for t, rows in self.unknown.tables.items():
            del rows[self._unknown.get(t, 0) :]

    def finish(self, result) -> None:
        """Members of groups no dump listed: every rank with a dump."""
        if self.unknown.count():
            fr.fill_members(self.unknown, sorted(self.ranks))
            self.held.extend(self.unknown.tables.pop("collectives", []))
            self.state.rows.merge(self.unknown)
        if not self.state.hold_fr:
            self.state.rows.extend("collectives", self.held)
            self.held = []
