"""``ranksight ui``: start the Streamlit server on the store, bound to loopback by default."""

from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from urllib.parse import urlencode

from ranksight.ground import env
from ranksight.ui import APP_PATH


@dataclass(kw_only=True, slots=True)
class LaunchConfig:
    """Where the UI listens and what it reads."""

    store: str
    """Store URL the UI reads (passed to the app as ``$RANKSIGHT_STORE``)."""
    host: str = "127.0.0.1"
    """Address to bind; anything but loopback exposes the UI to the network."""
    port: int = 8501
    """TCP port."""
    run: str | None = None
    """Open at this run's overview (printed URL)."""

    def __post_init__(self) -> None:
        if not 0 < self.port < 65536:
            raise ValueError(f"--port must be 1-65535, got {self.port}")
        if not self.host.strip():
            raise ValueError("--host must not be empty")


def streamlit_command(cfg: LaunchConfig) -> list[str]:
    """The ``streamlit run`` command line for ``cfg`` (headless, no usage stats, no file
    watcher, no browser opened)."""
    return [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        APP_PATH,
        "--server.address",
        cfg.host,
        "--server.port",
        str(cfg.port),
        "--server.headless",
        "true",
        "--server.fileWatcherType",
        "none",
        "--browser.gatherUsageStats",
        "false",
        "--client.toolbarMode",
        "viewer",
    ]


def page_url(cfg: LaunchConfig, **params: str) -> str:
    """The UI's URL on this host, with query ``params`` (e.g. page, run)."""
    host = "127.0.0.1" if cfg.host in ("0.0.0.0", "::") else cfg.host
    query = urlencode({k: v for k, v in params.items() if v is not None})
    return f"http://{host}:{cfg.port}/" + (f"?{query}" if query else "")


def child_env(cfg: LaunchConfig) -> dict[str, str]:
    """The server's environment: ours, with the store URL set."""
    return {**os.environ, env.STORE: cfg.store}


def port_taken(cfg: LaunchConfig) -> str:
    """``""`` if ``cfg.host:cfg.port`` can be bound now, else why not (in use, or not an
    address of this host), for a one-line error before Streamlit starts. The probe socket
    is closed at once; another process may still take the port in between."""
    try:
        infos = socket.getaddrinfo(cfg.host, cfg.port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        return f"--host {cfg.host}: {e.strerror or e}"
    family, kind, proto, _, addr = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as Streamlit's server does
        try:
            probe.bind(addr)
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return (
                    f"port {cfg.port} on {cfg.host} is in use (another ranksight ui or web "
                    f"server?): give another with --port, e.g. --port {cfg.port + 1}"
                )
            return f"cannot listen on {cfg.host}:{cfg.port}: {e.strerror or e}"
    return ""


def serve(cfg: LaunchConfig) -> int:
    """Run the server in the foreground until it exits, Ctrl-C or SIGTERM (which stop
    the server too, so a stopped ``ranksight ui`` leaves no server behind); returns its
    exit code."""
    proc = subprocess.Popen(streamlit_command(cfg), env=child_env(cfg))

    def _stop(signum, frame) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, _stop)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        try:
            return proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait()
    finally:
        signal.signal(signal.SIGTERM, previous)
