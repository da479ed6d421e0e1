"""Start a private ZooKeeper (Debian's ``zookeeper`` package, 3.8) as a child process, for
replicated ClickHouse tables on one machine (``store/local_cluster.py``).

Everything lives under one folder: ``zoo.cfg``, ``data/``, ``log/``. It listens on
127.0.0.1 only, on a free port, with the admin server off and only the ``ruok`` and
``mntr`` four-letter words allowed. ClickHouse 18.16 has no built-in Keeper; ZooKeeper is
what it speaks to for ReplicatedMergeTree and needs a Java runtime (the package brings one).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from ranksight.store.base import StoreError
from ranksight.store.server import free_port

ZK_SERVER = "/usr/share/zookeeper/bin/zkServer.sh"
"""Where Debian's ``zookeeper`` package puts the start script."""

_CONFIG = """tickTime=500
initLimit=10
syncLimit=5
dataDir={folder}/data
clientPort={port}
clientPortAddress=127.0.0.1
admin.enableServer=false
4lw.commands.whitelist=ruok,mntr
"""


def find_zookeeper() -> str:
    """Path of ``zkServer.sh``; raises StoreError saying how to install it."""
    for candidate in (
        os.environ.get("RANKSIGHT_ZOOKEEPER_SERVER"),
        ZK_SERVER,
        shutil.which("zkServer.sh"),
    ):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise StoreError(
        f"ZooKeeper not found (looked at $RANKSIGHT_ZOOKEEPER_SERVER, {ZK_SERVER}, PATH); "
        "install it with `apt-get install --no-install-recommends zookeeper`"
    )


@dataclass
class LocalZooKeeper:
    """A running private ZooKeeper; :meth:`stop` ends it."""

    process: subprocess.Popen
    folder: Path
    port: int

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM (the whole process group: the script and its JVM), then SIGKILL."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        return self.process.returncode


def ask(port: int, word: str = "ruok", timeout: float = 1.0) -> str:
    """Send a four-letter word to 127.0.0.1:``port``; the answer ("" if none)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(word.encode())
            return sock.recv(4096).decode(errors="replace")
    except OSError:
        return ""


def start_local_zookeeper(
    folder: str | Path, port: int | None = None, timeout: float = 60.0
) -> LocalZooKeeper:
    """Start ZooKeeper with all state under ``folder`` and wait until it answers ``imok``.
    Raises StoreError if it is not installed or does not answer within ``timeout`` s."""
    script = find_zookeeper()
    folder = Path(folder).resolve()
    for sub in ("data", "log"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    config = folder / "zoo.cfg"
    config.write_text(_CONFIG.format(folder=folder, port=port))
    env = {**os.environ, "ZOO_LOG_DIR": str(folder / "log"), "ZOOPIDFILE": str(folder / "pid")}
    with open(folder / "log" / "stdout.log", "ab") as out:
        process = subprocess.Popen(
            [script, "start-foreground", str(config)], cwd=folder, env=env,
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    zk = LocalZooKeeper(process, folder, port)
    deadline = time.monotonic() + timeout
    while ask(port) != "imok":
        if process.poll() is not None or time.monotonic() > deadline:
            zk.stop(5)
            tail = (folder / "log" / "stdout.log").read_text(errors="replace")[-400:]
            raise StoreError(
                f"ZooKeeper on 127.0.0.1:{port} did not start: {' '.join(tail.split())}"
            )
        time.sleep(0.2)
    return zk
