"""Fault scenarios on 2 NCCL GPUs (DP2, bf16): recorded on a GPU machine, scored here.

The 8-GPU matrix (DP2 x TP2 x PP2) needs a machine this project is not always lent; this
runs what 2 GPUs allow with one parallel dimension (DP2, FSDP2 ``replicate``; TP2), on real
NCCL, with the node collectors (NVML, processes on the GPUs, stacks on a stall, Flight
Recorder dumps) running beside the job:

==============  =========================================  ================================
scenario        what happens                               right finding
==============  =========================================  ================================
clean           nothing                                    none
slow            rank 1's compute 3x from step 4            straggler/compute @ 1
gpu_contention  another process runs bf16 matmuls on GPU   straggler/gpu_contention @ 1
                1 from step 4 (nothing in the job changes)
hang            rank 1 blocks before a collective, step 6  hang @ 1
crash           rank 1 exits (code 17) in step 6           crash @ 1
clean-tp2       TP2 instead of DP2: nothing                none
slow-tp2        TP2: rank 1's compute 3x from step 4       straggler/compute @ 1
==============  =========================================  ================================

On the GPU machine (``bench/gpu_session.sh`` with ``SESSION="bench/gpu_faults.py record"``
and ``SESSION_ARGS=""``): every scenario's job writes its spool; the collectors write the
store (Parquet segments; chdb is not needed to write them); the job logs are kept.

    python bench/gpu_faults.py record --work WORK --store STORE

Here, after fetching ``work.tgz`` and ``store.tgz``: ship the spool into the store, add
torchrun's failure summaries, analyze every run and score it as the fault matrix does
(``ranksight.faultmatrix.score``); prints a Markdown table.

    python bench/gpu_faults.py score --work WORK --store STORE
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from gpu_session import job_env  # noqa: E402  (hooks on, Flight Recorder on, NVLS off)

DP2 = {"dp": 2, "tp": 1, "pp": 1}
TP2 = {"dp": 1, "tp": 2, "pp": 1}
STEPS = 24
SCENARIOS = (
    ("clean", "none", DP2),
    ("slow", "slow:rank=1,factor=3,from_step=4", DP2),
    ("gpu_contention", "none", DP2),
    ("hang", "hang:rank=1,from_step=6", DP2),
    ("crash", "crash:rank=1,from_step=6", DP2),
    ("clean-tp2", "none", TP2),
    ("slow-tp2", "slow:rank=1,factor=3,from_step=4", TP2),
)
"""(name, fault, mesh shape). The TP2 pair: its two ranks wait for each other inside
every forward and backward (TP all_reduces), the case where a phase's device span holds
the wait for a slow peer."""
CONTENTION_FROM = 4
"""The step from which the competing process runs on GPU 1."""
CONTENTION_STEPS = 40
"""Steps of the contention run: a 150 ms step ends 20 steps in 3 s."""
MODEL = ["--d-model", "2048", "--layers", "8", "--heads", "16", "--seq-len", "1024",
         "--batch-size", "16", "--device", "cuda", "--dtype", "bf16"]  # fmt: skip
HANG_STALL_S = 45.0
"""A job with no new step for this long is stopped (the NCCL watchdog's default is 10 min)."""
CONTENDER = """
import os, sys, time, torch
x = torch.randn(8192, 8192, device="cuda:1", dtype=torch.bfloat16)
y = x @ x
torch.cuda.synchronize(1)
print("contender ready on", torch.cuda.get_device_name(1), flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.01)
print("contender running", flush=True)
while True:
    for _ in range(20):
        y = x @ x
    torch.cuda.synchronize(1)
"""
"""The competing process: warmed up (CUDA context, a first matmul) while the job starts,
it runs only once the go file exists, so the contention begins at a known step."""


def _job(
    run_id: str, inject: str, spool: str, fr_prefix: str, steps: int, shape: dict
) -> tuple[list[str], dict]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           "-m", "ranksight.reference_trainer.train", "--dp", str(shape["dp"]), "--tp", str(shape["tp"]), "--pp", "1",
           "--steps", str(steps), "--run-id", run_id, "--hooks", "default", "--log-every", "1",
           "--inject", inject, *MODEL]  # fmt: skip
    env = job_env(spool, run_id, {"TORCH_NCCL_DUMP_ON_TIMEOUT": "1", "OMP_NUM_THREADS": "4",
                                  "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": fr_prefix,
                                  "TORCH_FR_DUMP_TEMP_FILE": fr_prefix})  # fmt: skip
    return cmd, env


def _last_step(log_path: str) -> int | None:
    with open(log_path, errors="replace") as f:
        steps = re.findall(r"^step\s+(\d+) loss", f.read(), re.M)
    return int(steps[-1]) if steps else None


def run_one(name: str, inject: str, shape: dict, work: str, spool: str, fr_prefix: str) -> dict:
    """One scenario's job; returns its row (run id, exit code, wall time, notes)."""
    run_id = f"gpu2-{name}-{int(time.time())}"
    log_path = os.path.join(work, f"{name}.log")
    steps = CONTENTION_STEPS if name == "gpu_contention" else STEPS
    cmd, env = _job(run_id, inject, spool, fr_prefix, steps, shape)
    t0 = time.monotonic()
    contender, note = None, ""
    go = os.path.join(work, f"{name}.go")
    if name == "gpu_contention":
        contender = subprocess.Popen(
            [sys.executable, "-c", CONTENDER, go],
            stdout=open(os.path.join(work, "contender.log"), "w"), stderr=subprocess.STDOUT,
        )  # fmt: skip
    with open(log_path, "w") as log:
        job = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=work)
        last, seen_at = None, time.monotonic()
        while job.poll() is None:
            time.sleep(0.05)
            step = _last_step(log_path)
            if step != last:
                last, seen_at = step, time.monotonic()
            if contender is not None and not note and (step or -1) >= CONTENTION_FROM - 1:
                open(go, "w").close()
                note = f"contender running from after step {step}"
            if time.monotonic() - seen_at > HANG_STALL_S:
                note = f"stopped {HANG_STALL_S:.0f} s after step {last}"
                job.terminate()
                try:
                    job.wait(30)
                except subprocess.TimeoutExpired:
                    job.kill()
                    job.wait()
                break
    if contender is not None:
        contender.kill()
        contender.wait()
    row = {"scenario": name, "inject": inject, "run_id": run_id, "job_rc": job.returncode,
           "wall_s": round(time.monotonic() - t0, 1), "last_step": _last_step(log_path),
           "note": note, "log": os.path.basename(log_path), "shape": shape}  # fmt: skip
    print(json.dumps(row), flush=True)
    return row


def record(a: argparse.Namespace) -> None:
    """Run every scenario with the node collectors running; rows to ``<work>/rows.json``."""
    from ranksight.agent.collect import CollectConfig, Collection
    from ranksight.store.chdb_store import ChdbStore

    work, spool = os.path.abspath(a.work), os.path.join(os.path.abspath(a.work), "spool")
    fr_prefix = os.path.join(work, "frdump", "nccl_trace_rank_")
    os.makedirs(os.path.dirname(fr_prefix), exist_ok=True)
    os.makedirs(spool, exist_ok=True)
    store = ChdbStore(a.store)  # no init_schema: its version check needs the chdb engine
    config = CollectConfig(spool_dir=spool, data_dir=work, stall_s=8.0, fr_prefixes=(fr_prefix,))
    collection = Collection(store, config)
    collection.start()
    rows = []
    try:
        for name, inject, shape in SCENARIOS:
            if a.only and name not in a.only.split(","):
                continue
            rows.append(run_one(name, inject, shape, work, spool, fr_prefix))
            time.sleep(3)
    finally:
        time.sleep(12)  # two Flight Recorder polls: a dump must be stable before it is taken
        collection.stop()
    print(
        f"collectors: {collection.state}; errors {collection.errors}; rows {collection.sink.inserted}"
    )
    print(f"dumps: {sorted(os.listdir(os.path.dirname(fr_prefix)))}", flush=True)
    with open(os.path.join(work, "rows.json"), "w") as f:
        json.dump(rows, f, indent=1)


def _expected(name: str, inject: str, shape: dict):
    from ranksight.faultmatrix import Expectation, expectation
    from ranksight.reference_trainer.faults import faults_ground_truth, parse_faults

    if name == "gpu_contention":
        return Expectation("straggler", "gpu_contention", frozenset({1}), CONTENTION_FROM)
    return expectation(faults_ground_truth(parse_faults([inject]), shape), shape)


def score_all(a: argparse.Namespace) -> None:
    """Ship the recorded spool, analyze and score every recorded scenario."""
    from dataclasses import asdict

    from ranksight.analyzer import analyze
    from ranksight.faultmatrix import score
    from ranksight.importer.torchrun_log import record_failures
    from ranksight.store import open_store

    spool = os.path.join(a.work, "spool")
    subprocess.run([sys.executable, "-m", "ranksight.cli", "agent", "--once", "--keep-spool",
                    "--collectors", "none", "--spool", spool, "--store", a.store], check=True)  # fmt: skip
    store = open_store(a.store)
    with open(os.path.join(a.work, "rows.json")) as f:
        rows = json.load(f)
    print("| scenario | fault | expected | found | verdict | false findings | job rc | note |")
    print("|---|---|---|---|---|---|---|---|")
    out = []
    for row in rows:
        if row["job_rc"] not in (0, None):
            record_failures(store, row["run_id"], os.path.join(a.work, row["log"]))
        found = [asdict(f) for f in analyze(store, row["run_id"]).findings]
        e = _expected(row["scenario"], row["inject"], row.get("shape", DP2))
        s = score(found, e)
        out.append({**row, "expected": e.label, "found": s.found, "verdict": s.verdict,
                    "false_findings": list(s.false_findings), "findings": found})  # fmt: skip
        print(f"| {row['scenario']} | {row['inject']} | {e.label} | {s.found} | {s.verdict} | "
              f"{', '.join(s.false_findings) or '-'} | {row['job_rc']} | {row['note'] or '-'} |")  # fmt: skip
    with open(os.path.join(a.work, "scored.json"), "w") as f:
        json.dump(out, f, indent=1, default=str)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("what", choices=("record", "score"))
    p.add_argument("--work", required=True, help="folder of the spool, logs and dumps")
    p.add_argument("--store", required=True, help="store folder (initialized, schema current)")
    p.add_argument("--only", default="", help="comma-separated scenario names (record)")
    a = p.parse_args()
    record(a) if a.what == "record" else score_all(a)


if __name__ == "__main__":
    main()
