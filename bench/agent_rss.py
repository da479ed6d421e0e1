"""Resident memory of a running ``ranksight agent`` process (psutil), and which heavy
libraries it has loaded (from ``/proc/<pid>/maps``).

Starts ``ranksight agent`` on an empty spool for ``--seconds`` (default collectors unless
``--collectors`` says otherwise) once into a chdb folder and once into a ClickHouse URL
whose server is down (the agent buffers; nothing else changes in its memory), and prints
peak and final RSS. Run::

    python bench/agent_rss.py [--seconds 10] [--collectors default]
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--collectors", default="default")
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
    subprocess.run(["rm", "-rf", work], check=False)


if __name__ == "__main__":
    main()
