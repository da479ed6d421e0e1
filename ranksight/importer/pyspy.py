"""py-spy dumps of many ranks, as text (``py-spy dump --pid N``) or JSON (``--json``), into
``stacks`` rows shaped as the node agent writes them (``summary``: one line per thread,
innermost frames first; ``stack_json``: py-spy's JSON threads).

Text form::

    Process 52000: /usr/bin/python3 -u train.py
    Python v3.10.14 (/usr/bin/python3.10)

    Thread 52000 (idle): "MainThread"
        get (queue.py:180)
        _try_get_data (torch/utils/data/dataloader.py:1131)
"""

from __future__ import annotations

import json
import re

from ranksight.collectors.pyspy import summarize
from ranksight.store.fit import fit_int, fit_text

from .logs.pystacks import event_of

__all__ = ["event_of", "parse_json", "parse_text", "row_of"]

PROCESS = re.compile(r"^Process (?P<pid>\d+):")
THREAD = re.compile(
    r'^Thread (?P<tid>0x[0-9A-Fa-f]+|\d+) \((?P<state>[\w+]+)\)(?:: "(?P<name>[^"]*)")?'
)
FRAME = re.compile(r"^\s+(?P<name>.+?) \((?P<file>[^()]*?):(?P<line>\d+)\)\s*$")
FRAME_NOLINE = re.compile(r"^\s+(?P<name>\S.*?) \((?P<file>[^()]*?)\)\s*$")


def parse_text(text: str) -> tuple[int, list[dict]]:
    """(pid, threads in py-spy's JSON shape) of a text dump. Raises ValueError if no
    ``Thread`` line is found."""
    pid = 0
    threads: list[dict] = []
    for line in text.splitlines():
        if m := PROCESS.match(line):
            pid = int(m.group("pid"))
        elif m := THREAD.match(line):
            state = m.group("state")
            tid = m.group("tid")
            threads.append(
                {"thread_name": m.group("name") or "", "os_thread_id": int(tid, 16 if tid[:2] in ("0x", "0X") else 10),
                 "active": state.startswith("active"), "owns_gil": "gil" in state, "frames": []}
            )  # fmt: skip
        elif threads and (m := FRAME.match(line) or FRAME_NOLINE.match(line)):
            f = m.groupdict()
            threads[-1]["frames"].append(
                {"name": f["name"], "filename": f["file"], "short_filename": f["file"],
                 "line": int(f.get("line") or 0)}
            )  # fmt: skip
    if not threads:
        raise ValueError("no 'Thread N (...)' line: not a py-spy dump")
    return pid, threads


def parse_json(text: str) -> tuple[int, list[dict]]:
    """(pid, threads) of ``py-spy dump --json`` output (a list of threads, or an object with
    ``threads``), each thread in py-spy's shape with values of its types
    (:func:`thread_of`). Raises ValueError for anything else."""
    data = json.loads(text)
    threads = data.get("threads") if isinstance(data, dict) else data
    if not isinstance(threads, list) or not all(isinstance(t, dict) for t in threads):
        raise ValueError("not py-spy JSON (want a list of threads)")
    pid = fit_int(data.get("pid"), "UInt32") or 0 if isinstance(data, dict) else 0
    return pid, [thread_of(t) for t in threads]


def thread_of(raw: dict) -> dict:
    """One py-spy JSON thread with every field of its type: ``thread_name`` text,
    ``os_thread_id`` an int (0: unknown), ``active``/``owns_gil`` bools, ``frames`` dicts of
    ``name``, ``filename``, ``short_filename`` (text) and ``line`` (int; frames that are no
    dicts left out)."""
    frames = raw.get("frames")
    return {
        "thread_name": fit_text(raw.get("thread_name") or ""),
        "os_thread_id": fit_int(raw.get("os_thread_id"), "UInt64") or 0,
        "active": bool(raw.get("active")),
        "owns_gil": bool(raw.get("owns_gil")),
        "frames": [
            {"name": fit_text(f.get("name") or "?"), "filename": fit_text(f.get("filename") or ""),
             "short_filename": fit_text(f.get("short_filename") or ""),
             "line": fit_int(f.get("line"), "Int64") or 0}
            for f in (frames if isinstance(frames, list) else []) if isinstance(f, dict)
        ],
    }  # fmt: skip


def row_of(rank: int, pid: int, threads: list[dict], host: str, ts_ns: int) -> dict:
    """The ``stacks`` row of one rank's dump."""
    return {
        "rank": rank, "host": host, "pid": pid, "ts_ns": ts_ns, "trigger": "import",
        "native": 0, "ok": 1, "error": "", "threads": len(threads),
        "summary": summarize(threads, depth=8), "stack_json": json.dumps(threads), "took_ms": 0.0,
    }  # fmt: skip
