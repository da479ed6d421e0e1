"""End to end, real processes: `ranksight demo` trains 8 gloo ranks (DP2 x TP2 x PP2) with
the hooks, a node agent ships the records, the analyzer names the culprit."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.training

SLOW = "slow:rank=5,factor=3,from_step=4"


def ranksight(*args: str, home: str, timeout: float = 900) -> subprocess.CompletedProcess:
    """Run the real CLI in a fresh process with ``home`` as RANKSIGHT_HOME."""
    env = {**os.environ, "RANKSIGHT_HOME": home, "COLUMNS": "120"}
    env.pop("RANKSIGHT_STORE", None)
    return subprocess.run(
        [sys.executable, "-m", "ranksight.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def demo_json(home: str, store: str, inject: str, steps: int = 16):
    out = ranksight(
        "demo",
        "--inject",
        inject,
        "--steps",
        str(steps),
        "--store",
        store,
        "--format",
        "json",
        home=home,
    )
    assert out.returncode in (0, 3), out.stdout[-2000:] + out.stderr[-4000:]
    return out.returncode, json.loads(out.stdout), out.stderr


def check_slow_rank_named(code: int, doc: dict, stderr: str) -> None:
    assert "rank 5" in stderr and "dp=1, tp=1, pp=0" in stderr  # said up front
    assert code == 3 and doc["culprit_found"]
    top = doc["findings"][0]
    assert (top["culprit_rank"], top["cause"], top["kind"]) == (5, "compute", "straggler")
    assert (top["dp"], top["tp"], top["pp"]) == (1, 1, 0)
    assert top["host"]
    ev = top["evidence"]
    assert ev["phases"]["forward"]["ratio"] > 1.8 and ev["phases"]["backward"]["ratio"] > 1.8
    assert ev["waited_for_it"]["total_ms"] > 0 and ev["waited_for_it"]["victims"]
    assert 5 < top["impact_pct"] < 90
    assert len(doc["findings"]) == 1, doc["findings"]


def test_demo_names_the_slow_rank_on_chdb(tmp_path):
    home = str(tmp_path)
    code, doc, stderr = demo_json(home, os.path.join(home, "store"), SLOW)
    check_slow_rank_named(code, doc, stderr)
    # the findings were stored for the UI
    from ranksight.analyzer.queries import load_findings
    from ranksight.store import open_store

    stored = load_findings(open_store(os.path.join(home, "store")), doc["run_id"], 0)
    assert list(stored["culprit_rank"]) == [5] and list(stored["cause"]) == ["compute"]
    # the stored run can be listed and re-reported, in text and JSON
    runs = ranksight("runs", "--store", os.path.join(home, "store"), home=home)
    assert runs.returncode == 0 and doc["run_id"] in runs.stdout and "finished" in runs.stdout
    text = ranksight(
        "report", "--run", doc["run_id"], "--store", os.path.join(home, "store"), home=home
    )
    assert text.returncode == 3 and "rank 5" in text.stdout and "compute" in text.stdout


def test_clean_demo_names_no_one_on_chdb(tmp_path):
    code, doc, _ = demo_json(str(tmp_path), str(tmp_path / "store"), "none")
    assert code == 0 and doc["findings"] == [] and not doc["culprit_found"], doc["findings"]


@pytest.mark.clickhouse
def test_demo_names_the_slow_rank_on_clickhouse(tmp_path, clickhouse_db_url):
    check_slow_rank_named(*demo_json(str(tmp_path), clickhouse_db_url, SLOW))


@pytest.mark.clickhouse
def test_clean_demo_names_no_one_on_clickhouse(tmp_path, clickhouse_db_url):
    code, doc, _ = demo_json(str(tmp_path), clickhouse_db_url, "none")
    assert code == 0 and doc["findings"] == [], doc["findings"]


def test_rank_dying_mid_run_is_named_and_what_was_collected_stays(tmp_path):
    home, store = str(tmp_path), str(tmp_path / "store")
    out = ranksight(
        "demo",
        "--inject",
        "crash:rank=6,from_step=5",
        "--steps",
        "10",
        "--store",
        store,
        "--format",
        "json",
        home=home,
    )
    assert out.returncode == 1, out.stderr[-3000:]
    errors = [ln for ln in out.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "rank 6 failed first (exit code 17)" in errors[0]
    doc = json.loads(out.stdout)
    assert doc["status"] == "failed" and doc["steps_analyzed"] >= 3
    runs = ranksight("runs", "--store", store, home=home)
    assert doc["run_id"] in runs.stdout and "crashed" in runs.stdout  # as the UI says it
    again = ranksight(
        "report", "--run", doc["run_id"], "--store", store, "--format", "json", home=home
    )
    assert again.returncode in (0, 3) and json.loads(again.stdout)["steps_analyzed"] >= 3


def test_hang_is_localized_live_and_the_job_stopped(tmp_path):
    home, store = str(tmp_path), str(tmp_path / "store")
    out = ranksight(
        "demo",
        "--inject",
        "hang:rank=3,from_step=5",
        "--steps",
        "10",
        "--store",
        store,
        "--format",
        "json",
        home=home,
    )
    assert out.returncode == 3, out.stderr[-3000:]
    assert "hung" in out.stderr
    doc = json.loads(out.stdout)
    assert doc["status"] == "hung"
    kinds = [(f["kind"], f["culprit_rank"], f["cause"]) for f in doc["findings"]]
    assert kinds == [("hang", 3, "stuck")], kinds
    hang = doc["findings"][0]["evidence"]
    assert hang["waiting_on_root"] and 3 not in hang["waiting_on_root"][0]["blocked_ranks"]
