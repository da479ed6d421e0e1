"""torchrun's end-of-job summary: which ranks failed, how, and which it saw first.

The ``ChildFailedError`` block (torch >= 1.9) is read by :mod:`ranksight.importer.torchrun_log`
(the launcher's parser, one home for the format); the older single line
``failed (exitcode: -9) local_rank: 3 (pid: 1234) of binary: ...`` is read here. Each
failure is a ``child_failed`` event: ``rank`` (global, as torchrun says), ``local_rank``,
``host``, ``pid``, ``code`` the exit code (negative: killed by that signal), ``detail``
``root_cause`` (torchrun's first observed failure) and the signal's name.
"""

from __future__ import annotations

import re
import signal

from ranksight.importer.torchrun_log import torchrun_failures

from .events import Event
from .lines import LogLine

MARKERS = ("srun: error", "oom-kill event", "oom_kill event", "death signal", "exitcode", "Root Cause", "ChildFailedError", "Failures:", "local_rank", "error_file",
           "traceback", "host", "time", "rank", "[")  # fmt: skip
_DEATH = re.compile(
    r"(?:^[IWE]\d{4} [\d:.]+ (?P<pid>\d+) .*)?Received (?:Signals\.)?(?P<sig>SIG[A-Z]+|\d+) "
    r"death signal, shutting down workers"
)
"""torchrun's agent told to stop from outside (nvidia-resiliency-ext#18: ``W0227 17:39:41.936000
293817 .../agent/server/api.py:719] Received 15 death signal, shutting down workers``; torch
2.x: ``Received Signals.SIGTERM death signal``): the scheduler's time limit or preemption,
a person, or a job killed for another node's failure; the agent's pid where the glog
prefix gives it."""
_SLURM_OOM = re.compile(r"slurmstepd: error: Detected \d+ oom[-_]kill event")
"""SLURM's cgroup memory limit killing a step's processes (brain-score vision#950:
``slurmstepd: error: Detected 1 oom-kill event(s) in StepId=37205392.0``)."""
_SRUN = re.compile(r"srun: error: (?P<host>\S+): tasks? (?P<tasks>[\d,\-]+): (?P<what>.+)")
_OLD = re.compile(
    r"failed \(exitcode: (?P<code>-?\d+)\) local_rank: (?P<local>\d+) \(pid: (?P<pid>\d+)\)"
)


def signal_name(code: int) -> str:
    """``SIGKILL`` for exit code -9; "" for a plain exit code."""
    if code >= 0:
        return ""
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


class Reader:
    """Collects the summary's lines of one file; :meth:`finish` reads them."""

    name = "torchrun"
    markers = MARKERS

    def __init__(self) -> None:
        self.block: list[str] = []
        self.old: list[Event] = []
        self.first = 0

    def feed(self, line: LogLine) -> None:
        """Keep a line that may be part of the summary; read an old-style failure."""
        if m := _OLD.search(line.text):
            code = int(m.group("code"))
            self.old.append(
                Event("child_failed", local_rank=int(m.group("local")), pid=int(m.group("pid")),
                      host=line.host, line=line.number, code=code, text=line.text,
                      detail={"root_cause": not self.old, "signal": signal_name(code)})
            )  # fmt: skip
        if m := _SRUN.search(line.text):
            code = int(x.group(1)) if (x := re.search(r"exit code (\d+)", m.group("what"))) else -1
            self.old.append(Event("child_failed", host=m.group("host"), line=line.number,
                                  code=code, text=line.text,
                                  detail={"source": "srun", "tasks": m.group("tasks"),
                                          "what": m.group("what").strip()[:80],
                                          "root_cause": False, "signal": ""}))  # fmt: skip
        if m := _DEATH.search(line.text):
            sig = m.group("sig")
            number = int(sig) if sig.isdigit() else -1
            name = signal_name(-number) if number > 0 else sig
            self.old.append(Event("child_failed", host=line.host, line=line.number,
                                  pid=int(m.group("pid")) if m.group("pid") else -1,
                                  code=-number if number > 0 else -1, text=line.text,
                                  detail={"source": "agent_signal", "signal": name,
                                          "root_cause": False}))  # fmt: skip
        if _SLURM_OOM.search(line.text):
            self.old.append(Event("child_failed", host=line.host, line=line.number, text=line.text,
                                  detail={"source": "srun", "tasks": "", "what": "Out Of Memory",
                                          "root_cause": False, "signal": ""}))  # fmt: skip
        t = line.text.strip()
        if re.match(r"(?:\[\d+\]:|time|host|rank|exitcode|error_file|traceback|Root Cause|"
                    r"Failures:|Other Failures)", t) or _FLAT.search(t):  # fmt: skip
            self.first = self.first or line.number
            self.block.append(t)

    def finish(self) -> list[Event]:
        """One ``child_failed`` event per failed rank (root cause first)."""
        if not self.block:
            return self.old
        out, seen = [], set()
        text = "\n".join(self.block)
        for part in re.split(r"\n(?=Failures:)", text):  # two agents' summaries in one log
            for f in torchrun_failures(part):
                if (f["rank"], f["host"], f["exitcode"]) not in seen:
                    seen.add((f["rank"], f["host"], f["exitcode"]))
                    out.append(f)
        return [self._event(f) for f in out or _entries(text) or _flat(text)] or self.old

    def _event(self, f: dict) -> Event:
        """The ``child_failed`` event of one failure of the summary."""
        code = f["exitcode"]
        return Event("child_failed", rank=f["rank"], local_rank=f.get("local_rank", -1),
                     host=f["host"], pid=f["pid"], line=self.first, code=code,
                     text=f"rank {f['rank']} exitcode {code}",
                     detail={"root_cause": f["root_cause"], "signal": signal_name(code),
                             "time": f["time"]})  # fmt: skip


_RANK_LINE = re.compile(r"^rank\s*:\s*(?P<rank>\d+)(?:\s*\(local_rank:\s*(?P<local>\d+)\))?")
_CODE_LINE = re.compile(r"^exitcode\s*:\s*(?P<code>-?\d+)(?:\s*\(pid:\s*(?P<pid>\d+)\))?")
_HOST_LINE = re.compile(r"^host\s*:\s*(?P<host>\S+)")


def _entries(text: str) -> list[dict]:
    """Failures of a summary cut short (no ``[0]:`` or ``time`` line, only ``rank`` and
    ``exitcode``): the last one is taken as the root cause where the text says none."""
    out, host = [], ""
    lines = text.splitlines()
    for i, t in enumerate(lines):
        if m := _HOST_LINE.match(t):
            host = m.group("host")
        if (
            (m := _RANK_LINE.match(t))
            and i + 1 < len(lines)
            and (c := _CODE_LINE.match(lines[i + 1]))
        ):
            out.append({"rank": int(m.group("rank")),
                        "local_rank": int(m.group("local")) if m.group("local") else -1,
                        "exitcode": int(c.group("code")), "pid": int(c.group("pid") or 0),
                        "host": host, "time": "", "root_cause": False})  # fmt: skip
            host = ""
    if out:
        out[-1]["root_cause"] = True
    return out


_FLAT = re.compile(
    r"(?:time\s*:\s*(?P<time>\S+?)(?=\s|\S*host)[^\n]*?)?(?:host\s*:\s*(?P<host>[\w.-]+?)(?=\s|\S*rank)"
    r"[^\n]*?)?rank\s*:\s*(?P<rank>\d+)\s*\(local_rank:\s*(?P<local>\d+)\)[^\n]*?"
    r"exitcode\s*:\s*(?P<code>-?\d+)(?:\s*\(pid:\s*(?P<pid>\d+)\))?"
)


def _flat(text: str) -> list[dict]:
    """Failures of a summary whose newlines were lost (one entry, or all, on one line):
    the entries after ``Root Cause`` are the root cause."""
    root = text.find("Root Cause")
    out = []
    for m in _FLAT.finditer(text):
        out.append({"rank": int(m.group("rank")), "local_rank": int(m.group("local")),
                    "exitcode": int(m.group("code")), "pid": int(m.group("pid") or 0),
                    "host": m.group("host") or "", "time": m.group("time") or "",
                    "root_cause": 0 <= root < m.start()})  # fmt: skip
    return sorted(out, key=lambda f: not f["root_cause"])
