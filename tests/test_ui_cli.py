"""`ranksight ui`: loopback by default, the store URL passed through, bad input refused
with one line."""

from __future__ import annotations

import os
import subprocess
import sys

from ranksight import env
from ranksight.ui.launch import LaunchConfig, child_env, page_url, streamlit_command


def ui(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ranksight.cli", "ui", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_server_binds_loopback_and_gets_the_store_url():
    cfg = LaunchConfig(store="clickhouse://db.example:9000/rs")
    cmd = streamlit_command(cfg)
    assert cmd[cmd.index("--server.address") + 1] == "127.0.0.1"
    assert cmd[cmd.index("--server.headless") + 1] == "true"
    assert cmd[cmd.index("--browser.gatherUsageStats") + 1] == "false"
    assert child_env(cfg)[env.STORE] == "clickhouse://db.example:9000/rs"
    assert (
        page_url(cfg, page="overview", run="r 1") == "http://127.0.0.1:8501/?page=overview&run=r+1"
    )


def test_unreachable_store_and_bad_port_fail_with_one_line():
    out = ui("--store", "clickhouse://127.0.0.1:1/ranksight")
    errors = [ln for ln in out.stderr.splitlines() if ln.startswith("error:")]
    assert out.returncode == 1 and len(errors) == 1 and "127.0.0.1:1" in errors[0]
    out = ui("--store", os.devnull, "--port", "70000")
    assert out.returncode == 2 and "--port must be 1-65535" in out.stderr
