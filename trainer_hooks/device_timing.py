"""Device-side times of collectives on GPU: CUDA events, resolved off the training thread.

On a GPU the host runs ahead of the device: the time a rank *issues* a collective says
little about when its inputs are ready on the device or when the transfer ends. So, for
every collective issued from a CUDA rank, the hooks record two CUDA events on the
issuing (current) stream, as MegaScale times its critical segments (NSDI 2024, 4.1):

- **start**, just before the call: it completes when everything queued before the
  collective on that stream has run, i.e. when this rank's inputs are ready: the rank's
  device-side *arrival*;
- **end**, right after the rank waits for it (``Work.wait`` / a functional collective's
  wait / a synchronous call returning): c10d makes the current stream wait for the
  communication stream there, so the event completes once the transfer has ended.

Recording an event costs a few microseconds and never synchronizes. A resolver thread
polls ``Event.query()`` (non-blocking) and converts the events to the host's realtime
clock through an **anchor**: an event recorded on an idle side stream right after reading
``time.time_ns()``, synchronized by the resolver thread itself (never the training
stream); ``anchor_ns + anchor.elapsed_time(event)`` is the event's host time. Anchors are
renewed every ``anchor_every_s`` (GPU and host clocks drift apart by a few ppm); each
keeps its uncertainty (the host time between recording it and seeing it complete).
Records wait in the resolver until their events complete (bounded: past ``max_pending``
the oldest go out with host times only, counted).

Records resolved here carry device times in ``start_ns`` / ``end_ns`` (``enqueue_ns``
stays the host issue time); ops that were never waited on keep host times.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from typing import Any


class DeviceClock:
    """Host realtime ns of CUDA events through anchors (see the module docstring).

    ``cuda``: the ``torch.cuda`` module (tests pass a stand-in with the same surface).
    Raises RuntimeError if CUDA is unavailable."""

    def __init__(self, cuda: Any, device: Any = None, tries: int = 5) -> None:
        if not cuda.is_available():
            raise RuntimeError("CUDA is not available: no device timing")
        self.cuda = cuda
        self.stream = cuda.Stream(device=device)
        self.tries = tries
        self.anchor: Any = None
        self.anchor_ns = 0
        self.uncertainty_ns = 0
        """Host time between recording the current anchor and seeing it complete (ns)."""
        self.renew()

    def renew(self) -> None:
        """Record a new anchor (the tightest of ``tries``). Blocks the calling thread on
        the side stream only. Raises ValueError if ``tries`` < 1."""
        best: tuple[Any, int, int] | None = None
        for _ in range(self.tries):
            ev = self.cuda.Event(enable_timing=True)
            t0 = time.time_ns()
            ev.record(self.stream)
            ev.synchronize()
            t1 = time.time_ns()
            if best is None or t1 - t0 < best[2] - best[1]:
                best = (ev, t0, t1)
        if best is None:
            raise ValueError(f"tries must be >= 1, got {self.tries}")
        self.anchor, self.anchor_ns, self.uncertainty_ns = best[0], best[1], best[2] - best[1]

    def to_ns(self, event: Any) -> int:
        """The host realtime (ns) at which ``event`` completed on the device."""
        return self.anchor_ns + int(round(self.anchor.elapsed_time(event) * 1e6))


class DeviceTimer:
    """Per-op start/end events and their resolution (see the module docstring).

    ``emit(record)`` receives each record once its device times are known (or given up
    on). ``start()`` and ``end()`` are called from the training thread; :meth:`resolve`
    runs in the resolver thread started by :meth:`start_thread`.
    """

    def __init__(
        self,
        emit: Callable[[dict[str, Any]], None],
        clock: DeviceClock,
        *,
        max_pending: int = 8192,
        anchor_every_s: float = 2.0,
        poll_s: float = 0.2,
        prealloc: int = 512,
    ) -> None:
        self.emit = emit
        self.on_resolved: Callable[[dict[str, Any]], None] | None = None
        """Called (resolver thread) with each record the device finished, before emit."""
        self.on_poll: Callable[[], None] | None = None
        """Called (resolver thread) every poll: e.g. works nobody waited on yet."""
        self.clock = clock
        self.cuda = clock.cuda
        self.max_pending = max_pending
        self.anchor_every_s = anchor_every_s
        self.poll_s = poll_s
        self.resolved = 0
        self.unresolved = 0
        """Records emitted with host times only (no end event, or over ``max_pending``)."""
        self._starts: dict[int, Any] = {}
        self._pending: collections.deque[tuple[dict[str, Any], Any, Any]] = collections.deque()
        self._queued = 0
        """Records queued by :meth:`end` so far (training thread, under the lock)."""
        self._popped = 0
        """Records taken off the queue so far (resolver thread)."""
        self._coll_ns = 0
        """Device time of the collectives resolved so far (ns)."""
        self._marks: collections.deque[tuple[int, dict[str, Any]]] = collections.deque()
        """Phases begun: (records queued when they began, their record)."""
        self._lock = threading.Lock()
        self._event_type = type(self.cuda.Event(enable_timing=True))
        self._free: collections.deque[Any] = collections.deque()
        for _ in range(prealloc):  # created (and their CUDA events made) off the hot path
            ev = self.cuda.Event(enable_timing=True)
            ev.record(clock.stream)
            self._free.append(ev)
        """Events whose times were read: reused (creating one costs more than recording)."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_anchor = time.monotonic()
        self._record = current_stream_recorder(self.cuda)

    # ------------------------------------------------------------------ training thread
    def _reuse(self, ev: Any) -> None:
        if len(self._free) < 2 * self.max_pending:  # completed: safe to record again
            self._free.append(ev)

    def _event(self) -> Any:
        try:
            return self._free.pop()
        except IndexError:
            return self.cuda.Event(enable_timing=True)

    def start(self, rec: dict[str, Any]) -> None:
        """Record ``rec``'s start event on the current stream (before the call)."""
        ev = self._event()
        self._record(ev)
        self._starts[id(rec)] = ev
        if len(self._starts) > self.max_pending:  # never ended: forget the oldest
            self._starts.pop(next(iter(self._starts)))

    def start_phase(self, rec: dict[str, Any]) -> None:
        """:meth:`start` for a phase: also notes where it begins among the queued
        records, so that its resolution knows the device time of the collectives waited
        on inside it (the records queued between its start and its end)."""
        self.start(rec)
        with self._lock:
            self._marks.append((self._queued, rec))
            if len(self._marks) > self.max_pending:
                self._marks.popleft()

    def has_start(self, rec: dict[str, Any]) -> bool:
        """Whether ``rec`` has a start event waiting for its end."""
        return id(rec) in self._starts

    def end(self, rec: dict[str, Any], work: Any = None) -> bool:
        """Queue ``rec`` for resolution: its end is ``start + work._get_duration()`` when
        ``work`` (an async c10d Work) measured its own device duration (NCCL with
        ``TORCH_NCCL_ENABLE_TIMING=1``: c10d's events on the communication stream), else
        an end event recorded now, after the wait. False if it has no start event (then
        the caller emits it as it is)."""
        start = self._starts.pop(id(rec), None)
        if start is None:
            return False
        if work is not None and _timed(work):
            ev = work
        else:
            ev = self._event()
            self._record(ev)
        old = None
        with self._lock:
            if len(self._pending) >= self.max_pending:
                old, _, _ = self._pending.popleft()
                self._popped += 1
            self._pending.append((rec, start, ev))
            self._queued += 1
        if old is not None:
            self.unresolved += 1
            self._emit(old)
        return True

    # ------------------------------------------------------------------ resolver thread
    def resolve(self) -> int:
        """Emit the records whose end events completed, in order; returns how many."""
        n = 0
        pending = self._pending
        while pending:
            with self._lock:
                if not pending or not _done(pending[0][1], pending[0][2]):
                    break
                rec, start, end = pending.popleft()
                self._mark_phases()
                self._popped += 1
            try:
                rec["start_ns"] = self.clock.to_ns(start)
                if isinstance(end, self._event_type):
                    rec["end_ns"] = self.clock.to_ns(end)
                    self._reuse(end)
                else:  # the Work's own device duration (ms)
                    rec["end_ns"] = rec["start_ns"] + int(end._get_duration() * 1e6)
                self._reuse(start)
                self._device_wait(rec)
                self.resolved += 1
                if self.on_resolved is not None:
                    self.on_resolved(rec)
            except RuntimeError:  # an event from a stream that was destroyed
                self.unresolved += 1
            self._emit(rec)
            n += 1
        return n

    def _emit(self, rec: dict[str, Any]) -> None:
        """Hand ``rec`` on without the timer's own bookkeeping (a phase's ``_coll_ns0``)."""
        rec.pop("_coll_ns0", None)
        self.emit(rec)

    def _mark_phases(self) -> None:
        """(Under the lock, before the next record is taken off.) Phases that began
        before it note the collectives' device time so far."""
        while self._marks and self._marks[0][0] <= self._popped:
            _, rec = self._marks.popleft()
            rec["_coll_ns0"] = self._coll_ns

    def _device_wait(self, rec: dict[str, Any]) -> None:
        """A resolved collective adds its device time to the running total; a resolved
        phase's ``wait_ns`` becomes the device time of the collectives waited on inside
        it (NCCL kernels wait for the last peer: a victim's span holds its wait, as a CPU
        rank's blocked host time does), at least its host ``wait_ns`` and at most its
        span."""
        if "op" in rec:
            self._coll_ns += max(0, rec["end_ns"] - rec["start_ns"])
            return
        start_total = rec.pop("_coll_ns0", None)
        if start_total is None or "wait_ns" not in rec:
            return
        span = max(0, rec["end_ns"] - rec["start_ns"])
        rec["wait_ns"] = min(span, max(int(rec["wait_ns"]), self._coll_ns - start_total))

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.resolve()
                if self.on_poll is not None:
                    self.on_poll()
                if time.monotonic() - self._last_anchor >= self.anchor_every_s:
                    self.clock.renew()
                    self._last_anchor = time.monotonic()
            except Exception:  # never let timing stop the resolver
                self.unresolved += 1

    def start_thread(self) -> None:
        """Start the resolver thread (daemon)."""
        self._thread = threading.Thread(target=self._run, name="ranksight-cuda", daemon=True)
        self._thread.start()

    def close(self, timeout_s: float = 2.0) -> None:
        """Resolve what completes within ``timeout_s``; emit the rest with host times, or,
        for a collective the device never finished, with ``end_ns`` 0 (in flight)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        deadline = time.monotonic() + timeout_s
        while self._pending and time.monotonic() < deadline:
            if not self.resolve():
                time.sleep(0.01)
        with self._lock:
            left, self._pending = list(self._pending), collections.deque()
        for rec, start, end in left:
            self.unresolved += 1
            try:
                finished = _done(start, end)
            except RuntimeError:
                finished = False
            if not finished and "op" in rec:  # a collective the device never finished
                rec["end_ns"] = 0  # (a hang, a dead peer); a phase keeps its host times
            self._emit(rec)


def current_stream_recorder(cuda: Any) -> Callable[[Any], None]:
    """A function that records a CUDA event on the current stream, like
    ``event.record()`` but without building a new ``torch.cuda.Stream`` object on every
    call (``torch.cuda.Event.record`` calls ``torch.cuda.current_stream()``, which does):
    the current stream's (id, device, type) is read from c10 and its Stream object
    reused. ``cuda``: the ``torch.cuda`` module; anything else (a stand-in in tests, a
    torch without these bindings) gets plain ``event.record()``."""
    try:
        import torch

        if cuda is not torch.cuda:
            raise AttributeError("not torch.cuda")
        current = torch._C._cuda_getCurrentStream
        device = torch._C._cuda_getDevice
        base_record = torch._C._CudaEventBase.record
    except (ImportError, AttributeError):
        return lambda ev: ev.record()
    streams: dict[tuple, Any] = {}

    def record(ev: Any) -> None:
        data = current(device())
        stream = streams.get(data)
        if stream is None:
            if len(streams) > 256:  # streams come and go: keep the cache small
                streams.clear()
            stream = streams[data] = cuda.Stream(
                stream_id=data[0], device_index=data[1], device_type=data[2]
            )
        base_record(ev, stream)

    return record


def _timed(work: Any) -> bool:
    """Whether ``work`` can report its device duration (c10d NCCL with timing on)."""
    try:
        return bool(getattr(work, "_get_duration", None)) and _timing_enabled()
    except Exception:
        return False


def _timing_enabled() -> bool:
    import os

    return os.environ.get("TORCH_NCCL_ENABLE_TIMING", "0") not in ("0", "")


def _done(start: Any, end: Any) -> bool:
    """Both ends known: the start event completed, and the end event completed or the
    Work finished."""
    if not start.query():
        return False
    query = getattr(end, "query", None)
    return bool(query()) if query is not None else bool(end.is_completed())
