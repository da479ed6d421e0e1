"""Resident memory of a running ``ranksight agent`` process (psutil), and which heavy
libraries it has loaded (from ``/proc/<pid>/maps``).

Starts ``ranksight agent`` on an empty spool for ``--seconds`` (default collectors unless
``--collectors`` says otherwise) once into a chdb folder and once into a ClickHouse URL
whose server is down (the agent buffers; nothing else changes in its memory), and prints
peak and final RSS. With ``--burst N`` also an agent that finds a spool of N records (the
mix of ``bench/ingest.py``) and ships it into a local ClickHouse server: peak RSS of the
agent process and of its shipper processes while it ships, and again 3 s after the spool
is stored (the heap given back, ``agent/heap.py``). Run::

    python bench/agent_rss.py [--seconds 10] [--collectors default] [--burst 2000000]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time

import psutil

LIBS = {"torch": "libtorch", "chdb": "_chdb", "pandas": "pandas/_libs", "pyarrow": "libarrow."}


def measure(store: str, spool: str, collectors: str, seconds: float) -> dict:
    """Peak and final RSS (MB) of one agent process, and the heavy libraries mapped."""
    cmd = [sys.executable, "-m", "ranksight.cli", "agent", "--spool", spool, "--store", store]
    proc = subprocess.Popen(
        [*cmd, "--collectors", collectors], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    peak, rss, deadline = 0, 0, time.monotonic() + seconds
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            rss = psutil.Process(proc.pid).memory_info().rss
            peak = max(peak, rss)
            time.sleep(0.2)
        maps = open(f"/proc/{proc.pid}/maps").read()
    finally:
        proc.terminate()
        proc.wait(60)
    loaded = [name for name, marker in LIBS.items() if marker in maps]
    return {"peak_mb": peak / 2**20, "rss_mb": rss / 2**20, "loaded": loaded}


def burst(work: str, records: int, timeout_s: float = 300.0) -> dict:
    """Peak and settled RSS (MB) of an agent and its shipper processes shipping a spool of
    ``records`` into a local ClickHouse server; settled is 3 s after the spool is stored."""
    from pathlib import Path

    from ingest import write_spool

    from ranksight.store.server import start_local_server

    spool = Path(work) / "burst-spool"
    write_spool(spool, records, 8, 2500, "binary")
    server = start_local_server(Path(work) / "burst-clickhouse")
    url = f"clickhouse://127.0.0.1:{server.tcp_port}/rss"
    cmd = [sys.executable, "-m", "ranksight.cli", "agent", "--spool", str(spool), "--store", url]
    proc = subprocess.Popen(
        [*cmd, "--collectors", "none", "--stats-interval", "0"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    agent = psutil.Process(proc.pid)

    def sizes() -> tuple[int, int]:
        kids = 0
        for kid in agent.children():
            try:
                kids += kid.memory_info().rss
            except psutil.Error:
                pass
        return agent.memory_info().rss, kids

    peak_agent = peak_kids = 0
    started = time.monotonic()
    try:
        while list(spool.glob("bench/a0/*.spool")):  # deleted once stored
            assert time.monotonic() - started < timeout_s, "the burst was not stored in time"
            own, kids = sizes()
            peak_agent, peak_kids = max(peak_agent, own), max(peak_kids, kids)
            time.sleep(0.1)
        stored_s = time.monotonic() - started
        time.sleep(3.0)
        own, kids = sizes()
    finally:
        proc.terminate()
        proc.wait(60)
        server.stop()
    mb = 2**20
    return {
        "seconds": stored_s,
        "peak_agent_mb": peak_agent / mb,
        "peak_shippers_mb": peak_kids / mb,
        "agent_mb": own / mb,
        "shippers_mb": kids / mb,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--collectors", default="default")
    parser.add_argument("--burst", type=int, default=0, help="records of a burst to ship")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="ranksight-rss-")
    print("| store | collectors | RSS after run | peak RSS | heavy libraries loaded |")
    print("|---|---|---|---|---|")
    for name, url in (
        ("chdb folder", f"chdb://{work}/store"),
        ("ClickHouse (down)", "clickhouse://127.0.0.1:1/x"),
    ):
        r = measure(url, f"{work}/spool-{len(name)}", args.collectors, args.seconds)
        print(
            f"| {name} | {args.collectors} | {r['rss_mb']:.0f} MB | {r['peak_mb']:.0f} MB | {', '.join(r['loaded'])} |"
        )
    if args.burst:
        r = burst(work, args.burst)
        print(
            f"burst of {args.burst:,} records into ClickHouse 18.16, stored in {r['seconds']:.1f} s: "
            f"peak RSS agent {r['peak_agent_mb']:.0f} MB, shipper processes "
            f"{r['peak_shippers_mb']:.0f} MB; 3 s later agent {r['agent_mb']:.0f} MB, "
            f"shipper processes {r['shippers_mb']:.0f} MB"
        )
    subprocess.run(["rm", "-rf", work], check=False)


if __name__ == "__main__":
    main()
