"""``ranksight report --steps/--since/--watch``: analyzing part of a run, following one."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ranksight.analyzer import analyze
from ranksight.analyzer.window import StepWindow, parse_since, parse_steps
from ranksight.store import open_store
from ranksight.synthetic import SynthConfig, write_synthetic


def test_window_and_duration_specs():
    assert parse_steps("3:7") == StepWindow(3, 7)
    assert parse_steps("5:") == StepWindow(5, None) and parse_steps(":4") == StepWindow(None, 4)
    assert parse_steps("9") == StepWindow(9, 9)
    for bad in ("a:b", "7:3", "-1:"):
        with pytest.raises(ValueError, match="--steps|empty"):
            parse_steps(bad)
    assert parse_since("90s") == 90 and parse_since("10m") == 600 and parse_since("2h") == 7200
    assert parse_since("1.5d") == 129600 and parse_since(" 30 s ") == 30
    with pytest.raises(ValueError, match=r"--since '10': a number needs a unit: 10s, 10m, 10h"):
        parse_since("10")  # a bare number is not taken as seconds
    for bad in ("0s", "ten minutes", "5y"):
        with pytest.raises(ValueError, match="--since"):
            parse_since(bad)


@pytest.fixture(scope="module")
def slow_run(tmp_path_factory):
    url = str(tmp_path_factory.mktemp("store"))
    store = open_store(url)
    store.init_schema()
    cfg = SynthConfig(
        dp=2, tp=2, pp=2, steps=30, run_id="win", faults=("slow:rank=5,factor=2,from_step=15",)
    )
    write_synthetic(store, cfg)
    return url, store


def test_a_window_before_the_fault_names_no_one_and_one_after_names_the_rank(slow_run):
    _, store = slow_run
    before = analyze(store, "win", window=StepWindow(0, 13))
    assert before.findings == [] and "analyzed steps 0-13 only" in before.notes
    after = analyze(store, "win", window=StepWindow(14, None))
    assert [(f.kind, f.culprit_rank) for f in after.findings] == [("straggler", 5)]
    assert after.steps_analyzed < analyze(store, "win", save=False).steps_analyzed


def test_a_window_counts_both_ends_and_a_one_step_window_is_analyzed(slow_run):
    _, store = slow_run
    whole = analyze(store, "win", save=False).steps_analyzed  # the run's step 0 is warm-up
    assert whole == 29
    assert analyze(store, "win", window=StepWindow(0, 3)).steps_analyzed == 3
    assert analyze(store, "win", window=StepWindow(22, 23)).steps_analyzed == 2
    assert analyze(store, "win", window=StepWindow(7, 7)).steps_analyzed == 1
    empty = analyze(store, "win", window=StepWindow(100, 200))
    assert empty.steps_analyzed == 0 and empty.findings == []


def test_report_says_no_steps_were_compared_for_an_empty_window(slow_run):
    url, _ = slow_run
    out = subprocess.run(
        [sys.executable, "-m", "ranksight.cli", "report", "--store", url, "--run", "win",
         "--steps", "100:200"], capture_output=True, text=True, timeout=120,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "No step records to compare ranks on" in out.stdout
    assert "No culprit found" not in out.stdout


def test_report_cli_takes_the_window_and_refuses_both(slow_run):
    url, _ = slow_run
    env = {**os.environ, "COLUMNS": "200"}
    run = [sys.executable, "-m", "ranksight.cli", "report", "--run", "win", "--store", url]
    out = subprocess.run(
        [*run, "--steps", "0:13", "--format", "json"], capture_output=True, text=True, env=env
    )
    assert out.returncode == 0, out.stderr[-2000:]
    out = subprocess.run([*run, "--steps", "14:"], capture_output=True, text=True, env=env)
    assert out.returncode == 3 and "rank 5" in out.stdout
    out = subprocess.run(
        [*run, "--steps", "1:2", "--since", "5m"], capture_output=True, text=True, env=env
    )
    assert out.returncode == 2 and "not both" in out.stderr
    out = subprocess.run([*run, "--since", "yesterday"], capture_output=True, text=True, env=env)
    assert out.returncode == 2 and "--since" in out.stderr
    # --watch on a run that is not running prints once and stops
    out = subprocess.run(
        [*run, "--watch", "--interval", "1"], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 3 and "done watching" in out.stdout


def test_the_report_gives_the_jobs_median_step_as_the_ui_does_and_a_ranks_own(slow_run):
    """The headline's median step is the job's (first rank's start to last rank's end, as
    the UI's overview shows it), with the median rank's own beside it; an empty window
    shows no median at all."""
    from rich.console import Console

    from ranksight.report import print_text, to_markdown

    _, store = slow_run
    a = analyze(store, "win", save=False)
    steps = store.query("SELECT step, start_ns, end_ns FROM steps WHERE run_id = 'win'")
    by = steps.groupby("step")
    wall = (by["end_ns"].max() - by["start_ns"].min()).sort_index().iloc[1:] / 1e6
    own = (steps["end_ns"] - steps["start_ns"]).groupby(steps["step"]).median().iloc[1:] / 1e6
    assert a.median_wall_step_ms == pytest.approx(wall.median())
    assert a.median_step_ms == pytest.approx(own.median())
    assert a.median_wall_step_ms > a.median_step_ms  # the slow rank sets the job's step
    console = Console(record=True, width=200)
    print_text(a, console)
    head = console.export_text().splitlines()[0]
    assert f"median step {wall.median():.0f} ms (a rank's own: {own.median():.0f} ms)" in head
    assert f"median step {wall.median():.0f} ms" in to_markdown(a)
    empty = analyze(store, "win", window=StepWindow(500, 600))
    console = Console(record=True, width=200)
    print_text(empty, console)
    assert "0 steps analyzed" in console.export_text() and "median" not in console.export_text()


def test_runs_lists_what_the_ui_runs_page_shows(slow_run):
    """``ranksight runs`` (piped: no terminal width) prints each run's row of the UI's
    Runs table whole: start (UTC), status, steps, median step and findings."""
    from ranksight.ui.data.runs import runs_table

    url, store = slow_run
    analyze(store, "win")  # saved: the latest analysis gives the findings count
    (row,) = runs_table(store).to_dict("records")
    out = subprocess.run(
        [sys.executable, "-m", "ranksight.cli", "runs", "--store", url],
        capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "60"},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    (line,) = [x for x in out.stdout.splitlines() if " win " in x]
    cells = [c.strip() for c in line.strip("│ ").split("│")]
    from ranksight.cli.runs import started

    assert cells == [
        "win", "0", started(row["started_ns"]), row["status"], str(row["world_size"]),
        f"{row['dp']} x {row['tp']} x {row['pp']}", str(row["steps"]),
        f"{row['step_ms']:.0f}", str(row["findings"]),
    ]  # fmt: skip
    assert row["findings"] >= 1 and row["steps"] == 30
