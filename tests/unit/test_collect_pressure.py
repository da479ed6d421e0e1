"""The pressure-stall (PSI) collector on /proc files copied from a real machine
(tests/data/proc) and on this machine's own /proc/pressure."""

from __future__ import annotations

import math
import os
import shutil

import pytest

from ranksight.agent.collect import CollectConfig, build
from ranksight.collectors.base import NodeContext, Unavailable, frame
from ranksight.collectors.pressure import PressureCollector, parse

PROC = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "proc", "vm-6.18")
CTX = NodeContext(host="node-a")


def test_the_copied_files_read_as_they_say():
    c = PressureCollector(CTX, proc_root=PROC)
    c.open()
    assert c.resources == ("cpu", "memory", "io")  # this kernel has no irq file
    rows = {r["resource"]: r for r in c.collect(123)["host_pressure"]}
    cpu, io, mem = rows["cpu"], rows["io"], rows["memory"]
    assert (cpu["some_avg10"], cpu["some_avg60"], cpu["some_avg300"]) == (3.77, 18.70, 17.76)
    assert cpu["some_total_us"] == 8603346938 and cpu["full_total_us"] == 0
    assert (io["full_avg10"], io["full_avg300"], io["full_total_us"]) == (0.08, 5.48, 221914541)
    assert mem["some_avg10"] == 0.0 and mem["some_total_us"] == 0
    assert {r["host"] for r in rows.values()} == {"node-a"} and cpu["ts_ns"] == 123
    stored = frame("host_pressure", rows.values())  # the rows fit the table's columns
    assert len(stored) == 3 and stored["some_total_us"].dtype.kind == "i"


def test_the_gpu_machines_files_read_as_they_say():
    """Copied from the lent H200 machine (tests/data/proc/README.md): I/O "full" pressure
    equal to "some" there, as when one task is the only one waiting."""
    gpu = os.path.join(os.path.dirname(PROC), "h200-gpu-6.18")
    c = PressureCollector(CTX, proc_root=gpu)
    c.open()
    rows = {r["resource"]: r for r in c.collect(1)["host_pressure"]}
    assert set(rows) == {"cpu", "memory", "io"}
    assert rows["io"]["some_avg10"] == rows["io"]["full_avg10"] == 5.56
    assert rows["cpu"]["some_total_us"] > 0 and rows["cpu"]["full_avg60"] == 0.0


def test_this_machines_pressure_files_read_or_the_collector_says_why():
    c = PressureCollector(CTX)
    if not os.path.isdir("/proc/pressure"):
        with pytest.raises(Unavailable, match="no readable pressure stall information"):
            c.open()
        return
    c.open()
    rows = c.collect(1)["host_pressure"]
    assert rows and {r["resource"] for r in rows} <= {"cpu", "memory", "io", "irq"}
    for r in rows:
        assert 0.0 <= r["some_avg10"] <= 100.0 or r["resource"] == "irq"
        assert r["full_total_us"] >= 0


def test_an_old_kernel_without_full_cpu_and_a_new_one_with_irq(tmp_path):
    """Linux 4.20-5.12 writes no ``full`` line for cpu; 6.1+ adds an ``irq`` file with a
    ``full`` line only (Documentation/accounting/psi.rst)."""
    folder = tmp_path / "pressure"
    folder.mkdir()
    (folder / "cpu").write_text("some avg10=1.50 avg60=0.75 avg300=0.25 total=123456\n")
    (folder / "irq").write_text("full avg10=0.02 avg60=0.01 avg300=0.00 total=4096\n")
    c = PressureCollector(CTX, proc_root=str(tmp_path))
    c.open()
    assert c.resources == ("cpu", "irq")
    rows = {r["resource"]: r for r in c.collect(5)["host_pressure"]}
    assert rows["cpu"]["some_avg10"] == 1.5 and math.isnan(rows["cpu"]["full_avg10"])
    assert rows["cpu"]["full_total_us"] == -1
    assert math.isnan(rows["irq"]["some_avg10"]) and rows["irq"]["full_total_us"] == 4096


def test_garbage_is_left_empty_and_a_file_that_goes_away_drops_out(tmp_path):
    got = parse("some avg10=nan avg60=250.0 avg300=x total=-5\nfull avg10=1.0\nnoise\n")
    assert math.isnan(got["some_avg10"]) and math.isnan(got["some_avg60"])
    assert math.isnan(got["some_avg300"]) and got["some_total_us"] == -1
    assert got["full_avg10"] == 1.0 and got["full_total_us"] == -1
    root = tmp_path / "proc"
    shutil.copytree(PROC, root)
    c = PressureCollector(CTX, proc_root=str(root))
    c.open()
    os.remove(root / "pressure" / "io")
    assert {r["resource"] for r in c.collect(1)["host_pressure"]} == {"cpu", "memory"}


def test_no_pressure_files_is_unavailable_with_the_reason(tmp_path):
    (tmp_path / "pressure").mkdir()
    (tmp_path / "pressure" / "cpu").mkdir()  # not a file: psi=0 kernels refuse the read too
    with pytest.raises(Unavailable, match="psi=0"):
        PressureCollector(CTX, proc_root=str(tmp_path)).open()
    with pytest.raises(ValueError, match="interval_s"):
        PressureCollector(CTX, interval_s=0)


def test_the_agent_runs_it_by_default_and_by_name():
    assert "pressure" in [c.name for c in build(CollectConfig())]
    got = build(CollectConfig(collectors=("pressure",)))
    assert [type(c) for c in got] == [PressureCollector]
