"""PyTorch profiler (Kineto) traces, read as a stream: ``.json`` or ``.json.gz``, any size,
in memory bounded by the read chunk plus a few numbers per GPU kernel.

A trace is ``{..., "traceEvents": [event, ...], ...}``; events are decoded one at a time
from a sliding text buffer (``json.JSONDecoder.raw_decode``), so a 200 MB trace never sits
in memory whole. Keys before and after the event list (``distributedInfo``,
``baseTimeNanoseconds``) are read from the text around it.

What is kept, per rank (``distributedInfo.rank``, else the file name's number):

- steps: ``ProfilerStep#N`` spans (host time) -> ``steps``;
- GPU compute: the summed duration of the non-NCCL kernels launched in each step, or the
  step's time outside NCCL kernels where that is longer (a rank whose host stalls leaves
  its GPU idle, and its peers wait in their NCCL kernels for it) -> one ``phases`` row per
  step (phase ``gpu_compute``): what the straggler test compares between ranks;
- CPU-only traces (gloo): the step's host time outside collectives as ``gpu_compute``,
  and c10d's host spans (``gloo:all_reduce``) as the collectives;
- NCCL kernels (``ncclKernel_*``, ``ncclDevKernel_*``) -> ``collectives``: op, element
  count, dtype and process group from the kernel's args where the trace has them
  (``Collective name``, ``In msg nelems``, ``Process Group Ranks``...); else the op from
  the kernel name, the group being every imported rank, matched across ranks by order
  (the n-th ``all_reduce`` kernel of each rank is one collective). Device start is the
  arrival time the late-arriver test compares.

Times: ``ts``/``dur`` are microseconds; ``baseTimeNanoseconds`` (newer traces) is added.
"""

from __future__ import annotations

import codecs
import gzip
import io
import json
import math
import re
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from ranksight.collectors.bounded import mib
from ranksight.ground.words import counted
from ranksight.store.fit import fit_int, fit_rank

from .rows import Rows, group_id, norm_op, parse_ranks, ranks_text

_BETWEEN = re.compile(r"[ \t\r\n,]*")


def _skip_between(buf: str, pos: int) -> int:
    """The index of the first character at or after ``pos`` that is not a blank or comma."""
    gap = _BETWEEN.match(buf, pos)
    return gap.end() if gap else pos


STEP = re.compile(r"^ProfilerStep#(\d{1,9})$")
TIME_LIMIT_US = 9e15
"""Largest ``ts``/``dur`` (µs) taken: what int64 nanoseconds hold (year 2255); an event
past it, or with no finite time, is skipped and counted (``KinetoRank.skipped``)."""
NCCL = ("ncclKernel", "ncclDevKernel")


class TraceError(ValueError):
    """A trace that is not JSON of the Kineto shape, or is cut short."""


@dataclass
class KinetoRank:
    """What one trace holds for its rank (times in ns)."""

    path: str
    rank: int | None
    world_size: int = 0
    header: dict = field(default_factory=dict)
    steps: list[tuple[int, float, float]] = field(default_factory=list)  # (step, start, end)
    compute: array = field(default_factory=lambda: array("d"))  # start, dur, start, dur...
    spill: str = ""
    """File the compute kernels' (start, dur) pairs go to beyond ``keep`` (raw float64);
    "" keeps them all in ``compute``."""
    spilled: int = 0
    """Pairs in ``spill``."""
    keep: int = 1 << 62
    """Most pairs held in ``compute`` before they are appended to ``spill``."""
    nccl: list[tuple] = field(
        default_factory=list
    )  # (start, dur, op, nelems_in, nelems_out, dtype, pg_desc, ranks)
    events: int = 0
    skipped: int = 0
    """Complete events with no usable time (inf, nan, text, past :data:`TIME_LIMIT_US`)."""
    host_spans: list[tuple] = field(default_factory=list)
    """c10d's host spans of collectives (``gloo:all_reduce``, ``nccl:all_reduce``), used
    as the collectives only when the trace has no NCCL kernels (CPU-only, gloo)."""

    @property
    def collectives(self) -> list[tuple]:
        """NCCL kernels, else the host spans."""
        return self.nccl or self.host_spans

    problems: list[str] = field(default_factory=list)

    def spill_compute(self) -> None:
        """Append the held compute pairs to ``spill`` and let them go (no-op without one)."""
        if not self.spill or not self.compute:
            return
        with open(self.spill, "ab") as f:
            self.compute.tofile(f)
        self.spilled += len(self.compute) // 2
        self.compute = array("d")

    def compute_chunks(self, pairs: int = 1 << 20) -> Iterator[np.ndarray]:
        """Every compute (start, dur) pair, ``pairs`` rows at a time, as (n, 2) arrays:
        the spilled ones first (in the order read), then those held."""
        if self.spilled:
            with open(self.spill, "rb") as f:
                while len(block := np.fromfile(f, dtype=np.float64, count=2 * pairs)):
                    yield block.reshape(-1, 2)
        if self.compute:
            yield np.frombuffer(self.compute, dtype=float).reshape(-1, 2)

    @property
    def compute_count(self) -> int:
        """Compute kernels read (spilled and held)."""
        return self.spilled + len(self.compute) // 2


def open_stream(path: str) -> tuple[io.BufferedIOBase, io.BufferedIOBase]:
    """(decoded byte stream, raw file) for ``path``, gunzipping by magic number."""
    raw = open(path, "rb")  # noqa: SIM115 - closed by the caller
    magic = raw.read(2)
    raw.seek(0)
    return (gzip.GzipFile(fileobj=raw) if magic == b"\x1f\x8b" else raw), raw


def events(
    path: str, chunk: int = 4 << 20, on_read: Callable[[int], None] | None = None
) -> Iterator[dict]:
    """Each event of the trace at ``path``, then one final dict ``{"__top__": {...}}`` with
    the trace's other keys. ``on_read(n)`` is told of every ``n`` file bytes read (the
    compressed size for ``.gz``). Raises TraceError for a file that is not a Kineto trace
    or is truncated (after yielding the events before the damage)."""
    stream, raw = open_stream(path)
    most = max(chunk, 1 << 20)  # one event, or the keys before the events, at most this
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    dec = json.JSONDecoder()
    last = 0

    def more() -> str:
        nonlocal last
        try:
            data = stream.read(chunk)
        except (OSError, EOFError) as exc:
            raise TraceError(f"damaged compressed data ({exc})") from None
        if on_read:
            pos = raw.tell()
            on_read(pos - last)
            last = pos
        return decoder.decode(data, final=not data)

    try:
        buf, eof = "", False
        while True:
            m = re.search(r'"traceEvents"\s*:\s*\[', buf)
            if m:
                break
            if eof or len(buf) > most:
                raise TraceError(
                    f"no 'traceEvents' list in its first {mib(most)}: not a Kineto trace"
                )
            piece = more()
            eof = not piece
            buf += piece
        head = buf[: m.start()].rstrip().rstrip(",")
        top = _loads(head + "}" if head.strip() != "{" else "{}")
        pos, buf, consumed = 0, buf[m.end() :], m.end()
        while True:
            pos = _skip_between(buf, pos)
            if pos >= len(buf) - 1 and not eof:
                consumed += pos
                buf = buf[pos:] + more()
                pos, eof = 0, False if len(buf) else True
                if not buf:
                    eof = True
                continue
            if pos < len(buf) and buf[pos] == "]":
                break
            if pos >= len(buf):
                raise TraceError("the file ends inside 'traceEvents' (truncated)")
            try:
                obj, end = dec.raw_decode(buf, pos)
            except ValueError:
                if len(buf) - pos > most:
                    raise TraceError(
                        f"an event longer than {mib(most)} (the read chunk: a sixteenth of "
                        "the memory budget, at least 1 MiB) at character "
                        f"{consumed + pos:,}: not read"
                    ) from None
                piece = more() if not eof else ""
                if not piece:
                    raise TraceError("the file ends inside 'traceEvents' (truncated)") from None
                consumed += pos
                buf = buf[pos:] + piece
                pos = 0
                continue
            pos = end
            if isinstance(obj, dict):
                yield obj
            if pos > chunk:
                consumed += pos
                buf, pos = buf[pos:], 0
        tail = buf[pos + 1 :]
        while piece := more():
            tail += piece
            if len(tail) > 1 << 20:
                break
        top.update(
            _loads("{" + tail.strip().lstrip(",").strip()) if tail.strip() not in ("", "}") else {}
        )
        yield {"__top__": top}
    finally:
        stream.close()
        raw.close()


def _loads(text: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def read(
    path: str, rank: int | None, chunk: int = 4 << 20, on_read=None, spill: str = ""
) -> KinetoRank:
    """One rank's trace, streamed (see the module doc). Truncation is kept as a problem,
    with what came before it; a file that is no Kineto trace raises TraceError.

    With ``spill`` (a file path), the compute kernels' times beyond ``chunk`` bytes are
    appended to that file as they come, and all of them once the trace is read, so what
    an import holds between traces is a few numbers per NCCL kernel and step."""
    out = KinetoRank(path, rank, spill=spill, keep=max(1, chunk // 16) if spill else 1 << 62)
    try:
        for ev in events(path, chunk, on_read):
            if "__top__" in ev:
                out.header = ev["__top__"]
                break
            out.events += 1
            _take(out, ev)
    except TraceError as exc:
        if out.events == 0:
            raise
        out.problems.append(f"{exc}; kept the {counted(out.events, 'event')} before it")
    out.spill_compute()
    if out.skipped:
        out.problems.append(f"skipped {counted(out.skipped, 'event')} with no usable ts/dur")
    info = out.header.get("distributedInfo") or {}
    if isinstance(info, dict):
        said = info.get("rank")
        if said is not None and fit_rank(said) is None:
            out.problems.append(f"distributedInfo.rank {str(said)[:40]!r} is no rank: ignored")
        elif said is not None:
            out.rank = fit_rank(said)
        out.world_size = fit_int(info.get("world_size"), "UInt32") or 0
    return out


def _take(out: KinetoRank, ev: dict) -> None:
    if ev.get("ph") != "X":
        return
    name = str(ev.get("name", ""))
    try:
        ts, dur = float(ev.get("ts", 0)), float(ev.get("dur", 0))
    except (TypeError, ValueError, OverflowError):
        ts = dur = math.inf
    if not (abs(ts) < TIME_LIMIT_US and abs(dur) < TIME_LIMIT_US):  # inf and nan too
        out.skipped += 1
        return
    cat = ev.get("cat")
    if cat == "kernel":
        if name.startswith(NCCL):
            a = ev.get("args")
            a = a if isinstance(a, dict) else {}
            out.nccl.append(
                (ts, dur, norm_op(str(a.get("Collective name") or name)),
                 fit_int(a.get("In msg nelems"), "UInt64") or 0,
                 fit_int(a.get("Out msg nelems"), "UInt64") or 0,
                 str(a.get("dtype") or "").lower(), str(a.get("Process Group Description") or ""),
                 str(a.get("Process Group Ranks") or ""))
            )  # fmt: skip
        else:
            out.compute.extend((ts, dur))
            if len(out.compute) >= 2 * out.keep:
                out.spill_compute()
    elif cat in ("cpu_op", "user_annotation") and name.startswith(("gloo:", "nccl:")):
        # c10d's profiling span of a collective on the host (CPU-only traces have no kernels)
        out.host_spans.append((ts, dur, norm_op(name), 0, 0, "", "", ""))
    elif (m := STEP.match(name)) and cat in ("user_annotation", "cpu_op", None):
        out.steps.append((int(m.group(1)), ts, ts + dur))


def rows_of(traces: list[KinetoRank]) -> Rows:
    """Rows of every rank's trace together (groups without member lists: every rank)."""
    out = Rows()
    everyone = sorted({t.rank for t in traces if t.rank is not None})
    for t in traces:
        out.merge(rank_rows(t, everyone))
    return out


def rank_rows(t: KinetoRank, everyone: list[int]) -> Rows:
    """Rows of one rank's trace; ``everyone``: the imported ranks, the members of groups
    whose kernels do not list them. (One trace at a time, so an import writes each
    trace's rows before it builds the next one's.)"""
    out = Rows()
    if t.rank is None:
        return out
    base = fit_int(t.header.get("baseTimeNanoseconds"), "Int64") or 0
    base = base if abs(base) < 1 << 62 else 0  # ns() adds at most 9e18

    def ns(us: float, base: int = base) -> int:
        return base + int(round(us * 1000))

    world = t.world_size or len(everyone)
    out.add("ranks", {"rank": t.rank, "world_size": world, "backend": "nccl",
                      "dp": -1, "tp": -1, "pp": -1})  # fmt: skip
    steps = sorted(t.steps)
    starts = np.array([s[1] for s in steps], dtype=float)
    for step, a, b in steps:
        out.add("steps", {"rank": t.rank, "step": step, "start_ns": ns(a), "end_ns": ns(b),
                          "loss": float("nan")})  # fmt: skip
    if steps:
        busy = np.zeros(len(steps))
        for comp in t.compute_chunks():
            idx = np.searchsorted(starts, comp[:, 0], side="right") - 1
            busy += np.bincount(idx[idx >= 0], weights=comp[idx >= 0, 1], minlength=len(steps))
        # the step's time outside collectives: all there is for a CPU-only trace; with
        # kernels, the larger of the two, so a rank whose GPU idles between kernels (its
        # host is slow) is as slow as one whose kernels are (its peers wait in NCCL)
        outside = np.clip(
            np.array([b - a for _, a, b in steps]) - _comm_per_step(t.collectives, steps), 0, None
        )
        busy = np.maximum(busy, outside) if t.compute_count else outside
        for (step, a, _), us in zip(steps, busy, strict=True):
            out.add("phases", {"rank": t.rank, "step": step, "phase": "gpu_compute",
                               "microbatch": -1, "stage": -1, "start_ns": ns(a),
                               "end_ns": ns(a + us), "wait_ns": 0})  # fmt: skip
    seq: dict[str, int] = {}
    for ts, dur, op, nin, nout, dtype, desc, ranks_s in sorted(t.collectives):
        members = parse_ranks(ranks_s) or everyone
        gid = group_id(desc or f"kineto_{op}", members)
        seq[gid] = seq.get(gid, -1) + 1
        k = int(np.searchsorted(starts, ts, side="right") - 1) if steps else -1
        out.add(
            "collectives",
            {"rank": t.rank, "step": steps[k][0] if k >= 0 else -1, "group_id": gid,
             "group_ranks": ranks_text(members), "group_seq": seq[gid], "op": op, "peer": -1,
             "dtype": dtype, "numel_in": nin, "numel_out": nout, "enqueue_ns": ns(ts),
             "start_ns": ns(ts), "end_ns": ns(ts + dur)},
        )  # fmt: skip
    return out


def _comm_per_step(colls: list[tuple], steps: list[tuple[int, float, float]]) -> np.ndarray:
    """Per step (``steps``: (step, start, end), sorted, µs): the time (µs) some collective
    ran within the step, overlapping kernels (several streams) counted once."""
    out = np.zeros(len(steps))
    spans = sorted((c[0], c[0] + c[1]) for c in colls)
    for i, (_, a, b) in enumerate(steps):
        end = a
        for s, e in spans:
            if s >= b:
                break
            s, e = max(s, end), min(e, b)
            if e > s:
                out[i] += e - s
                end = e
    return out


def comm_time_by_op(traces: list[KinetoRank]) -> dict[str, dict[str, float]]:
    """Per collective op: kernels and total GPU time (ms) over every trace."""
    out: dict[str, dict[str, float]] = {}
    for t in traces:
        for _, dur, op, *_ in t.collectives:
            d = out.setdefault(op, {"kernels": 0, "total_ms": 0.0})
            d["kernels"] += 1
            d["total_ms"] = round(d["total_ms"] + dur / 1000.0, 3)
    return out
