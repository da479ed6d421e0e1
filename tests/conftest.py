"""Shared fixtures of every tier: a private ClickHouse server for the session, and store
URLs; and the tier markers (``unit``, ``multiprocess``, ``store``, ``ui``, ``e2e``), set on
each test from the folder it is in.

The server is Debian's ``clickhouse-server`` (18.16), started by
``ranksight.store.server`` on free loopback ports in a temp folder. If it is not
installed, tests that need it fail (CI installs it; a silent skip would hide a broken
store).
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

from ranksight.store import StoreError, open_store
from ranksight.store.server import LocalServer, find_server_binary, start_local_server


@pytest.fixture(scope="session")
def clickhouse_server(tmp_path_factory: pytest.TempPathFactory) -> LocalServer:
    """A clickhouse-server on 127.0.0.1 (free ports) for the whole session."""
    try:
        find_server_binary()
        server = start_local_server(tmp_path_factory.mktemp("clickhouse"))
    except StoreError as exc:
        pytest.fail(f"ClickHouse server tests need clickhouse-server: {exc}", pytrace=False)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def clickhouse_url(clickhouse_server: LocalServer) -> str:
    """``clickhouse://127.0.0.1:<port>/ranksight`` on the session's server."""
    return clickhouse_server.url


@pytest.fixture
def clickhouse_db_url(clickhouse_server: LocalServer) -> str:
    """A URL naming a fresh, not yet created database on the session's server."""
    return f"clickhouse://127.0.0.1:{clickhouse_server.tcp_port}/t_{uuid.uuid4().hex[:12]}"


@pytest.fixture
def chdb_url(tmp_path) -> str:
    """A ``chdb://`` URL of an empty temp folder."""
    return f"chdb://{tmp_path / 'store'}"


@pytest.fixture(params=["chdb", pytest.param("clickhouse", marks=pytest.mark.clickhouse)])
def store_url(request: pytest.FixtureRequest) -> str:
    """Each backend in turn: a fresh chdb folder, then a fresh server database."""
    if request.param == "chdb":
        return request.getfixturevalue("chdb_url")
    return request.getfixturevalue("clickhouse_db_url")


@pytest.fixture
def store(store_url: str):
    """An initialized store of each backend in turn, closed after the test."""
    with open_store(store_url) as opened:
        opened.init_schema()
        yield opened


@pytest.fixture(scope="session")
def hooked_job_spool(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Spool folder of a real 4-rank gloo job run with the hooks (tests/workers/hooked_job.py)."""
    spool = str(tmp_path_factory.mktemp("spool"))
    worker = os.path.join(os.path.dirname(__file__), "workers", "hooked_job.py")
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=4",
        worker,
        spool,
        "hooks-test",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TORCH_FR_DUMP_TEMP_FILE": f"{spool}/fr-rank"}
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return spool


TIERS = ("unit", "multiprocess", "store", "ui", "e2e")
"""The folders of tests/, one a tier; each is also a marker (pyproject.toml), so
``pytest -m unit`` runs one tier."""


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks each test with the tier of the folder it is in (tests/<tier>/...)."""
    root = os.path.dirname(os.path.abspath(__file__))
    for item in items:
        rel = os.path.relpath(str(item.path), root)
        tier = rel.split(os.sep, 1)[0]
        if tier in TIERS:
            item.add_marker(tier)
