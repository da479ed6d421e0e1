"""Bookkeeping shared by both ways of seeing collectives (API wrappers and dispatch mode).

One record per collective or P2P op, with the ``collectives`` table's columns (less
run_id/attempt/rank) and ``"t": "collectives"``. Its end is known from a Work future's
callback (which runs on the backend's thread and only stamps the time), a Work.wait that
returns, or a wait on a functional collective's output. Records are emitted from the
training thread at the next issue, wait or step end, so the blocked time of a wait that
follows completion is still on the record; ops never completed are emitted at close with
``end_ns`` 0.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from .groups import GroupInfo, GroupRegistry

_C = torch._C._distributed_c10d
MAX_PENDING = 10_000
"""Ops awaiting completion at most; past this the oldest is emitted with ``end_ns`` 0."""


def tensors_of(x: Any) -> list[torch.Tensor]:
    """Every tensor in ``x`` (a tensor or nested lists/tuples of tensors)."""
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for item in x for t in tensors_of(item)]
    return []


_DTYPE_NAMES: dict[Any, str] = {}


def sizes_of(x: Any) -> tuple[int, int, str]:
    """(element count, bytes, dtype name) over every tensor in ``x``."""
    if isinstance(x, torch.Tensor):  # the common case, without building a list
        n = x.numel()
        name = _DTYPE_NAMES.get(x.dtype)
        if name is None:
            name = _DTYPE_NAMES[x.dtype] = str(x.dtype).removeprefix("torch.")
        return n, n * x.element_size(), name
    ts = tensors_of(x)
    if not ts:
        return 0, 0, ""
    numel = sum(t.numel() for t in ts)
    nbytes = sum(t.numel() * t.element_size() for t in ts)
    return numel, nbytes, str(ts[0].dtype).removeprefix("torch.")


def storage_key(t: torch.Tensor) -> int:
    """Identity of a tensor's memory, shared by the wrappers around it (an
    AsyncCollectiveTensor is keyed by the tensor it wraps)."""
    t = getattr(t, "elem", t)
    try:
        return t.untyped_storage().data_ptr() or id(t)
    except (RuntimeError, NotImplementedError):
        return id(t)


class BlockedClock:
    """Process-wide sum of nanoseconds training threads spent blocked waiting for
    collectives. Phases read it at entry and exit; their difference is the phase's
    ``wait_ns``."""

    def __init__(self) -> None:
        self.total_ns = 0


class CollectiveLog:
    """Sequence numbers per group (P2P: per peer and direction), record building and
    completion tracking. ``emit`` takes finished records; ``context`` gives the current
    ``(step, phase)``. Bookkeeping errors are counted in ``errors``, never raised."""

    def __init__(
        self,
        emit: Callable[[dict[str, Any]], None],
        context: Callable[[], tuple[int, str]],
        clock: BlockedClock,
    ) -> None:
        self.emit = emit
        self.context = context
        self.clock = clock
        self.groups = GroupRegistry()
        self.local = threading.local()
        self.errors = 0
        self.last_error = ""
        self.issued = 0
        self._seq: dict[Any, int] = {}
        self._by_tensor: dict[int, dict[str, Any]] = {}
        self._by_work: dict[int, tuple[Any, dict[str, Any]]] = {}
        self._no_future: list[tuple[dict[str, Any], Any]] = []
        self._done: collections.deque[dict[str, Any]] = collections.deque()
        self.device: Any = None
        """A :class:`~.device_timing.DeviceTimer` (CUDA ranks), or None."""
        self.blackbox: Any = None
        """A :class:`~.blackbox.BlackBox` every op is also written to, or None."""
        self._in_call: dict[int, dict[str, Any]] = {}
        """Records of the API calls now running (a synchronous collective blocks inside)."""
        self.native: Callable[[Any], bool] | None = None
        """Tells the wrappers a group (object, None, or name) is recorded elsewhere
        (:mod:`.fr_ring`): they then only call through."""
        self.progress: dict[tuple[str, str, int], list[Any]] = {}
        """(group_id, direction, peer) -> [group_ranks, issued, completed, last_op, last_issue_ns]."""

    def note_error(self, e: BaseException) -> None:
        """Count a bookkeeping failure (training goes on)."""
        self.errors += 1
        self.last_error = f"{type(e).__name__}: {e}"

    # ------------------------------------------------------------------ issue
    def issue(
        self, op: str, info: GroupInfo, peer: int, direction: str, x_in: Any, x_out: Any, t0: int
    ) -> dict[str, Any]:
        """A new record for an op issued at ``t0`` (ns). ``direction`` is "send"/"recv"
        for P2P (sequence per peer and direction), "" for collectives."""
        key = (info.group_id, direction, peer if direction else -1)
        seq = self._seq.get(key, 0)
        self._seq[key] = seq + 1
        entry = self.progress.get(key)
        if entry is None:
            entry = self.progress[key] = [info.ranks_str, -1, -1, op, t0]
        entry[1], entry[3], entry[4] = seq, op, t0
        step, phase = self.context()
        n_in, b_in, dtype = sizes_of(x_in)
        n_out, b_out, dtype_out = sizes_of(x_out)
        self.issued += 1
        self.drain()
        rec = {
            "t": "collectives", "step": step, "phase": phase, "group_id": info.group_id,
            "group_ranks": info.ranks_str, "group_seq": seq, "op": op, "peer": peer,
            "dtype": dtype or dtype_out, "numel_in": n_in, "numel_out": n_out,
            "bytes": max(b_in, b_out), "enqueue_ns": t0, "start_ns": t0, "end_ns": 0, "wait_ns": 0,
        }  # fmt: skip
        if self.blackbox is not None:
            self.blackbox.issued(rec)
        if self.device is not None:
            self.device.start(rec)
        return rec

    def enter_call(self, rec: dict[str, Any]) -> None:
        """The training thread is inside the API call that issued ``rec``."""
        self._in_call[id(rec)] = rec

    def leave_call(self, rec: dict[str, Any]) -> None:
        """The API call that issued ``rec`` returned."""
        self._in_call.pop(id(rec), None)

    def _completed(self, rec: dict[str, Any]) -> None:
        direction = rec["op"] if rec["op"] in ("send", "recv") else ""
        entry = self.progress.get((rec["group_id"], direction, rec["peer"] if direction else -1))
        if entry is not None and rec["group_seq"] > entry[2]:
            entry[2] = rec["group_seq"]
        if self.blackbox is not None:
            self.blackbox.completed(rec)

    def complete(self, rec: dict[str, Any], end_ns: int | None = None, work: Any = None) -> None:
        """Set the record's end (now by default), count it completed and emit it (training
        thread only). On a CUDA rank the host returning from a wait says nothing about
        the device: the device timer counts it completed and emits it once its events
        (or ``work``'s own device timing) show the GPU finished it."""
        rec["end_ns"] = rec["end_ns"] or end_ns or time.time_ns()
        if self.device is not None and self.device.end(rec, work):
            return
        self._completed(rec)
        self.emit(rec)

    def device_completed(self, rec: dict[str, Any]) -> None:
        """The device timer saw ``rec`` finish on the GPU (its thread); phases, which it
        times too, are not collectives and are left alone."""
        if "op" in rec:
            self._completed(rec)

    def poll_device(self) -> None:
        """Count the CUDA works that finished on the GPU but that nobody waited on yet
        (a DDP comm hook chains their futures): progress must not call them in flight.
        Called from the device timer's thread."""
        for rec, work in list(self._no_future):
            try:
                if work.is_completed():
                    self._completed(rec)
            except RuntimeError:
                pass

    def _done_callback(self, rec: dict[str, Any]) -> None:
        rec["end_ns"] = time.time_ns()
        self._completed(rec)  # at once: the training thread may be stuck
        self._done.append(rec)

    def progress_records(self, step: int) -> list[dict[str, Any]]:
        """One ``progress`` record per (group, direction, peer) seen so far."""
        now = time.time_ns()
        return [
            {"t": "progress", "ts_ns": now, "step": step, "group_id": gid, "group_ranks": e[0],
             "direction": direction, "peer": peer, "issued_seq": e[1], "completed_seq": e[2],
             "last_op": e[3], "last_issue_ns": e[4]}
            for (gid, direction, peer), e in list(self.progress.items())
        ]  # fmt: skip

    def drain(self) -> None:
        """Emit the records whose futures completed since the last drain."""
        done = self._done
        while done:
            self.emit(done.popleft())

    # ------------------------------------------------------------------ Work
    def track_work(self, rec: dict[str, Any], work: Any) -> None:
        """Complete ``rec`` when ``work`` (a Work or its boxed ScriptObject) finishes: by
        its future's callback, else (gloo P2P has no future) when a later wait returns."""
        if isinstance(work, torch.ScriptObject):
            work = _C.Work.unbox(work)
        self._by_work[id(work)] = (work, rec)
        if len(self._by_work) > MAX_PENDING:  # never waited on: forget the oldest mapping
            self._by_work.pop(next(iter(self._by_work)))
        if self.device is not None:  # a CUDA work's future completes when it is enqueued
            self._no_future.append((rec, work))
            if len(self._no_future) > MAX_PENDING:  # never waited on: let the oldest go
                self.emit(self._no_future.pop(0)[0])
            return
        try:
            fut = work.get_future()
        except RuntimeError:
            self._no_future.append((rec, work))
            return
        fut.add_done_callback(lambda _f, rec=rec: self._done_callback(rec))

    def waited_on_work(self, work: Any, dt: int) -> None:
        """A Work.wait on ``work`` blocked ``dt`` ns: charge it to its record if known,
        then complete the future-less ops that have finished."""
        entry = self._by_work.pop(id(work), None)
        if entry is not None and entry[1]["wait_ns"] == 0:
            entry[1]["wait_ns"] = dt
        if self._no_future:
            still = []
            for rec, w in self._no_future:
                if w is work or w.is_completed():  # the awaited one: its wait returned
                    self.complete(rec, work=w)
                else:
                    still.append((rec, w))
            self._no_future = still
        self.drain()

    # ------------------------------------------------------------------ functional
    def track_output(self, rec: dict[str, Any], out: Any) -> None:
        """A functional collective's output: completed when someone waits on it."""
        for t in tensors_of(out):
            old = self._by_tensor.get(storage_key(t))
            if (
                old is not None and old is not rec
            ):  # memory reused: the old one was dropped unwaited
                self.emit(old)
            self._by_tensor[storage_key(t)] = rec
        if len(self._by_tensor) > MAX_PENDING:
            self.emit(self._by_tensor.pop(next(iter(self._by_tensor))))

    def waited_on_tensor(self, tensor: Any, t0: int, t1: int) -> None:
        """A wait on a functional collective's output blocked from t0 to t1 (ns)."""
        self.clock.total_ns += t1 - t0
        if not isinstance(tensor, torch.Tensor):
            return
        rec = self._by_tensor.pop(storage_key(tensor), None)
        if rec is not None:
            rec["wait_ns"] = t1 - t0
            self.complete(rec, t1)

    def flush(self) -> int:
        """Emit what completed, then every op not yet completed (``end_ns`` 0); returns
        how many were incomplete."""
        self.drain()
        pending = {id(r): r for r in self._by_tensor.values()}
        for r, w in self._no_future:  # finished (on the device) but never waited on
            try:
                if w.is_completed():
                    r["end_ns"] = r["end_ns"] or time.time_ns()
                    self.emit(r)
                    continue
            except RuntimeError:
                pass
            pending[id(r)] = r
        pending.update(dict(self._in_call))
        pending.update({id(r): r for _, r in self._by_work.values() if r["end_ns"] == 0})
        pending = {k: r for k, r in pending.items() if r["end_ns"] == 0}
        self._by_tensor.clear()
        self._no_future.clear()
        self._by_work.clear()
        self._in_call.clear()
        for rec in pending.values():
            self.emit(rec)
        self.drain()
        return len(pending)
