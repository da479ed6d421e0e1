"""Text logs: a console file, a job log, one rank's log, ``dmesg``; read line by line by
every line format of :mod:`ranksight.importer.logs` into ``log_events`` rows."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from ranksight.collectors.bounded import mib
from ranksight.ground.words import counted, span

from .base import Format, json_prefix

if TYPE_CHECKING:  # the line readers load on use: an import of dumps alone needs none of them
    from .. import logs

WORDS = {"timeout": ("watchdog timeout", None), "status": ("watchdog status line", None),
         "desync_report": ("desync report line", None), "mismatch": ("fingerprint mismatch", "fingerprint mismatches"),
         "child_failed": ("failed rank", None), "nccl_calls": ("NCCL communicator", None),
         "nccl_warn": ("NCCL warning", None), "fr_missing": ("fr_trace/RAS line", None),
         "gpu_error": ("GPU error", None), "exception": ("exception", None),
         "stack": ("stack", None), "nccl_info": ("NCCL topology note", None),
         "watchdog_stuck": ("stuck watchdog", None), "comm_abort": ("NCCL communicator abort", None)}  # fmt: skip
"""How a file's message counts each kind of event."""


def _whose(events: list[logs.Event]) -> str:
    """Whose lines ``events`` (of one kind) are, as a file's message says it: the global
    ranks the lines state, and the ``[Rank N]`` of a group where a line states no global
    rank (that is the global rank only in the default group: the analyzer decides)."""
    ranks = {e.rank for e in events if e.rank >= 0}
    groups = {e.group_rank for e in events if e.rank < 0 and e.group_rank >= 0}
    said = [f"rank{'s' if len(ranks) > 1 else ''} {span(ranks, limit=8)}"] if ranks else []
    if groups:
        said.append(f"[Rank {span(groups, limit=8)}] of a group, no global rank said")
    return f" ({'; '.join(said)})" if said else ""


def _device(e: logs.Event) -> bool:
    """Whether ``e``'s local rank is NCCL's ``[cudaDev]`` (a GPU index, not a rank the
    line states)."""
    return e.kind.startswith("nccl") or e.detail.get("source") == "nccl"


class TextLog(Format):
    """Any other text (the fallback: registered last)."""

    kind = "log"

    @staticmethod
    def recognize(head: bytes, text: str) -> str | None:
        """Any text that is not JSON (:func:`~.base.json_prefix`: a Python dict's repr
        opening a console log is text) or binary."""
        if json_prefix(text):
            return None
        return None if "\x00" in text[:4096] else ""

    def read(self, path: str, rank: int | None) -> tuple[str, int | None]:
        """One file's events. The rank in the file name is used only where no line names
        any rank, global, local or of a group (a number in a file name never overrides
        the rank written in the line)."""
        from .. import logs

        st = self.state
        cut: list[int] = []
        damage: list[str] = []
        events = logs.read_file(path, st.shown, cut, damage)
        named = sorted({e.rank for e in events if e.rank >= 0})
        says_rank = any(e.rank >= 0 or e.group_rank >= 0 or (e.local_rank >= 0 and not _device(e))
                        for e in events)  # fmt: skip
        if not says_rank and rank is not None:
            for e in events:
                e.rank = rank if e.kind != "child_failed" else e.rank
            events.insert(0, logs.Event("present", rank=rank, file=st.shown,
                                        detail={"source": "file name"}))  # fmt: skip
            named = [rank]
        one = named[0] if len(named) == 1 else None
        if damage and not logs.says_something(events):  # nothing readable before the cut
            raise ValueError(f"the gzip ends before any line that says something: {damage[0]}")
        if not logs.says_something(events):
            st.silent_logs.extend(events)
            return f"skipped: {_why_skipped(events)}", one
        st.log_events.extend(events)
        kinds: Counter[str] = Counter()
        of: dict[str, list[logs.Event]] = {}
        for e in events:
            if e.kind in WORDS:
                kinds[e.kind] += e.count
                of.setdefault(e.kind, []).append(e)
        said = ", ".join(counted(n, *WORDS[k]) + _whose(of[k]) for k, n in kinds.most_common())
        who = f" (ranks {span(named)})" if len(named) > 1 and not said else ""
        long = (
            f"; {counted(cut[0], 'line')} over {mib(logs.LINE_BYTES)} cut to it" if cut[0] else ""
        )
        if damage:
            long += f"; the gzip ends early ({damage[0][:80]}): read up to there"
        return said + who + long, one

    def finish(self, result) -> None:
        """The ``log_events`` rows (with the presence of silent ranks' files, when other
        logs speak), a ``ranks`` row per rank named, and NCCL's topology notes."""
        st = self.state
        if not st.log_events:
            return
        from .. import logs

        events = st.log_events + st.silent_logs
        st.rows.extend("log_events", [e.row() for e in events])
        seen = sorted({e.rank for e in events if e.rank >= 0})
        said = [e.code for e in events if e.kind == "world" and e.code > 0]
        world = max(said + [seen[-1] + 1 if seen else 0])
        hosts = _hosts(events)
        for r in seen:
            st.rows.add("ranks", {"rank": r, "world_size": world, "host": hosts.get(r, ""),
                                  "dp": -1, "tp": -1, "pp": -1})  # fmt: skip
        st.fault_lines = sum(e.count for e in events if logs.is_fault(e))
        notes = {str(e.rank): e.detail["notes"] for e in events if e.kind == "nccl_info"}
        if notes:
            result.meta["nccl_notes"] = notes


def _hosts(events) -> dict[int, str]:
    """rank -> the one host its lines name (pytorch#20630: ``dlciwpwqw7kd1h3y-master-0:301:315
    [3] NCCL INFO comm 0x12fd4c240 rank 3 nranks 4``); a rank whose lines name two hosts,
    or none, has no entry."""
    named: dict[int, set[str]] = {}
    for e in events:
        if e.rank >= 0 and e.host:
            named.setdefault(e.rank, set()).add(e.host)
    return {r: next(iter(h)) for r, h in named.items() if len(h) == 1}


def _why_skipped(events) -> str:
    """Why a text file holds nothing to diagnose: no line of the formats read at all, or
    NCCL lines that only say a process was there (set-up, topology, error returns such as
    Fuser#3055's ``dgx1v-loki-23:5892:6289 [2] NCCL INFO misc/socket.cc:47 -> 3``), which
    count for presence and hosts but report no timeout, failure or call."""
    nccl = [e for e in events if e.kind == "present" and e.detail.get("source") == "nccl"]
    if not nccl:
        return "text with no watchdog, NCCL, torchrun, GPU or py-spy lines"
    hosts = sorted({e.host for e in nccl if e.host})
    where = f" on {', '.join(hosts[:3])}" if hosts else ""
    failed = [e.detail["failed"] for e in nccl if "failed" in e.detail]
    last = (
        f", the last an error return ({failed[0]['at']} -> {failed[0]['code']})" if failed else ""
    )
    return (
        f"NCCL lines of {counted(len(nccl), 'process', 'processes')}{where} that report no "
        f"timeout, warning, failure or collective call{last}: read for who was there"
    )
