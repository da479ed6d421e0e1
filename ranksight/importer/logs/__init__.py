"""Text logs a job printed, read the way an expert reads them: line by line, each line
by every format that knows its words, into ``log_events`` rows (:mod:`.events`).

A line format is one module here with either a ``parse(line) -> list[Event]`` function
(a line says everything itself) or a ``Reader`` class (``feed(line)``, ``finish() ->
list[Event]``: blocks of lines, counts over a file), and a ``MARKERS`` tuple: words one
of which a line must hold for the format to look at it. Register it in
:data:`LINE_FORMATS`; nothing else changes (docs/import-formats.md).
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Callable, Iterable

from ranksight.collectors.bounded import Lines

from . import (
    desync,
    exceptions,
    frtrace,
    gpu,
    horovod,
    launcher,
    mpi,
    nccl,
    presence,
    pydumps,
    pystacks,
    ray,
    rendezvous,
    sglang,
    signals,
    torchrun,
    watchdog,
)
from .events import Event, dedupe
from .lines import LogLine, logical_lines, wrap_widths

LINE_FORMATS: tuple = (
    watchdog,
    desync,
    gpu,
    nccl,
    torchrun,
    frtrace,
    signals,
    rendezvous,
    ray,
    sglang,
    horovod,
    exceptions,
    launcher,
    mpi,
    pystacks,
    pydumps,
    presence,
)
"""Every line format, each a module with ``parse`` or ``Reader`` and ``MARKERS``."""

FAULT_KINDS = ("timeout", "status", "desync_report", "mismatch", "child_failed", "nccl_warn",
               "fr_missing", "gpu_error", "exception", "watchdog_stuck", "fatal_signal",
               "init_failure", "peer_gone", "nccl_error", "worker_died")  # fmt: skip
"""Events that say the job failed: a run with one is never "finished" (an NCCL warning
about a library it falls back from is no failure: :func:`is_fault`)."""


def is_fault(e: Event) -> bool:
    """Whether ``e`` says the job failed (see :data:`FAULT_KINDS`)."""
    return e.kind in FAULT_KINDS and not (
        e.kind == "nccl_warn" and e.detail.get("category") == "benign"
    )


MAX_EVENTS = 200_000
"""Most events kept from one file after repeats are folded (the rest counted as cut)."""


class _Parser:
    """A stateless ``parse`` function seen as a reader."""

    def __init__(self, module) -> None:
        self.parse: Callable[[LogLine], list[Event]] = module.parse
        self.markers = module.MARKERS
        self.out: list[Event] = []

    def feed(self, line: LogLine) -> None:
        self.out.extend(self.parse(line))

    def finish(self) -> list[Event]:
        return self.out


def _readers() -> list:
    return [m.Reader() if hasattr(m, "Reader") else _Parser(m) for m in LINE_FORMATS]


def read_lines(
    lines: Iterable[str], file: str = "", widths: frozenset[int] = frozenset()
) -> list[Event]:
    """Every event of one file's ``lines``, repeats folded (:func:`events.dedupe`), each
    marked with ``file``; ``widths``: the file's wrap widths (:func:`lines.wrap_widths`)."""
    readers = _readers()
    markers = [tuple(getattr(r, "markers", ("",))) for r in readers]
    for line in logical_lines(lines, widths):
        for reader, words in zip(readers, markers, strict=True):
            if any(w in line.text for w in words):
                reader.feed(line)
    events = dedupe([e for r in readers for e in r.finish()])
    for e in events[:MAX_EVENTS]:
        e.file = file
    return events[:MAX_EVENTS]


LINE_BYTES = 1 << 20
"""Longest line read (bytes): a longer one is cut to it (a 1 GiB line takes 1 MiB)."""


class _UpToDamage:
    """A gzip stream read up to where it is damaged or cut short: ``readline`` then ends
    the file instead of raising, and :attr:`damage` says why (a log copied while it was
    written, or cut to a size limit, still holds the lines before the cut)."""

    def __init__(self, stream) -> None:
        self.stream, self.damage = stream, ""

    def readline(self, size: int = -1) -> bytes:
        if self.damage:
            return b""
        try:
            return self.stream.readline(size)
        except (EOFError, OSError, zlib.error) as exc:
            self.damage = str(exc) or type(exc).__name__
            return b""


def read_file(
    path: str, shown: str = "", cut: list[int] | None = None, damage: list[str] | None = None
) -> list[Event]:
    """:func:`read_lines` of the text file at ``path`` (gzip or not; bad bytes replaced;
    each line at most :data:`LINE_BYTES`, the number of longer lines cut appended to
    ``cut``). A gzip that is damaged or cut short is read up to there, and why it ends
    is appended to ``damage``. Raises OSError if it cannot be read."""
    with open(path, "rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
    if not gz:
        with open(path, "rb") as f:  # a first pass: the width a terminal wrapped the file at
            widths = wrap_widths(Lines(f, LINE_BYTES))
        with open(path, "rb") as f:
            lines = Lines(f, LINE_BYTES)
            events = read_lines(lines, shown or path, widths)
    else:
        with gzip.open(path, "rb") as f:
            widths = wrap_widths(Lines(_UpToDamage(f), LINE_BYTES))
        with gzip.open(path, "rb") as f:
            stream = _UpToDamage(f)
            lines = Lines(stream, LINE_BYTES)
            events = read_lines(lines, shown or path, widths)
        if stream.damage and damage is not None:
            damage.append(stream.damage)
    if cut is not None:
        cut.append(lines.cut)
    return events


def says_something(events: list[Event]) -> bool:
    """Whether ``events`` hold more than presence and sizes (a log worth a run)."""
    return any(e.kind not in ("present", "world", "nodes") for e in events)


__all__ = [
    "FAULT_KINDS",
    "Event",
    "LINE_BYTES",
    "LINE_FORMATS",
    "LogLine",
    "read_file",
    "read_lines",
    "says_something",
]
