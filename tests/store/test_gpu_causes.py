"""GPU causes of a compute straggler (analyzer/gpu_causes.py) on both stores.

A synthetic run (real schema) with one slow rank, plus ``gpu_samples`` rows made by the
real NVML collector replaying answers recorded on a 2x H200 machine during a power-capped
training run (tests/data/nvml), with answers overridden where a GPU is made to throttle;
``gpu_procs`` rows in the collector's format name each rank's process on its GPU and, where
a GPU is shared, another process.
"""

from __future__ import annotations

import gzip
import json
import os

import pandas as pd
import pytest

from ranksight.analyzer import analyze, load_run
from ranksight.analyzer.gpu_causes import GpuCauseConfig, gpu_cause
from ranksight.collectors.base import NodeContext, frame
from ranksight.collectors.nvml import NvmlCollector
from ranksight.collectors.nvml_replay import ReplayNvml
from ranksight.synthetic import SynthConfig, write_synthetic

RECORDING = os.path.join(
    os.path.dirname(os.path.dirname(__file__)), "data", "nvml", "h200x2.json.gz"
)
TRAINING = range(20, 48)
"""Snapshots of the recording taken while both GPUs trained (power-capped, 93-97% busy)."""
SLOW, ONSET = 5, 10
THERMAL = {
    "nvmlDeviceGetCurrentClocksEventReasons()": {"value": 0x40 | 0x20 | 0x4},
    "nvmlDeviceGetClockInfo(1)": {"value": 795},
    "nvmlDeviceGetTemperature(0)": {"value": 92},
}
"""GPU 0 in HW + SW thermal slowdown (nvml.h bits 0x40, 0x20) under the power cap (0x4),
SM clock at 795 MHz, 92 °C."""
POWER_BRAKE = {
    "nvmlDeviceGetCurrentClocksEventReasons()": {"value": 0x80 | 0x4},
    "nvmlDeviceGetClockInfo(1)": {"value": 795},
}
"""GPU 0 under an external power brake (nvml.h bit 0x80) and the power cap (0x4), SM clock
at 795 MHz, at its recorded temperature."""


@pytest.fixture(scope="module")
def recording() -> dict:
    with gzip.open(RECORDING, "rt") as f:
        return json.load(f)


def collector_rows(recording: dict, overrides: dict | None = None) -> list[dict]:
    """The collector's ``gpu_samples`` rows of GPU 0 over the training snapshots."""
    replay = ReplayNvml(recording, overrides={(0, k): v for k, v in (overrides or {}).items()})
    c = NvmlCollector(NodeContext(host="vm"), nvml=replay)
    c.open()
    rows = []
    try:
        for k, snap in enumerate(recording["rows"][: TRAINING.stop]):
            if k:
                replay.advance()
            got = c.collect(snap["now_ns"])["gpu_samples"]
            if k in TRAINING:
                rows.append(next(r for r in got if r["gpu_index"] == 0))
    finally:
        c.close()
    return rows


def gpu_tables(
    ranks: pd.DataFrame,
    t0: int,
    t1: int,
    normal: list[dict],
    odd: list[dict],
    odd_from: int,
    foreign_on: tuple[int, ...] = (),
    run_id: str = "",
    every_ns: int = 250_000_000,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """gpu_samples and gpu_procs rows for every rank's GPU from ``t0`` to ``t1``: the
    rank ``SLOW``'s GPU gives ``odd`` rows from ``odd_from`` on; a process of another job
    (pid 31337, 20 GiB) shares the GPUs of ``foreign_on`` from ``odd_from`` on."""
    samples, procs = [], []
    for i, ts in enumerate(range(t0, t1, every_ns)):
        for r in ranks.itertuples():
            src = odd if r.rank == SLOW and ts >= odd_from else normal
            where = {"host": r.host, "ts_ns": ts, "gpu_index": r.local_rank, "gpu_uuid": r.device}
            samples.append({**src[(i + r.rank) % len(src)], **where})
            mine = {"pid": r.pid, "used_mem_bytes": 30 << 30, "run_id": run_id, "rank": r.rank}
            procs.append({**where, **mine})
            if r.rank in foreign_on and ts >= odd_from:
                procs.append({**where, "pid": 31337, "used_mem_bytes": 20 << 30, "rank": -1})
    return frame("gpu_samples", samples), frame("gpu_procs", procs)


def slow_run(
    store, recording, throttle: bool, foreign_on: tuple[int, ...] = (), odd: dict | None = None
) -> str:
    """A DP2 x TP2 x PP2 run, rank SLOW 1.6x slow from step ONSET, with GPU rows; its GPU
    answers ``odd`` (default :data:`THERMAL`) where ``throttle``."""
    cfg = SynthConfig(
        dp=2, tp=2, pp=2, steps=24, seed=1, faults=(f"slow:rank={SLOW},factor=1.6,from_step={ONSET}",)
    )  # fmt: skip
    write_synthetic(store, cfg)
    data = load_run(store, cfg.run_id)
    t0, t1 = int(data.steps["start_ns"].min()), int(data.steps["end_ns"].max())
    onset = int(data.steps.loc[data.steps["step"] == ONSET, "start_ns"].min())
    normal = collector_rows(recording)
    slow = collector_rows(recording, odd or THERMAL) if throttle else normal
    samples, procs = gpu_tables(data.ranks, t0, t1, normal, slow, onset, foreign_on, cfg.run_id)
    store.insert("gpu_samples", samples)
    store.insert("gpu_procs", procs)
    return cfg.run_id


def the_straggler(store, run_id: str):
    found = [f for f in analyze(store, run_id, save=False).findings if f.kind == "straggler"]
    assert [f.culprit_rank for f in found] == [SLOW]
    return found[0]


def test_thermal_slowdown_is_gpu_thermal_with_the_nvml_reason(store, recording):
    f = the_straggler(store, slow_run(store, recording, throttle=True))
    assert f.cause == "gpu_thermal" and "heat" in f.summary
    ev = f.evidence["gpu_clocks"]
    assert ev["nvml_reason"]["name"] == "hw_thermal_slowdown"
    assert ev["nvml_reason"]["bit"] == "0x40"
    assert "sw_thermal_slowdown (0x20)" in ev["nvml_reason"]["all"]
    assert ev["sm_clock_mhz"] == 795.0 and 1450 < ev["peers_sm_clock_mhz"] < 1700
    assert ev["max_temperature_c"] == 92.0
    # every GPU in the recording runs at its power cap: that is no cause by itself
    assert ev["peers_slowdown_share"] == {"sw_power_cap": 1.0}
    assert ev["gpu"]["index"] == SLOW and "GPU" in f.summary


def test_a_power_brake_is_gpu_throttle_not_heat(store, recording):
    f = the_straggler(store, slow_run(store, recording, throttle=True, odd=POWER_BRAKE))
    assert f.cause == "gpu_throttle" and "heat" not in f.summary
    ev = f.evidence["gpu_clocks"]
    assert ev["nvml_reason"]["name"] == "hw_power_brake_slowdown"
    assert ev["nvml_reason"]["bit"] == "0x80"
    assert ev["max_temperature_c"] < 92.0  # the recording's own temperature


def test_another_process_on_its_gpu_is_gpu_contention(store, recording):
    f = the_straggler(store, slow_run(store, recording, throttle=False, foreign_on=(SLOW,)))
    assert f.cause == "gpu_contention"
    ev = f.evidence["gpu_processes"]
    other = ev["other_processes"][0]
    assert other["pid"] == 31337 and other["gpu_mem_mb"] == 20 * 1024
    assert other["present_share"] >= 0.5
    assert ev["peer_gpus_with_other_processes"] == "0 of 3"


def test_power_cap_everywhere_and_a_shared_node_stay_compute(chdb_url, recording):
    from ranksight.store import open_store

    with open_store(chdb_url) as store:
        store.init_schema()
        # the same other process on every GPU of its stage (0, 1, 4, 5): not this rank's problem
        f = the_straggler(store, slow_run(store, recording, False, foreign_on=(0, 1, 4, 5)))
    assert f.cause == "compute"
    assert f.evidence["gpu_clocks"]["slowdown_share"] == {"sw_power_cap": 1.0}
    assert "nvml_reason" not in f.evidence["gpu_clocks"]
    assert f.evidence["gpu_processes"]["peer_gpus_with_other_processes"] == "3 of 3"


def test_low_clock_without_a_reason_is_not_throttle():
    """A GPU simply running slower, with no slowdown reason reported, is left as compute."""
    samples = pd.DataFrame(
        {
            "gpu_uuid": ["GPU-a", "GPU-b", "GPU-c"],
            "gpu_host": "n0",
            "index_on_host": [0, 1, 2],
            "samples": 10,
            "sm_mhz": [900.0, 1600.0, 1590.0],
            "sm_known": 10,
            "sm_peak_mhz": 1980.0,
            "watts": 500.0,
            "limit_w": 700.0,
            "hottest_c": 60.0,
            "reasons_known": 10,
            **{f"n_{n}": 0 for n in ("hw_power_brake_slowdown", "hw_thermal_slowdown",
                                     "hw_slowdown", "sw_thermal_slowdown", "sw_power_cap")},
        }
    )  # fmt: skip
    from ranksight.analyzer.gpu_causes import GpuTables

    tables = GpuTables(
        samples, pd.DataFrame(), pd.DataFrame(), {0: "GPU-a", 1: "GPU-b", 2: "GPU-c"}
    )
    job = pd.DataFrame({"rank": [0, 1, 2], "host": "n0", "pid": [1, 2, 3]})
    cause, ev = gpu_cause(0, [1, 2], tables, job, "r", 0)
    assert cause is None and ev["gpu_clocks"]["sm_clock_mhz"] == 900.0
    hot = samples.assign(n_hw_slowdown=[8, 0, 0])
    tables = GpuTables(hot, pd.DataFrame(), pd.DataFrame(), tables.gpus)
    assert gpu_cause(0, [1, 2], tables, job, "r", 0)[0] == "gpu_throttle"
    assert gpu_cause(0, [1, 2], tables, job, "r", 0, GpuCauseConfig(min_share=0.9))[0] is None


def test_a_rank_without_a_gpu_uuid_is_found_through_its_process(store, recording):
    """Ranks that recorded no GPU UUID (device "cpu" or "cuda:N") are mapped to the GPU
    ``gpu_procs`` saw their process on (RANK_GPUS), on both stores."""
    from ranksight.analyzer.gpu_causes import fetch_gpu_tables

    run_id = slow_run(store, recording, throttle=True)
    data = load_run(store, run_id)
    uuids = dict(zip(data.ranks["rank"], data.ranks["device"], strict=True))
    blind = data.ranks.assign(device="cuda:0")
    t0, t1 = int(data.steps["start_ns"].min()), int(data.steps["end_ns"].max())
    tables = fetch_gpu_tables(
        store.query,  # errors surface here (load_run's loader reads old stores as empty)
        {"run_id": run_id, "attempt": 0},
        blind,
        [SLOW, 0, 1, 4],
        t0,
        t1,
    )
    assert tables.gpus == {r: uuids[r] for r in (SLOW, 0, 1, 4)}
    assert set(tables.samples["gpu_uuid"]) == {uuids[r] for r in (SLOW, 0, 1, 4)}
    job = data.ranks[["rank", "host", "pid"]]
    assert gpu_cause(SLOW, [0, 1, 4], tables, job, run_id, 0)[0] == "gpu_thermal"
