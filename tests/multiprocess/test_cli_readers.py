"""Readers read: ``report`` and ``runs`` change nothing in the store (no migration, no
findings unless ``report --save``), an older-schema store is an error naming the store
and ``ranksight db migrate``, and a one-shot ``import`` keeps nothing but reports as an
import into a store does (real chdb, real CLI processes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pandas as pd
import pytest

from ranksight.store import open_store, schema

DUMPS = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "import", "nccl_hang")


def cli(*args: str, cwd: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("RANKSIGHT_STORE", "RANKSIGHT_HOME")}
    return subprocess.run(
        [sys.executable, "-m", "ranksight.cli", *args],
        capture_output=True, text=True, timeout=300, cwd=cwd, env=env,
    )  # fmt: skip


def listing(folder: str) -> dict[str, tuple[int, int]]:
    """Every file under ``folder``: (size, mtime ns)."""
    out = {}
    for root, _, files in os.walk(folder):
        for name in files:
            st = os.stat(os.path.join(root, name))
            out[os.path.relpath(os.path.join(root, name), folder)] = (st.st_size, st.st_mtime_ns)
    return out


@pytest.fixture(scope="module")
def imported(tmp_path_factory) -> str:
    """A chdb store holding run ``hang`` imported from real Flight Recorder dumps."""
    home = str(tmp_path_factory.mktemp("readers"))
    store = os.path.join(home, "store")
    out = cli("import", DUMPS, "--store", store, "--run", "hang", "--no-report", cwd=home)
    assert out.returncode == 0, out.stderr
    return store


def test_report_and_runs_change_nothing_and_save_only_when_asked(imported, tmp_path):
    before = listing(imported)
    report = cli(
        "report", "--run", "hang", "--store", imported, "--format", "json", cwd=str(tmp_path)
    )
    assert report.returncode == 3, report.stderr
    assert json.loads(report.stdout)["findings"]
    runs = cli("runs", "--store", imported, cwd=str(tmp_path))
    assert runs.returncode == 0 and "hang" in runs.stdout, runs.stderr
    assert listing(imported) == before  # not one file written, touched or removed
    stored = open_store(imported).query("SELECT count() AS n FROM findings WHERE run_id = 'hang'")
    assert int(stored["n"].iloc[0]) == 0
    saved = cli("report", "--run", "hang", "--store", imported, "--save", cwd=str(tmp_path))
    assert saved.returncode == 3, saved.stderr
    stored = open_store(imported).query("SELECT count() AS n FROM findings WHERE run_id = 'hang'")
    assert int(stored["n"].iloc[0]) == len(json.loads(report.stdout)["findings"])


def test_an_older_schema_is_named_with_the_command_that_migrates_it(imported, tmp_path):
    import shutil

    old = str(tmp_path / "old")
    shutil.copytree(imported, old)
    shutil.rmtree(os.path.join(old, "schema_version"))
    shutil.rmtree(os.path.join(old, "rank_step_summary"), ignore_errors=True)
    s = open_store(old)
    os.makedirs(os.path.join(old, "schema_version"))
    s.insert(
        "schema_version", pd.DataFrame([{"version": schema.SCHEMA_VERSION - 1, "applied_ns": 1}])
    )
    before = listing(old)
    for command in (("report", "--run", "hang"), ("runs",)):
        out = cli(*command, "--store", old, cwd=str(tmp_path))
        assert out.returncode == 1, (command, out.stdout, out.stderr)
        assert f"{old}: store has schema version {schema.SCHEMA_VERSION - 1}, older" in out.stderr
        assert f"run 'ranksight db migrate --store {old}'" in out.stderr
    assert listing(old) == before
    assert cli("db", "migrate", "--store", old, cwd=str(tmp_path)).returncode == 0
    assert cli("report", "--run", "hang", "--store", old, cwd=str(tmp_path)).returncode == 3


def test_a_one_shot_import_keeps_nothing_and_reports_as_a_stored_one(tmp_path):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    shm = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    once = cli("import", DUMPS, "--run", "hang", "--format", "json", cwd=str(cwd))
    kept = cli("import", DUMPS, "--run", "hang", "--format", "json", "--store",
               str(tmp_path / "s"), cwd=str(cwd))  # fmt: skip
    assert once.returncode == kept.returncode == 3, once.stderr
    strip = ("analyzed_ns", "generated_ns")
    a, b = json.loads(once.stdout), json.loads(kept.stdout)
    for doc in (a, b):
        for key in strip:
            doc.pop(key, None)
    assert a == b
    assert "run hang is not kept: give --store to keep it" in once.stderr
    assert "not kept" not in kept.stderr
    assert os.listdir(cwd) == []  # no ./.ranksight/store made
    if shm:
        assert not {n for n in os.listdir("/dev/shm") if n.startswith("ranksight-memory-")} - shm


def test_the_memory_store_reads_empty_tables_typed_and_is_gone_at_close():
    s = open_store("memory:")
    folder = s.folder
    got = s.query("SELECT count() AS n, max(rank) AS r FROM steps")
    assert int(got["n"].iloc[0]) == 0 and str(got["r"].dtype) == "uint32"
    s.insert("ranks", pd.DataFrame([{"run_id": "m", "rank": 3, "host": "h"}]))
    got = s.query("SELECT rank, host FROM ranks WHERE run_id = %(r)s", {"r": "m"})
    assert got.to_dict("records") == [{"rank": 3, "host": "h"}]
    assert s.schema_version() == schema.SCHEMA_VERSION
    s.close()
    assert not os.path.exists(folder)
