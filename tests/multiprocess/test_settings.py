"""Configuration precedence: built-in defaults < environment variables < the TOML file <
flags; ``ranksight config show`` prints what is in force and where it came from."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ranksight.cli.settings import ConfigError, load_settings, resolve
from ranksight.ground import env


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    for name in (
        env.STORE,
        env.SPOOL_DIR,
        env.LEVEL,
        env.MESH,
        env.AUTO_ATTACH,
        env.OTLP_ENDPOINT,
        env.CONFIG,
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)  # no ./ranksight.toml
    return monkeypatch


def test_env_over_defaults_file_over_env_flags_over_all(clean_env, tmp_path):
    assert load_settings()["launch.level"] == "default"
    clean_env.setenv(env.LEVEL, "detailed")
    clean_env.setenv(env.STORE, "/env/store")
    clean_env.setenv(env.AUTO_ATTACH, "0")
    got = resolve()
    assert got["launch.level"] == ("detailed", "$RANKSIGHT_LEVEL")
    assert got["launch.auto_attach"] == (False, "$RANKSIGHT_AUTO_ATTACH")
    path = tmp_path / "r.toml"
    path.write_text('[store]\nurl = "clickhouse://h:9000/db"\n[agent]\ninterval_s = 2\n')
    got = resolve(str(path))
    assert got["store.url"] == ("clickhouse://h:9000/db", str(path))
    assert got["agent.interval_s"] == (2.0, str(path))
    assert got["launch.level"] == ("detailed", "$RANKSIGHT_LEVEL")  # the file does not set it
    got = resolve(str(path), {"store.url": "/flag/store", "agent.interval_s": None})
    assert got["store.url"] == ("/flag/store", "flag")
    assert got["agent.interval_s"] == (2.0, str(path))  # None: flag not given
    clean_env.setenv(env.CONFIG, str(path))
    assert load_settings()["store.url"] == "clickhouse://h:9000/db"
    (tmp_path / "ranksight.toml").write_text('[launch]\nmesh = "dp=2"\n')
    clean_env.delenv(env.CONFIG)
    assert resolve()["launch.mesh"] == ("dp=2", "ranksight.toml")


def test_bad_configuration_is_named(clean_env, tmp_path):
    with pytest.raises(ConfigError, match="--config /nope.toml: no such file"):
        load_settings("/nope.toml")
    path = tmp_path / "r.toml"
    path.write_text("[agent]\nintervall = 1\n")
    with pytest.raises(ConfigError, match="unknown setting 'agent.intervall' .*agent.interval_s"):
        load_settings(str(path))
    path.write_text("[agent\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_settings(str(path))
    path.write_text("level = 'x'\n")
    with pytest.raises(ConfigError, match="settings go in \\[sections\\]"):
        load_settings(str(path))
    clean_env.setenv(env.AUTO_ATTACH, "maybe")
    with pytest.raises(ConfigError, match=r"\$RANKSIGHT_AUTO_ATTACH: want bool, got 'maybe'"):
        load_settings()


@pytest.mark.parametrize(
    "line, said",
    [("batch_rows = 2000000", "agent.batch_rows: 2000000 is out of range (want at least 1 and at most 1000000)"),
     ("batch_rows = 0", "agent.batch_rows: 0 is out of range (want at least 1 and at most 1000000)"),
     ("interval_s = 0", "agent.interval_s: 0.0 is out of range (want at least 0.05)"),
     ("buffer_mb = -5", "agent.buffer_mb: -5 is out of range (want at least 1)"),
     ("stall_s = 0.5", "agent.stall_s: 0.5 is out of range (want at least 1)"),
     ("interval_s = nan", "agent.interval_s: nan is not a finite number"),
     ("stats_interval_s = inf", "agent.stats_interval_s: inf is not a finite number")],
)  # fmt: skip
def test_a_value_out_of_range_names_the_file_and_key(clean_env, tmp_path, line, said):
    """The bounds the command-line flags have hold for the file too, named there: the
    agent would otherwise refuse the value later without saying where it came from."""
    path = tmp_path / "r.toml"
    path.write_text(f"[agent]\n{line}\n")
    with pytest.raises(ConfigError) as got:
        load_settings(str(path))
    assert str(got.value) == f"{path}: {said}"
    path.write_text("[agent]\nbatch_rows = 1000000\ninterval_s = 0.05\n")
    assert load_settings(str(path))["agent.batch_rows"] == 1_000_000


def test_config_show_prints_values_and_sources(clean_env, tmp_path):
    path = tmp_path / "r.toml"
    path.write_text("[agent]\nbuffer_mb = 64\n")
    run_env = {**os.environ, env.LEVEL: "off"}
    out = subprocess.run([sys.executable, "-m", "ranksight.cli", "config", "show", "--config", str(path)],
                         capture_output=True, text=True, env=run_env, cwd=tmp_path)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert f"buffer_mb = 64  # {path}" in out.stdout
    assert 'level = "off"  # $RANKSIGHT_LEVEL' in out.stdout
    assert "interval_s = 1.0  # default" in out.stdout and "[store]" in out.stdout
    bad = subprocess.run([sys.executable, "-m", "ranksight.cli", "config", "show", "--config", "/nope"],
                         capture_output=True, text=True, cwd=tmp_path)  # fmt: skip
    assert bad.returncode == 2 and "no such file" in bad.stderr


def test_agent_takes_unset_flags_from_the_file_and_flags_win(clean_env, tmp_path):
    wide = {**os.environ, "COLUMNS": "200"}
    path = tmp_path / "r.toml"
    (tmp_path / "spool").mkdir()
    path.write_text(
        f'[store]\nurl = "{tmp_path / "file-store"}"\n[agent]\nspool = "{tmp_path / "spool"}"\n'
    )
    cmd = [sys.executable, "-m", "ranksight.cli", "agent", "--once", "--config", str(path)]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=wide)
    assert out.returncode == 0, out.stderr
    # an empty spool: no record read; the one row stored is the agent's own stats
    assert "read 0 records from the spool (0 rejected) and stored 1 row" in out.stdout
    assert (tmp_path / "file-store").is_dir() and list((tmp_path / "spool").glob(".agent-*"))
    out = subprocess.run(
        [*cmd, "--store", str(tmp_path / "flag-store")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "flag-store").is_dir()
    path.write_text('[agent]\ndrop = "drop_everything"\n')
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 2 and "drop_everything" in out.stderr
