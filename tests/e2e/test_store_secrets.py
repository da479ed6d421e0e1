"""The store's password: split out of ``$RANKSIGHT_STORE`` once, handed to the agent by
environment only (never argv), never given to the training job, masked wherever a URL is
printed. The end-to-end test runs ``ranksight launch`` of a real job against a real 18.16
server whose user needs the password, and reads the processes' /proc while they run."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from ranksight.ground import env
from ranksight.launcher import LaunchConfig, job_environment
from ranksight.launcher.processes import job_env
from ranksight.store import StoreError, open_store
from ranksight.store.server import LocalServer, start_local_server
from ranksight.store.url import redact, split_password

SECRET = "Zq9s3cretPW"
WORKER = os.path.join(os.path.dirname(os.path.dirname(__file__)), "workers", "zero_code_job.py")


# ------------------------------------------------------------------ unit
@pytest.mark.parametrize(
    ("url", "public", "password", "shown"),
    [
        ("clickhouse://bob:Zq9s3cretPW@h:9000/db", "clickhouse://bob@h:9000/db", SECRET,
         "clickhouse://bob:***@h:9000/db"),
        ("clickhouses://bob:Zq9%2Fs3cret%40x@h/db", "clickhouses://bob@h/db", "Zq9/s3cret@x",
         "clickhouses://bob:***@h/db"),
        ("clickhouse://bob:Zq9/s3c@ret@h:9000/db", "clickhouse://bob@h:9000/db", "Zq9/s3c@ret",
         "clickhouse://bob:***@h:9000/db"),
        ("clickhouse://:Zq9s3cretPW@h/db", "clickhouse://h/db", SECRET, "clickhouse://:***@h/db"),
        ("clickhouse://bob@h/db", "clickhouse://bob@h/db", None, "clickhouse://bob@h/db"),
        ("clickhouse://h:9000/db", "clickhouse://h:9000/db", None, "clickhouse://h:9000/db"),
        ("/some/folder", "/some/folder", None, "/some/folder"),
        ("chdb:///a:b@c", "chdb:///a:b@c", None, "chdb:///a:b@c"),
    ],
)  # fmt: skip
def test_split_password_takes_the_secret_out_and_redact_masks_it(url, public, password, shown):
    assert split_password(url) == (public, password)
    assert redact(url) == shown


def test_redact_masks_urls_inside_messages():
    text = "store clickhouse://bob:Zq9/s3c@ret@h:9000/db failed; retry clickhouse://h:1/x"
    assert redact(text) == "store clickhouse://bob:***@h:9000/db failed; retry clickhouse://h:1/x"


def test_a_password_with_white_space_is_refused_without_echoing_it():
    with pytest.raises(StoreError, match="percent-encode") as caught:
        split_password("clickhouse://bob:Zq9 s3cretPW@h/db")
    assert "s3cret" not in str(caught.value) and "bob:***@h/db" in str(caught.value)


def test_open_store_takes_a_password_holding_slash_and_at():
    store = open_store("clickhouse://bob:Zq9/s3c@ret@127.0.0.1:9/db", connect=False)
    params = store.reopen_spec()["clickhouse"]
    assert (params["host"], params["port"], params["user"]) == ("127.0.0.1", 9, "bob")
    assert params["password"] == "Zq9/s3c@ret" and "s3c" not in store.url


def _no_secret(environ: dict[str, str]) -> list[str]:
    return [f"{k}={v}" for k, v in environ.items() if SECRET in v]


def test_the_jobs_environment_holds_no_password(monkeypatch, tmp_path):
    url = f"clickhouse://bob:{SECRET}@h:9000/db"
    secret_file = tmp_path / "pw"
    secret_file.write_text(SECRET)
    monkeypatch.setenv(env.STORE, url)
    monkeypatch.setenv(env.CH_PASSWORD, SECRET)
    monkeypatch.setenv(env.CH_PASSWORD_FILE, str(secret_file))
    for got in (job_environment(LaunchConfig(command=("x",)), "r1", "s", url),
                job_env("r1", "s", url)):  # fmt: skip
        assert _no_secret(got) == []
        assert got[env.STORE] == "clickhouse://bob@h:9000/db"
        assert env.CH_PASSWORD not in got and env.CH_PASSWORD_FILE not in got


def test_config_show_masks_the_password(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "ranksight.cli", "config", "show"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env={**os.environ, env.STORE: f"clickhouse://bob:{SECRET}@h:9000/db"},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert 'url = "clickhouse://bob:***@h:9000/db"' in out.stdout
    assert SECRET not in out.stdout + out.stderr


# ------------------------------------------------------------------ real launch
@pytest.fixture(scope="module")
def password_server(tmp_path_factory) -> LocalServer:
    """A private 18.16 server with user ``bob`` who needs :data:`SECRET` (added to its
    users.xml after start; the server reloads it within a few seconds)."""
    from clickhouse_driver import Client

    server = start_local_server(tmp_path_factory.mktemp("ch-pw"))
    users = Path(server.folder) / "users.xml"
    bob = (f"<bob><password>{SECRET}</password><networks><ip>127.0.0.1</ip></networks>"
           "<profile>default</profile><quota>default</quota></bob>")  # fmt: skip
    users.write_text(users.read_text().replace("</users>", bob + "</users>"))
    later = time.time() + 5  # a newer mtime than the first write, for the reloader
    os.utime(users, (later, later))
    deadline = time.monotonic() + 60
    while True:
        try:
            Client("127.0.0.1", port=server.tcp_port, user="bob", password=SECRET).execute(
                "SELECT 1"
            )
            break
        except Exception:
            if time.monotonic() > deadline:
                server.stop()
                raise
            time.sleep(0.3)
    yield server
    server.stop()


def _tree(root: psutil.Process) -> list[psutil.Process]:
    try:
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return [root]


def _in_agent(p: psutil.Process) -> bool:
    """Whether ``p`` is the node agent or one of its shipper processes."""
    try:
        return any(b"ranksight.cli\0agent" in _read(q.pid, "cmdline") for q in [p, *p.parents()])
    except psutil.Error:
        return False


def _read(pid: int, what: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/{what}").read_bytes()
    except OSError:
        return b""


@pytest.mark.training
@pytest.mark.clickhouse
def test_launch_keeps_the_password_off_argv_out_of_the_job_and_off_the_screen(
    tmp_path, password_server
):
    url = f"clickhouse://bob:{SECRET}@127.0.0.1:{password_server.tcp_port}/pwdb"
    home = tmp_path / "home"
    env_ = {**os.environ, env.HOME: str(home), env.STORE: url, "OMP_NUM_THREADS": "1"}
    for name in (env.RUN_ID, env.CH_PASSWORD, env.CH_PASSWORD_FILE, env.CH_USER):
        env_.pop(name, None)
    cmd = [sys.executable, "-m", "ranksight.cli", "launch", "--spool", str(tmp_path / "spool"),
           "--run-id", "pw-run", "--", sys.executable, "-m", "torch.distributed.run",
           "--standalone", "--nproc-per-node=2", WORKER, "6", "slow"]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env_, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    wrapper = psutil.Process(proc.pid)
    seen: dict[int, tuple[str, bytes, bytes]] = {}
    deadline = time.monotonic() + 240
    while proc.poll() is None and time.monotonic() < deadline:
        for p in _tree(wrapper)[1:]:
            cmdline, environ = _read(p.pid, "cmdline"), _read(p.pid, "environ")
            if cmdline:
                role = "agent" if _in_agent(p) else "job"
                if p.pid not in seen or len(environ) > len(seen[p.pid][2]):
                    seen[p.pid] = (role, cmdline, environ)
        time.sleep(0.2)
    out = proc.communicate(timeout=240)[0].decode()
    assert proc.returncode == 0, out[-3000:]
    roles = [r for r, _, _ in seen.values()]
    workers = [c for r, c, _ in seen.values() if WORKER.encode() in c and b"torch.distributed.run"
               not in c]  # fmt: skip
    assert "agent" in roles and len(workers) >= 2, seen
    for pid, (role, cmdline, environ) in seen.items():
        assert SECRET.encode() not in cmdline, (pid, role, cmdline)
        if role == "job":
            assert SECRET.encode() not in environ, (pid, cmdline)
    agent_env = next(e for _, c, e in seen.values() if b"ranksight.cli\0agent" in c)
    assert f"{env.CH_PASSWORD}={SECRET}".encode() in agent_env.split(b"\0")
    assert SECRET not in out and f"bob:***@127.0.0.1:{password_server.tcp_port}/pwdb" in out
    for log in home.iterdir():
        assert SECRET not in log.read_text(errors="replace"), log
    with open_store(url) as store:  # the agent connected as bob and shipped the job
        steps = store.query("SELECT count() AS n FROM steps WHERE run_id = 'pw-run'")
        status = store.query(
            "SELECT argMax(status, updated_ns) AS s FROM runs WHERE run_id = 'pw-run'"
        )
    assert int(steps["n"].iloc[0]) == 2 * 6 and status["s"].tolist() == ["finished"]


@pytest.mark.clickhouse
@pytest.mark.parametrize("page", ["runs", "overview"])
def test_ui_pages_mask_the_password(monkeypatch, password_server, page):
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    from ranksight.ui import APP_PATH

    url = f"clickhouse://bob:{SECRET}@127.0.0.1:{password_server.tcp_port}/uidb"
    with open_store(url) as store:
        store.init_schema()  # an empty store: the pages say so, naming it
    monkeypatch.setenv(env.STORE, url)
    st.cache_data.clear()
    at = AppTest.from_file(APP_PATH, default_timeout=120)
    at.query_params["page"] = page
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    shown = "\n".join(
        str(e.value) for kind in ("markdown", "info", "warning", "error", "caption")
        for e in getattr(at, kind)
    )  # fmt: skip
    assert "No runs in this store yet (clickhouse://bob:***@" in shown, shown
    assert SECRET not in shown


def test_the_demo_names_its_store_masked():
    import io

    from rich.console import Console

    from ranksight.demo import DemoConfig, _describe

    out = io.StringIO()
    _describe(
        DemoConfig(), Console(file=out, width=300), "r1", f"clickhouse://bob:{SECRET}@h/db", "s"
    )
    assert "-> store clickhouse://bob:***@h/db" in out.getvalue() and SECRET not in out.getvalue()


def test_ui_refuses_a_password_on_its_command_line():
    out = subprocess.run(
        [sys.executable, "-m", "ranksight.cli", "ui", "--store", f"clickhouse://bob:{SECRET}@127.0.0.1:9/db"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 1, out.stdout + out.stderr
    assert "RANKSIGHT_CH_PASSWORD" in out.stderr and "bob:***@" in out.stderr
    assert SECRET not in out.stdout + out.stderr
