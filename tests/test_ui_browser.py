"""The web UI in a real headless Chromium (Debian's package, driven by Playwright):
`ranksight ui` serves the demo run; every page is opened and drawn, the heatmap and
timeline hold every rank, a click on the heatmap selects a rank and step, the overview
leads to a finding's evidence and on to its timeline. Screenshots of each page go to
``$RANKSIGHT_TEST_ARTIFACTS`` (default ``tests/artifacts/ui``)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.ui_stores import demo_run, straggler

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
    os.path.dirname(__file__), "artifacts", "ui"
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
    """Wait until the app finished its script run (no 'running' status widget)."""
    page.wait_for_selector("[data-testid=stApp]", timeout=60_000)
    page.wait_for_function(
        "() => !document.querySelector('[data-testid=stStatusWidget]')", timeout=90_000
    )
    page.wait_for_timeout(500)


def open_page(browser, base: str, query: str):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(f"{base}/?{query}")
    settle(page)
    return page


def plot(page, n: int = 0):
    """The n-th Plotly graph div, once drawn."""
    page.wait_for_selector(".js-plotly-plot .main-svg", timeout=60_000)
    return page.locator(".js-plotly-plot").nth(n)


def shot(page, name: str) -> None:
    os.makedirs(ARTIFACTS, exist_ok=True)
    page.screenshot(path=os.path.join(ARTIFACTS, f"{name}.png"), full_page=True)


def test_every_page_draws_in_chromium(server, browser):
    base, run = server
    for name in ("runs", "overview", "heatmap", "timeline", "mesh", "hang", "hosts"):
        page = open_page(browser, base, f"page={name}&run={run.run_id}")
        assert not page.locator("[data-testid=stException]").count(), name
        if name in ("overview", "heatmap", "timeline", "mesh"):
            plot(page)
        shot(page, name)
        page.close()


def test_heatmap_and_timeline_hold_every_rank(server, browser):
    base, run = server
    page = open_page(browser, base, f"page=heatmap&run={run.run_id}")
    rows = plot(page).evaluate("g => g._fullData[0].z.length")
    cols = plot(page).evaluate("g => g._fullData[0].z[0].length")
    labels = plot(page).evaluate("g => Array.from(g._fullData[1].y)")
    assert (rows, cols) == (run.world, run.steps) and len(labels) == run.world
    assert page.locator(".js-plotly-plot .hm image").count() == 1  # the cells are drawn
    page.close()
    page = open_page(browser, base, f"page=timeline&run={run.run_id}&step=6")
    ranks = plot(page).evaluate("g => g.layout.yaxis.categoryarray.length")
    drawn = page.locator(".js-plotly-plot .barlayer .point").count()
    assert ranks == run.world and drawn > run.world * 4  # phases and collectives of each rank
    page.close()


def click_bar(page, trace: int, point: int) -> None:
    """A real mouse click on bar ``point`` of bar trace ``trace`` (Plotly's drag layer
    takes the events, as it does for a user)."""
    plot(page)
    box = (
        page.locator(".js-plotly-plot .barlayer .trace")
        .nth(trace)
        .locator(".point")
        .nth(point)
        .bounding_box()
    )
    page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] - 2)


def test_clicks_on_the_heatmap_strips_select_a_rank_and_a_step(server, browser):
    base, run = server
    page = open_page(browser, base, f"page=heatmap&run={run.run_id}&order=rank")
    click_bar(page, 0, run.culprit)  # rank strip, rows in rank order
    page.wait_for_url(f"**rank={run.culprit}**", timeout=30_000)
    settle(page)
    click_bar(page, 1, run.steps - 2)  # step strip
    page.wait_for_url(f"**step={run.steps - 2}**", timeout=30_000)
    settle(page)
    page.get_by_text(f"rank {run.culprit} (host").wait_for(timeout=30_000)
    assert page.get_by_text("a culprit").count() == 1
    page.close()


def test_overview_leads_to_a_findings_evidence_and_its_timeline(server, browser):
    base, run = server
    page = open_page(browser, base, f"page=overview&run={run.run_id}")
    plot(page)
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
