"""Fault specs of every fault-matrix kind, and their injectors (no torchrun)."""

from __future__ import annotations

import gc
import os
import socket
import subprocess
import sys
import time

import pytest
import torch

from ranksight.reference_trainer.faults import faults_ground_truth, parse_fault, parse_faults
from ranksight.reference_trainer.inject import StepClock, install_faults
from ranksight.reference_trainer.inject_comm import group_members
from ranksight.reference_trainer.inject_host import CpuContention, DataStall, NanOutput
from tests.helpers.spool import read_spool

SHAPE = {"dp": 2, "tp": 2, "pp": 2}


@pytest.mark.parametrize(
    "text",
    [
        "slow_link:rank=2,delay_ms=20.0,group=tp,from_step=4",
        "slow_link:rank=2,delay_ms=5.0,group=pp,from_step=0,until_step=3",
        "hang:rank=3,from_step=5",
        "crash:rank=6,from_step=5",
        "desync:rank=7,mode=skip,from_step=5",
        "desync:rank=4,mode=resize,from_step=5",
        "data_stall:rank=3,delay_ms=400.0,from_step=4",
        "cpu_contention:rank=4,procs=3,from_step=4",
        "gc_storm:rank=2,from_step=4",
        "nan:rank=7,from_step=6",
        "gc_pauses:delay_ms=2500.0,every=3,from_step=4",
    ],
)
def test_every_kind_parses_and_round_trips(text):
    spec = parse_fault(text)
    assert spec.text == text and parse_fault(spec.text) == spec


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("slow_link:rank=1", "missing delay_ms"),
        ("slow_link:rank=1,delay_ms=0", "delay_ms must be in"),
        ("slow_link:rank=1,delay_ms=5,group=nic", "group must be one of"),
        ("desync:rank=1", "missing mode"),
        ("desync:rank=1,mode=swap", "mode must be one of"),
        ("cpu_contention:rank=1,procs=0", "procs must be in"),
        ("cpu_contention:rank=1,procs=two", "procs='two' is not int"),
        ("hang:rank=1,delay_ms=3", "hang does not take delay_ms"),
        ("nan:from_step=2", "missing rank"),
        ("data_stall:rank=1,delay_ms=10,factor=2", "data_stall does not take factor"),
        ("gc_pauses:delay_ms=10,every=0", "every must be in"),
        ("gc_pauses:rank=1,delay_ms=10", "gc_pauses does not take rank"),
    ],
)
def test_bad_specs_name_the_spec_and_the_problem(text, problem):
    with pytest.raises(ValueError, match=problem) as info:
        parse_fault(text)
    assert repr(text) in str(info.value)


def test_ground_truth_records_parameters_and_coordinates():
    specs = parse_faults(
        ["slow_link:rank=5,delay_ms=20,group=dp,from_step=3", "cpu_contention:rank=2"]
    )
    link, cpu = faults_ground_truth(specs, SHAPE)
    assert (link["kind"], link["rank"], link["delay_ms"], link["group"]) == (
        "slow_link",
        5,
        20.0,
        "dp",
    )
    assert (link["dp"], link["tp"], link["pp"], link["from_step"]) == (1, 1, 0, 3)
    assert (cpu["procs"], cpu["pp"]) == (2, 1)  # the default, recorded
    assert faults_ground_truth(parse_faults(["slow_link:rank=1,delay_ms=5"]))[0]["group"] == "tp"


def test_slow_link_groups_follow_the_layout():
    def members(text):
        return sorted(group_members(parse_fault(text), SHAPE))

    assert members("slow_link:rank=2,delay_ms=1,group=tp") == [2, 3]
    assert members("slow_link:rank=2,delay_ms=1,group=dp") == [2, 6]
    assert members("slow_link:rank=2,delay_ms=1,group=pp") == [0]  # its receivers
    deep = {"dp": 1, "tp": 2, "pp": 4}
    assert sorted(group_members(parse_fault("slow_link:rank=3,delay_ms=1,group=pp"), deep)) == [
        1,
        5,
    ]


class _Stage:
    def forward_one_chunk(self, *a, **k):
        return 1

    def backward_one_chunk(self, *a, **k):
        return 2


def test_gc_storm_collects_inside_the_compute_call():
    stage, clock = _Stage(), StepClock(step=0)
    (storm,) = install_faults(stage, parse_faults(["gc_storm:rank=1,from_step=1"]), rank=1,
                              clock=clock, device=torch.device("cpu"))  # fmt: skip
    seen = []

    def count(phase, info):
        if phase == "stop":
            seen.append(info["collected"])

    gc.callbacks.append(count)
    try:
        stage.forward_one_chunk()
        assert seen == [] or max(seen) < 1000
        clock.step = 1
        stage.forward_one_chunk()
    finally:
        gc.callbacks.remove(count)
    assert max(seen) >= 100_000 and storm.injected_s > 0  # the cycle, collected


def test_gc_pauses_take_turns_and_are_one_pause_each_as_gc_callbacks_time_them():
    import time

    spec = parse_fault("gc_pauses:delay_ms=300,every=3,from_step=4")
    turns = {s: spec.paused_rank(s, 8) for s in range(30) if spec.paused_rank(s, 8) is not None}
    assert list(turns) == [4, 7, 10, 13, 16, 19, 22, 25, 28]
    assert list(turns.values())[:8] == [0, 3, 6, 1, 4, 7, 2, 5]  # every rank once in 8 turns
    from ranksight.reference_trainer.inject import GcPauses

    clock = StepClock(step=0)
    pauses = GcPauses(spec=spec, clock=clock, rank=3, world_size=8)  # as install_faults makes it
    call = pauses.wrap(lambda: None)
    spans, t0 = [], {}

    def timer(phase, info):  # how the hooks time GC pauses (trainer_hooks/gc_pauses.py)
        if phase == "start":
            t0["t"] = time.perf_counter()
        else:
            spans.append(time.perf_counter() - t0["t"])

    long_pauses = []
    gc.callbacks.insert(0, timer)
    try:
        for step in (4, 7, 7, 10):  # rank 3's turn is step 7, its first call only
            clock.step = step
            spans.clear()
            call()
            long_pauses.append(len([d for d in spans if d > 0.25]))
    finally:
        gc.callbacks.remove(timer)
    assert long_pauses == [0, 1, 0, 0]
    assert pauses.injected_s >= 0.3  # at least the pause asked for, on its one turn


def test_data_stall_sleeps_only_when_active():
    stall = DataStall(spec=parse_fault("data_stall:rank=0,delay_ms=80,from_step=2"))
    t0 = time.perf_counter()
    stall.on_data(1)
    assert time.perf_counter() - t0 < 0.05
    stall.on_data(2)
    assert time.perf_counter() - t0 >= 0.08 and stall.injected_s == pytest.approx(0.08)


def test_nan_output_turns_the_stage_output_nan():
    clock = StepClock(step=0)
    module = torch.nn.Linear(4, 4)
    NanOutput(spec=parse_fault("nan:rank=0,from_step=1"), clock=clock).install_stage(None, module)
    assert torch.isfinite(module(torch.ones(2, 4))).all()
    clock.step = 1
    assert torch.isnan(module(torch.ones(2, 4))).all()


def test_cpu_contention_pins_busy_processes_beside_the_rank():
    before = os.sched_getaffinity(0)
    contention = CpuContention(spec=parse_fault("cpu_contention:rank=1,procs=2,from_step=3"))
    try:
        contention.on_step(2)
        assert contention.procs == []
        contention.on_step(3)
        assert os.sched_getaffinity(0) == {contention.core}
        assert len(contention.procs) == 2
        time.sleep(0.5)  # the children pin themselves before they spin
        for p in contention.procs:
            assert p.poll() is None and os.sched_getaffinity(p.pid) == {contention.core}
    finally:
        contention.close()
        os.sched_setaffinity(0, before)
    assert contention.procs == []


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_comm_modes_sit_under_and_over_the_hooks(tmp_path):
    worker = os.path.join(os.path.dirname(os.path.dirname(__file__)), "workers", "fault_modes.py")
    out = subprocess.run(
        [sys.executable, worker, str(tmp_path), "modes", str(_free_port())],
        capture_output=True, text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    frames = read_spool(str(tmp_path))
    c = frames["collectives"].sort_values(["step", "enqueue_ns"])
    per_step = c.groupby("step")
    assert list(per_step.size()) == [2, 2, 2, 1]  # step 3: the skipped op never reached the hooks
    took_ms = (c["end_ns"] - c["enqueue_ns"]) / 1e6
    assert (took_ms[c["step"] == 0] < 50).all()
    assert (took_ms[c["step"] >= 1] >= 60).all()  # slow link: both wait paths held
    resized = c[c["step"] == 2]["numel_in"].tolist()
    assert resized == [1001, 500]  # the hooks saw the resized all_reduce
    ph = frames["phases"]
    fwd = ph[(ph["phase"] == "forward") & (ph["step"] >= 1)]
    blocked = fwd["wait_ns"] / (fwd["end_ns"] - fwd["start_ns"])
    assert (blocked > 0.8).all()  # the delay counts as waiting, not as compute
    assert "ranksight-fault: slow_link" in out.stderr and "resize" in out.stderr


def test_slow_pipeline_link_holds_the_receiver_not_the_sender(tmp_path):
    worker = os.path.join(os.path.dirname(os.path.dirname(__file__)), "workers", "p2p_slow_link.py")
    out = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
         worker, str(tmp_path), "p2p"],
        capture_output=True, text=True, timeout=180, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    c = read_spool(str(tmp_path))["collectives"]
    recv, send = c[c["op"] == "recv"], c[c["op"] == "send"]
    assert len(recv) == len(send) == 9 and set(recv["rank"]) == {1} and set(send["rank"]) == {0}
    took_ms = (recv["end_ns"] - recv["enqueue_ns"]) / 1e6
    assert (took_ms[recv["step"] == 0] < 60).all()
    assert (took_ms[recv["step"] >= 1] >= 80).all()
    # the sender is not held: its first send of a step completes at once (the later ones
    # wait for the held receiver to post its next recv: back-pressure, as on a slow link)
    first = send[send["step"] >= 1].sort_values("enqueue_ns").groupby("step").head(1)
    assert ((first["end_ns"] - first["enqueue_ns"]) / 1e6 < 60).all()


def test_every_fault_kind_names_its_injector_and_a_wrong_one_is_refused():
    """The fault seam: each kind of FAULT_KINDS names one Injector class, found on use."""
    from ranksight.reference_trainer.faults import FAULT_KINDS, FaultKind
    from ranksight.reference_trainer.injector import Injector, injector_class

    kinds = [k for k in FAULT_KINDS if k != "none"]
    assert {k: issubclass(injector_class(k), Injector) for k in kinds} == dict.fromkeys(kinds, True)
    FAULT_KINDS["bogus_test_kind"] = FaultKind(
        (), (), "x", injector="ranksight.ground.mesh:coords_of"
    )
    try:
        with pytest.raises(ValueError, match="bogus_test_kind.*not an Injector"):
            injector_class("bogus_test_kind")
    finally:
        del FAULT_KINDS["bogus_test_kind"]


def test_slow_turns_slow_each_rank_in_its_turn_only():
    """``slow_turns`` through the seam: every rank gets the injector, and a rank's compute
    is ``factor`` x as long only in the steps that are its turn (rank 3: step 6 of
    ``from_step=4, every=2``; turns go 0, 3, 6, 1, ...)."""
    import time

    class TimedStage:
        def forward_one_chunk(self):
            time.sleep(0.02)

    specs = parse_faults(["slow_turns:factor=4,every=2,from_step=4"])
    assert [specs[0].paused_rank(s, 8) for s in (4, 5, 6, 8)] == [0, None, 3, 6]
    clock = StepClock(step=0)
    took = {}
    for rank in (3, 5):
        stage = TimedStage()
        (turns,) = install_faults(stage, specs, rank=rank, clock=clock, device=torch.device("cpu"))
        turns.world_size = 8  # the job's (no process group here)
        for step in (4, 6, 8):
            clock.step = step
            t0 = time.perf_counter()
            stage.forward_one_chunk()
            took[rank, step] = time.perf_counter() - t0
    assert took[3, 6] >= 0.075 and took[5, 6] < 0.05  # 4 x 20 ms on its turn only
    assert max(took[3, 4], took[3, 8], took[5, 4], took[5, 8]) < 0.05
