"""One recorded session on a GPU machine (run by bench/gpu_session.sh there).

1. Records the machine's NVML answers while it idles and trains
   (``collectors/nvml_record.py``) -> ``nvml_h200x2.json``.
2. Runs the node agent's collectors (all, default intervals; ``stall_s`` 6 s) into a
   store while a hooked 2-GPU DDP training job runs (``tests/workers/fr_job.py train``),
   takes the ranks' stacks once on demand in the middle, and logs ``nvidia-smi`` every
   2 s beside it for comparison; measures this process's CPU and RSS (the agent cost).
3. Runs the same job in ``hang`` mode: rank 1 never joins an all_reduce; the stall watcher
   must dump both ranks' stacks, NCCL's watchdog must write a Flight Recorder dump at the
   timeout (to ``<work>/frdump/``), and the FR collector must ingest it.
4. Leaves everything under ``--work`` (spool, dumps, logs) and the store.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from agent_cost import cpu_window  # noqa: E402

SMI_FIELDS = (
    "timestamp,index,uuid,pci.bus_id,clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem,power.draw,"
    "power.limit,temperature.gpu,utilization.gpu,utilization.memory,memory.used,memory.total,"
    "pcie.link.gen.current,pcie.link.width.current,clocks_event_reasons.active"
)


def job_env(spool: str, run_id: str, extra: dict) -> dict:
    """Environment of a training job: hooks on, Flight Recorder on, NVLink multicast off."""
    return {
        **os.environ,
        "RANKSIGHT_SPOOL_DIR": spool,
        "RANKSIGHT_RUN_ID": run_id,
        "RANKSIGHT_LEVEL": "default",
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
        "TORCH_NCCL_ENABLE_TIMING": "1",
        "NCCL_NVLS_ENABLE": "0",
        "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
        "NVSHMEM_DISABLE_NVLS": "1",
        **extra,
    }


def torchrun(args: list[str], env: dict, log: str, timeout_s: float) -> int:
    """Run a 2-process torchrun job; returns its exit code (-9 on timeout)."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        *args,
    ]
    with open(log, "w") as f:
        try:
            return subprocess.run(
                cmd, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=timeout_s
            ).returncode
        except subprocess.TimeoutExpired:
            return -9


def manual_stacks(
    collection, spool: str, run_id: str, after_s: float, host: str
) -> threading.Thread:
    """After ``after_s``, dump the run's local ranks once (trigger ``manual``)."""
    from ranksight.collectors.local_ranks import scan_spool
    from ranksight.collectors.pyspy import StackTaker

    def go() -> None:
        time.sleep(after_s)
        ranks = [r for r in scan_spool(spool) if r.run_id == run_id]
        rows = StackTaker(host).take(ranks, "manual")
        collection.sink.add({"stacks": rows})
        print(f"manual stacks: {len(rows)} ranks, ok={[r['ok'] for r in rows]}", flush=True)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t


def main() -> None:
    """Run the session; see the module doc."""
    p = argparse.ArgumentParser()
    p.add_argument("--work", required=True)
    p.add_argument("--store", required=True, help="an initialized chdb store folder")
    p.add_argument("--seconds", type=float, default=40.0)
    a = p.parse_args()
    from ranksight.agent.collect import CollectConfig, Collection
    from ranksight.store.chdb_store import ChdbStore

    work, spool = a.work, os.path.join(a.work, "spool")
    fr_prefix = os.path.join(work, "frdump", "nccl_trace_rank_")
    os.makedirs(work, exist_ok=True)
    os.makedirs(os.path.dirname(fr_prefix), exist_ok=True)
    recorder = subprocess.Popen(
        [sys.executable, "-m", "ranksight.collectors.nvml_record", os.path.join(work, "nvml_h200x2.json"),
         "--snapshots", "14", "--every", "4", "--spool", spool],
        stdout=open(os.path.join(work, "nvml_record.log"), "w"), stderr=subprocess.STDOUT,
        cwd=work,  # not the source folder: its ranksight/ would shadow the package for -m
    )  # fmt: skip
    store = ChdbStore(a.store)  # no init_schema: its version check needs the chdb engine
    config = CollectConfig(spool_dir=spool, data_dir=work, stall_s=6.0, fr_prefixes=(fr_prefix,))
    collection = Collection(store, config)
    collection.start()
    time.sleep(3)
    idle = cpu_window(8)
    print(f"agent with collectors, GPUs idle: {idle:.2f} % of one core", flush=True)
    try:
        smi = subprocess.Popen(
            ["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv,nounits", "-lms", "2000"],
            stdout=open(os.path.join(work, "nvidia_smi.csv"), "w"), stderr=subprocess.STDOUT,
        )  # fmt: skip
    except OSError as exc:
        print(f"no nvidia-smi: {exc}", flush=True)
        smi = None
    run_id = f"gpu-train-{int(time.time())}"
    env = job_env(spool, run_id, {})
    manual_stacks(collection, spool, run_id, 25.0, config.host)
    box: dict = {}
    measure = threading.Thread(
        target=lambda: box.update(cpu=cpu_window(a.seconds - 5)), daemon=True
    )
    threading.Timer(12.0, measure.start).start()
    rc = torchrun(["tests/workers/fr_job.py", "train", os.path.join(work, "fr"), str(a.seconds)], env,
                  os.path.join(work, "train.log"), a.seconds + 120)  # fmt: skip
    measure.join(timeout=5)
    import psutil

    rss = psutil.Process().memory_info().rss / 2**20
    print(
        f"train rc={rc}; agent during training: {box.get('cpu', float('nan')):.2f} % of one core, RSS {rss:.1f} MB",
        flush=True,
    )
    if smi is not None:
        smi.terminate()
    hang_id = f"gpu-hang-{int(time.time())}"
    extra = {"FR_JOB_TIMEOUT_S": "30", "FR_JOB_HANG_S": "42", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
             "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": fr_prefix, "TORCH_FR_DUMP_TEMP_FILE": fr_prefix}  # fmt: skip
    rc = torchrun(["tests/workers/fr_job.py", "hang", os.path.join(work, "fr"), "3"], job_env(spool, hang_id, extra),
                  os.path.join(work, "hang.log"), 100)  # fmt: skip
    print(f"hang rc={rc}; dumps: {sorted(os.listdir(os.path.dirname(fr_prefix)))}", flush=True)
    time.sleep(12)  # two FR polls: the dump must be stable before it is taken
    collection.stop()
    recorder.wait(timeout=60)
    print(
        f"collectors: {collection.state}; errors {collection.errors}; rows {collection.sink.inserted}",
        flush=True,
    )


if __name__ == "__main__":
    main()
