"""Time to first complete render of the UI's heatmap and run overview on big runs, in a
real browser (Debian's Chromium, driven by Playwright).

For each size (default 1,024 ranks x 1,000 steps and 16,384 ranks x 100 steps, the
targets being 2 s and 5 s) it writes a synthetic run (``ranksight.synthetic``, the real
schema: about 33 rows per rank and step) into a fresh chdb store, starts
``ranksight ui`` on it and opens each page in a new browser tab, timing from navigation
until the script run is over, the loading placeholder is gone and the page's own Plotly
chart has its traces drawn. The first visit of a page is cold (nothing cached in the UI
server); the second, in a new tab, is warm. Each size is measured on ``--repeat`` fresh
UI servers and the medians shown (the machine's other load moves single runs by a
second). Per cold visit it prints the milestones: app shell up, first element from the
script, Plotly loaded, done. It also times the page's store queries alone, in this
process, for the breakdown.

    python bench/ui_load.py [--sizes 1024x1000,16384x100] [--work DIR] [--keep] [--reuse]

Prints one table row per size and page; record results in bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TARGET_S = {(1024, 1000): 2.0, (16384, 100): 5.0}


def write_run(folder: str, ranks: int, steps: int) -> tuple[str, float, int]:
    """A synthetic run (one rank 1.5x slow from 1/5 of the steps) in a fresh store:
    (run id, seconds, rows)."""
    from ranksight.store import open_store
    from ranksight.synthetic import SynthConfig, write_synthetic

    store = open_store(folder)
    store.init_schema()
    slow = f"slow:rank={ranks // 3},factor=1.5,from_step={steps // 5}"
    cfg = SynthConfig(ranks=ranks, steps=steps, faults=(slow,), run_id=f"bench-{ranks}x{steps}")
    got = write_synthetic(store, cfg)
    return got.run_id, got.seconds, sum(got.rows.values())


def query_times(folder: str, run_id: str) -> dict[str, float]:
    """Seconds of the heatmap's and overview's store reads alone (cold, this process)."""
    from ranksight.store import open_store
    from ranksight.ui.config import UiConfig
    from ranksight.ui.data import heatmap, overview
    from ranksight.ui.data.run import ORDERS, load_run_view

    cfg, store = UiConfig(), open_store(folder)
    t = time.perf_counter()
    run = load_run_view(store, run_id)
    span = heatmap.step_range(store, run)
    heatmap.load_heatmap(
        store, run, "compute", ORDERS["pp, tp, dp"], span, cfg.heatmap_rows, cfg.heatmap_cols
    )
    t_heat = time.perf_counter() - t
    t = time.perf_counter()
    overview.step_series(store, load_run_view(store, run_id), cfg.overview_points)
    return {"heatmap": t_heat, "overview": time.perf_counter() - t}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_ui(folder: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "ranksight.cli", "ui", "--store", folder, "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    for _ in range(240):
        try:
            with urllib.request.urlopen(base + "/_stcore/health", timeout=2) as r:
                if r.read().strip() == b"ok":
                    return proc, base
        except OSError:
            time.sleep(0.5)
    proc.terminate()
    raise SystemExit(f"ranksight ui did not start on {base}")


CHART_KEY = {"heatmap": "heatmap_chart", "overview": "overview_chart"}
"""The widget key (CSS class ``st-key-<key>...``) of each benchmarked page's chart."""

# Milestones (ms since navigation), recorded in the page as they happen.
MILESTONES = """
window.__rs = {};
const mark = (k) => { if (!(k in window.__rs)) window.__rs[k] = performance.now(); };
new MutationObserver(() => {
  if (document.querySelector('[data-testid=stApp]')) mark('shell');
  if (document.querySelector('[data-testid=stSidebar] [data-testid=stHeading], h1, h2')) mark('first_element');
  if (document.querySelector('.js-plotly-plot')) mark('plotly_ready');
}).observe(document, {subtree: true, childList: true});
"""

# Done: the script run is over, the loading placeholder is gone and the page's own chart
# has its traces drawn (a heatmap image, or scatter lines).
DRAWN = """(key) => {
  if (document.querySelector('[data-testid=stStatusWidget]')) return false;
  if (document.querySelector('[class*="st-key-chart_preload"]')) return false;
  if (!key) return true;
  const gd = document.querySelector('[class*="st-key-' + key + '"] .js-plotly-plot');
  return !!(gd && gd.querySelector('.heatmaplayer image, .scatterlayer .trace'));
}"""


def render_time(browser, url: str, key: str | None = None) -> tuple[float, dict]:
    """Seconds from navigation until the script run is over and (``key``) the page's
    chart is drawn, and the milestones (ms) on the way: app shell up, first element from
    the script, Plotly loaded (first chart element), done."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.add_init_script(MILESTONES)
    t = time.perf_counter()
    page.goto(url)
    page.wait_for_selector("[data-testid=stApp]", timeout=300_000)
    page.wait_for_function(DRAWN, arg=key, timeout=300_000, polling=20)
    took = time.perf_counter() - t
    marks = page.evaluate("window.__rs")
    page.close()
    marks["done"] = took * 1000
    return took, marks


def stored_run(folder: str, ranks: int, steps: int) -> tuple[str, int] | None:
    """(run id, rows) of the run an earlier ``--keep`` left in ``folder``, else None."""
    from ranksight.store import StoreError, open_store

    run_id = f"bench-{ranks}x{steps}"
    try:
        store = open_store(folder)
        n = store.query("SELECT count() AS n FROM runs WHERE run_id = %(r)s", {"r": run_id})
        if int(n["n"].iloc[0]) == 0:
            return None
        tables = ("ranks", "steps", "phases", "collectives", "hook_stats", "progress")
        rows = sum(
            int(
                store.query(f"SELECT count() AS n FROM {t} WHERE run_id = %(r)s", {"r": run_id})[
                    "n"
                ].iloc[0]
            )
            for t in tables
        )
    except StoreError:
        return None
    return run_id, rows


def bench_size(
    ranks: int, steps: int, work: str, reuse: bool = False, repeat: int = 1
) -> list[dict]:
    folder = os.path.join(work, f"store-{ranks}x{steps}")
    found = stored_run(folder, ranks, steps) if reuse and os.path.isdir(folder) else None
    if found:
        run_id, rows = found
        print(f"{ranks} ranks x {steps} steps: reusing {rows:,} rows in {folder}", flush=True)
    else:
        shutil.rmtree(folder, ignore_errors=True)
        run_id, gen_s, rows = write_run(folder, ranks, steps)
        print(f"{ranks} ranks x {steps} steps: wrote {rows:,} rows in {gen_s:.0f} s", flush=True)
    queries = query_times(folder, run_id)
    print(
        f"  store queries alone: heatmap {queries['heatmap']:.2f} s, overview {queries['overview']:.2f} s",
        flush=True,
    )
    times: dict[str, list[tuple[float, float]]] = {"heatmap": [], "overview": []}
    for _ in range(repeat):
        for name, got in visit_pages(folder, run_id).items():
            times[name].append(got)
    out = []
    for name, got in times.items():
        cold, warm = sorted(c for c, _ in got), sorted(w for _, w in got)
        out.append(
            {
                "size": f"{ranks}x{steps}",
                "page": name,
                "rows": rows,
                "queries_s": queries[name],
                "cold_s": statistics.median(cold),
                "warm_s": statistics.median(warm),
                "cold_range": (cold[0], cold[-1]),
                "n": len(cold),
                "target_s": TARGET_S.get((ranks, steps)),
            }
        )
    return out


def visit_pages(folder: str, run_id: str) -> dict[str, tuple[float, float]]:
    """A fresh ``ranksight ui`` on ``folder``: each page's first and second render (s)."""
    proc, base = start_ui(folder)
    out = {}
    try:
        from playwright.sync_api import sync_playwright

        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
            render_time(browser, f"{base}/?page=runs")  # server warm-up
            for name in ("heatmap", "overview"):
                url = f"{base}/?page={name}&run={run_id}"
                cold, marks = render_time(browser, url, CHART_KEY[name])
                warm, _ = render_time(browser, url, CHART_KEY[name])
                stages = ", ".join(f"{k} {v / 1000:.2f}" for k, v in marks.items())
                print(
                    f"  {name}: first render {cold:.2f} s ({stages}), again {warm:.2f} s",
                    flush=True,
                )
                out[name] = (cold, warm)
            browser.close()
    finally:
        proc.terminate()
        proc.wait(30)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1024x1000,16384x100", help="RANKSxSTEPS, comma-separated")
    ap.add_argument("--work", default=None, help="folder for the stores (default: a temp folder)")
    ap.add_argument("--keep", action="store_true", help="keep the stores")
    ap.add_argument(
        "--repeat", type=int, default=3, help="fresh UI servers per size (medians are shown)"
    )
    ap.add_argument(
        "--reuse", action="store_true", help="use the runs a --keep run left in --work, if any"
    )
    args = ap.parse_args()
    work = args.work or tempfile.mkdtemp(prefix="ranksight-ui-bench-")
    rows = []
    try:
        for size in args.sizes.split(","):
            r, s = (int(x) for x in size.lower().split("x"))
            rows += bench_size(r, s, work, args.reuse, args.repeat)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(
        "\n| run | page | rows stored | store queries | first render (median, range) | again (median) | target |"
    )
    print("|---|---|---|---|---|---|---|")
    for x in rows:
        target = f"{x['target_s']:.0f} s" if x["target_s"] else "-"
        lo, hi = x["cold_range"]
        print(
            f"| {x['size']} | {x['page']} | {x['rows']:,} | {x['queries_s']:.2f} s | {x['cold_s']:.2f} s ({lo:.2f}-{hi:.2f}, n={x['n']}) | {x['warm_s']:.2f} s | {target} |"
        )


if __name__ == "__main__":
    main()
