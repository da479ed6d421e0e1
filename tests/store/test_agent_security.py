"""Credentials never on a command line or in logs, TLS to a real 18.16 server, and a spool
folder only the agent's own user can use."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pandas as pd
import pytest

from ranksight.agent import Agent, AgentConfig
from ranksight.store import StoreError, open_store
from ranksight.store.server import free_port, start_local_server
from ranksight.store.url import password_from_env

NOBODY = 65534


def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ranksight.cli", *args],
        capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})},
    )  # fmt: skip


@pytest.mark.parametrize("command", [["runs"], ["db", "migrate"]])
def test_a_password_on_the_command_line_is_refused_and_never_echoed(command, tmp_path) -> None:
    url = "clickhouse://bob:s3cret-pw@127.0.0.1:9/db"
    out = cli(*command, "--store", url, env={"RANKSIGHT_SPOOL_DIR": str(tmp_path)})
    assert out.returncode == 1, out.stdout + out.stderr
    assert "RANKSIGHT_CH_PASSWORD" in out.stderr and "bob:***@" in out.stderr
    assert "s3cret-pw" not in out.stdout + out.stderr


def test_the_agent_refuses_a_password_in_its_store_url(tmp_path) -> None:
    from ranksight.agent.command import open_agent

    with pytest.raises(StoreError, match="visible to every user") as caught:
        open_agent(str(tmp_path), "clickhouse://bob:s3cret-pw@127.0.0.1:9/db", AgentConfig())
    assert "s3cret-pw" not in str(caught.value)


def test_password_comes_from_the_environment_or_an_owner_only_file(tmp_path, monkeypatch):
    monkeypatch.delenv("RANKSIGHT_CH_PASSWORD", raising=False)
    secret = tmp_path / "pw"
    secret.write_text("from-file\n")
    monkeypatch.setenv("RANKSIGHT_CH_PASSWORD_FILE", str(secret))
    os.chmod(secret, 0o644)
    with pytest.raises(StoreError, match="may be read by other users; chmod 600"):
        password_from_env()
    os.chmod(secret, 0o600)
    assert password_from_env() == "from-file"
    monkeypatch.setenv("RANKSIGHT_CH_PASSWORD", "from-env")
    assert password_from_env() == "from-env"


@pytest.mark.clickhouse
def test_tls_to_a_real_server_verifies_its_certificate(tmp_path, monkeypatch) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
         "-out", str(cert), "-days", "2", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    port = free_port()
    server = start_local_server(tmp_path / "srv", tls=(port, str(cert), str(key)))
    try:
        url = f"clickhouses://127.0.0.1:{port}/tls"
        monkeypatch.delenv("RANKSIGHT_CH_CA_CERTS", raising=False)
        with pytest.raises(StoreError, match="CERTIFICATE_VERIFY_FAILED"):
            open_store(url)  # a self-signed certificate is not trusted by default
        monkeypatch.setenv("RANKSIGHT_CH_CA_CERTS", str(cert))
        store = open_store(url)
        store.init_schema()
        agent = Agent(str(tmp_path / "spool"), store, config=AgentConfig(stats_interval_s=0))
        agent.submit("steps", pd.DataFrame({"run_id": "tls", "step": range(10)}))
        assert agent.drain() == 10
        assert store.query("SELECT count() AS n FROM steps")["n"].tolist() == [10]
    finally:
        server.kill()


def test_spool_of_another_user_is_refused_and_their_files_skipped(tmp_path, chdb_url) -> None:
    if os.getuid() != 0:
        pytest.skip("needs root to hand files to another user")  # CI and dev machines run as root
    store = open_store(chdb_url)
    store.init_schema()
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    with pytest.raises(PermissionError, match="belongs to uid 65534"):
        Agent(str(theirs), store)
    spool = tmp_path / "spool"
    for owner, rank in ((os.getuid(), 0), (NOBODY, 1)):
        path = spool / "r" / "a0" / f"rank{rank:05d}-1.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        header = {"t": "_header", "run_id": "r", "attempt": 0, "rank": rank}
        path.write_text(json.dumps(header) + "\n" + json.dumps({"t": "steps", "step": 1}) + "\n")
        os.chown(path, owner, owner)
    agent = Agent(str(spool), store, config=AgentConfig(stats_interval_s=0))
    assert agent.drain() == 1, "only the agent's own user's records are taken"
    assert store.query("SELECT rank FROM steps")["rank"].tolist() == [0]
