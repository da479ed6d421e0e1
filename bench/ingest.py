"""Agent ingest throughput against the store's own ceiling, measured side by side.

1. Writes a spool of ``--records`` records the way the hooks do: one binary segment per
   rank (``trainer_hooks/spool_format.py``: a header frame, then the writer's encoding of
   each flush of ``--frame-records`` records, an end frame): 80% collectives, 15% phases,
   5% steps. The same records as JSON lines (the format older hooks wrote) for comparison.
2. Ceiling: the ClickHouse server inserts the same number of rows of the same tables,
   generated inside it (``INSERT INTO t SELECT ... FROM numbers(n)``), no client involved.
   chdb's own ceiling is measured the same way (``INSERT INTO FUNCTION file(..., Parquet)``).
3. The agent: a child process runs ``Agent(spool, store).run`` (a reader thread and,
   into the server, shipper processes, into chdb shipper threads, as in production:
   parse, validate, disk buffer with fsync, idempotent insert) on an empty spool folder;
   once its shipper processes are ready (a running agent's state) the spool's run folder
   is moved in and the clock starts, until the whole spool is stored, into the server and
   into a chdb folder (the binary spool), and into the server again from the JSON spool;
   records/s, CPU% (user+sys over wall, the agent and its shipper processes) and peak
   RSS (their sum, sampled every 0.1 s). The spool is kept (``keep_spool``) and moved
   back, so that each run reads the same files. Into the server once more without
   compression (``$RANKSIGHT_CH_COMPRESSION=none``: lz4 is the default).

Prints records/s and the ratio agent / server ceiling (the target is >= 0.5, and >= 1 M
records/s where the ceiling allows). Run (needs ``clickhouse-server``)::

    python bench/ingest.py [--records 5000000] [--ranks 8] [--repeat 1] [--batch-rows 500000]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ranksight.store import open_store, schema
from ranksight.store.server import start_local_server

MIX = {"collectives": 0.80, "phases": 0.15, "steps": 0.05}
T0 = 1_764_000_000_000_000_000

AGENT = """
import json, os, resource, sys, threading, time
import psutil
from ranksight.agent import Agent, AgentConfig
from ranksight.store import open_store
spool, staged = sys.argv[1], sys.argv[5]
store = open_store(sys.argv[2]); store.init_schema()
total = int(sys.argv[4])
cfg = AgentConfig(batch_rows=int(sys.argv[3]), stats_interval_s=0, buffer_bytes=8 << 30,
                  interval_s=0.05, keep_spool=True, shippers=int(sys.argv[6]))  # spool found within 0.05 s
agent = Agent(spool, store, config=cfg)
stop = threading.Event()
runner = threading.Thread(target=agent.run, args=(stop,))
runner.start()  # the agent as it runs in production: reader thread, shipper processes/threads
while not all(p.ready for p in agent.shipper_processes):
    time.sleep(0.01)  # started and ready, as in a running agent (none to a chdb folder)
me = psutil.Process()
server = psutil.Process(int(sys.argv[7])) if sys.argv[7] != "0" else None
def cpu():
    kids = {k.pid: k.cpu_times() for k in me.children()}
    return {me.pid: me.cpu_times(), **kids}
def server_cpu():
    return sum(server.cpu_times()[:2]) if server else 0.0
own_peak = 0
def rss():  # shippers by pid, as me.children() reads every process's /proc/PID/stat
    global own_peak
    total = me.memory_info().rss
    own_peak = max(own_peak, total)
    for pid in [p.pid for p in agent.shipper_processes if p.pid]:
        try:
            total += psutil.Process(pid).memory_info().rss
        except psutil.Error:
            pass
    return total
c0, s0, w0 = cpu(), server_cpu(), time.perf_counter()
os.rename(staged, os.path.join(spool, "bench"))  # the spool's records appear now
peak, sampled = rss(), w0
while agent.stats.shipped < total and runner.is_alive():
    time.sleep(0.02)
    if time.perf_counter() - sampled > 0.1:
        peak, sampled = max(peak, rss()), time.perf_counter()
c1, s1, w1 = cpu(), server_cpu(), time.perf_counter()
peak = max(peak, rss())
stop.set()
runner.join()
os.rename(os.path.join(spool, "bench"), staged)
used = {pid: sum(t[:2]) - sum(c0[pid][:2]) if pid in c0 else sum(t[:2]) for pid, t in c1.items()}
print(json.dumps({"rows": agent.stats.shipped, "seconds": w1 - w0,
                  "cpu_pct": 100 * sum(used.values()) / (w1 - w0),
                  "cpu_pct_shippers": 100 * (sum(used.values()) - used[me.pid]) / (w1 - w0),
                  "server_cpu_pct": 100 * (s1 - s0) / (w1 - w0), "rss_mb": peak / 1e6, "agent_rss_mb": own_peak / 1e6, "processes": len(c1),
                  "rejected": agent.stats.rejected}))
"""


def records(rank: int, n: int, rng: random.Random):
    """``n`` hook-shaped records of one rank (all three tables, in a realistic order)."""
    for i in range(n):
        u = rng.random()
        t = T0 + i * 1000 + rng.randrange(1000)
        step = i // 2000
        if u < MIX["collectives"]:
            yield {"t": "collectives", "step": step, "phase": "backward", "group_id": "g3-0,1,2,3",
                   "group_ranks": "0,1,2,3", "group_seq": i, "op": "all_reduce", "peer": -1,
                   "dtype": "torch.bfloat16", "numel_in": 1 << 20, "numel_out": 1 << 20,
                   "bytes": 2 << 20, "enqueue_ns": t, "start_ns": t + 10, "end_ns": t + 5000,
                   "wait_ns": rng.randrange(5000)}  # fmt: skip
        elif u < MIX["collectives"] + MIX["phases"]:
            yield {"t": "phases", "step": step, "phase": "forward", "microbatch": i % 8,
                   "stage": rank % 2, "start_ns": t, "end_ns": t + 9000,
                   "wait_ns": rng.randrange(3000)}  # fmt: skip
        else:
            yield {"t": "steps", "step": i, "start_ns": t, "end_ns": t + 90000,
                   "loss": float("nan") if rank % 2 else 2.5, "tokens": 4096, "lr": 3e-4,
                   "rss_bytes": 1 << 30, "grad_norm": 0.75, "gpu_mem_allocated_bytes": 40 << 30,
                   "gpu_mem_reserved_bytes": 48 << 30}  # fmt: skip


def write_spool(folder: Path, total: int, ranks: int, frame_records: int, fmt: str) -> int:
    """The spool of ``total`` records over ``ranks`` files in format ``fmt`` (``binary``:
    the hooks' segments; ``json``: JSON lines); returns its size in bytes."""
    from ranksight.trainer_hooks import spool_format as sf

    size = 0
    for rank in range(ranks):
        header = {"run_id": "bench", "attempt": 0, "rank": rank}
        recs = list(records(rank, total // ranks, random.Random(rank)))
        if fmt == "binary":
            path = folder / "bench" / "a0" / f"rank{rank:05d}-{1000 + rank}-0000.spool"
            chunks = [sf.header_frame(header)]
            chunks += [
                sf.encode(recs[i : i + frame_records]) for i in range(0, len(recs), frame_records)
            ]
            data = b"".join(chunks) + sf.end_frame(len(recs))
        else:
            path = folder / "bench" / "a0" / f"rank{rank:05d}-{1000 + rank}.jsonl"
            lines = [json.dumps({"t": "_header", **header})]
            lines += [json.dumps(r, separators=(",", ":")) for r in recs]
            data = ("\n".join(lines) + "\n").encode()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        size += len(data)
    return size


def generated(table: str, n: int) -> str:
    """``SELECT`` of ``n`` rows shaped like the spool's, generated inside ClickHouse."""
    run = "'bench' AS run_id, toUInt32(0) AS attempt, toUInt32(number % 8) AS rank"
    t = f"toInt64({T0} + number * 1000)"
    cols = {
        "collectives": f"toInt32(intDiv(number, 2000)) AS step, 'backward' AS phase, "
        f"'g3-0,1,2,3' AS group_id, '0,1,2,3' AS group_ranks, number AS group_seq, "
        f"'all_reduce' AS op, toInt32(-1) AS peer, 'torch.bfloat16' AS dtype, "
        f"toUInt64(1048576) AS numel_in, toUInt64(1048576) AS numel_out, "
        f"toUInt64(2097152) AS bytes, {t} AS enqueue_ns, {t} + 10 AS start_ns, "
        f"{t} + 5000 AS end_ns, toInt64(number % 5000) AS wait_ns",
        "phases": f"toUInt32(intDiv(number, 2000)) AS step, 'forward' AS phase, "
        f"toInt32(number % 8) AS microbatch, toInt32(number % 2) AS stage, {t} AS start_ns, "
        f"{t} + 9000 AS end_ns, toInt64(number % 3000) AS wait_ns",
        "steps": f"toUInt32(number) AS step, {t} AS start_ns, {t} + 90000 AS end_ns, "
        f"2.5 AS loss, toUInt64(4096) AS tokens, 3e-4 AS lr, toUInt64(1073741824) AS rss_bytes, "
        f"0.75 AS grad_norm, toUInt64(42949672960) AS gpu_mem_allocated_bytes, "
        f"toUInt64(51539607552) AS gpu_mem_reserved_bytes",
    }
    return f"SELECT {run}, {cols[table]}, toUInt64(number + 1) AS batch_id FROM numbers({n})"


def server_ceiling(store, total: int) -> float:
    """Rows/s of the server inserting the mix generated inside itself."""
    client, seconds = store._client, 0.0
    for table, share in MIX.items():
        names = ", ".join(schema.TABLES[table].column_names)
        started = time.perf_counter()
        client.execute(f"INSERT INTO {table} ({names}) {generated(table, int(total * share))}")
        seconds += time.perf_counter() - started
    return total / seconds


def server_events(store) -> dict[str, int]:
    """The server's ``InsertedRows`` and ``MergedRows`` counters so far."""
    rows = store._client.execute(
        "SELECT event, value FROM system.events WHERE event IN ('InsertedRows', 'MergedRows')"
    )
    return {"InsertedRows": 0, "MergedRows": 0, **{str(k): int(v) for k, v in rows}}


def merged_per_inserted(before: dict[str, int], after: dict[str, int]) -> float:
    """Rows the server merged per row inserted between two :func:`server_events`."""
    inserted = after["InsertedRows"] - before["InsertedRows"]
    return (after["MergedRows"] - before["MergedRows"]) / max(inserted, 1)


def merges_done(store, quiet_s: float = 1.0, timeout_s: float = 300.0) -> float:
    """Wait until the server has run no merge for ``quiet_s`` seconds (the parts an earlier
    run wrote are merged in the background, on the same cores); returns seconds waited."""
    started = time.perf_counter()
    quiet_since = None
    while time.perf_counter() - started < timeout_s:
        busy = store._client.execute("SELECT count() FROM system.merges")[0][0]
        now = time.perf_counter()
        if busy:
            quiet_since = None
        elif quiet_since is None:
            quiet_since = now
        elif now - quiet_since >= quiet_s:
            break
        time.sleep(0.1)
    return time.perf_counter() - started


def chdb_ceiling(folder: Path, total: int) -> float:
    """Rows/s of chdb writing the mix as Parquet files, generated inside it."""
    from ranksight.store import chdb_engine
    from ranksight.store.types import structure

    seconds = 0.0
    for table, share in MIX.items():
        spec = schema.TABLES[table]
        sql = (
            f"INSERT INTO FUNCTION file('{folder}/{table}.parquet', Parquet, '{structure(spec)}') "
            f"{generated(table, int(total * share))}"
        )
        started = time.perf_counter()
        chdb_engine.run(sql)
        seconds += time.perf_counter() - started
    return total / seconds


def run_agent(
    spool: Path, url: str, batch_rows: int, total: int, shippers: int, server_pid: int, env=None
) -> dict:
    """Run an agent into ``url`` in a child process (``env``: more environment; ``shippers``
    its shippers), on a fresh spool folder into which ``spool``'s run folder is moved once
    the agent is ready, until it has shipped ``total`` rows; its measurements, with the CPU
    of the server process ``server_pid`` (0: none) over the same time."""
    folder = Path(tempfile.mkdtemp(prefix="spool-", dir=spool.parent))
    out = subprocess.run(
        [sys.executable, "-c", AGENT, str(folder), url, str(batch_rows), str(total),
         str(spool / "bench"), str(shippers), str(server_pid)],
        capture_output=True, text=True, check=True, env={**os.environ, **(env or {})},
    )  # fmt: skip
    subprocess.run(["rm", "-rf", str(folder)], check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def cpu_breakdown(work: Path, url: str, frame_records: int, records: int = 200_000) -> dict:
    """CPU µs per record of each stage, one thread after the other, on a fresh binary spool
    of ``records``: reading, decoding and validating the frames; sealing into the disk
    buffer (uncompressed Arrow IPC, fsync); shipping into ``url`` (in this process)."""
    from ranksight.agent import Agent, AgentConfig, heap

    heap.keep()  # as Agent.run and its shipper processes do
    spool = work / "breakdown"
    write_spool(spool, records, 1, frame_records, "binary")
    store = open_store(url)
    store.init_schema()
    cfg = AgentConfig(batch_rows=200_000, stats_interval_s=0, keep_spool=True)
    agent = Agent(str(spool), store, config=cfg)
    c0 = time.process_time()
    parsed = agent.tailer.read(200_000)
    read = time.process_time() - c0
    assert parsed.count == records and not parsed.rejected, (parsed.count, parsed.rejected[:3])
    c0 = time.process_time()
    agent._seal(parsed)
    seal = time.process_time() - c0
    c0 = time.process_time()
    while agent.ship_once():
        pass
    ship = time.process_time() - c0
    agent.close()
    per = 1e6 / records
    return {"read+decode+validate": read * per, "seal": seal * per, "ship": ship * per}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=5_000_000)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--batch-rows", type=int, default=500_000)
    parser.add_argument("--shippers", type=int, default=2, help="the agent's shippers")
    parser.add_argument(
        "--frame-records", type=int, default=2_500,
        help="records per writer flush (a rank writing 10,000 records/s, flushing every 0.25 s)",
    )  # fmt: skip
    parser.add_argument("--no-json", action="store_true", help="skip the JSON spool run")
    parser.add_argument(
        "--repeat", type=int, default=1,
        help="runs into the server (each compression), alternated: the machine may be shared",
    )  # fmt: skip
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ranksight-ingest-"))
    size = write_spool(work / "spool", args.records, args.ranks, args.frame_records, "binary")
    total = args.records // args.ranks * args.ranks
    print(f"spool: {total} records, {size / 1e6:.0f} MB binary ({size / total:.0f} B/record)")
    if not args.no_json:
        json_size = write_spool(work / "json", args.records, args.ranks, 0, "json")
        print(f"JSON spool: {json_size / 1e6:.0f} MB ({json_size / total:.0f} B/record)")
    os.sync()  # the spools' writeback is not to run beside the measurements
    server = start_local_server(work / "clickhouse")
    try:
        ceiling_store = open_store(f"clickhouse://127.0.0.1:{server.tcp_port}/ceiling")
        ceiling_store.init_schema()
        events = server_events(ceiling_store)
        ceiling = server_ceiling(ceiling_store, total)
        ceiling_merged = merged_per_inserted(events, server_events(ceiling_store))
        url = f"clickhouse://127.0.0.1:{server.tcp_port}/agent"
        runs = []
        plain = {"RANKSIGHT_CH_COMPRESSION": "none"}

        def agent_run(name: str, fmt: str, into: str, env: dict | None = None) -> None:
            waited = merges_done(ceiling_store)  # the last run's merges are not this one's
            spool = work / ("spool" if fmt == "binary" else "json")
            pid = server.process.pid if into.startswith("clickhouse") else 0
            events = server_events(ceiling_store)
            result = run_agent(spool, into, args.batch_rows, total, args.shippers, pid, env)
            merged = merged_per_inserted(events, server_events(ceiling_store)) if pid else 0.0
            runs.append((name, fmt, {**result, "merges_waited_s": waited, "merged": merged}))

        for i in range(args.repeat):  # alternately, each into a database of its own
            agent_run("ClickHouse 18.16", "binary", f"{url}{i}")
            agent_run("ClickHouse 18.16, no compression", "binary", f"{url}{i}_plain", plain)
        agent_run("chdb folder", "binary", f"chdb://{work}/chdb")
        if not args.no_json:
            agent_run("ClickHouse 18.16", "JSON lines", f"{url}_json")
        merges_done(ceiling_store)
        ceiling_after = server_ceiling(ceiling_store, total)
        breakdown = cpu_breakdown(
            work, f"clickhouse://127.0.0.1:{server.tcp_port}/breakdown", args.frame_records
        )
    finally:
        server.stop()
    chdb_own = chdb_ceiling(work, total)
    print(f"server ceiling (INSERT ... SELECT inside 18.16): {ceiling:,.0f} rows/s before the "
          f"agent runs, {ceiling_after:,.0f} after")  # fmt: skip
    print(f"chdb ceiling (INSERT INTO FUNCTION file Parquet): {chdb_own:,.0f} rows/s")
    print(
        "| destination | spool | agent records/s | / server ceiling | CPU% (of it shippers) "
        "| server CPU% | processes | peak RSS MB (agent process alone) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, fmt, r in runs:
        assert r["rows"] == total and r["rejected"] == 0, r
        rate = r["rows"] / r["seconds"]
        print(
            f"| {name} | {fmt} | {rate:,.0f} | {rate / ceiling:.2f} | {r['cpu_pct']:.0f} "
            f"({r['cpu_pct_shippers']:.0f}) | {r['server_cpu_pct']:.0f} | {r['processes']} "
            f"| {r['rss_mb']:.0f} ({r['agent_rss_mb']:.0f}) |"
        )
    waits = ", ".join(f"{r['merges_waited_s']:.1f}" for _, _, r in runs)
    print(f"before each run, until the server had merged nothing for 1 s: {waits} s")
    merged = ", ".join(f"{r['merged']:.2f}" for _, _, r in runs)
    print(f"rows the server merged per row inserted: ceiling {ceiling_merged:.2f}; runs {merged}")
    print("every ratio is against the server's ceiling, the chdb folder's too")
    for name, fmt in dict.fromkeys((n, f) for n, f, _ in runs):
        rates = sorted(r["rows"] / r["seconds"] for n, f, r in runs if (n, f) == (name, fmt))
        if len(rates) > 1:
            print(
                f"{name}, {fmt}: median {rates[len(rates) // 2]:,.0f} records/s "
                f"({rates[len(rates) // 2] / ceiling:.2f} of the ceiling), "
                f"{rates[0] / ceiling:.2f}-{rates[-1] / ceiling:.2f} over {len(rates)} runs"
            )
    print("CPU per record, one thread (binary spool into the server): " + ", ".join(
        f"{k} {v:.2f} µs" for k, v in breakdown.items()))  # fmt: skip
    subprocess.run(["rm", "-rf", str(work)], check=False)


if __name__ == "__main__":
    main()
