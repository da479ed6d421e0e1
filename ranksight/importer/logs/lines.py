"""A posted log as logical lines: launcher and terminal prefixes taken off and read.

Real logs come interleaved (torchrun's console holds every local rank), prefixed (line
numbers of a log viewer, ``host: `` from pdsh, ``N: `` from ``srun --label``, timestamps)
and hard-wrapped (a terminal's or a post's width). :func:`logical_lines` gives each
line's own text with what its prefixes said:

=============================  =============================================
prefix                         read as
=============================  =============================================
``[rank3]:``                   global rank 3 (torchrun >= 2.2, ``--tee``)
``[default3]:``                local rank 3 (torchrun < 2.2, role "default")
``[1,3]<stderr>:``             global rank 3 (OpenMPI ``--tag-output``)
``host-1: ``                   host ``host-1`` (pdsh, DeepSpeed's launcher)
``<time>  host [rank1]:``      host ``host`` (a log collector's time and node:
                               chitu#80's ``2025-03-27 17:31:09.952  sm228-a100-40g-23``)
``[80746] ``, ``12: ``         a viewer's line number, an srun task label
=============================  =============================================

A number in the file name is never read here: the caller may use it only for a file
whose lines name no rank at all.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

_RANK = re.compile(r"\[?rank(?P<rank>\d+)\]:\s?", re.I)
_RANK_INSIDE = re.compile(r"\[rank(?P<rank>\d+)\]:")
_LOCAL = re.compile(r"\[default(?P<local>\d+)\]:\s?")
_RAY_RANK = re.compile(r"\(\w+\[rank=(?P<rank>\d+)\] pid=\d+(?:, ip=(?P<ip>[\d.]+))?\)\s*")
"""A Ray actor that names its rank (NeMo-RL#2937: ``(MegatronPolicyWorker[rank=8]
pid=3294808, ip=10.109.19.209)``): the rank of the training job's workers, its node's
address the host."""
_MPI = re.compile(r"\[\d+,(?P<mpi>\d+)\]<std(?:out|err)>:\s?")
_LEVELS = r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)"
"""Python logging's level names: ``name: [ERROR]`` is a logger's name (torch >= 2.1's
``[ts] torch.distributed.elastic.multiprocessing.api: [ERROR] failed ...``,
speechbrain#2401), never a pdsh host."""
_PDSH_NEXT = r"what\(\):|terminate called after|frame #\d+:"
"""A C++ abort's lines, which begin so behind pdsh's ``host: `` and never after an
exception's ``Name: `` (DeepSpeed#2119: ``gr064:   what():  CUDA error: an illegal memory
access was encountered``, ``gr064: frame #13: ...``)."""
_LEAD = re.compile(
    r"^(?:\s+"
    r"|\[\d+\]\s+(?=\[)"  # a viewer's line number: [80746] [rank0]:...
    r"|\d{1,5}:\s+(?=\S)"  # srun --label
    r"|(?P<host>[A-Za-z][\w.-]*[\w]):\s+(?=\[(?!"
    + _LEVELS
    + r"\])|\d{4}-|[A-Z]\d{4}|"
    + _PDSH_NEXT
    + r")"  # pdsh
    r"|\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?Z?\s+(?P<host_ts>[A-Za-z][\w.-]*\w)\s+"
    r"(?=\[rank\d+\]:|[\w.-]+:\d+:\d+ \[\d+\])"  # 2025-03-27 17:31:09.952  host [rank1]:
    r"|\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?Z?(?:\s*[|:-]?\s*)"  # 2024-05-01 12:00:00,1
    r"|\[\d{4}-\d\d-\d\d[T ]\d\d:\d\d(?::\d\d(?:[.,]\d+)?)?\]\s*"  # [2024-05-01 12:00:00]
    r"|\d{4}-\d\d-\d\d[T ]\d\d:\d\d\s+"  # 2025-02-18 12:54
    r"|\(\w+ pid=\d+(?:, ip=[\d.]+)?\)\s*"  # Ray: (RayWorkerWrapper pid=4009)
    r"|\S*\x1b?\[\d+m\(\w+ pid=\d+(?:, ip=[\d.]+)?\)\s*"  # Ray, colour left in
    r"|\[[\w.-]+:\d+\]:(?=\[rank)"  # [alphagpu12:5]:[rank5]:
    r"|[\w.-]+(?:\.nolog)? \[std(?:err|out)\]\s+"  # milabench: host [stderr]
    r"|[>│|]\s+"  # a quote marker, a box's border
    r"|std(?:err|out):\s+"  # a wrapper's stream tag
    r")"
)
_STARTS_NEW = re.compile(
    r"^\s*(?:\[(?:rank|default)\d+\]:|\[\d+,\d+\]<|\[[EWIF]\s?\d*|[EWIF]\d{4}\s|\[?\d{4}-\d\d-"
    r"|[\w.-]+:\d+:\d+ \[\d+\]|Traceback|\w*(?:Error|Exception)\b|\S+: \[rank)"
)
MAX_JOIN = 3
"""Most physical lines joined into one logical line (a wrap of a long watchdog line)."""


@dataclass(frozen=True, slots=True)
class LogLine:
    """One logical line: ``text`` without its prefixes; ``rank``/``local_rank`` as the
    prefixes give them (-1: not said); ``host`` from a pdsh prefix; ``number``: the
    1-based line number of its first physical line in the file."""

    text: str
    number: int
    rank: int = -1
    local_rank: int = -1
    host: str = ""


def split_prefix(raw: str) -> tuple[str, int, int, str]:
    """(text, rank, local_rank, host) of one physical line (see the module table)."""
    text, rank, local, host = raw.rstrip("\r\n"), -1, -1, ""
    for _ in range(6):
        if ray := _RAY_RANK.match(text):
            rank, host, text = (
                int(ray.group("rank")),
                host or ray.group("ip") or "",
                text[ray.end() :],
            )
            continue
        m = _LEAD.match(text)
        if m and m.end() > 0:
            host = host or (m.group("host") or m.group("host_ts") or "")
            text = text[m.end() :]
            continue
        m = _RANK.match(text) or _MPI.match(text) or _LOCAL.match(text)
        if not m:
            break
        got = m.groupdict()
        if got.get("rank") is not None:
            rank = int(got["rank"])
        elif got.get("mpi") is not None:
            rank = int(got["mpi"])
        else:
            local = int(got["local"])
        text = text[m.end() :]
    if rank < 0 and (inside := list(_RANK_INSIDE.finditer(text))):  # glued to a progress bar
        rank, text = int(inside[-1].group("rank")), text[inside[-1].end() :]
    return text, rank, local, host


_OPEN_END = re.compile(
    r"(?:(?:WorkNCCL|NCCL work|enqueued|completed|Fingerprint|[Ww]atchdog|timeout|collective)"
    r"[^.]*[,:]|\b(?:detected|enqueued|completed|last|NCCL|work|by|at|of|the|for|with|from|"
    r"is|are|running))\s*$"
)


def _unfinished(text: str) -> bool:
    """Whether ``text`` stops mid-sentence of a long log line: open parentheses, a
    trailing comma or ``:`` of a watchdog or fingerprint line, or a word no sentence of
    theirs ends with (``detected``, ``last enqueued``)."""
    if text.count("(") > text.count(")"):
        return True
    return bool(_OPEN_END.search(text))


WRAP_WIDTH = 80
"""Physical lines at least this long, of one length in a row, are a terminal's hard wrap
(joined with no space: the wrap cuts words)."""


RECORD_HEAD = 12
"""Two lines that begin with the same this many characters are two records of one log
(a repeated prefix), never one line wrapped."""


def _continues(nxt: str | None, cur: str = "") -> bool:
    """Whether ``nxt`` can be the rest of the wrapped line ``cur``: it has no prefix of its
    own (no rank, host, timestamp or line number), starts no line of its own, and does
    not begin as ``cur`` does (a record of the same log)."""
    if nxt is None or not nxt.strip():
        return False
    if cur and len(cur) >= RECORD_HEAD and nxt[:RECORD_HEAD] == cur[:RECORD_HEAD]:
        return False
    text, rank, local, host = split_prefix(nxt)
    return (
        rank < 0 and local < 0 and not host and text == nxt.lstrip()
        and not _STARTS_NEW.match(text)
    )  # fmt: skip


def _pairs(raw_lines: Iterable[str]) -> Iterator[tuple[str, str | None]]:
    """Each line with the one after it (None after the last)."""
    it = iter(raw_lines)
    prev = next(it, None)
    if prev is None:
        return
    for cur in it:
        yield prev, cur
        prev = cur
    yield prev, None


def wrap_widths(raw_lines: Iterable[str]) -> frozenset[int]:
    """Line lengths (>= :data:`WRAP_WIDTH`) that at least 3 lines of a file share: the
    width a terminal or a post wrapped it at (a first pass over the file)."""
    seen: dict[int, int] = {}
    for raw in raw_lines:
        n = len(raw.rstrip("\r\n"))
        if n >= WRAP_WIDTH:
            seen[n] = seen.get(n, 0) + 1
    return frozenset(n for n, c in seen.items() if c >= 3)


def logical_lines(
    raw_lines: Iterable[str], widths: frozenset[int] = frozenset()
) -> Iterator[LogLine]:
    """Each logical line of ``raw_lines`` (a file's lines, newlines kept or not): prefixes
    read off; a line that stops unfinished joined with the next ones (at most
    :data:`MAX_JOIN`) that do not start a line of their own; a terminal's fixed-width
    wrap (lines of one length >= :data:`WRAP_WIDTH`, or of a length in ``widths``: see
    :func:`wrap_widths`) joined whole."""
    pending: list = []  # [text, number, rank, local, host, joined, wrapped]
    width_before = -1
    for n, (raw, after) in enumerate(_pairs(raw_lines), 1):
        raw = raw.rstrip("\r\n")
        width = len(raw)
        nxt = after.rstrip("\r\n") if after is not None else None
        if pending and pending[6]:  # the wrap goes on: this piece belongs to it
            pending[0] += raw.rstrip() if width != pending[6] else raw
            pending[5] += 1
            if (width != pending[6] and width not in widths) or not _continues(nxt, raw):
                pending[6] = 0
            width_before = width
            continue
        text, rank, local, host = split_prefix(raw)
        wraps = (
            width >= WRAP_WIDTH
            and _continues(nxt, raw)
            and (len(nxt or "") == width or width_before == width or width in widths)
        )
        if pending:
            same = rank in (-1, pending[2]) and not _STARTS_NEW.match(raw.lstrip())
            if same and pending[5] < MAX_JOIN and _unfinished(pending[0]) and text.strip():
                pending[0] = (
                    pending[0] + text.strip()
                    if pending[0].endswith(("(", "=", "_"))
                    else pending[0].rstrip() + " " + text.strip()
                )
                pending[5] += 1
                width_before = width
                continue
            yield LogLine(pending[0].rstrip(), pending[1], pending[2], pending[3], pending[4])
        pending = [text, n, rank, local, host, 1, width if wraps else 0]
        width_before = width
    if pending:
        yield LogLine(pending[0].rstrip(), pending[1], pending[2], pending[3], pending[4])
