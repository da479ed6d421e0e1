"""``ranksight agent``: run the node agent in the foreground until SIGTERM / SIGINT."""

from __future__ import annotations

import logging
import signal
import threading

from ranksight.store import StoreError, open_store
from ranksight.store.url import default_store_url, refuse_password

from .agent import Agent
from .config import AgentConfig

log = logging.getLogger("ranksight.agent")


def open_agent(spool: str, store_url: str | None, config: AgentConfig) -> Agent:
    """An Agent for ``spool`` and the store ``store_url`` (None: ``$RANKSIGHT_STORE`` or the
    default folder). The store need not be up: the agent buffers until it is. Raises
    StoreError for a bad URL or a password in it, RuntimeError / PermissionError from
    :class:`Agent`."""
    refuse_password(store_url)
    store = open_store(store_url or default_store_url(), connect=False)
    try:
        store.init_schema()
    except StoreError as exc:
        log.warning("store not ready, buffering until it is: %s", exc)
    return Agent(spool, store, config=config)


def serve(agent: Agent) -> None:
    """Run ``agent`` until SIGTERM or SIGINT, then log its counters."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    log.info("agent started: state %s", agent.state_dir)
    agent.run(stop)
    s = agent.stats
    log.info(
        "stopped: accepted=%d shipped=%d already_stored=%d rejected=%d dropped=%d "
        "store_errors=%d buffered_rows=%d",
        s.accepted, s.shipped, s.already_stored, s.rejected, s.dropped,
        s.store_errors, s.buffered_rows,
    )  # fmt: skip
    agent.close()
