"""NCCL collectives from PyTorch's Flight Recorder ring, read off the training thread.

torch's ProcessGroupNCCL writes every collective and P2P op it enqueues into one C++ ring
of ``TORCH_NCCL_TRACE_BUFFER_SIZE`` (``TORCH_FR_BUFFER_SIZE``) entries, at no Python cost:
``record_id`` (one counter for the ring), ``process_group`` (c10d group name),
``collective_seq_id`` / ``p2p_seq_id``, ``profiling_name`` (``nccl:all_reduce``,
``nccl:send 0->1``, ``nccl:recv 1<-0``, ``nccl:coalesced``), sizes and dtypes,
``time_created_ns`` (host realtime at enqueue, ``c10::getTime``), ``state``
(scheduled / started / completed), ``time_discovered_completed_ns`` (host time the watchdog
or a dump first saw the end event done) and, with ``TORCH_NCCL_ENABLE_TIMING=1`` set
before the group was made, ``duration_ms`` (CUDA events on the NCCL stream around the
kernel: the device time from this rank's arrival to the end, waiting for the last peer
included). Source: torch/csrc/distributed/c10d/FlightRecorderDetail.hpp
(``recordWithResetEnabled``, ``dump_entries``, ``getCollectiveTrace``), torch 2.11-2.13.

:class:`FrRing` dumps the ring (``_dump_nccl_trace(includeStackTraces=False)``) from the
thread of its own, takes the entries it has not seen (``record_id`` above the last one
read) and turns each into the ``collectives`` record the Python wrappers write
(:mod:`.collective_log`), once torch shows it completed. The training thread pays nothing
per collective; the reader pays one dump per tick, a copy of the whole ring under torch's
lock plus unpickling, whose cost ``bench/gpu_precision.py ab`` measures.

What it keeps and how:

- completeness: every entry is one record, P2P ops included (the members of a
  ``batch_isend_irecv`` are entries of their own; the ``nccl:coalesced`` entry that closes
  them gives their completion and is not a record). A ring that wrapped between two reads
  (the first ``record_id`` of a dump above the next one expected) counts the entries it
  overwrote in ``lost``; an entry overwritten while still in flight counts in
  ``lost_open``. Neither is ever silent: both go into the hooks' ``dropped``.
- device times: ``end_ns`` is ``time_discovered_completed_ns``; ``start_ns`` is ``end_ns``
  less ``duration_ms`` (the device duration is CUDA-event exact; where it sits on the host
  clock is only as exact as the discovery, which lags the device end by up to the
  watchdog's poll, about 100 ms, or the reader's tick). Without timing: host times.
- the black box and the progress snapshots: each entry is written to the black box and
  to ``CollectiveLog.progress`` when first read, and marked completed when it completes.

``group_seq`` of a collective is torch's ``collective_seq_id`` less the group's count at
attach (``pg_status``), so a loss shifts no later number; a P2P op's counts this rank's
ops per (group, direction, peer) in ``record_id`` order, as the wrappers do (torch keeps
one P2P count per group, not per peer), so after a loss it may shift. The members of a
coalesced collective (``all_reduce_coalesced``) share torch's number. ``step`` and ``phase`` come from the times at
which this rank's steps and phases began (:class:`Timeline`), ``wait_ns`` is 0 (no host
wait is seen). Not seen: collectives of other backends (gloo keeps the wrappers).
"""

from __future__ import annotations

import bisect
import collections
import pickle
import re
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import torch

from .collective_log import CollectiveLog
from .groups import GroupInfo

if TYPE_CHECKING:
    from torch.distributed.distributed_c10d import GroupName  # a NewType of str

_C = torch._C._distributed_c10d
NCCL_DUMP = "_dump_nccl_trace"
COALESCED = "coalesced"

_OPS: dict[str, str] = {
    "all_reduce": "all_reduce", "allreduce": "all_reduce",
    "allreduce_coalesced": "all_reduce", "all_reduce_coalesced": "all_reduce",
    "all_gather": "all_gather", "_allgather_base": "all_gather", "allgather": "all_gather",
    "allgather_into_tensor_coalesced": "all_gather", "all_gather_into_tensor_coalesced": "all_gather",
    "reduce_scatter": "reduce_scatter", "_reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter", "broadcast": "broadcast",
    "reduce": "reduce", "gather": "gather", "scatter": "scatter", "all_to_all": "all_to_all",
    "all_to_allv": "all_to_all", "alltoall": "all_to_all", "alltoall_base": "all_to_all",
    "barrier": "barrier", "send": "send", "recv": "recv",
}  # fmt: skip
"""``profiling_name`` (less ``<backend>:``) -> the op name the wrappers record."""
_DTYPES: dict[str, tuple[str, int]] = {
    "Float": ("float32", 4), "Double": ("float64", 8), "Half": ("float16", 2),
    "BFloat16": ("bfloat16", 2), "Long": ("int64", 8), "Int": ("int32", 4),
    "Short": ("int16", 2), "Char": ("int8", 1), "Byte": ("uint8", 1), "Bool": ("bool", 1),
    "ComplexFloat": ("complex64", 8), "ComplexDouble": ("complex128", 16),
    "Float8_e4m3fn": ("float8_e4m3fn", 1), "Float8_e5m2": ("float8_e5m2", 1),
}  # fmt: skip
"""c10 ScalarType names (``c10::toString``) -> (torch dtype name, bytes per element)."""
_PEER = re.compile(r"(-?\d+)\s*(->|<-)\s*(-?\d+)")
DUTY = 20
"""A read waits this many times the last read's cost (a read is at most 1/DUTY of the
writer thread's time)."""


def ring_entries() -> int:
    """The ring's size: ``TORCH_FR_BUFFER_SIZE``, else ``TORCH_NCCL_TRACE_BUFFER_SIZE``,
    else 2000 (torch's default). 0 where the setting is not a number."""
    import os

    raw = os.environ.get("TORCH_FR_BUFFER_SIZE") or os.environ.get(
        "TORCH_NCCL_TRACE_BUFFER_SIZE", "2000")  # fmt: skip
    try:
        return max(0, int(raw))
    except ValueError:
        return 0


def nccl_dump() -> bytes:
    """NCCL's ring, without stack traces (pickle). Raises RuntimeError where this torch
    has no NCCL ring, and whatever the dump raises."""
    fn = getattr(_C, NCCL_DUMP, None)
    if fn is None:
        raise RuntimeError(f"this torch build has no {NCCL_DUMP}")
    return fn(includeCollectives=True, includeStackTraces=False, onlyActive=False)


def ring_enabled(dump: Callable[[], bytes]) -> bool:
    """Whether the ring records: torch registers each process group's ranks in it only
    when it is on (``record_pg_ranks``), so a dump naming no group means a ring of size 0
    or no group of that backend. Never raises."""
    try:
        return bool(pickle.loads(dump()).get("pg_config"))  # noqa: S301 - our own dump
    except Exception:  # noqa: BLE001 - no ring: the wrappers then
        return False


class Timeline:
    """When this rank's steps and phases ran (host realtime ns), to give an entry read
    later the step and phase it was issued in. Written from the training thread (one
    append per step and per phase), read from the writer thread; bounded."""

    def __init__(self, keep: int = 4096) -> None:
        self.steps: collections.deque[tuple[int, int]] = collections.deque(maxlen=keep)
        """(start ns, step), in start order."""
        self.phases: collections.deque[tuple[int, int, str]] = collections.deque(maxlen=keep)
        """(start ns, end ns, name) of phases that ended, in end order."""

    def step(self, step: int, start_ns: int) -> None:
        """Step ``step`` began at ``start_ns``."""
        self.steps.append((start_ns, step))

    def phase(self, name: str, start_ns: int, end_ns: int) -> None:
        """Phase ``name`` ran from ``start_ns`` to ``end_ns``."""
        self.phases.append((start_ns, end_ns, name))

    def at(self, t_ns: int, current: tuple[int, str]) -> tuple[int, str]:
        """(step, phase) at ``t_ns``: the last step begun by then (-1: none) and the
        innermost ended phase covering it, else ``current``'s phase when ``t_ns`` is past
        every ended phase (a phase still running), else ""."""
        steps = list(self.steps)
        i = bisect.bisect_right(steps, (t_ns, 1 << 62)) - 1
        step = steps[i][1] if i >= 0 else -1
        phases = list(self.phases)
        best: tuple[int, int, str] | None = None
        for start, end, name in reversed(phases[-64:]):
            if start <= t_ns <= end and (best is None or start >= best[0]):
                best = (start, end, name)
        if best is not None:
            return step, best[2]
        if not phases or t_ns > phases[-1][1]:
            return step, current[1]
        return step, ""


def _numel(sizes: Any) -> int:
    total = 0
    for shape in sizes or []:
        n = 1
        for d in shape:
            n *= int(d)
        total += n
    return total


class FrRing:
    """The incremental reader (see the module docstring).

    ``dump()`` returns a Flight Recorder dump (pickle); ``emit(record)`` takes each
    finished ``collectives`` record; ``context()`` gives the training thread's current
    (step, phase). ``wait_for_completion=False`` takes entries as they are first read
    (``end_ns`` 0 unless completed): for rings whose backend never marks entries
    completed (gloo's, used by the tests). Every method but ``__init__`` never raises."""

    def __init__(
        self,
        log: CollectiveLog,
        emit: Callable[[dict[str, Any]], None],
        dump: Callable[[], bytes] = nccl_dump,
        *,
        context: Callable[[], tuple[int, str]] = lambda: (-1, ""),
        wait_for_completion: bool = True,
    ) -> None:
        self.log, self.emit, self.dump, self.context = log, emit, dump, context
        self.wait_for_completion = wait_for_completion
        self.timeline = Timeline()
        self.emitted = 0
        self.lost = 0
        """Entries overwritten before any read saw them (the ring wrapped between reads)."""
        self.lost_open = 0
        """Entries overwritten while still in flight (their end was never seen)."""
        self.resets = 0
        self.reads = 0
        self.read_ns = 0
        """Reader time spent in dumps and conversion so far (ns, writer thread)."""
        self.errors = 0
        self.last_error = ""
        self._open: dict[int, dict[str, Any]] = {}
        """record_id -> record of entries read and not yet completed."""
        self._next_id = 0
        self._closers: dict[tuple[Any, bool, Any], dict[str, Any]] = {}
        """(group name, P2P, sequence number) -> the ``nccl:coalesced`` entry closing it."""
        self._pg_names: dict[str, GroupInfo | None] = {}
        self._due = 0.0
        self._last_at = 0.0
        self._size = ring_entries()
        """Entries the ring keeps (torch's setting)."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        """One read at a time (the writer thread's tick, a close from a signal's thread)."""
        doc = self._doc()  # entries before attach are not this run's to record
        entries = list(doc.get("entries") or [])
        self._next_id = max((e.get("record_id", -1) for e in entries), default=-1) + 1
        self._size = max(self._size, len(entries))
        self._base: dict[int, int] = {}
        """pg_id -> its collectives enqueued before attach (``pg_status``)."""
        for pg_id, status in (doc.get("pg_status") or {}).items():
            try:
                self._base[int(pg_id)] = int(status.get("last_enqueued_collective", 0))
            except (TypeError, ValueError, AttributeError):
                continue

    # ------------------------------------------------------------------ reading
    def _doc(self) -> dict[str, Any]:
        doc = pickle.loads(self.dump())  # noqa: S301 - this process's own dump
        return doc if isinstance(doc, dict) else {}

    def _entries(self) -> list[dict[str, Any]]:
        return list(self._doc().get("entries") or [])

    def maybe_read(self, now: float | None = None) -> int:
        """:meth:`read` when due (the writer thread's tick calls this): a dump copies the
        whole ring, so its cost grows with the ring's size, not with the collectives; the
        next read waits ``DUTY`` times the last one's cost (at most 1/DUTY of a core),
        but no longer than half the time the ring takes to fill at the rate of new
        entries seen, so it does not wrap. Returns the records emitted."""
        now = time.monotonic() if now is None else now
        if now < self._due:
            return 0
        ids0, t0 = self._next_id, time.perf_counter_ns()
        n = self.read()
        cost_s = (time.perf_counter_ns() - t0) / 1e9
        since = max(now - self._last_at, 1e-3) if self._last_at else 0.0
        self._last_at = now
        wait = DUTY * cost_s
        if since and self._size:
            rate = max(self._next_id - ids0, 1) / since  # entries a second
            wait = min(wait, 0.5 * self._size / rate)
        self._due = now + wait
        return n

    def start_thread(self) -> None:
        """Read on a daemon thread of its own whenever :meth:`maybe_read` is due (the
        writer thread's tick, every 2 s, is too slow for a 2,000-entry ring on a job
        issuing thousands of collectives a second)."""
        self._thread = threading.Thread(target=self._run, name="ranksight-fr", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(max(0.005, self._due - time.monotonic())):
            self.maybe_read()

    def read(self) -> int:
        """Dump the ring and emit the entries that completed since the last read; returns
        how many records were emitted."""
        with self._lock:
            t0 = time.perf_counter_ns()
            try:
                return self._read(self._entries())
            except Exception as e:  # noqa: BLE001 - never the job's error
                self.errors += 1
                self.last_error = f"{type(e).__name__}: {e}"
                return 0
            finally:
                self.reads += 1
                self.read_ns += time.perf_counter_ns() - t0

    def _read(self, entries: list[dict[str, Any]]) -> int:
        if not entries:
            return 0
        by_id = {int(e["record_id"]): e for e in entries}
        first, last = min(by_id), max(by_id)
        if last + 1 < self._next_id:  # the ring was reset (torch's reset_all): ids anew
            self.resets += 1
            self._next_id = 0
        if first > self._next_id:  # wrapped between reads: these were never seen
            self.lost += first - self._next_id
            self._next_id = first
        n = 0
        self._closers = {self._seq_key(e): e for e in entries if self._op_name(e)[0] == COALESCED}
        for rid in range(self._next_id, last + 1):
            e = by_id.get(rid)
            self._next_id = rid + 1  # first: an entry that fails is not taken twice
            if e is not None:
                self._first_sight(rid, e)
        for rid in sorted(self._open):
            e = by_id.get(rid)
            if e is None:
                if rid < first:  # overwritten while in flight
                    self.lost_open += 1
                    del self._open[rid]
                continue
            if self._settle(rid, e):
                n += 1
        return n

    def _first_sight(self, rid: int, e: dict[str, Any]) -> None:
        """A new entry: a coalesced closer completes its members; anything else becomes a
        record, counted issued (progress, black box)."""
        if self._op_name(e)[0] == COALESCED:
            return
        rec = self._record(e)
        if rec is None:
            return
        self._open[rid] = rec
        self.log.issued += 1
        if self.log.blackbox is not None:
            self.log.blackbox.issued(rec)

    def _settle(self, rid: int, e: dict[str, Any]) -> bool:
        """Emit ``rid``'s record if its entry (or the coalesced entry closing it) shows
        it done."""
        done = self._done_by(rid, e)
        if done is None and self.wait_for_completion:
            return False
        rec = self._open.pop(rid)
        if done is not None:
            self._times(rec, done)
            self.log._completed(rec)
        self.emitted += 1
        self.emit(rec)
        return True

    def _done_by(self, rid: int, e: dict[str, Any]) -> dict[str, Any] | None:
        """The completed entry that gives ``rid`` its end: itself, else the later
        ``nccl:coalesced`` entry of its group and sequence number, else None."""
        if e.get("state") == "completed":
            return e
        closer = self._closers.get(self._seq_key(e))
        if closer is not None and int(closer["record_id"]) > rid:
            return closer if closer.get("state") == "completed" else None
        return None

    @staticmethod
    def _seq_key(e: dict[str, Any]) -> tuple[Any, bool, Any]:
        pg = e.get("process_group") or ("", "")
        p2p = bool(e.get("is_p2p"))
        return pg[0], p2p, e.get("p2p_seq_id") if p2p else e.get("collective_seq_id")

    @staticmethod
    def _op_name(e: dict[str, Any]) -> tuple[str, str]:
        """(base op name, the rest) of ``nccl:send 0->1``: ("send", "0->1")."""
        name = str(e.get("profiling_name") or "")
        name = name.split(":", 1)[1] if ":" in name else name
        base, _, rest = name.partition(" ")
        return base, rest

    # ------------------------------------------------------------------ conversion
    def _group(self, name: str) -> GroupInfo | None:
        if name not in self._pg_names:
            try:
                self._pg_names[name] = self.log.groups.by_name(name)
            except KeyError:  # destroyed before we read it: no member ranks to name
                self._pg_names[name] = None
        return self._pg_names[name]

    def _record(self, e: dict[str, Any]) -> dict[str, Any] | None:
        """The ``collectives`` record of entry ``e`` (end unknown yet), its sequence
        number taken; None for a group this rank cannot resolve (counted in errors)."""
        pg = e.get("process_group") or ("", "")
        info = self._group(str(pg[0]))
        if info is None:
            self.errors += 1
            self.last_error = f"Flight Recorder entry of unknown process group {pg!r}"
            return None
        base, rest = self._op_name(e)
        op = _OPS.get(base, base)
        direction, peer = "", -1
        if op in ("send", "recv"):
            direction = op
            m = _PEER.search(rest)
            if m is not None:
                peer = info.global_rank(int(m.group(3)))
        dtypes = list(e.get("input_dtypes") or []) + list(e.get("output_dtypes") or [])
        dtype, size = _DTYPES.get(dtypes[0], (str(dtypes[0]).lower(), 0)) if dtypes else ("", 0)
        n_in, n_out = _numel(e.get("input_sizes")), _numel(e.get("output_sizes"))
        t0 = int(e.get("time_created_ns") or 0)
        step, phase = self.timeline.at(t0, self.context())
        key = (info.group_id, direction, peer if direction else -1)
        seq = self.log._seq.get(key, 0)
        if not direction:  # torch's count: the same on every member, past any loss
            seq = max(0, int(e.get("collective_seq_id") or 0) - 1 - self._base.get(
                int(e.get("pg_id") or 0), 0))  # fmt: skip
        self.log._seq[key] = seq + 1
        entry = self.log.progress.get(key)
        if entry is None:
            entry = self.log.progress[key] = [info.ranks_str, -1, -1, op, t0]
        entry[1], entry[3], entry[4] = seq, op, t0
        return {
            "t": "collectives", "step": step, "phase": phase, "group_id": info.group_id,
            "group_ranks": info.ranks_str, "group_seq": seq, "op": op, "peer": peer,
            "dtype": dtype, "numel_in": n_in, "numel_out": n_out,
            "bytes": max(n_in, n_out) * size, "enqueue_ns": t0, "start_ns": t0, "end_ns": 0,
            "wait_ns": 0,
        }  # fmt: skip

    @staticmethod
    def _times(rec: dict[str, Any], done: dict[str, Any]) -> None:
        """End from the discovery of completion; start from the device duration."""
        end = int(done.get("time_discovered_completed_ns") or 0) or time.time_ns()
        rec["end_ns"] = max(end, rec["enqueue_ns"])
        duration = done.get("duration_ms")
        if duration is not None:
            rec["start_ns"] = max(rec["enqueue_ns"], rec["end_ns"] - int(float(duration) * 1e6))
        else:
            started = int(done.get("time_discovered_started_ns") or 0)
            rec["start_ns"] = min(max(started, rec["enqueue_ns"]), rec["end_ns"])

    def close(self) -> int:
        """A last read, then every entry still in flight as a record with ``end_ns`` 0
        (as :meth:`CollectiveLog.flush` does); returns how many were in flight."""
        self._stop.set()
        self.read()
        with self._lock:
            left = list(self._open.values())
            self._open.clear()
        for rec in left:
            self.emitted += 1
            self.emit(rec)
        return len(left)

    @property
    def stats(self) -> dict[str, int]:
        """Counters: records ``emitted``, ``lost``, ``lost_open``, ``resets``, ``reads``,
        ``read_ns`` (ns), ``errors``."""
        return {"emitted": self.emitted, "lost": self.lost, "lost_open": self.lost_open,
                "resets": self.resets, "reads": self.reads, "read_ns": self.read_ns,
                "errors": self.errors}  # fmt: skip


def native_groups() -> Callable[[Any], bool]:
    """A test, for the wrappers, of whether a process group (object, None for the
    default, or c10d group name) runs on NCCL and so is read from the ring: cached by
    group name. Never raises (an unknown group: False, the wrapper records it)."""
    from torch.distributed import distributed_c10d as c10d

    cache: dict[str, bool] = {}

    def is_native(group: Any) -> bool:
        try:
            if isinstance(group, str):
                name = group
            else:
                pg = group if group is not None else c10d._get_default_group()
                name = pg.group_name
            hit = cache.get(name)
            if hit is None:
                pg = c10d._resolve_process_group(cast("GroupName", name))
                hit = cache[name] = "nccl" in str(c10d.get_backend(pg)).lower()
            return hit
        except Exception:  # noqa: BLE001 - recorded by the wrapper then
            return False

    return is_native


def choose(level: str, enabled: bool, backend: str) -> bool:
    """Whether attach reads NCCL collectives from the ring: the ``default`` level, the
    setting on (``HooksConfig.fr_ring``), an NCCL default group, a torch with the NCCL
    ring, and the ring recording (:func:`ring_enabled`). Never raises."""
    ok = level == "default" and enabled and "nccl" in backend.lower()
    return ok and hasattr(_C, NCCL_DUMP) and ring_enabled(nccl_dump)
