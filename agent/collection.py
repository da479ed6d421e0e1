"""Start the node collectors a ``--collectors`` spec names, inside the agent process."""

from __future__ import annotations

import logging

from .collect import CollectConfig, Collection, default_data_dir, parse_collectors

log = logging.getLogger("ranksight.agent")


def start_collection(
    store, spool_dir: str, spec: str, stall_s: float, sysfs_root: str = "/sys"
) -> Collection | None:
    """Start the collectors ``spec`` names (``default``, ``none`` or a list) writing to
    ``store``; None for ``none``. ``stall_s``: seconds without progress before a run's
    ranks are py-spied. Raises ValueError for an unknown name or bad value."""
    names = parse_collectors(spec)
    if not names:
        return None
    config = CollectConfig(
        collectors=names,
        spool_dir=spool_dir,
        data_dir=default_data_dir(),
        stall_s=stall_s,
        sysfs_root=sysfs_root,
    )
    collection = Collection(store, config)
    collection.start()
    log.info("collectors started: %s", ", ".join(names))
    return collection
