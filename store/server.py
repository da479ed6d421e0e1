"""Start a private ClickHouse server (Debian's ``clickhouse-server`` 18.16) as a child.

Everything the server writes lives under one folder: ``<folder>/config.xml`` and
``users.xml`` (generated here), ``data/``, ``tmp/``, ``user_files/``, ``log/``. It listens
on 127.0.0.1 only, with the native (TCP) and HTTP ports given or picked free. The user
``default`` has no password and may connect from loopback only.

Running as root: 18.16 starts as root without complaint (it does not drop privileges;
newer servers switch to the owner of the data folder, which here is the caller). The
Debian package's ``policy-rc.d`` keeps the system service from starting; this module never
touches it, ``/etc/clickhouse-server`` or ``/var/lib/clickhouse``.

Command line (``deploy/clickhouse/start_server.sh`` wraps it)::

    python -m ranksight.store.server --dir DIR [--tcp-port 9000] [--http-port 8123]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ranksight.ground import env
from ranksight.store.base import StoreError

SERVER_BINARY = env.CLICKHOUSE_SERVER

_CONFIG = """<?xml version="1.0"?>
<yandex>
  <logger>
    <level>warning</level>
    <log>{folder}/log/server.log</log>
    <errorlog>{folder}/log/server.err.log</errorlog>
    <size>100M</size>
    <count>2</count>
  </logger>
  <listen_host>127.0.0.1</listen_host>
  <tcp_port>{tcp_port}</tcp_port>
  <http_port>{http_port}</http_port>
  <path>{folder}/data/</path>
  <tmp_path>{folder}/tmp/</tmp_path>
  <user_files_path>{folder}/user_files/</user_files_path>
  <format_schema_path>{folder}/format_schemas/</format_schema_path>
  <users_config>users.xml</users_config>
  <default_profile>default</default_profile>
  <default_database>default</default_database>
  <timezone>UTC</timezone>
  <max_concurrent_queries>100</max_concurrent_queries>
  <mark_cache_size>268435456</mark_cache_size>
  <uncompressed_cache_size>268435456</uncompressed_cache_size>{tls}
</yandex>
"""

_TLS = """
  <tcp_port_secure>{port}</tcp_port_secure>
  <openSSL><server>
    <certificateFile>{cert}</certificateFile>
    <privateKeyFile>{key}</privateKeyFile>
    <verificationMode>none</verificationMode>
    <loadDefaultCAFile>false</loadDefaultCAFile>
    <disableProtocols>sslv2,sslv3,tlsv1,tlsv1_1</disableProtocols>
  </server></openSSL>"""

_USERS = """<?xml version="1.0"?>
<yandex>
  <profiles><default><max_memory_usage>8000000000</max_memory_usage></default></profiles>
  <users>
    <default>
      <password></password>
      <networks><ip>127.0.0.1</ip><ip>::1</ip></networks>
      <profile>default</profile>
      <quota>default</quota>
    </default>
  </users>
  <quotas><default><interval><duration>3600</duration><queries>0</queries><errors>0</errors>
    <result_rows>0</result_rows><read_rows>0</read_rows><execution_time>0</execution_time>
  </interval></default></quotas>
</yandex>
"""


def find_server_binary() -> str:
    """Path of ``clickhouse-server``: ``$RANKSIGHT_CLICKHOUSE_SERVER``, else PATH, else
    ``/usr/sbin/clickhouse-server``. Raises StoreError saying how to install it."""
    for candidate in (
        os.environ.get(SERVER_BINARY),
        shutil.which("clickhouse-server"),
        "/usr/sbin/clickhouse-server",
    ):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise StoreError(
        "clickhouse-server not found (looked at $RANKSIGHT_CLICKHOUSE_SERVER, PATH and "
        "/usr/sbin); install it with `apt-get install clickhouse-server`"
    )


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class LocalServer:
    """A running private server; :meth:`stop` ends it. Usable as a context manager."""

    process: subprocess.Popen
    folder: Path
    tcp_port: int
    http_port: int
    tls_port: int | None = None
    """Native protocol over TLS (``clickhouses://``), if started with a certificate."""

    @property
    def url(self) -> str:
        """Store URL of this server's ``ranksight`` database."""
        return f"clickhouse://127.0.0.1:{self.tcp_port}/ranksight"

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM, then SIGKILL after ``timeout`` seconds; returns the exit code.
        Safe to call twice."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode

    def kill(self) -> None:
        """SIGKILL the server (a crash: no flush, no clean shutdown) and reap it."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()

    def pause(self) -> None:
        """SIGSTOP the server: it keeps its connections but answers nothing."""
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT a paused server."""
        self.process.send_signal(signal.SIGCONT)

    def restart(self, timeout: float = 60.0) -> None:
        """Start the server again on the same folder and ports (after :meth:`kill` or
        :meth:`stop`) and wait until it answers. Raises StoreError as
        :func:`start_local_server` does."""
        if self.process.poll() is None:
            raise StoreError(f"clickhouse-server pid {self.process.pid} is still running")
        fresh = start_local_server(self.folder, self.tcp_port, self.http_port, timeout, self._tls)
        self.process = fresh.process

    @property
    def _tls(self) -> tuple[int, str, str] | None:
        """The TLS settings this server was started with (read back from its config)."""
        if self.tls_port is None:
            return None
        text = (self.folder / "config.xml").read_text()
        cert = text.split("<certificateFile>")[1].split("<")[0]
        key = text.split("<privateKeyFile>")[1].split("<")[0]
        return self.tls_port, cert, key

    def __enter__(self) -> LocalServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def write_config(
    folder: Path, tcp_port: int, http_port: int, tls: tuple[int, str, str] | None = None
) -> Path:
    """Write ``config.xml`` and ``users.xml`` into ``folder`` and create the data
    folders; returns the path of ``config.xml``. ``tls``: (port, certificate PEM, key PEM)
    for the native protocol over TLS."""
    for sub in ("data", "tmp", "user_files", "format_schemas", "log"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    config = folder / "config.xml"
    secure = _TLS.format(port=tls[0], cert=tls[1], key=tls[2]) if tls else ""
    config.write_text(
        _CONFIG.format(folder=folder, tcp_port=tcp_port, http_port=http_port, tls=secure)
    )
    (folder / "users.xml").write_text(_USERS)
    return config


def _die_with_parent() -> None:
    """In the child before exec: get SIGTERM when the parent dies (Linux only)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def start_local_server(
    folder: str | os.PathLike,
    tcp_port: int | None = None,
    http_port: int | None = None,
    timeout: float = 60.0,
    tls: tuple[int, str, str] | None = None,
) -> LocalServer:
    """Start ``clickhouse-server`` on 127.0.0.1 with all state under ``folder`` and wait
    until it answers ``SELECT 1`` on ``tcp_port`` (``None``: a free port).

    The server is a foreground child of this process and gets SIGTERM if this process
    dies. ``tls``: see :func:`write_config`. Raises StoreError if the binary is missing,
    or if the server exits or does not answer within ``timeout`` seconds (the message
    quotes its error log).
    """
    binary = find_server_binary()
    folder = Path(folder).resolve()
    tcp_port = tcp_port or free_port()
    http_port = http_port or free_port()
    config = write_config(folder, tcp_port, http_port, tls)
    with open(folder / "log" / "stdout.log", "ab") as out:
        process = subprocess.Popen(
            [binary, f"--config-file={config}"],
            cwd=folder,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
        )
    server = LocalServer(process, folder, tcp_port, http_port, tls[0] if tls else None)
    try:
        _wait_ready(server, timeout)
    except BaseException:
        server.stop(timeout=5)
        raise
    return server


def _wait_ready(server: LocalServer, timeout: float) -> None:
    """Poll ``SELECT 1`` until it answers; StoreError if the process exits or time runs out."""
    from clickhouse_driver import Client

    deadline = time.monotonic() + timeout
    while True:
        if server.process.poll() is not None:
            raise StoreError(
                f"clickhouse-server exited with code {server.process.returncode} at start: "
                f"{_log_tail(server.folder)}"
            )
        if _port_open(server.tcp_port):
            client = Client("127.0.0.1", port=server.tcp_port, connect_timeout=1)
            try:
                if client.execute("SELECT 1") == [(1,)]:
                    return
            except Exception:  # noqa: BLE001 - not up yet; any failure means "poll again"
                pass
            finally:
                client.disconnect()
        if time.monotonic() > deadline:
            raise StoreError(
                f"clickhouse-server on 127.0.0.1:{server.tcp_port} did not answer within "
                f"{timeout:.0f} s: {_log_tail(server.folder)}"
            )
        time.sleep(0.1)


def _port_open(port: int) -> bool:
    """Whether something accepts TCP connections on 127.0.0.1:``port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _log_tail(folder: Path, chars: int = 400) -> str:
    """The end of the server's error log and stdout, on one line (for error messages)."""
    text = ""
    for name in ("server.err.log", "stdout.log"):
        path = folder / "log" / name
        if path.exists():
            text += path.read_text(errors="replace")[-chars:]
    return " ".join(text.split()) or "(no log output)"


def main(argv: list[str] | None = None) -> int:
    """Run a private server in the foreground until SIGINT/SIGTERM."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", required=True, help="folder for config, data and logs")
    parser.add_argument("--tcp-port", type=int, default=9000, help="native protocol port")
    parser.add_argument("--http-port", type=int, default=8123, help="HTTP port")
    args = parser.parse_args(argv)
    try:
        server = start_local_server(args.dir, args.tcp_port, args.http_port)
    except StoreError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"ClickHouse ready: {server.url} (folder {server.folder}, pid {server.process.pid})")
    signals = []

    def forward(signum: int, _frame: object) -> None:
        # No waiting in here: the main thread is inside wait() and holds its lock.
        signals.append(signum)
        server.process.send_signal(signal.SIGTERM if len(signals) == 1 else signal.SIGKILL)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    code = server.process.wait()
    return 0 if signals else code


if __name__ == "__main__":
    sys.exit(main())
