"""Time to first complete render of the UI's heatmap and run overview on big runs, in a
real browser (Debian's Chromium, driven by Playwright).

For each size (default 1,024 ranks x 1,000 steps and 16,384 ranks x 100 steps, the
targets being 2 s and 5 s) it writes a synthetic run (``ranksight.synthetic``, the real
schema: about 33 rows per rank and step) into a fresh chdb store, starts
``ranksight ui`` on it and opens each page in a new browser tab, timing from navigation
until the script run is over, the loading placeholder is gone and the page's own chart
is drawn: an ECharts chart (the overview and heatmap) has its option set and its canvas
sized (animation is off, so that is its final state), a Plotly chart (an older UI's,
via ``--before``) has its traces drawn. The first visit of a page is cold (nothing
cached in the UI server); the second, in a new tab, is warm. Each size is measured on ``--repeat`` fresh
UI servers and the medians shown (the machine's other load moves single runs by a
second). Per cold visit it prints the milestones: app shell up, first element from the
script, chart library loaded (``plotly_ready`` or ``echarts_ready``: its first chart
element, the loading placeholder included), done. It also times the page's store queries alone, in this
process, for the breakdown.

Pages: the heatmap (compute time, the default metric), the heatmap of the time each rank
waited on others (``heatmap_waited``) and the run overview. Before the visits the run's
per-rank-step summary (``analyzer/summary.py``) is made once, in this process, and timed:
a run's first heatmap view ever pays that once; "first render" is a fresh UI server's
first visit of a run whose summary is stored.

``--before ROOT`` compares side by side: ``ROOT`` is a folder holding an older
``ranksight`` package (e.g. ``git archive <commit>`` with the top-level folders linked
under ``ROOT/ranksight/``, as the editable install maps them), the UI server's working
folder and first on its ``PYTHONPATH``. Each repeat then starts one server of each, alternating which
goes first, on the same store, and prints both medians and their ratio.

Each repeat also measures a returning user: a fresh UI server, and per page a browser
profile that has drawn a small run's overview before (the app shell and its chart
library in its HTTP cache, as for anyone who has used the UI), then the page of the big run in a new
tab; the server shows that run for the first time.

``--think S``: the browser stays S seconds on the Runs page (a fresh server's first page,
where the server starts reading the newest runs ahead, ``ui/warm.py``) before it opens
the run's pages, as a user reading the list would; 0 (default) opens them at once.

``--floor N`` first measures, N times each, what no page can beat: a fresh browser's
first render of a trivial Streamlit app with one 3-point chart drawn by Streamlit's
Plotly, by its ECharts (``st.echarts_chart``, a lighter bundle), and with no chart.

    python bench/ui_load.py [--sizes 1024x1000,16384x100] [--work DIR] [--keep] [--reuse]
                            [--pages heatmap,overview,heatmap_waited] [--before ROOT]
                            [--floor N] [--think S]

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


def build_summary(folder: str, run_id: str) -> float:
    """Seconds to make the run's per-rank-step summary (once per run, stored)."""
    from ranksight.analyzer import summary
    from ranksight.store import open_store
    from ranksight.ui.data.run import load_run_view

    store = open_store(folder)
    store.init_schema()  # a kept store from before the summary table: add it
    run = load_run_view(store, run_id)
    t = time.perf_counter()
    running = str(run.row.get("status", "")) == "running"
    covered = summary.ensure(store, run.run_id, run.attempt, running=running)
    took = time.perf_counter() - t
    print(f"  summary: steps up to {covered} in {took:.2f} s (stored)", flush=True)
    return took


def query_times(folder: str, run_id: str) -> dict[str, float]:
    """Seconds of each page's store reads alone (this process), from the summary and
    (``<page> raw``) from the raw rows."""
    from ranksight.store import open_store
    from ranksight.ui.config import UiConfig
    from ranksight.ui.data import heatmap, overview
    from ranksight.ui.data.run import ORDERS, load_run_view

    cfg, store = UiConfig(), open_store(folder)
    out = {}
    for name, metric in (("heatmap", "compute"), ("heatmap_waited", "waited")):
        for raw in (False, True):
            t = time.perf_counter()
            run = load_run_view(store, run_id)
            span = heatmap.step_range(store, run)
            heatmap.load_heatmap(
                store,
                run,
                metric,
                ORDERS["pp, tp, dp"],
                span,
                cfg.heatmap_rows,
                cfg.heatmap_cols,
                use_summary=not raw,
            )
            out[name + (" raw" if raw else "")] = time.perf_counter() - t
    t = time.perf_counter()
    overview.step_series(store, load_run_view(store, run_id), cfg.overview_points)
    out["overview"] = out["overview raw"] = time.perf_counter() - t
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_ui(folder: str, root: str | None = None) -> tuple[subprocess.Popen, str]:
    """``ranksight ui`` on ``folder`` (with ``root`` first on its PYTHONPATH: an older
    ranksight) on a free port; (process, base URL) once it answers."""
    port = free_port()
    cmd = [sys.executable, "-m", "ranksight.cli", "ui", "--store", folder, "--port", str(port)]
    env = dict(os.environ)
    if root:  # first on the path: as the working folder (python -m puts it first) too
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=root or None
    )
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


PAGES = {
    "heatmap": ("heatmap", "", "heatmap_chart"),
    "heatmap_waited": ("heatmap", "&metric=waited", "heatmap_chart"),
    "overview": ("overview", "", "overview_chart"),
}
"""Benchmarked page -> (page, extra query, the widget key (CSS class ``st-key-<key>...``)
of its chart)."""

# Milestones (ms since navigation), recorded in the page as they happen.
MILESTONES = """
window.__rs = {};
const mark = (k) => { if (!(k in window.__rs)) window.__rs[k] = performance.now(); };
new MutationObserver(() => {
  if (document.querySelector('[data-testid=stApp]')) mark('shell');
  if (document.querySelector('[data-testid=stSidebar] [data-testid=stHeading], h1, h2')) mark('first_element');
  if (document.querySelector('.js-plotly-plot')) mark('plotly_ready');
  if (document.querySelector('[data-testid=stEChartsChart] canvas')) mark('echarts_ready');
}).observe(document, {subtree: true, childList: true});
"""

# Done: the script run is over, the loading placeholder is gone and the page's own chart
# is drawn (no key: the Runs page, its table drawn): an ECharts chart with its option set (aria-busy off; animation off, so drawn
# in full) on a sized canvas, or a Plotly chart (an older UI) with its traces drawn (a
# heatmap image, or scatter lines).
DRAWN = """(key) => {
  if (document.querySelector('[data-testid=stStatusWidget]')) return false;
  if (document.querySelector('[class*="st-key-chart_preload"]')) return false;
  if (!key) return !!document.querySelector('[data-testid=stDataFrame] canvas');  // Runs
  const box = document.querySelector('[class*="st-key-' + key + '"]');
  if (!box) return false;
  const gd = box.querySelector('.js-plotly-plot');
  if (gd) return !!gd.querySelector('.heatmaplayer image, .scatterlayer .trace');
  const ec = box.querySelector('[data-testid=stEChartsChart][aria-busy=false] canvas');
  return !!(ec && ec.width > 0 && ec.height > 0);
}"""


def render_time(browser, url: str, key: str | None = None) -> tuple[float, dict]:
    """Seconds from navigation until the script run is over and (``key``) the page's
    chart is drawn, and the milestones (ms) on the way: app shell up, first element from
    the script, chart library loaded (first chart element), done."""
    if hasattr(browser, "new_context"):  # a browser: a new page in a new profile
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
    else:  # a browser context (profile): a new tab in it
        page = browser.new_page()
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
    ranks: int,
    steps: int,
    work: str,
    reuse: bool = False,
    repeat: int = 1,
    pages: tuple[str, ...] = tuple(PAGES),
    before: str | None = None,
    think: float = 0.0,
) -> list[dict]:
    folder = os.path.abspath(os.path.join(work, f"store-{ranks}x{steps}"))
    found = stored_run(folder, ranks, steps) if reuse and os.path.isdir(folder) else None
    if found:
        run_id, rows = found
        print(f"{ranks} ranks x {steps} steps: reusing {rows:,} rows in {folder}", flush=True)
    else:
        shutil.rmtree(folder, ignore_errors=True)
        run_id, gen_s, rows = write_run(folder, ranks, steps)
        print(f"{ranks} ranks x {steps} steps: wrote {rows:,} rows in {gen_s:.0f} s", flush=True)
    ensure_warm_run(folder)
    built = build_summary(folder, run_id)
    queries = query_times(folder, run_id)
    print(
        "  store queries alone: "
        + ", ".join(f"{k} {v:.2f} s" for k, v in queries.items() if k != "overview raw"),
        flush=True,
    )
    codes = {"new": None} if before is None else {"old": before, "new": None}
    times = {(code, name): [] for code in codes for name in pages}
    returning: dict[str, list[float]] = {}
    for i in range(repeat):
        order = list(codes) if i % 2 == 0 else list(reversed(codes))
        for code in order:
            print(f"  round {i + 1}, {code} UI:", flush=True)
            for name, got in visit_pages(folder, run_id, pages, codes[code], think).items():
                times[(code, name)].append(got)
        print(f"  round {i + 1}, new UI, returning user:", flush=True)
        for name, got in visit_returning(folder, run_id, pages).items():
            returning.setdefault(name, []).append(got)
    out = []
    for (code, name), got in times.items():
        cold, warm = sorted(c for c, _ in got), sorted(w for _, w in got)
        out.append(
            {
                "size": f"{ranks}x{steps}",
                "code": code,
                "page": name,
                "rows": rows,
                "summary_s": built,
                "queries_s": queries[name if code == "new" else name + " raw"],
                "cold_s": statistics.median(cold),
                "warm_s": statistics.median(warm),
                "returning_s": statistics.median(returning[name]) if code == "new" else None,
                "cold_range": (cold[0], cold[-1]),
                "n": len(cold),
                "target_s": TARGET_S.get((ranks, steps)),
            }
        )
    return out


def visit_pages(
    folder: str, run_id: str, pages: tuple[str, ...], root: str | None = None, think: float = 0.0
) -> dict[str, tuple[float, float]]:
    """A fresh ``ranksight ui`` on ``folder`` (``root``: see :func:`start_ui`), in a fresh
    browser that opens the Runs page first and stays there ``think`` seconds: each page's
    first and second render (s)."""
    proc, base = start_ui(folder, root)
    out = {}
    try:
        from playwright.sync_api import sync_playwright

        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
            render_time(browser, f"{base}/?page=runs")  # server warm-up
            time.sleep(think)  # a user reading the runs list
            for name in pages:
                page, extra, key = PAGES[name]
                url = f"{base}/?page={page}&run={run_id}{extra}"
                cold, marks = render_time(browser, url, key)
                warm, _ = render_time(browser, url, key)
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


WARM_RUN = "bench-warm"
"""A small run in every bench store: a returning user's browser has drawn its overview."""


def ensure_warm_run(folder: str) -> None:
    """Write :data:`WARM_RUN` (8 ranks x 10 steps) into the store at ``folder`` if absent."""
    from ranksight.store import open_store
    from ranksight.synthetic import SynthConfig, write_synthetic

    store = open_store(folder)
    n = store.query("SELECT count() AS n FROM runs WHERE run_id = %(r)s", {"r": WARM_RUN})
    if int(n["n"].iloc[0]) == 0:
        write_synthetic(store, SynthConfig(ranks=8, steps=10, run_id=WARM_RUN))


def visit_returning(
    folder: str, run_id: str, pages: tuple[str, ...], root: str | None = None
) -> dict[str, float]:
    """A fresh ``ranksight ui`` on ``folder``; for each page, one browser profile that has
    drawn the small run's overview (app shell and chart library in its HTTP cache, as for anyone
    who has used the UI before), then the page in a new tab: its first render (s). The
    server has not shown the big run before, so its data is read as on a first visit."""
    proc, base = start_ui(folder, root)
    out = {}
    try:
        from playwright.sync_api import sync_playwright

        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
            for name in pages:
                ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
                render_time(ctx, f"{base}/?page=overview&run={WARM_RUN}", "overview_chart")
                page, extra, key = PAGES[name]
                out[name], _ = render_time(ctx, f"{base}/?page={page}&run={run_id}{extra}", key)
                print(f"  {name}: returning user's first render {out[name]:.2f} s", flush=True)
                ctx.close()
            browser.close()
    finally:
        proc.terminate()
        proc.wait(30)
    return out


FLOOR_APPS = {
    "plotly": (
        "import plotly.graph_objects as go\n"
        "st.plotly_chart(go.Figure(go.Scatter(x=[0, 1, 2], y=[1, 3, 2])), key='floor_chart')",
        ".js-plotly-plot .scatterlayer .trace",
    ),
    "echarts": (
        "st.echarts_chart({'xAxis': {'type': 'value'}, 'yAxis': {'type': 'value'}, 'series':"
        " [{'type': 'line', 'data': [[0, 1], [1, 3], [2, 2]]}]}, key='floor_chart')",
        "canvas",
    ),
    "no chart": ("with st.container(key='floor_chart'):\n    st.write('text')", "p"),
}
"""The floor apps: (code after ``st.header``, what is drawn inside ``st-key-floor_chart``)."""


def floor(repeat: int) -> dict[str, tuple[float, float]]:
    """Median seconds of the first render of each trivial app in :data:`FLOOR_APPS` in a
    fresh browser that has visited the app without its chart (as the pages' browser
    visits the Runs page first), and of a second visit."""
    from playwright.sync_api import sync_playwright

    folder = tempfile.mkdtemp(prefix="ranksight-ui-floor-")
    got: dict[str, list[tuple[float, float]]] = {k: [] for k in FLOOR_APPS}
    try:
        for _ in range(repeat):
            for name, (code, drawn) in FLOOR_APPS.items():
                path = os.path.join(folder, name.replace(" ", "_") + ".py")
                with open(path, "w") as f:
                    body = "\n".join("    " + line for line in code.splitlines())
                    f.write(
                        "import streamlit as st\nst.set_page_config(layout='wide')\n"
                        f"st.header('floor: {name}')\n"
                        f"if st.query_params.get('chart'):\n{body}\nelse:\n    st.write('warm-up')\n"
                    )
                got[name].append(_floor_visit(sync_playwright, path, drawn))
                print(f"  floor, {name}: {got[name][-1][0]:.2f} s", flush=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return {k: tuple(statistics.median(x[i] for x in v) for i in (0, 1)) for k, v in got.items()}


def _floor_visit(sync_playwright, path: str, drawn: str) -> tuple[float, float]:
    port = free_port()
    cmd = [sys.executable, "-m", "streamlit", "run", path, "--server.port", str(port)]
    cmd += ["--server.headless", "true", "--browser.gatherUsageStats", "false"]
    cmd += ["--server.fileWatcherType", "none"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}/"
    done = (
        "() => !document.querySelector('[data-testid=stStatusWidget]') && "
        f"!!document.querySelector('[class*=st-key-floor_chart] {drawn}')"
    )
    try:
        for _ in range(240):
            try:
                with urllib.request.urlopen(base + "_stcore/health", timeout=2):
                    break
            except OSError:
                time.sleep(0.5)
        with sync_playwright() as p:

            def visit(browser, url: str, until: str) -> float:
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                t = time.perf_counter()
                page.goto(url)
                page.wait_for_function(until, timeout=120_000, polling=20)
                took = time.perf_counter() - t
                page.close()
                return took

            # As the pages: the browser has the app shell (a visit with no chart: the
            # server's first script run) but not the chart library.
            browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
            visit(browser, base, "() => !!document.querySelector('[data-testid=stMarkdown]')")
            cold = visit(browser, base + "?chart=1", done)
            again = visit(browser, base + "?chart=1", done)
            browser.close()
    finally:
        proc.terminate()
        proc.wait(30)
    return cold, again


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
    ap.add_argument("--pages", default=",".join(PAGES), help=f"of {', '.join(PAGES)}")
    ap.add_argument(
        "--before", default=None, help="folder with an older ranksight package to compare"
    )
    ap.add_argument("--floor", type=int, default=0, help="trivial-app renders first (N each)")
    ap.add_argument(
        "--think",
        type=float,
        default=0.0,
        help="seconds the browser stays on the Runs page (a fresh server's first page) "
        "before it opens the run's pages (default 0: at once)",
    )
    args = ap.parse_args()
    floors = floor(args.floor) if args.floor else {}
    pages = tuple(p for p in args.pages.split(",") if p)
    unknown = set(pages) - set(PAGES)
    if unknown:
        raise SystemExit(
            f"--pages: unknown {', '.join(sorted(unknown))}; known: {', '.join(PAGES)}"
        )
    work = args.work or tempfile.mkdtemp(prefix="ranksight-ui-bench-")
    rows = []
    try:
        for size in args.sizes.split(","):
            r, s = (int(x) for x in size.lower().split("x"))
            rows += bench_size(r, s, work, args.reuse, args.repeat, pages, args.before, args.think)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print_table(rows)
    if floors:
        print("\n| trivial app, one 3-point chart | fresh browser (median) | again |")
        print("|---|---|---|")
        for name, (cold, again) in floors.items():
            print(f"| {name} | {cold:.2f} s | {again:.2f} s |")


def print_table(rows: list[dict]) -> None:
    """The results as a markdown table, and with ``--before`` the new/old ratios."""
    print(
        "\n| run | UI | page | rows stored | summary made | store queries | first render (median, range) | again (median) | returning user's first render | target |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for x in rows:
        target = f"{x['target_s']:.0f} s" if x["target_s"] else "-"
        lo, hi = x["cold_range"]
        back = f"{x['returning_s']:.2f} s" if x["returning_s"] is not None else "-"
        print(
            f"| {x['size']} | {x['code']} | {x['page']} | {x['rows']:,} | {x['summary_s']:.2f} s | {x['queries_s']:.2f} s | {x['cold_s']:.2f} s ({lo:.2f}-{hi:.2f}, n={x['n']}) | {x['warm_s']:.2f} s | {back} | {target} |"
        )
    old = {(x["size"], x["page"]): x for x in rows if x["code"] == "old"}
    if not old:
        return
    print("\n| run | page | old first | new first | new/old | old again | new again | new/old |")
    print("|---|---|---|---|---|---|---|---|")
    for x in rows:
        o = old.get((x["size"], x["page"]))
        if x["code"] != "new" or o is None:
            continue
        print(
            f"| {x['size']} | {x['page']} | {o['cold_s']:.2f} s | {x['cold_s']:.2f} s | {x['cold_s'] / o['cold_s']:.2f} | {o['warm_s']:.2f} s | {x['warm_s']:.2f} s | {x['warm_s'] / o['warm_s']:.2f} |"
        )


if __name__ == "__main__":
    main()
