"""The GPU collector against NVML answers recorded on a 2x H200 machine (tests/data/nvml)."""

from __future__ import annotations

import csv
import gzip
import json
import os
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest

from ranksight.collectors.base import NodeContext, Unavailable, frame
from ranksight.collectors.nvml import NvmlCollector, NvmlConfig, pci_bus_id
from ranksight.collectors.nvml_events import XidCollector
from ranksight.collectors.nvml_read import clock_event_names
from ranksight.collectors.nvml_replay import ReplayNvml
from ranksight.collectors.topology import TopologyCollector

DATA = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "nvml")
RATES = ["pcie_tx_bytes_s", "pcie_rx_bytes_s", "nvlink_tx_bytes_s", "nvlink_rx_bytes_s"]
LOST = {"error": "NVMLError_GpuIsLost", "code": 15}
NOT_SUPPORTED = {"error": "NVMLError_NotSupported", "code": 3}


@pytest.fixture(scope="module")
def recording() -> dict:
    with gzip.open(os.path.join(DATA, "h200x2.json.gz"), "rt") as f:
        return json.load(f)


@pytest.fixture(scope="module")
def device_rows() -> dict:
    with gzip.open(os.path.join(DATA, "h200x2_rows.json.gz"), "rt") as f:
        return json.load(f)


def run_replay(
    recording: dict, collector: NvmlCollector, replay: ReplayNvml, n: int | None = None
) -> dict:
    """Collect once per recorded snapshot, at the recorded times; rows per table."""
    out: dict = {}
    for k, snap in enumerate(recording["rows"][:n]):
        if k:
            replay.advance()
        for table, rows in collector.collect(snap["now_ns"]).items():
            out.setdefault(table, []).extend(rows)
    return out


def test_replay_writes_the_rows_the_collector_wrote_on_the_gpu_machine(
    recording, device_rows
) -> None:
    replay = ReplayNvml(recording)
    c = NvmlCollector(NodeContext(host="vm"), nvml=replay)
    c.open()
    got = frame("gpu_samples", run_replay(recording, c, replay)["gpu_samples"])
    want = frame("gpu_samples", device_rows["gpu_samples"])
    first = got.ts_ns == got.ts_ns.min()
    assert got[RATES][first].isna().all().all(), "no rate before a second sample"
    got.loc[first, RATES] = want.loc[first, RATES]
    pd.testing.assert_frame_equal(got, want)
    # what the GPU machine went through: a power-capped training run and an idle GPU
    capped = want[want.clock_event_names == "sw_power_cap"]
    assert len(capped) >= 20
    assert capped.power_w.median() > 0.95 * capped.power_limit_w.iloc[0], "at the power cap"
    assert (capped.sm_clock_mhz < capped.sm_clock_max_mhz).all()
    assert (capped.nvlink_tx_bytes_s > 1e10).all(), "DDP all_reduce over NVLink, > 10 GB/s"
    assert (want[want.clock_event_names == "gpu_idle"].power_w < 150).all()
    assert set(want.unsupported) == {
        "nvlink_crc_errors,nvlink_recovery_errors,nvlink_replay_errors"
    }


def test_values_agree_with_nvidia_smi(device_rows) -> None:
    with open(os.path.join(DATA, "h200x2_nvidia_smi.csv")) as f:
        smi = [{k.strip(): v.strip() for k, v in r.items()} for r in csv.DictReader(f)]
    rows = frame("gpu_samples", device_rows["gpu_samples"])
    for r in smi:
        gpu = rows[rows.gpu_index == int(r["index"])].iloc[0]
        assert gpu.gpu_uuid == r["uuid"]
        assert gpu.pci_bus_id == pci_bus_id(r["pci.bus_id"])
        assert gpu.sm_clock_max_mhz == float(r["clocks.max.sm [MHz]"])
        assert gpu.power_limit_w == float(r["power.limit [W]"])
        assert gpu.mem_total_bytes == float(r["memory.total [MiB]"]) * 2**20
        assert (gpu.pcie_gen, gpu.pcie_width) == (
            float(r["pcie.link.gen.current"]),
            float(r["pcie.link.width.current"]),
        )
    matched = 0
    for r in smi:  # nvidia-smi's clock is the host's local wall clock; pair by order of power
        t = pd.Timestamp(r["timestamp"].replace("/", "-"), tz="UTC").value
        near = rows[(rows.gpu_index == int(r["index"])) & ((rows.ts_ns - t).abs() < 500_000_000)]
        if len(near) == 1 and near.clock_events.iloc[0] == int(
            r["clocks_event_reasons.active"], 16
        ):
            matched += 1
            assert abs(near.power_w.iloc[0] - float(r["power.draw [W]"])) < 60
    assert matched >= 20, f"only {matched} nvidia-smi rows matched a sample within 0.5 s"


def test_a_field_the_gpu_does_not_report_is_empty_named_and_not_asked_again(recording) -> None:
    key = "nvmlDeviceGetTotalEccErrors(0, 0)"
    replay = ReplayNvml(recording, overrides={(1, key): NOT_SUPPORTED})
    c = NvmlCollector(NodeContext(host="vm"), nvml=replay)
    c.open()
    rows = frame("gpu_samples", run_replay(recording, c, replay, n=3)["gpu_samples"])
    gpu0, gpu1 = rows[rows.gpu_index == 0], rows[rows.gpu_index == 1]
    assert (gpu0.ecc_corrected == 0).all() and gpu1.ecc_corrected.isna().all()
    assert all("ecc_corrected" in u.split(",") for u in gpu1.unsupported)
    assert not any("ecc_corrected" in u for u in gpu0.unsupported)
    assert (gpu1.ecc_uncorrected == 0).all(), "other fields of that GPU still read"
    assert replay.calls.count(key) == 3 + 1, "GPU 0 asked every sample, GPU 1 once"


def test_a_lost_gpu_is_reported_once_and_not_read_again(recording) -> None:
    replay = ReplayNvml(recording, overrides={(1, "nvmlDeviceGetClockInfo(1)"): LOST})
    c = NvmlCollector(NodeContext(host="vm"), nvml=replay)
    c.open()
    out = run_replay(recording, c, replay, n=4)
    assert [r["gpu_index"] for r in out["gpu_samples"]] == [0, 0, 0, 0]
    (event,) = out["gpu_events"]
    assert (event["kind"], event["gpu_index"], event["code"]) == ("gpu_lost", 1, 15)
    assert event["gpu_uuid"] == "GPU-1b0b5fd2-8a66-1ed5-c453-383807724add"


def test_a_gpu_lost_before_the_agent_started_costs_only_itself(recording) -> None:
    """GPU 1 is lost when the collector opens: GPU 0 is read, GPU 1 reported once."""
    replay = ReplayNvml(recording, overrides={(1, "nvmlDeviceGetMaxClockInfo(1)"): LOST})
    c = NvmlCollector(NodeContext(host="vm"), nvml=replay)
    c.open()
    out = run_replay(recording, c, replay, n=3)
    assert [r["gpu_index"] for r in out["gpu_samples"]] == [0, 0, 0]
    (event,) = out["gpu_events"]
    assert (event["kind"], event["gpu_index"], event["code"]) == ("gpu_lost", 1, 15)


def test_without_nvml_the_collector_is_unavailable() -> None:
    import pynvml

    try:
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        pytest.skip("NVML is installed here: the unavailable path needs a machine without it (CI)")
    except pynvml.NVMLError:
        pass
    for collector in (NvmlCollector(NodeContext()), XidCollector(NodeContext())):
        with pytest.raises(Unavailable, match="NVML is not available on this node"):
            collector.open()


def test_xid_events_become_rows(recording) -> None:
    replay = ReplayNvml(recording, events=[(1, 79)])
    xid = XidCollector(NodeContext(host="vm"), nvml=replay, wait_ms=50)
    xid.open()
    (row,) = xid.collect(time.time_ns())["gpu_events"]
    assert (row["kind"], row["code"], row["gpu_index"]) == ("xid", 79, 1)
    assert row["gpu_uuid"] == "GPU-1b0b5fd2-8a66-1ed5-c453-383807724add"
    t0 = time.monotonic()
    assert xid.collect(time.time_ns()) == {}, "a wait that times out gives no row"
    assert time.monotonic() - t0 >= 0.04
    xid.close()


def test_processes_name_the_local_rank_that_runs_them(recording, tmp_path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        spool = tmp_path / "spool" / "run-gpu" / "a2"
        spool.mkdir(parents=True)
        (spool / f"rank00005-{proc.pid}.jsonl").write_text('{"t":"_header"}\n')
        answer = {
            "value": [
                {"pid": proc.pid, "usedGpuMemory": 8 << 30},
                {"pid": 1, "usedGpuMemory": None},
            ]
        }
        replay = ReplayNvml(
            recording, overrides={(0, "nvmlDeviceGetComputeRunningProcesses()"): answer}
        )
        c = NvmlCollector(
            NodeContext(host="vm", spool_dir=str(tmp_path / "spool")),
            NvmlConfig(procs_every=1),
            nvml=replay,
        )
        c.open()
        rows = [r for r in c.collect(1)["gpu_procs"] if r["gpu_index"] == 0]
    finally:
        proc.kill()
        proc.wait()
    mine, other = rows
    assert (mine["pid"], mine["run_id"], mine["attempt"], mine["rank"]) == (
        proc.pid,
        "run-gpu",
        2,
        5,
    )
    assert mine["used_mem_bytes"] == 8 << 30
    assert (other["rank"], other["run_id"]) == (-1, "")
    assert np.isnan(frame("gpu_procs", [other]).used_mem_bytes[0]), "unknown memory is empty"


def test_topology_names_gpus_by_nvml_on_the_gpu_machines_pci_layout(recording) -> None:
    ctx = NodeContext(
        host="vm",
        sysfs_root=os.path.join(
            os.path.dirname(os.path.dirname(__file__)), "data", "sysfs", "vm_h200x2"
        ),
    )
    topo = TopologyCollector(ctx, nvml=ReplayNvml(recording))
    topo.open()
    rows = topo.collect(7)["gpu_nic"]
    got = [
        (
            r["gpu_index"],
            r["gpu_pci"],
            r["nic"],
            r["nic_pci"],
            r["relation"],
            r["hops"],
            r["nearest"],
        )
        for r in rows
    ]
    # as the collector wrote them on the GPU machine
    assert got == [
        (0, "0000:00:06.0", "eth0", "0000:00:03.0", "PHB", 2, 1),
        (1, "0000:00:07.0", "eth0", "0000:00:03.0", "PHB", 2, 1),
    ]
    assert rows[0]["gpu_uuid"] == "GPU-98f5b96d-b5d3-9169-dfcd-9d28452e8680"
    assert topo.collect(8) == {}, "rows only when the pairing changes"


def test_clock_event_names_and_bus_ids() -> None:
    assert clock_event_names(0x44) == "sw_power_cap,hw_thermal_slowdown"
    assert clock_event_names(0x1) == "gpu_idle"
    assert clock_event_names(0) == ""
    assert clock_event_names(0x80 | 0x10000) == "hw_power_brake_slowdown,bit0x10000"
    assert pci_bus_id("00000000:3B:00.0") == "0000:3b:00.0"
    assert pci_bus_id(b"00000000:00:06.0") == "0000:00:06.0"
