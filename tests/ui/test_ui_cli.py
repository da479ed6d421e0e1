"""`ranksight ui`: loopback by default, the store URL passed through, bad input refused
with one line."""

from __future__ import annotations

import os
import subprocess
import sys

from ranksight.ground import env
from ranksight.store import open_store
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


def test_a_missing_store_folder_is_refused_as_runs_and_report_refuse_it(tmp_path):
    missing = tmp_path / "typo" / "store"
    out = ui("--store", str(missing))
    errors = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert out.returncode == 1 and len(errors) == 1, out.stderr
    assert errors[0].startswith(f"error: no store at {missing}")
    assert "ranksight UI on" not in out.stdout and not (tmp_path / "typo").exists()


def test_a_port_in_use_is_named_with_the_option_that_moves_it(tmp_path):
    import socket

    store = tmp_path / "store"
    open_store(str(store)).init_schema()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = ui("--store", str(store), "--port", str(port))
    errors = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert out.returncode == 1 and len(errors) == 1, out.stderr
    assert f"port {port} on 127.0.0.1 is in use" in errors[0] and "--port" in errors[0]
    assert "ranksight UI on" not in out.stdout  # no URL that points at the other server


def test_sigterm_stops_the_streamlit_server_too(tmp_path):
    import socket
    import time
    import urllib.request

    import psutil

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = tmp_path / "store"
    open_store(str(store)).init_schema()
    cmd = [sys.executable, "-m", "ranksight.cli", "ui", "--store", str(store), "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    children = []
    try:
        for _ in range(120):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2):
                    break
            except OSError:
                time.sleep(0.5)
        children = psutil.Process(proc.pid).children(recursive=True)
        assert children, "ranksight ui started no server"
        proc.terminate()  # SIGTERM, as systemd or kill sends
        proc.wait(60)
        gone, alive = psutil.wait_procs(children, timeout=30)
        assert not alive, [p.pid for p in alive]
    finally:
        for p in [*children, psutil.Process(proc.pid)] if proc.poll() is None else children:
            if p.is_running():
                p.kill()
