"""The web UI in a real headless Chromium (Debian's package, driven by Playwright):
`ranksight ui` serves the demo run; every page is opened and drawn (overview and heatmap
by ECharts on a canvas, the others by Plotly), the heatmap and timeline hold every rank
(the heatmap's rows read back by hovering each one: ECharts' tooltip names its rank and
value), clicks on the heatmap select a rank and step, the overview leads to a finding's
evidence and on to its timeline; and every page is judged at 1280, 1440 and 1920 px by
what a person can read (``tests.helpers.ui_seen``). Screenshots of each page at each width go to
``$RANKSIGHT_TEST_ARTIFACTS`` (default ``tests/artifacts/ui``; docs/img holds a set)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from ranksight.store import open_store
from ranksight.ui.figures import heatmap as hm
from tests.helpers import ui_seen as seen
from tests.helpers.ui_stores import compute_ms, demo_run, step_wall_ms, straggler

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
ARTIFACTS = os.environ.get("RANKSIGHT_TEST_ARTIFACTS") or os.path.join(
    os.path.dirname(os.path.dirname(__file__)), "artifacts", "ui"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"ranksight ui exited with {proc.returncode}"
        try:
            with urllib.request.urlopen(url + "/_stcore/health", timeout=2) as r:
                if r.read().strip() == b"ok":
                    return
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"ranksight ui did not answer at {url} within {timeout_s:.0f} s")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """`ranksight ui` on the demo store, on a free loopback port: (base URL, run)."""
    run = demo_run(tmp_path_factory)
    port = free_port()
    cmd = [sys.executable, "-m", "ranksight.cli", "ui", "--store", run.store, "--port", str(port)]
    log = open(tmp_path_factory.mktemp("ui_log") / "ui.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base, proc)
        yield base, run
    finally:
        proc.terminate()
        proc.wait(20)
        log.close()


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    assert os.path.exists(CHROMIUM), f"{CHROMIUM} missing: apt-get install chromium"
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        yield b
        b.close()


def settle(page) -> None:
    """Wait until the app finished its script run: a heading drawn (every page has one;
    before it the page may be blank with no status widget yet), then no 'running'
    status widget, and every table's cells drawn (its grid loads after the page)."""
    page.wait_for_selector("[data-testid=stApp]", timeout=60_000)
    page.wait_for_selector("[data-testid=stMain] [data-testid=stHeading]", timeout=90_000)
    page.wait_for_function(
        "() => !document.querySelector('[data-testid=stStatusWidget]')", timeout=90_000
    )
    page.wait_for_function(TABLES_DRAWN, timeout=60_000)
    page.wait_for_timeout(500)


TABLES_DRAWN = """() => Array.from(document.querySelectorAll('[data-testid=stDataFrame]'))
  .every((d) => d.querySelector('canvas') && d.querySelector('[data-testid^=glide-cell]'))"""
"""Every table's grid drawn with its cells (the pages' tables all have rows)."""


def open_page(browser, base: str, query: str):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(f"{base}/?{query}")
    settle(page)
    return page


def plot(page, n: int = 0):
    """The n-th Plotly graph div, once drawn."""
    page.wait_for_selector(".js-plotly-plot .main-svg", timeout=60_000)
    return page.locator(".js-plotly-plot").nth(n)


ECHARTS_DRAWN = """(sel) => {
  const el = document.querySelector(sel + ' [data-testid=stEChartsChart][aria-busy=false]');
  const c = el && el.querySelector('canvas');
  return !!(c && c.width > 0 && c.height > 0);
}"""


def echart(page, key: str):
    """The ECharts chart of widget key ``key`` (CSS class ``st-key-<key>...``), once its
    option is set and its canvas drawn (animation is off: that is its final state)."""
    sel = f'[class*="st-key-{key}"]'
    page.wait_for_function(ECHARTS_DRAWN, arg=sel, timeout=60_000)
    return page.locator(f"{sel} [data-testid=stEChartsChart]").first


TOOLTIP = """(el) => {
  for (const d of el.querySelectorAll('div')) {
    const s = getComputedStyle(d);
    if (s.zIndex === '9999999' && s.display !== 'none' && s.opacity === '1') return d.innerText;
  }
  return '';
}"""


def tooltip(page, chart, x: float, y: float, expect: str) -> str:
    """Hover (x, y) in ``chart`` (px from its top left) and return ECharts' tooltip text
    once it holds ``expect`` (fails naming what it held after 10 s)."""
    box = chart.bounding_box()
    page.mouse.move(box["x"] + x, box["y"] + y)
    text, deadline = "", time.monotonic() + 10
    while time.monotonic() < deadline:
        text = chart.evaluate(TOOLTIP)
        if expect in text:
            return text
        page.wait_for_timeout(50)
    raise AssertionError(f"tooltip at ({x:.0f}, {y:.0f}) is {text!r}, wanted {expect!r} in it")


def cell_center(chart, rows: int, cols: int, row: int, col: int) -> tuple[float, float]:
    """Where cell (row, col) of the heatmap is drawn (px from the chart's top left), by
    the figure's layout constants (the cells' grid, row 0 at the top)."""
    box = chart.bounding_box()
    x0, x1 = hm.LABELS + hm.STRIP_W + hm.GAP, box["width"] - hm.RIGHT
    y0, y1 = hm.TOP, box["height"] - (hm.BOTTOM + hm.STRIP_H + hm.GAP)
    return x0 + (col + 0.5) * (x1 - x0) / cols, y0 + (row + 0.5) * (y1 - y0) / rows


def pixels(chart, x: float, y: float) -> list[list[int]]:
    """The RGBA at (x, y) px (CSS px from the chart's top left) of each of the chart's
    canvases (ECharts draws some parts on layers of their own)."""
    return chart.evaluate(
        """(el, [x, y]) => {
          const e = el.getBoundingClientRect();
          return Array.from(el.querySelectorAll('canvas'), (c) => {
            const r = c.getBoundingClientRect(), k = c.width / r.width;
            const px = Math.round((x - (r.left - e.left)) * k), py = Math.round((y - (r.top - e.top)) * k);
            return Array.from(c.getContext('2d').getImageData(px, py, 1, 1).data);
          });
        }""",
        [x, y],
    )


def shot(page, name: str) -> None:
    """A screenshot of what the window shows (not the whole page), in few colours (a
    small PNG), as ``<name>.png`` under ARTIFACTS."""
    from PIL import Image

    os.makedirs(ARTIFACTS, exist_ok=True)
    path = os.path.join(ARTIFACTS, f"{name}.png")
    page.screenshot(path=path)
    Image.open(path).convert("RGB").quantize(colors=256).save(path, optimize=True)


PAGES = ("runs", "overview", "heatmap", "timeline", "mesh", "hang", "hosts")
WIDTHS = (1280, 1440, 1920)
"""Window widths (px) every page is judged at: a laptop, a larger laptop, a desktop."""
ROW_PX = 28
"""The least height (px) a timeline row may get: room for its label and its bars."""


def test_every_page_is_readable_at_every_width(server, browser):
    """Each page at each width in Chromium: drawn without an error, and readable: no
    text over another, no legend over a plot, no cut headline number; the timeline's
    every rank row labelled and at least ROW_PX high, its x axis spanning the step
    (a bar past the step's end clipped, not stretching the axis)."""
    base, run = server
    with open_store(run.store) as s:
        worst, walls = worst_step(s, run.run_id), step_wall_ms(s, run.run_id)
    problems = []
    for width in WIDTHS:
        for name in PAGES:
            visits = [("", None)] + ([(f"&step={worst}", worst)] if name == "timeline" else [])
            for extra, step in visits:
                page = browser.new_page(viewport={"width": width, "height": 900})
                page.goto(f"{base}/?page={name}&run={run.run_id}{extra}")
                settle(page)
                where = f"{name}{extra} at {width} px"
                problems += [f"{where}: {p}" for p in seen_problems(page, name, run, walls, step)]
                if not extra:
                    shot(page, f"ui-{name}-{width}")
                page.close()
    assert not problems, "\n".join(problems)


def seen_problems(page, name: str, run, walls, step: int | None) -> list[str]:
    """What a person could not read on page ``name`` (see ``tests.helpers.ui_seen``); ``walls``:
    step -> wall time (ms) from the stored rows; ``step``: the timeline's, if linked."""
    heading = page.locator("[data-testid=stMain] [data-testid=stHeading]").first.inner_text()
    assert (run.run_id if name != "runs" else "Runs") in heading, (name, heading)
    out = [f"error shown: {e}" for e in page.locator("[data-testid=stException]").all_inner_texts()]
    if page.locator("[data-testid=stEChartsChartError]").count():
        out.append("an ECharts chart failed")
    out += [f"headline value cut: {v!r}" for v in page.evaluate(seen.METRICS_CUT)]
    if name in ("overview", "heatmap"):
        got = echart(page, f"{name}_chart").evaluate(seen.ECHARTS_SEEN)
        assert got is not None, f"no ECharts instance found on {name}"
        out += seen.echarts_problems(got, lambda t: "from here" in t or "hung" in t)
        if page.locator(".js-plotly-plot").count():
            out.append("Plotly loaded on an ECharts page")
    if name in ("timeline", "mesh", "hosts"):
        got = plot(page).evaluate(seen.PLOTLY_SEEN)
        out += seen.plotly_problems(got, lambda t: name == "mesh" and t.isdigit())
        if name == "timeline":
            step = step if step is not None else page_step(page)
            out += timeline_problems(got, run.world, walls[step], step)
    return out


def page_step(page) -> int:
    """The step the Timeline page shows (its Step input)."""
    return int(page.get_by_label("Step", exact=True).input_value())


def timeline_problems(got: dict, world: int, step_ms: float, step: int) -> list[str]:
    """Rank rows: every one labelled, each at least ROW_PX high; x axis: spans the
    step's wall time (first start to last end over all ranks), the step >= 80% of it."""
    out = []
    ticks = [t["text"] for t in got["texts"] if t["cls"] == "ytick"]
    for label in got["categories"]:
        if not any(label in t for t in ticks):
            out.append(f"rank row {label!r} has no label (labels shown: {ticks})")
    if len(got["categories"]) != world:
        out.append(f"{len(got['categories'])} rank rows, want {world}")
    per_row = got["plot"][3] / max(len(got["categories"]), 1)
    if per_row < ROW_PX:
        out.append(
            f"rank rows {per_row:.1f} px high (plot {got['plot'][3]:.0f} px), want >= {ROW_PX}"
        )
    lo, hi = got["xrange"]
    if lo > 1 or hi < step_ms - 1 or step_ms / (hi - lo) < 0.8:
        out.append(f"x axis {lo:.0f}..{hi:.0f} ms for step {step} of {step_ms:.0f} ms")
    return out


def worst_step(store, run_id: str) -> int:
    """The step with the completed collective that ends furthest past its step's end
    (over all ranks): the one a timeline is most easily stretched by."""
    coll = store.query(
        "SELECT step, end_ns FROM collectives WHERE run_id = %(r)s AND end_ns > 0", {"r": run_id}
    )
    steps = store.query("SELECT step, end_ns FROM steps WHERE run_id = %(r)s", {"r": run_id})
    over = coll["end_ns"] - coll["step"].map(steps.groupby("step")["end_ns"].max())
    return int(coll.loc[over.idxmax(), "step"])


def test_heatmap_and_timeline_hold_every_rank(server, browser):
    base, run = server
    page = open_page(browser, base, f"page=heatmap&run={run.run_id}&order=rank")
    chart = echart(page, "heatmap_chart")
    with open_store(run.store) as s:
        want = compute_ms(s, run.run_id)
    col = run.steps - 1
    for rank in range(run.world):  # rows are ranks in rank order, one row each
        x, y = cell_center(chart, run.world, run.steps, rank, col)
        text = tooltip(page, chart, x, y, f"r{rank} dp")
        lines = text.splitlines()
        assert lines[0].split(" ")[-4] == f"r{rank}" and lines[1] == f"step {col}", text
        assert float(lines[2].split(" ")[0]) == pytest.approx(want.loc[rank, col], abs=0.006)
        drawn = [p for p in pixels(chart, x, y) if p[3] == 255 and p[:3] != [255, 255, 255]]
        assert drawn, (rank, pixels(chart, x, y))  # a colored cell
    page.close()
    page = open_page(browser, base, f"page=timeline&run={run.run_id}&step=6")
    ranks = plot(page).evaluate("g => g.layout.yaxis.categoryarray.length")
    drawn = page.locator(".js-plotly-plot .barlayer .point").count()
    assert ranks == run.world and drawn > run.world * 4  # phases and collectives of each rank
    page.close()


def click_at(page, chart, x: float, y: float) -> None:
    """A real mouse click at (x, y) px from the chart's top left (ECharts draws on a
    canvas: the click lands on whatever is drawn there, as for a user)."""
    box = chart.bounding_box()
    page.mouse.click(box["x"] + x, box["y"] + y)


def test_clicks_on_the_heatmap_select_a_rank_and_a_step(server, browser):
    base, run = server
    page = open_page(browser, base, f"page=heatmap&run={run.run_id}&order=rank")
    chart = echart(page, "heatmap_chart")
    _, y = cell_center(chart, run.world, run.steps, run.culprit, 0)
    click_at(page, chart, hm.LABELS + hm.STRIP_W - 3, y)  # the rank strip's bar
    page.wait_for_url(f"**rank={run.culprit}**", timeout=30_000)
    settle(page)
    chart = echart(page, f"heatmap_chart_{run.culprit}_None")
    x, _ = cell_center(chart, run.world, run.steps, 0, run.steps - 2)
    click_at(page, chart, x, chart.bounding_box()["height"] - hm.BOTTOM - 3)  # step strip
    page.wait_for_url(f"**step={run.steps - 2}**", timeout=30_000)
    settle(page)
    page.get_by_text(f"rank {run.culprit} (host").wait_for(timeout=30_000)
    assert page.get_by_text("a culprit").count() == 1
    chart = echart(page, f"heatmap_chart_{run.culprit}_{run.steps - 2}")
    click_at(page, chart, *cell_center(chart, run.world, run.steps, 2, 3))  # a cell
    page.wait_for_url(lambda url: "rank=2&" in url + "&" and "step=3&" in url + "&", timeout=30_000)
    page.close()


def test_overview_leads_to_a_findings_evidence_and_its_timeline(server, browser):
    base, run = server
    page = open_page(browser, base, f"page=overview&run={run.run_id}")
    echart(page, "overview_chart")
    index = straggler(run.store, run.run_id)[0]  # findings are listed by impact
    page.get_by_role("button", name="Evidence").nth(index).click()
    page.wait_for_url("**finding=**", timeout=30_000)
    settle(page)
    page.get_by_text(f"Evidence for rank {run.culprit}").wait_for(timeout=30_000)
    page.get_by_text("peers ms (median)").first.wait_for(timeout=30_000)  # the phase table
    page.get_by_text("victim rank").first.wait_for(timeout=30_000)
    shot(page, "finding")
    page.get_by_role("button", name="Timeline").nth(index).click()
    page.wait_for_url("**page=timeline**", timeout=30_000)
    settle(page)
    assert plot(page).evaluate("g => g.layout.yaxis.categoryarray.length") == run.world
    assert f"rank={run.culprit}" in page.url
    page.close()
