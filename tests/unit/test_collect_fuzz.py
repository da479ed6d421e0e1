"""Fuzzing the node collectors' parsers with hypothesis, seeded from real formats: the
sysfs tree of an HGX node (tests/data/sysfs/hgx), ``/proc/PID/task/*/schedstat``, the
hooks' spool and black-box files (written by the real ``trainer_hooks`` writers, then
mutated), a real ``py-spy dump --json`` (tests/data/pyspy) and the NVML recording of a
2x H200 machine (tests/data/nvml). Files get any content (truncated, binary, huge or
negative numbers, NaN text, non-UTF-8), or are replaced by a folder, a FIFO, a symlink
loop or nothing. Promise: a collector never raises out of its read, never blocks (a FIFO
is not waited on), emits only values that fit their columns, and never turns garbage
into a rate no device can reach. ``RANKSIGHT_FUZZ_EXAMPLES`` sets the examples per test
(default 40); a long local run: ``RANKSIGHT_FUZZ_EXAMPLES=3000``."""

from __future__ import annotations

import gzip
import json
import logging
import math
import os
import shutil
import struct
import tempfile
import threading

from hypothesis import given
from hypothesis import strategies as st

from ranksight.collectors.base import MISFITS, Collector, NodeContext, Unavailable, frame
from ranksight.collectors.counters import MAX_RATE_PER_S, CounterSet
from ranksight.collectors.host import HostCollector, run_delay_ns
from ranksight.collectors.local_ranks import LocalRanks, parse_spool_path, scan_spool
from ranksight.collectors.netdev import NetdevCollector
from ranksight.collectors.nvml import NvmlCollector, NvmlConfig
from ranksight.collectors.nvml_events import XidCollector
from ranksight.collectors.nvml_replay import ReplayNvml
from ranksight.collectors.postmortem import PostmortemCollector
from ranksight.collectors.pyspy import PySpyConfig, StackTaker, dump, parse_dump
from ranksight.collectors.rdma import RdmaCollector, RdmaConfig
from ranksight.collectors.topology import TopologyCollector
from ranksight.trainer_hooks import blackbox
from tests.helpers.fuzz_inputs import FUZZ, CheckingStore, mutated, nasty

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HGX = os.path.join(TESTS, "data", "sysfs", "hgx")
S = 1_000_000_000

# ------------------------------------------------------------------ shared checks


def within(fn, *args, timeout_s: float = 10.0):
    """``fn(*args)`` in a thread; fails if it has not returned in ``timeout_s`` (a read
    that waits on a FIFO) and raises what it raised."""
    out: dict = {}

    def run() -> None:
        try:
            out["value"] = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            out["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout_s)
    assert not t.is_alive(), f"{getattr(fn, '__qualname__', fn)} blocked for {timeout_s} s"
    if "error" in out:
        raise out["error"]
    return out["value"]


def fits(rows: dict) -> None:
    """Every row of every table fits its columns (tests/fuzz_inputs.CheckingStore)."""
    store = CheckingStore()
    for table, items in rows.items():
        store.insert(table, frame(table, items))


text_bytes = st.one_of(
    st.integers(0, (1 << 64) + 5).map(lambda n: f"{n}\n".encode()),
    st.sampled_from([b"", b"\n", b"-1\n", b"-0\n", b"18446744073709551616\n", b"nan\n",
                     b"inf\n", b"1e30\n", b"0x\n", b"0xfffffffffffffffffff\n", b"1_000\n",
                     " \u0661\u0662\u0663\n".encode(), "\u00b2\n".encode(), b"\xff\xfe\x00",
                     b"12\x00junk", b"9" * 5000, b"4: ACTIVE\n", b"\x80abc", b"+7\n"]),
    st.binary(max_size=40),
    st.text(max_size=12).map(lambda s: s.encode("utf-8", "surrogateescape")),
)  # fmt: skip
"""What a sysfs or procfs file may hold."""

damage = st.one_of(
    st.tuples(st.just("write"), text_bytes),
    st.sampled_from([("folder", b""), ("fifo", b""), ("missing", b""), ("loop", b""),
                     ("big", b"")]),
)  # fmt: skip


def spoil(path: str, how: str, data: bytes) -> None:
    """Make ``path`` hold ``data`` or become a folder, FIFO, symlink loop, nothing, or
    a 200 KiB file."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)
    if how == "folder":
        os.mkdir(path)
    elif how == "fifo":
        os.mkfifo(path)
    elif how == "loop":
        os.symlink(os.path.basename(path), path)
    elif how == "big":
        with open(path, "wb") as f:
            f.write(b"7" * (200 << 10))
    elif how in ("write", "real"):
        with open(path, "wb") as f:
            f.write(data)


# ------------------------------------------------------------------ sysfs: RDMA, netdev, topology


def _sysfs_files() -> list[str]:
    """The files the sysfs collectors read in the HGX tree, through the paths they use."""
    wanted = []
    for base, sub in (("class/infiniband", "ports/1"), ("class/net", "")):
        for dev in sorted(os.listdir(os.path.join(HGX, base))):
            top = os.path.join(base, dev, sub)
            for dirpath, _, files in os.walk(os.path.join(HGX, top)):
                rel = os.path.relpath(dirpath, HGX)
                wanted += [os.path.join(rel, f) for f in sorted(files)]
    for bdf in sorted(os.listdir(os.path.join(HGX, "bus/pci/devices"))):
        wanted += [f"bus/pci/devices/{bdf}/{f}" for f in ("vendor", "class", "numa_node")]
    return wanted


SYSFS_FILES = _sysfs_files()


class NoNvml:
    """An NVML module whose init fails as on a node without the driver."""

    def __getattr__(self, name):
        import pynvml

        return getattr(pynvml, name)

    def nvmlInit(self):
        import pynvml

        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)


def check_rates(rows: list[dict], dt_ns: int) -> None:
    """No rate or delta beyond what any device counts."""
    for r in rows:
        most = MAX_RATE_PER_S[r["unit"]]
        assert not r["rate_per_s"] > most, r
        assert r["delta"] <= most * max(dt_ns, 0) / 1e9, r


@FUZZ
@given(rounds=st.lists(st.lists(st.tuples(st.sampled_from(SYSFS_FILES), damage),
                                min_size=1, max_size=5), min_size=1, max_size=3))  # fmt: skip
def test_sysfs_collectors_on_a_damaged_tree(rounds) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = os.path.join(tmp, "sys")
        shutil.copytree(HGX, root, symlinks=True)
        ctx = NodeContext(host="n1", sysfs_root=root)
        collectors = [RdmaCollector(ctx, RdmaConfig(all_counters=True)), NetdevCollector(ctx),
                      TopologyCollector(ctx, nvml=NoNvml())]  # fmt: skip
        for c in collectors:
            c.open()
        now = S
        for c in collectors:
            fits(within(c.collect, now))
        for damages in rounds:
            for rel, (how, data) in damages:
                spoil(os.path.join(root, rel), how, data)
            now += S
            for c in collectors:
                rows = within(c.collect, now)
                fits(rows)
                check_rates(rows.get("nic_samples", []), S)


def test_a_garbage_counter_is_logged_once_and_not_read(tmp_path, caplog) -> None:
    root = str(tmp_path / "sys")
    shutil.copytree(HGX, root, symlinks=True)
    n = NetdevCollector(NodeContext(host="n1", sysfs_root=root))
    n.collect(S)
    stats = os.path.join(root, "class", "net", "eth0", "statistics")
    for name, data in (("rx_bytes", b"18446744073709551616\n"), ("tx_bytes", b"\xff\xfe"),
                       ("rx_errors", " \u0661\u0662\n".encode())):  # fmt: skip
        spoil(os.path.join(stats, name), "write", data)
    spoil(os.path.join(stats, "tx_packets"), "fifo", b"")
    with caplog.at_level(logging.WARNING, logger="ranksight.collectors"):
        for k in range(2, 5):
            rows = within(n.collect, k * S)["nic_samples"]
    got = {r["counter"] for r in rows if r["device"] == "eth0"}
    assert not got & {"rx_bytes", "tx_bytes", "rx_errors", "tx_packets"}, got
    assert "rx_packets" in got, "the good counters beside them are read"
    for name in ("rx_bytes", "tx_bytes", "rx_errors", "tx_packets"):
        said = [m for m in caplog.messages if m.startswith(os.path.join(stats, name) + ":")]
        assert len(said) == 1, (name, caplog.messages)


def test_odd_names_in_sysfs_are_no_crash_and_fit(tmp_path) -> None:
    """A port folder named by a non-ASCII digit or a number past UInt32, an interface
    whose name is no UTF-8."""
    root = str(tmp_path / "sys")
    shutil.copytree(HGX, root, symlinks=True)
    ports = os.path.join(root, "class", "infiniband", "mlx5_0", "ports")
    for odd in ("\u00b2", "4294967296", "\u0663"):
        shutil.copytree(os.path.join(ports, "1"), os.path.join(ports, odd))
    eth = os.path.join(root, "class", "net", "eth0")
    os.symlink(os.path.realpath(eth), os.path.join(root, "class", "net").encode() + b"/e\xff")
    ctx = NodeContext(host="n1", sysfs_root=root)
    r = RdmaCollector(ctx)
    r.open()
    assert [(p.device, p.port) for p in r.ports] == [("mlx5_0", 1), ("mlx5_1", 1)]
    n = NetdevCollector(ctx)
    rows = n.collect(S)
    fits(rows)
    assert {p["device"] for p in rows["nic_ports"]} == {"eth0", "ib0", "e\ufffd"}


class Garbling(Collector):
    """A collector whose parser let garbage through: every kind of misfit at once."""

    name = "garbling"

    def collect(self, now_ns: int) -> dict:
        row = {"host": "h\udcff", "ts_ns": now_ns, "kind": "rdma", "device": "mlx5_0",
               "port": 1 << 40, "counter": "c", "unit": "count", "value": 1 << 70,
               "delta": -3, "rate_per_s": "fast", "note": None}  # fmt: skip
        return {"nic_samples": [row, dict(row, value=5, port=1, delta=0, rate_per_s=2.0)]}


def test_what_a_collector_returns_is_made_to_fit_and_told_once(caplog) -> None:
    c = Garbling()
    with caplog.at_level(logging.WARNING, logger="ranksight.collectors"):
        rows = [c.collect(k) for k in range(3)]
    for r in rows:
        fits(r)
    bad, good = rows[-1]["nic_samples"]
    assert (bad["value"], bad["delta"], bad["port"], bad["host"]) == (
        (1 << 64) - 1,
        0,
        (1 << 32) - 1,
        "h\ufffd",
    )
    assert math.isnan(bad["rate_per_s"]) and (good["value"], good["rate_per_s"]) == (5, 2.0)
    told = [m for m in caplog.messages if m.startswith("garbling nic_samples.")]
    assert sorted(m.split(":")[0] for m in told) == [
        f"garbling nic_samples.{c}" for c in ("delta", "host", "port", "rate_per_s", "value")
    ]
    assert MISFITS.counts["garbling nic_samples.value"] == 3


# ------------------------------------------------------------------ counters


@FUZZ
@given(values=st.lists(st.one_of(st.integers(0, (1 << 64) - 1),
                                 st.sampled_from([0, 1, (1 << 32) - 1, 1 << 32, (1 << 63),
                                                  (1 << 64) - 1, 10**12])), min_size=2,
                       max_size=8),
       unit=st.sampled_from(["bytes", "count"]))  # fmt: skip
def test_counter_garbage_never_becomes_a_huge_rate(values, unit) -> None:
    cs, most = CounterSet(), MAX_RATE_PER_S[unit]
    for k, v in enumerate(values):
        ch = cs.update(("c",), v, k * S, max_rate_per_s=most)
        assert not ch.rate_per_s > most and ch.delta <= most, (k, v, ch)


def test_a_spike_costs_one_sample_and_is_named() -> None:
    cs, base = CounterSet(), 10**12
    seen = [cs.update(("c",), v, k * S) for k, v in enumerate([base, 1 << 63, base + 5, base + 9])]
    assert [(c.delta, c.note) for c in seen[1:]] == [(0, "jump"), (0, ""), (4, "")]
    assert math.isnan(seen[1].rate_per_s) and math.isnan(seen[2].rate_per_s)


# ------------------------------------------------------------------ /proc: schedstat


@FUZZ
@given(files=st.lists(st.one_of(st.tuples(st.integers(0, 1 << 63), st.integers(0, 1 << 63))
                                .map(lambda t: ("real", f"{t[0]} {t[1]} 12\n".encode())),
                                damage), min_size=1, max_size=4))  # fmt: skip
def test_run_delay_on_damaged_schedstat(files) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        task = os.path.join(tmp, "4242", "task")
        want, good = 0, True
        for tid, (how, data) in enumerate(files, start=4242):
            os.makedirs(os.path.join(task, str(tid)))
            spoil(os.path.join(task, str(tid), "schedstat"), how, data)
            if how == "real":
                want += int(data.split()[1])
            else:
                good = False
        got = within(run_delay_ns, 4242, tmp)
        assert isinstance(got, float) and (math.isnan(got) or 0 <= got)
        if good:
            assert got == float(want)


# ------------------------------------------------------------------ spool file names

NUMBERS = st.sampled_from(["00003", "0", "\u0661\u0662", "\u00b2", "99999999999",
                           "4294967296", "2147483648", "-1", "", "1e3", "007"])  # fmt: skip


@FUZZ
@given(rank=NUMBERS, attempt=NUMBERS, tail=st.sampled_from(["-0.spool", ".jsonl", "-x.spool",
                                                             "-99999999999999.spool", ""]),
       run=st.sampled_from([b"run", b"r\xff", b"x" * 200, b"a b", b"\xed\xa0\x80"]))  # fmt: skip
def test_spool_names_give_ranks_that_fit_or_none(rank, attempt, tail, run) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        spool = os.path.join(tmp, "spool")
        folder = os.path.join(spool.encode(), run, f"a{attempt}".encode())
        os.makedirs(folder)
        name = f"rank{rank}-{os.getpid()}{tail}".encode()
        open(os.path.join(folder, name), "w").close()
        os.mkfifo(os.path.join(folder, f"rank00001-{os.getpid()}-0.spool".encode()))
        found = within(scan_spool, spool)
        for lr in found:
            assert lr == parse_spool_path(lr.spool_path)
            assert 0 <= lr.rank < 1 << 31 and 0 <= lr.attempt < 1 << 32 and 0 < lr.pid < 1 << 32
            lr.run_id.encode("utf-8")
        host = HostCollector(NodeContext(host="n1", spool_dir=spool),
                             local_ranks=LocalRanks(spool, refresh_s=0))  # fmt: skip
        host.open()
        rows = within(host.collect, S)
        fits(rows)
        assert len(rows["proc_samples"]) == len(found)


# ------------------------------------------------------------------ black boxes and crash files


def _dead_pid() -> int:
    """A pid no process can have (one past the kernel's ``pid_max``): the rank is gone."""
    with open("/proc/sys/kernel/pid_max") as f:
        return int(f.read()) + 1


DEAD = _dead_pid()


def _real_blackbox() -> bytes:
    """A black box the hooks' writer wrote: three ops issued, one completed, step 7."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "b.bin")
        box = blackbox.BlackBox(path)
        box.set_step(7, 1_700_000_000 * S)
        recs = [{"group_id": "g0", "op": op, "dtype": "float32", "phase": "backward",
                 "group_ranks": "0,1", "group_seq": k, "enqueue_ns": 1_700_000_001 * S + k,
                 "numel_in": 4096, "numel_out": 4096, "bytes": 16384, "step": 7, "peer": -1,
                 "end_ns": 1_700_000_002 * S}
                for k, op in enumerate(("all_reduce", "all_gather", "reduce_scatter"))]  # fmt: skip
        for r in recs:
            box.issued(r)
        box.completed(recs[0])
        with open(path, "rb") as f:
            return f.read()


BOX = _real_blackbox()
HEADER_FIELDS = {"slots": 8, "written": 16, "flushed": 24, "step": 32, "last_ns": 40}
SLOT_FIELDS = {"serial": 0, "group_seq": 8, "enqueue_ns": 16, "end_ns": 24, "numel_in": 32,
               "numel_out": 40, "bytes": 48}  # fmt: skip
int64 = st.one_of(st.integers(-(1 << 63), (1 << 63) - 1),
                  st.sampled_from([-1, 0, 1 << 31, (1 << 63) - 1, -(1 << 63), 1 << 32]))  # fmt: skip


@st.composite
def damaged_box(draw) -> bytes:
    """The real black box with header fields, slot fields or bytes overwritten, then
    perhaps cut short or grown."""
    data = bytearray(BOX)
    for _ in range(draw(st.integers(0, 4))):
        how = draw(st.sampled_from(["header", "slot", "bytes"]))
        if how == "header":
            off = HEADER_FIELDS[draw(st.sampled_from(sorted(HEADER_FIELDS)))]
            struct.pack_into("<q", data, off, draw(int64))
        elif how == "slot":
            slot = blackbox.HEADER.size + draw(st.integers(0, 3)) * blackbox.SLOT.size
            field = draw(st.sampled_from(sorted(SLOT_FIELDS) + ["step", "peer", "text"]))
            if field in SLOT_FIELDS:
                struct.pack_into("<q", data, slot + SLOT_FIELDS[field], draw(int64))
            elif field == "text":
                data[slot + 64 : slot + 80] = draw(st.binary(min_size=16, max_size=16))
            else:
                value = draw(st.integers(-(1 << 31), (1 << 31) - 1))
                struct.pack_into("<i", data, slot + (56 if field == "step" else 60), value)
        else:
            at = draw(st.integers(0, len(data) - 1))
            chunk = draw(st.binary(min_size=1, max_size=16))
            data[at : at + len(chunk)] = chunk
    end = draw(st.sampled_from(["keep", "keep", "cut", "grow"]))
    if end == "cut":
        del data[draw(st.integers(0, len(data))) :]
    elif end == "grow":
        data += draw(st.binary(max_size=64))
    return bytes(data)


@FUZZ
@given(box=damaged_box(), crash=st.one_of(st.binary(max_size=300), st.just(b"\xff" * 10)),
       kinds=st.tuples(*[st.sampled_from(["file", "file", "fifo", "folder", "big"])] * 2))  # fmt: skip
def test_postmortem_on_damaged_black_boxes_and_crash_files(box, crash, kinds) -> None:
    with tempfile.TemporaryDirectory() as spool:
        folder = os.path.join(spool, "run", "a0")
        os.makedirs(folder)
        with open(os.path.join(folder, f"blackbox-rank00000-{DEAD}.bin"), "wb") as f:
            f.write(BOX)  # a good one beside them: all its rows must come
        for name, data, kind in ((f"blackbox-rank00001-{DEAD}.bin", box, kinds[0]),
                                 (f"crash-rank00001-{DEAD}.txt", crash, kinds[1])):  # fmt: skip
            spoil(os.path.join(folder, name), "write" if kind == "file" else kind, data)
        c = PostmortemCollector(NodeContext(host="h", spool_dir=spool))
        rows = within(c.collect, S)
        fits(rows)
        good = [r for r in rows["collectives"] if r["rank"] == 0]
        assert [r["op"] for r in good] == ["all_gather", "reduce_scatter"]
        assert [r["last_step"] for r in rows["rank_ends"] if r["rank"] == 0] == [7]
        left = [n for n in os.listdir(folder) if not n.endswith(".shipped")]
        assert left == [], f"each file is handled once: {left}"
        assert within(c.collect, 2 * S) == {"collectives": [], "stacks": [], "rank_ends": []}


# ------------------------------------------------------------------ py-spy output

PYSPY = os.path.join(TESTS, "data", "pyspy", "two_threads_py311.json")
with open(PYSPY, "rb") as _f:
    PYSPY_BYTES = _f.read()
PYSPY_DOC = json.loads(PYSPY_BYTES)


@st.composite
def pyspy_output(draw) -> bytes:
    how = draw(st.sampled_from(["doc", "doc", "bytes", "cut", "deep", "other"]))
    if how == "doc":
        return json.dumps(draw(mutated(PYSPY_DOC)), default=str).encode("utf-8", "surrogatepass")
    if how == "bytes":
        at = draw(st.integers(0, len(PYSPY_BYTES)))
        return PYSPY_BYTES[:at] + draw(st.binary(min_size=1, max_size=8)) + PYSPY_BYTES[at:]
    if how == "cut":
        return PYSPY_BYTES[: draw(st.integers(0, len(PYSPY_BYTES)))]
    if how == "deep":
        return b"[" * draw(st.integers(1, 200_000))
    return json.dumps(draw(nasty), default=str).encode()


@FUZZ
@given(out=pyspy_output(), err=st.binary(max_size=40), rc=st.sampled_from([0, 0, 1, -9]))
def test_pyspy_output_of_any_shape_gives_a_row_that_fits(out, err, rc) -> None:
    d = parse_dump(4242, rc, out, err, 12.5, False)
    taker = StackTaker("n1", PySpyConfig(command=("py-spy",)))
    row = taker.row(_rank(), d, "manual", S)
    fits({"stacks": [row]})
    if d.ok:
        assert row["threads"] == len(d.threads) and all(isinstance(t, dict) for t in d.threads)


def test_pyspy_that_prints_no_utf8_is_a_failed_dump_not_a_crash(tmp_path) -> None:
    """A real process (a stand-in for py-spy) printing bytes that are no UTF-8."""
    out = tmp_path / "out"
    out.write_bytes(PYSPY_BYTES.replace(b"MainThread", b"Main\xff\xfeThread"))
    d = dump(4242, ("sh", "-c", 'cat "$0"', str(out)), PySpyConfig(timeout_s=10))
    assert d.ok and [t["thread_name"] for t in d.threads] == [
        "pin_memory",
        "Main\ufffd\ufffdThread",
    ]
    (tmp_path / "deep").write_bytes(b"[" * 100_000)
    d = dump(4242, ("sh", "-c", 'cat "$0"', str(tmp_path / "deep")), PySpyConfig(timeout_s=10))
    assert not d.ok and "py-spy printed no JSON" in d.error


def _rank():
    from ranksight.collectors.local_ranks import LocalRank

    return LocalRank("run", 0, 3, 4242, "")


# ------------------------------------------------------------------ NVML recordings

with gzip.open(os.path.join(TESTS, "data", "nvml", "h200x2.json.gz"), "rt") as _f:
    NVML = json.load(_f)
NVML["snapshots"] = NVML["snapshots"][:3]
NVML.pop("rows")


@st.composite
def nvml_damage(draw) -> tuple:
    """(snapshot, gpu, key, field or None, new answer)."""
    snap = draw(st.integers(0, 2))
    gpu = draw(st.integers(0, 1))
    keys = sorted(NVML["snapshots"][snap]["devices"][gpu])
    key = draw(st.sampled_from(keys))
    field = None
    if key == "fields":
        field = draw(st.sampled_from(sorted(NVML["snapshots"][snap]["devices"][gpu]["fields"])))
        answer = {"ret": draw(st.sampled_from([0, 0, 3, 15, 999])),
                  "type": draw(st.sampled_from([0, 1, 3, 4, 5, 99])), "value": draw(nasty)}  # fmt: skip
    else:
        answer = draw(st.one_of(
            st.builds(lambda v: {"value": v}, nasty),
            st.builds(lambda c: {"error": "NVMLError_Fuzz", "code": c},
                      st.sampled_from([1, 2, 3, 15, 999, 0])),
            st.builds(lambda v: {"value": {"used": v, "total": v, "gpu": v, "memory": v,
                                           "busId": v, "pid": v, "usedGpuMemory": v}}, nasty),
        ))  # fmt: skip
    return snap, gpu, key, field, answer


@FUZZ
@given(damages=st.lists(nvml_damage(), min_size=1, max_size=6), wait=nasty)
def test_nvml_collectors_on_a_damaged_recording(damages, wait) -> None:
    rec = json.loads(json.dumps(NVML))
    for snap, gpu, key, field, answer in damages:
        device = rec["snapshots"][snap]["devices"][gpu]
        if field is None:
            device[key] = answer
        else:
            device["fields"][field] = answer
    rec["system"]["nvmlEventSetWait_v2(*, 100)"] = {"value": {"device": wait, "eventType": wait,
                                                              "eventData": wait}}  # fmt: skip
    replay = ReplayNvml(rec)
    config = NvmlConfig(procs_every=1, pcie_throughput_fallback=False)  # not recorded
    c = NvmlCollector(NodeContext(host="vm"), config, nvml=replay)
    c.open()
    for k in range(3):
        if k:
            replay.advance()
        fits(c.collect((k + 1) * S))
    x = XidCollector(NodeContext(host="vm"), nvml=ReplayNvml(rec), wait_ms=1)
    try:
        x.open()
    except Unavailable:
        return
    fits(x.collect(S))


@FUZZ
@given(doc=mutated({"system": NVML["system"], "snapshots": NVML["snapshots"][:1]}))
def test_a_damaged_nvml_recording_is_refused_naming_it_or_replayed(doc) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "rec.json")
        with open(path, "w") as f:
            json.dump(doc, f, default=str)
        try:
            replay = ReplayNvml.load(path)
        except ValueError as exc:
            assert path in str(exc), exc
            return
        c = NvmlCollector(NodeContext(host="vm"), nvml=replay)
        try:
            c.open()
            fits(c.collect(S))
        except Unavailable as exc:  # what open may say: no GPU count, here
            assert "for the number of GPUs" in str(exc), exc
        except KeyError as exc:  # the replay's word for a call it holds no answer to
            assert "the NVML recording holds no" in str(exc), exc
