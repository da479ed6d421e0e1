"""Device-timing precision and NCCL completeness of the hooks, on a GPU machine.

Worker (under torchrun, NCCL, one GPU per rank): a bf16 MLP trained with DDP-style
gradient all_reduces (synchronous and async), a functional all_reduce, an all_gather and
a barrier each step; from step 3 rank 1 arrives late on the device (``torch.cuda._sleep``
before its collectives), so arrival skew is real. The hooks run at the default level
(CUDA events on); steps ``--profile-from`` .. ``+5`` run under the PyTorch profiler
(Kineto/CUPTI). At the end each rank writes its profiler trace, a Flight Recorder dump
(``_dump_nccl_trace``) and the hooks' per-group collective counts to ``--out``.

    torchrun --nproc-per-node 2 bench/gpu_precision.py worker --out OUT --spool SPOOL

Compare (here, after fetching OUT): per collective the hooks' device start and duration
against the NCCL kernel's in the profiler trace, matched in order per rank; and the hooks'
count per process group against the Flight Recorder's.

    python bench/gpu_precision.py compare --out OUT --spool SPOOL

Overhead in one process (hooks off / default with the Python wrappers / without CUDA
events / default reading the Flight Recorder ring, in alternating blocks, same model), with
``TORCH_NCCL_ENABLE_TIMING=1`` set before the process group is made:

    torchrun --nproc-per-node 2 bench/gpu_precision.py ab --out OUT --spool SPOOL

The Flight Recorder path's records against the wrappers' on one job (same collectives):

    torchrun --nproc-per-node 1 bench/gpu_precision.py match --out OUT --spool SPOOL
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import pickle
import statistics
import sys
import time

NCCL_OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "barrier", "all_to_all")


def worker(a: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    from torch.profiler import ProfilerActivity, profile

    from ranksight import trainer_hooks

    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dev = torch.device("cuda")
    hooks = trainer_hooks.attach(
        mesh={"dp": rank, "tp": 0, "pp": 0},
        mesh_shape={"dp": world, "tp": 1, "pp": 1},
        spool_dir=a.spool,
        run_id="gpu-precision",
    )
    torch.manual_seed(0)
    layers = [torch.nn.Linear(4096, 4096, device=dev, dtype=torch.bfloat16) for _ in range(8)]
    model = torch.nn.Sequential(*layers)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = torch.randn(64, 4096, device=dev, dtype=torch.bfloat16)
    prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
    for step in range(a.steps):
        if step == a.profile_from:
            prof.__enter__()
        with hooks.step(step):
            with hooks.phase("forward"):
                loss = model(x).float().pow(2).mean()
            with hooks.phase("backward"):
                loss.backward()
            with hooks.phase("optimizer"):
                if step >= 3 and rank == 1:
                    torch.cuda._sleep(2_000_000)  # ~1 ms late on the device
                grads = [p.grad for p in model.parameters()]
                for g in grads[:4]:
                    dist.all_reduce(g)  # synchronous
                works = [dist.all_reduce(g, async_op=True) for g in grads[4:]]
                for w in works:
                    w.wait()
                y = funcol.all_reduce(grads[0][:1024], "sum", dist.group.WORLD)
                y.wait()
                out = [torch.empty(1024, device=dev, dtype=torch.bfloat16) for _ in range(world)]
                dist.all_gather(out, grads[0][0, :1024].contiguous())
                opt.step()
                opt.zero_grad()
            dist.barrier()
        if step == a.profile_from + 5:
            torch.cuda.synchronize()
            prof.__exit__(None, None, None)
            prof.export_chrome_trace(os.path.join(a.out, f"trace-rank{rank}.json"))
    torch.cuda.synchronize()
    counts = dict(hooks._log._seq)
    device = hooks._device
    stats = {
        "hooks_per_group": {f"{k[0]}|{k[1]}|{k[2]}": v for k, v in counts.items()},
        "group_ranks": {gid: e[0] for (gid, _, _), e in hooks._log.progress.items()},
        "resolved": device.resolved if device else None,
        "anchor_uncertainty_ns": device.clock.uncertainty_ns if device else None,
    }
    hooks.close()
    stats["resolved_at_close"] = device.resolved if device else None
    stats["unresolved"] = device.unresolved if device else None
    try:
        dump = torch._C._distributed_c10d._dump_nccl_trace()
        with open(os.path.join(a.out, f"fr-rank{rank}.pkl"), "wb") as f:
            f.write(dump)
    except Exception as e:  # noqa: BLE001
        stats["fr_error"] = f"{type(e).__name__}: {e}"
    with open(os.path.join(a.out, f"counts-rank{rank}.json"), "w") as f:
        json.dump(stats, f)
    dist.destroy_process_group()


def ab(a: argparse.Namespace) -> None:
    """Hook overhead in one process: blocks of steps with the hooks off and at the default
    level, alternating (launch-to-launch noise on a shared host is larger than the cost),
    plus the host cost per collective (synchronous small all_reduces)."""
    import contextlib

    import torch
    import torch.distributed as dist

    from ranksight import trainer_hooks

    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dev = torch.device("cuda")
    torch.manual_seed(0)
    width = a.width
    model = torch.nn.Sequential(
        *[torch.nn.Linear(width, width, device=dev, dtype=torch.bfloat16) for _ in range(8)]
    )
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=1e-6)
    x = torch.randn(a.batch, width, device=dev, dtype=torch.bfloat16)

    def step() -> None:
        model(x).float().pow(2).mean().backward()
        for w in [dist.all_reduce(p.grad, async_op=True) for p in params]:
            w.wait()
        opt.step()
        opt.zero_grad(set_to_none=False)

    def attach(level: str):
        return trainer_hooks.attach(
            mesh={"dp": rank, "tp": 0, "pp": 0},
            mesh_shape={"dp": world, "tp": 1, "pp": 1},
            spool_dir=a.spool,
            run_id=f"ab-{time.time_ns()}",
            device_timing=level != "no_cuda_events",
            fr_ring=level == "fr_ring",
        )

    levels = ("off", "default", "no_cuda_events", "fr_ring")
    issue: dict[str, list[float]] = {k: [] for k in levels}
    ring_reads: list[tuple[int, int]] = []
    times: dict[str, list[float]] = {k: [] for k in levels}
    per_op: dict[str, list[float]] = {k: [] for k in levels}
    small = torch.ones(1024, device=dev)
    for block in range(a.blocks):
        k = block % len(levels)
        for level in levels[k:] + levels[:k]:
            hooks = attach(level) if level != "off" else None
            if level == "fr_ring":
                assert hooks._ring is not None, "the Flight Recorder path was not chosen"
            elif hooks is not None:
                assert hooks._ring is None
            for i in range(a.block_steps):
                ctx = hooks.step(i) if hooks is not None else contextlib.nullcontext()
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                with ctx:
                    step()
                torch.cuda.synchronize()
                if i > 0:  # the first step of a block warms up
                    times[level].append(time.perf_counter() - t0)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(200):
                dist.all_reduce(small)
            torch.cuda.synchronize()
            per_op[level].append((time.perf_counter() - t0) / 200)
            t0 = time.perf_counter()  # host cost alone: enqueue, no wait for the device
            works = [dist.all_reduce(small, async_op=True) for _ in range(200)]
            issue[level].append((time.perf_counter() - t0) / 200)
            for w in works:
                w.wait()
            torch.cuda.synchronize()
            if hooks is not None:
                ring = hooks._ring
                hooks.close()
                if ring is not None:
                    ring_reads.append((ring.reads, ring.read_ns))
                    assert ring.lost == 0 and ring.lost_open == 0, ring.stats
    if rank == 0:
        med = {k: statistics.median(v) for k, v in times.items()}
        op = {k: statistics.median(v) for k, v in per_op.items()}
        doc = {
            "step_ms": {k: round(v * 1e3, 3) for k, v in med.items()},
            "ratio": {k: round(med[k] / med["off"], 4) for k in levels},
            "steps": {k: len(v) for k, v in times.items()},
            "per_collective_us": {k: round(v * 1e6, 1) for k, v in op.items()},
            "issue_us": {k: round(statistics.median(v) * 1e6, 2) for k, v in issue.items()},
            "ring_read_ms": round(
                sum(n for _, n in ring_reads) / 1e6 / max(1, sum(r for r, _ in ring_reads)), 3
            ),  # fmt: skip
            "ring_reads": sum(r for r, _ in ring_reads),
            "collectives_per_step": len(params),
            "params": sum(p.numel() for p in params),
        }
        print(json.dumps(doc), flush=True)
        with open(os.path.join(a.out, "ab.json"), "w") as f:
            json.dump(doc, f)
    dist.destroy_process_group()


def match(a: argparse.Namespace) -> None:
    """One NCCL job, wrappers on, and a Flight Recorder reader beside them on the same
    collectives: per (group, group_seq) the two records' op, sizes, dtype and device
    duration side by side, and how far apart their device starts are."""
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    from ranksight import trainer_hooks
    from ranksight.trainer_hooks.collective_log import BlockedClock, CollectiveLog
    from ranksight.trainer_hooks.fr_ring import FrRing

    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dev = torch.device("cuda")
    hooks = trainer_hooks.attach(spool_dir=a.spool, run_id="fr-match", fr_ring=False)
    wrapped: list[dict] = []
    put = hooks._put
    hooks._put = lambda r: (wrapped.append(r) if r.get("t") == "collectives" else None, put(r))[1]
    hooks._log.emit = hooks._put
    if hooks._device is not None:
        hooks._device.emit = hooks._put
    got: list[dict] = []
    reader = FrRing(CollectiveLog(got.append, hooks._context, BlockedClock()), got.append,
                    context=hooks._context)  # fmt: skip
    hooks._ring = reader  # its timeline is fed; the wrappers still record (no native)
    grads = [torch.randn(1 << s, device=dev, dtype=torch.bfloat16) for s in range(10, 24, 2)]
    out = [torch.empty(1 << 14, device=dev) for _ in range(dist.get_world_size())]
    sub = dist.new_group([0])
    for step in range(a.steps):
        with hooks.step(step), hooks.phase("backward"):
            for g in grads[:3]:
                dist.all_reduce(g)
            for w in [dist.all_reduce(g, async_op=True) for g in grads[3:]]:
                w.wait()
            funcol.all_reduce(grads[0], "sum", dist.group.WORLD).wait()
            dist.all_gather(out, torch.ones(1 << 14, device=dev))
            dist.broadcast(grads[1], 0, group=sub)
            dist.reduce_scatter_tensor(torch.empty(1 << 12, device=dev),
                                       torch.ones(1 << 12, device=dev))  # fmt: skip
        reader.read()
    torch.cuda.synchronize()
    time.sleep(1.0)  # the watchdog marks the last ones completed
    hooks.close()
    key = ("group_id", "group_seq")
    fr = {tuple(r[k] for k in key): r for r in got}
    wr = {tuple(r[k] for k in key): r for r in wrapped}
    same = [k for k in wr if k in fr]
    fields = ("op", "dtype", "numel_in", "numel_out", "bytes", "step", "phase")
    differ = {f: sum(fr[k][f] != wr[k][f] for k in same) for f in fields}
    dur = [((fr[k]["end_ns"] - fr[k]["start_ns"]) - (wr[k]["end_ns"] - wr[k]["start_ns"])) / 1e3
           for k in same if fr[k]["end_ns"] and wr[k]["end_ns"]]  # fmt: skip
    start = [(fr[k]["start_ns"] - wr[k]["start_ns"]) / 1e3 for k in same
             if fr[k]["end_ns"] and wr[k]["end_ns"]]  # fmt: skip
    doc = {
        "wrapper_records": len(wrapped), "fr_records": len(got), "matched": len(same),
        "only_wrapper": sorted({wr[k]["op"] for k in wr if k not in fr}),
        "only_fr": sorted({fr[k]["op"] for k in fr if k not in wr}),
        "fields_differing": differ, "fr_stats": reader.stats,
        "fr_ended": sum(1 for r in got if r["end_ns"]),
        "duration_fr_minus_wrapper_us": {
            "median": round(statistics.median(dur), 1) if dur else None,
            "p99_abs": round(_pct([abs(x) for x in dur], 0.99), 1) if dur else None},
        "start_fr_minus_wrapper_us": {
            "median": round(statistics.median(start), 1) if start else None,
            "p99_abs": round(_pct([abs(x) for x in start], 0.99), 1) if start else None},
        "ops": sorted({r["op"] for r in got}),
    }  # fmt: skip
    print(json.dumps(doc), flush=True)
    with open(os.path.join(a.out, "match.json"), "w") as f:
        json.dump(doc, f)
    dist.destroy_process_group()


def _kernels(path: str) -> tuple[list[dict], int]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        doc = json.load(f)
    base = int(doc.get("baseTimeNanoseconds", 0))
    ks = [
        e
        for e in doc["traceEvents"]
        if e.get("cat") == "kernel" and "nccl" in e.get("name", "").lower()
    ]
    ks.sort(key=lambda e: e["ts"])
    return ks, base


def _pct(v: list[float], q: float) -> float:
    v = sorted(v)
    return v[min(len(v) - 1, int(round(q * (len(v) - 1))))]


def compare(a: argparse.Namespace) -> None:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from ranksight.agent import SpoolTailer

    frames = SpoolTailer(a.spool).read().frames()
    coll = frames["collectives"]
    print(f"records: {len(coll)} collectives")
    errs_start, errs_dur, raw_start = [], [], []
    for rank in sorted(coll["rank"].unique()):
        path = os.path.join(a.out, f"trace-rank{rank}.json")
        if not os.path.exists(path):
            continue
        ks, base = _kernels(path)
        if not ks:
            continue
        k0 = base + int(ks[0]["ts"] * 1000)
        k1 = base + int((ks[-1]["ts"] + ks[-1]["dur"]) * 1000)
        mine = coll[(coll["rank"] == rank) & coll["op"].isin(NCCL_OPS) & (coll["end_ns"] > 0)]
        mine = mine.sort_values("start_ns")
        # the records whose device start falls in the profiled window (+-2 ms)
        win = mine[(mine["start_ns"] >= k0 - 2_000_000) & (mine["start_ns"] <= k1 + 2_000_000)]
        n = min(len(win), len(ks))
        print(f"rank {rank}: {len(ks)} NCCL kernels in the window, {len(win)} records")
        for (_, r), k in zip(win.head(n).iterrows(), ks[:n], strict=True):
            ks_ns = base + int(k["ts"] * 1000)
            kd_ns = int(k["dur"] * 1000)
            raw_start.append((r["start_ns"] - ks_ns) / 1e3)
            errs_dur.append(((r["end_ns"] - r["start_ns"]) - kd_ns) / 1e3)
    if raw_start:
        off = statistics.median(raw_start)
        errs_start = [abs(x - off) for x in raw_start]
        print(
            f"start (hooks - kernel), us: median {statistics.median(raw_start):.1f}, "
            f"|error| after removing the median offset: median {statistics.median(errs_start):.1f}, "
            f"p99 {_pct(errs_start, 0.99):.1f} (n={len(raw_start)})"
        )
        absd = [abs(x) for x in errs_dur]
        print(
            f"duration (hooks - kernel), us: median {statistics.median(errs_dur):.1f}, "
            f"|error| median {statistics.median(absd):.1f}, p99 {_pct(absd, 0.99):.1f}"
        )
    for rank in (0, 1):
        cpath = os.path.join(a.out, f"counts-rank{rank}.json")
        fpath = os.path.join(a.out, f"fr-rank{rank}.pkl")
        if not (os.path.exists(cpath) and os.path.exists(fpath)):
            continue
        stats = json.load(open(cpath))
        fr = pickle.loads(open(fpath, "rb").read())
        entries = fr.get("entries", [])
        by_pg: dict[str, int] = {}
        for e in entries:
            pg = e.get("process_group", ("?", "?"))
            key = str(pg[1] if isinstance(pg, (list, tuple)) else pg)
            by_pg[key] = by_pg.get(key, 0) + 1
        hooks_total = sum(v for k, v in stats["hooks_per_group"].items() if k.split("|")[1] == "")
        print(
            f"rank {rank}: hooks {hooks_total} collectives in "
            f"{len(stats['hooks_per_group'])} groups; Flight Recorder {len(entries)} entries "
            f"{by_pg}; resolved {stats.get('resolved_at_close')}, unresolved "
            f"{stats.get('unresolved')}, anchor uncertainty {stats.get('anchor_uncertainty_ns')} ns"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=("worker", "compare", "ab", "match"))
    p.add_argument("--out", required=True)
    p.add_argument("--spool", required=True)
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--profile-from", type=int, default=6)
    p.add_argument("--blocks", type=int, default=6, help="ab: blocks per level")
    p.add_argument("--block-steps", type=int, default=8, help="ab: steps per block")
    p.add_argument("--width", type=int, default=8192, help="ab: hidden size (8 layers)")
    p.add_argument("--batch", type=int, default=4096, help="ab: rows per step")
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    t0 = time.time()
    {"worker": worker, "compare": compare, "ab": ab, "match": match}[a.mode](a)
    print(f"{a.mode} took {time.time() - t0:.1f} s", flush=True)


if __name__ == "__main__":
    main()
