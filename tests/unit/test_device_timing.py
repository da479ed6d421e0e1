"""CUDA-event timing of collectives (trainer_hooks/device_timing.py), with a stand-in for
``torch.cuda`` (no GPU here): events whose device timestamps the test controls. The real
thing is measured on the GPU machine against the profiler (bench/RESULTS.md)."""

from __future__ import annotations

import time

from ranksight.trainer_hooks.device_timing import DeviceClock, DeviceTimer


class FakeCuda:
    """``torch.cuda``'s surface used here. ``device_ns`` is the device clock: an event
    recorded now completes at the device time the test sets (or at once on a side
    stream), ``offset_ns`` ahead of the host clock."""

    def __init__(self, offset_ns: int = 5_000_000_000) -> None:
        self.offset_ns = offset_ns
        self.next_at: list[int] = []  # device times of the next recorded events
        self.done: set[int] = set()

    def is_available(self) -> bool:
        return True

    def Stream(self, device=None):  # noqa: N802 - torch's name
        return object()

    def Event(self, enable_timing=False):  # noqa: N802
        return FakeEvent(self)


class FakeEvent:
    def __init__(self, cuda: FakeCuda) -> None:
        self.cuda, self.t = cuda, None

    def record(self, stream=None) -> None:
        if stream is not None:  # the idle side stream: completes at once
            self.t = time.time_ns() + self.cuda.offset_ns
            self.cuda.done.add(id(self))
        else:
            self.t = self.cuda.next_at.pop(0)

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return id(self) in self.cuda.done

    def elapsed_time(self, other: FakeEvent) -> float:
        return (other.t - self.t) / 1e6  # ms, as torch


def test_anchor_maps_device_times_onto_the_host_clock():
    cuda = FakeCuda()
    clock = DeviceClock(cuda)
    assert 0 <= clock.uncertainty_ns < 50_000_000
    ev = FakeEvent(cuda)
    cuda.next_at.append(clock.anchor.t + 1_234_567)
    ev.record()
    assert abs(clock.to_ns(ev) - (clock.anchor_ns + 1_234_567)) <= 1  # device clock offset gone


def test_records_wait_for_their_events_and_come_out_with_device_times_in_order():
    cuda = FakeCuda()
    out: list[dict] = []
    timer = DeviceTimer(out.append, DeviceClock(cuda), prealloc=0)
    base = timer.clock.anchor.t
    recs = [{"op": "all_reduce", "start_ns": 1, "end_ns": 2, "enqueue_ns": 1} for _ in range(3)]
    events = []
    for i, rec in enumerate(recs):
        cuda.next_at += [base + 1000 * (i + 1), base + 1000 * (i + 1) + 500]
        timer.start(rec)
        assert timer.has_start(rec)
        assert timer.end(rec)
        _, start, end = timer._pending[-1]
        cuda.done.add(id(start))  # the start events completed; the ends not yet
        events.append(end)
    assert timer.resolve() == 0 and out == []  # nothing completed on the device yet
    cuda.done.add(id(events[0]))
    cuda.done.add(id(events[2]))
    assert timer.resolve() == 1  # in order: the second holds the third back
    cuda.done.add(id(events[1]))
    assert timer.resolve() == 2
    anchor_ns = timer.clock.anchor_ns
    assert [(r["start_ns"] - anchor_ns, r["end_ns"] - anchor_ns) for r in out] == [
        (1000, 1500), (2000, 2500), (3000, 3500)
    ]  # fmt: skip
    assert all(r["enqueue_ns"] == 1 for r in out)  # the host issue time stays
    assert timer.resolved == 3 and timer.unresolved == 0


def test_an_op_never_waited_on_and_unfinished_events_leave_with_host_times():
    cuda = FakeCuda()
    out: list[dict] = []
    timer = DeviceTimer(out.append, DeviceClock(cuda), max_pending=2, prealloc=0)
    never = {"op": "all_gather", "start_ns": 7, "end_ns": 8}
    cuda.next_at.append(0)
    timer.start(never)
    assert timer.end({"op": "x"}) is False  # no start event: the caller emits it itself
    recs = [{"op": "all_reduce", "start_ns": i, "end_ns": i} for i in range(3)]
    for rec in recs:
        cuda.next_at += [0, 0]
        timer.start(rec)
        timer.end(rec)
    assert out == [recs[0]] and timer.unresolved == 1  # over max_pending: the oldest goes
    cuda.done.add(id(timer._pending[0][1]))  # recs[1]: started and ended on the device
    cuda.done.add(id(timer._pending[0][2]))
    timer.close(timeout_s=0.05)
    assert out == recs and timer.unresolved >= 2
    assert recs[2]["start_ns"] == 2 and recs[2]["end_ns"] == 0  # never finished on the device


class FakeWork:
    """An async c10d Work that measured its own device duration (NCCL timing on)."""

    def __init__(self, ms: float) -> None:
        self.ms, self.completed = ms, False

    def is_completed(self) -> bool:
        return self.completed

    def _get_duration(self) -> float:
        return self.ms


def test_an_async_work_ends_at_its_start_plus_its_own_device_duration(monkeypatch):
    monkeypatch.setenv("TORCH_NCCL_ENABLE_TIMING", "1")
    cuda = FakeCuda()
    out: list[dict] = []
    timer = DeviceTimer(out.append, DeviceClock(cuda), prealloc=0)
    rec = {"op": "all_reduce", "start_ns": 1, "end_ns": 2}
    cuda.next_at.append(timer.clock.anchor.t + 10_000)
    timer.start(rec)
    work = FakeWork(0.25)
    assert timer.end(rec, work)  # waited on long after it finished: no end event needed
    cuda.done.add(id(timer._pending[-1][1]))
    assert timer.resolve() == 0  # the Work has not finished
    work.completed = True
    assert timer.resolve() == 1
    start = timer.clock.anchor_ns + 10_000
    assert (out[0]["start_ns"], out[0]["end_ns"]) == (start, start + 250_000)


def test_events_are_made_ahead_and_reused_once_read():
    cuda = FakeCuda()
    out: list[dict] = []
    timer = DeviceTimer(out.append, DeviceClock(cuda), prealloc=4)
    made = list(timer._free)
    assert len(made) == 4
    rec = {"op": "all_reduce", "start_ns": 0, "end_ns": 0}
    cuda.next_at += [timer.clock.anchor.t + 10, timer.clock.anchor.t + 20]
    timer.start(rec)
    timer.end(rec)
    _, start, end = timer._pending[-1]
    assert start in made and end in made  # no event made on the training thread
    assert timer.resolve() == 1 and len(timer._free) == 4  # both back in the pool


class _Info:
    group_id, ranks_str = "g1", "0,1"

    def global_rank(self, r: int) -> int:
        return r


class CudaWork:
    """An NCCL Work seen from the host: done when the GPU says so."""

    def __init__(self) -> None:
        self.done = False

    def is_completed(self) -> bool:
        return self.done

    def _get_duration(self) -> float:  # ms, measured by c10d on the NCCL stream
        return 0.5

    def get_future(self):  # NCCL futures complete at enqueue: must not be trusted
        raise AssertionError("a CUDA rank must not complete ops through the future")


def test_on_a_gpu_rank_an_op_counts_completed_only_once_the_device_finished_it(monkeypatch):
    import torch

    from ranksight.trainer_hooks.collective_log import BlockedClock, CollectiveLog

    monkeypatch.setenv("TORCH_NCCL_ENABLE_TIMING", "1")
    cuda = FakeCuda()
    out: list[dict] = []
    log = CollectiveLog(out.append, lambda: (3, "backward"), BlockedClock())
    timer = DeviceTimer(out.append, DeviceClock(cuda), prealloc=0)
    timer.on_resolved, timer.on_poll = log.device_completed, log.poll_device
    log.device = timer
    base = timer.clock.anchor.t
    cuda.next_at += [base + 100, base + 200]
    x = torch.ones(8)
    waited, unwaited = CudaWork(), CudaWork()
    rec = log.issue("all_reduce", _Info(), -1, "", x, x, 1)
    log.track_work(rec, waited)
    rec2 = log.issue("all_reduce", _Info(), -1, "", x, x, 2)
    log.track_work(rec2, unwaited)
    log.waited_on_work(waited, 5)  # the host's wait returned at once: the GPU is still busy
    entry = log.progress[("g1", "", -1)]
    assert (entry[1], entry[2]) == (1, -1) and out == []  # issued #1; nothing completed
    cuda.done.add(id(timer._pending[-1][1]))  # start event
    assert timer.resolve() == 0  # the Work has not finished on the device
    waited.done = True
    assert timer.resolve() == 1 and entry[2] == 0 and out == [rec]
    assert out[0]["start_ns"] == timer.clock.anchor_ns + 100
    assert out[0]["end_ns"] == out[0]["start_ns"] + 500_000  # its own device duration
    unwaited.done = True  # a DDP comm hook's work: nobody waits on it
    log.poll_device()
    assert entry[2] == 1  # progress sees it finished
    log.flush()
    assert out[-1] is rec2 and rec2["end_ns"] > 0  # emitted as completed at close


class _HooksStandIn:
    """What a phase needs of Hooks: its phase stack, blocked clock, device timer, step."""

    def __init__(self, device) -> None:
        from ranksight.trainer_hooks.hooks import Hooks

        self._phase_record = Hooks._phase_record.__get__(self)
        self._phase_stack: list[str] = []
        self._clock = type("Clock", (), {"total_ns": 0})()
        self._device, self._step, self.out = device, 7, []
        self._device_errors = 0
        self._ring = None  # collectives recorded by the wrappers, not the Flight Recorder ring

    def _put(self, rec: dict) -> None:
        self.out.append(rec)


def test_on_a_gpu_rank_a_phase_carries_the_devices_times():
    """A GPU slowed by another process shows only on the device: the host issues the
    phase's kernels in the same time. The phase's record leaves with the times of CUDA
    events recorded at its enter and exit, once they completed."""
    from ranksight.trainer_hooks.collective_log import BlockedClock, CollectiveLog
    from ranksight.trainer_hooks.hooks import _Phase

    cuda = FakeCuda()
    h = _HooksStandIn(None)
    timer = DeviceTimer(h._put, DeviceClock(cuda), prealloc=0)
    log = CollectiveLog(h._put, lambda: (7, "forward"), BlockedClock())
    timer.on_resolved, timer.on_poll = log.device_completed, log.poll_device
    h._device = timer
    base = timer.clock.anchor.t
    cuda.next_at += [base + 1_000_000, base + 41_000_000]  # 40 ms on the device
    t0 = time.time_ns()
    with _Phase(h, "forward", 2, 0):
        pass  # the host only queued kernels: microseconds
    host_ns = time.time_ns() - t0
    assert h.out == [] and h._phase_stack == []  # waits for its events
    _, start, end = timer._pending[-1]
    cuda.done.update({id(start), id(end)})
    assert timer.resolve() == 1
    (rec,) = h.out
    assert (rec["t"], rec["phase"], rec["step"], rec["microbatch"], rec["stage"]) == (
        "phases", "forward", 7, 2, 0
    )  # fmt: skip
    assert rec["start_ns"] == timer.clock.anchor_ns + 1_000_000
    assert rec["end_ns"] - rec["start_ns"] == 40_000_000 > host_ns
    assert rec["wait_ns"] == 0 and timer.resolved == 1
    cpu = _HooksStandIn(None)  # no device timer: host times, at once
    with _Phase(cpu, "backward", -1, -1):
        pass
    assert [r["phase"] for r in cpu.out] == ["backward"] and cpu.out[0]["end_ns"] >= t0


def test_host_work_phases_and_failing_events_keep_host_times():
    """``data_wait`` is host work: timed on the host even on a CUDA rank. A CUDA error in
    a phase's events is counted and the phase recorded with host times, never raised."""
    from ranksight.trainer_hooks.hooks import _Phase

    cuda = FakeCuda()
    h = _HooksStandIn(None)
    h._device = DeviceTimer(h._put, DeviceClock(cuda), prealloc=0)
    with _Phase(h, "data_wait", -1, -1):
        pass
    assert [r["phase"] for r in h.out] == ["data_wait"] and not h._device._pending

    class Broken:
        def start(self, rec):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    h._device = Broken()
    with _Phase(h, "forward", 0, 0):
        pass
    assert [r["phase"] for r in h.out] == ["data_wait", "forward"]
    assert h._device_errors == 1 and h._phase_stack == []


def test_a_phase_the_device_never_finished_leaves_at_close_with_its_host_times():
    """At the end of a hung job a collective still in flight on the device is emitted
    with ``end_ns`` 0 (in flight); a phase keeps the host's times, not 0."""
    from ranksight.trainer_hooks.hooks import _Phase

    cuda = FakeCuda()
    h = _HooksStandIn(None)
    timer = DeviceTimer(h._put, DeviceClock(cuda), prealloc=0)
    h._device = timer
    base = timer.clock.anchor.t
    cuda.next_at += [base + 1_000, base + 2_000, base + 3_000, base + 4_000]
    with _Phase(h, "backward", 0, 0):
        pass
    op = {"op": "all_reduce", "start_ns": 5, "end_ns": 6}
    timer.start(op)
    timer.end(op)
    timer.close(timeout_s=0.05)  # neither finished on the device
    phase, coll = h.out
    assert phase["phase"] == "backward" and phase["end_ns"] >= phase["start_ns"] > 0
    assert coll is op and coll["end_ns"] == 0


def test_a_phases_device_wait_is_the_device_time_of_collectives_waited_on_inside_it():
    """A TP peer of a slow rank spends its forward's device span waiting in the NCCL
    all_reduce: that time is the phase's wait (as a CPU rank's blocked host time is), so
    its compute is not taken for slow. A collective waited on before the phase began
    does not count; the wait never exceeds the span."""
    from ranksight.trainer_hooks.hooks import _Phase

    cuda = FakeCuda()
    h = _HooksStandIn(None)
    timer = DeviceTimer(h._put, DeviceClock(cuda), prealloc=0)
    h._device = timer
    b = timer.clock.anchor.t
    ms = 1_000_000
    before = {"op": "all_reduce", "start_ns": 1, "end_ns": 2}
    inside = {"op": "all_reduce", "start_ns": 3, "end_ns": 4}
    cuda.next_at += [b, b + 50 * ms]  # before the phase: 50 ms
    timer.start(before)
    timer.end(before)
    cuda.next_at += [b + 100 * ms, b + 105 * ms, b + 135 * ms, b + 140 * ms]
    with _Phase(h, "forward", 0, 0):
        timer.start(inside)  # issued at 105 ms, the peer arrives late: done at 135 ms
        timer.end(inside)
    for _, start, end in timer._pending:
        cuda.done.update({id(start), id(end)})
    assert timer.resolve() == 3
    phase = h.out[-1]
    assert phase["phase"] == "forward" and "_coll_ns0" not in phase
    assert phase["end_ns"] - phase["start_ns"] == 40 * ms
    assert phase["wait_ns"] == 30 * ms  # the inside all_reduce only
    # a collective longer than the phase (overlapping compute on NCCL's stream)
    long = {"op": "all_reduce", "start_ns": 5, "end_ns": 6}
    cuda.next_at += [b + 200 * ms, b + 201 * ms, b + 300 * ms, b + 210 * ms]
    with _Phase(h, "backward", 0, 0):
        timer.start(long)
        timer.end(long)
    for _, start, end in timer._pending:
        cuda.done.update({id(start), id(end)})
    timer.resolve()
    assert h.out[-1]["phase"] == "backward" and h.out[-1]["wait_ns"] == 10 * ms  # its span
