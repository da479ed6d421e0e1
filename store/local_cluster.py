"""A ClickHouse cluster on one machine: N shards x M replicas of Debian's clickhouse-server
on loopback ports, with a local ZooKeeper when tables are replicated.

What each node gets on top of ``store/server.py``'s private config is the same
``config.d/cluster.xml`` a real deployment uses (``deploy/clickhouse/cluster/``,
rendered by :func:`node_config_xml`): the cluster in ``<remote_servers>``, the node's
``<macros>`` (``shard``, ``replica``), its interserver HTTP port (replicas fetch parts
from each other there) and, with replication, ``<zookeeper>``.

Command line (``deploy/clickhouse/cluster/start_local_cluster.sh`` wraps it)::

    python -m ranksight.store.local_cluster --dir DIR [--shards 2] [--replicas 1] [--name ranksight]
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from ranksight.store.base import StoreError
from ranksight.store.server import LocalServer, free_port, start_local_server
from ranksight.store.zookeeper import LocalZooKeeper, start_local_zookeeper

Layout = list[list[tuple[str, int]]]
"""Per shard, its replicas' (host, native port)."""


def remote_servers_xml(name: str, layout: Layout, internal_replication: bool) -> str:
    """``<remote_servers>`` with cluster ``name``: one ``<shard>`` per entry of ``layout``.
    ``internal_replication``: a Distributed insert writes one replica of each shard and the
    replicated table copies it to the others (set it with ReplicatedMergeTree)."""
    shards = []
    for replicas in layout:
        rs = "".join(
            f"\n        <replica><host>{h}</host><port>{p}</port></replica>" for h, p in replicas
        )
        flag = "true" if internal_replication else "false"
        shards.append(
            f"\n      <shard>\n        <internal_replication>{flag}</internal_replication>{rs}"
            "\n      </shard>"
        )
    return (
        f"  <remote_servers>\n    <{name}>{''.join(shards)}\n    </{name}>\n  </remote_servers>\n"
    )


def node_config_xml(
    name: str,
    layout: Layout,
    shard: int,
    replica: int,
    interserver_port: int,
    zookeeper: list[tuple[str, int]] | None,
    interserver_host: str = "127.0.0.1",
) -> str:
    """The ``config.d/cluster.xml`` of the node that is replica ``replica`` of shard
    ``shard`` (both from 1) of cluster ``name``: remote_servers, macros, interserver HTTP
    port and host, and ``<zookeeper>`` nodes if given."""
    zk = ""
    if zookeeper:
        nodes = "".join(
            f"\n    <node><host>{h}</host><port>{p}</port></node>" for h, p in zookeeper
        )
        zk = f"  <zookeeper>{nodes}\n    <session_timeout_ms>30000</session_timeout_ms>\n  </zookeeper>\n"
    return (
        '<?xml version="1.0"?>\n<yandex>\n'
        + remote_servers_xml(name, layout, internal_replication=bool(zookeeper))
        + f"  <macros>\n    <cluster>{name}</cluster>\n    <shard>{shard}</shard>\n"
        f"    <replica>s{shard}r{replica}</replica>\n  </macros>\n"
        f"  <interserver_http_port>{interserver_port}</interserver_http_port>\n"
        f"  <interserver_http_host>{interserver_host}</interserver_http_host>\n"
        + zk
        + "</yandex>\n"
    )


@dataclass
class LocalCluster:
    """Running servers of a local cluster (shard-major order) and its ZooKeeper."""

    name: str
    shards: int
    replicas: int
    servers: list[LocalServer]
    zookeeper: LocalZooKeeper | None = None

    def server(self, shard: int, replica: int = 1) -> LocalServer:
        """The server of ``shard``/``replica`` (from 1)."""
        return self.servers[(shard - 1) * self.replicas + (replica - 1)]

    def url(self, shard: int = 1, replica: int = 1, database: str = "ranksight") -> str:
        """Store URL of ``database`` through that node (its Distributed tables reach all)."""
        return f"clickhouse://127.0.0.1:{self.server(shard, replica).tcp_port}/{database}"

    def stop(self) -> None:
        """Stop every server, then ZooKeeper. Safe to call twice."""
        for server in self.servers:
            server.stop()
        if self.zookeeper is not None:
            self.zookeeper.stop()

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_local_cluster(
    folder: str | Path,
    *,
    name: str = "ranksight",
    shards: int = 2,
    replicas: int = 1,
    timeout: float = 60.0,
) -> LocalCluster:
    """Start ``shards`` x ``replicas`` clickhouse-servers (and ZooKeeper if ``replicas`` >
    1) under ``folder``, each node in ``<folder>/s<shard>r<replica>``, all on free loopback
    ports, and wait until each answers. Raises StoreError (ValueError for bad counts) if
    a server or ZooKeeper does not start; whatever did start is stopped."""
    if shards < 1 or replicas < 1:
        raise ValueError(f"shards and replicas must be >= 1, got {shards} x {replicas}")
    folder = Path(folder).resolve()
    zk = start_local_zookeeper(folder / "zookeeper", timeout=timeout) if replicas > 1 else None
    ports = [[free_port() for _ in range(replicas)] for _ in range(shards)]
    layout = [[("127.0.0.1", p) for p in row] for row in ports]
    cluster = LocalCluster(name, shards, replicas, [], zk)
    try:
        for s in range(1, shards + 1):
            for r in range(1, replicas + 1):
                node = folder / f"s{s}r{r}"
                (node / "config.d").mkdir(parents=True, exist_ok=True)
                zk_nodes = [("127.0.0.1", zk.port)] if zk else None
                (node / "config.d" / "cluster.xml").write_text(
                    node_config_xml(name, layout, s, r, free_port(), zk_nodes)
                )
                cluster.servers.append(start_local_server(node, ports[s - 1][r - 1], None, timeout))
    except BaseException:
        cluster.stop()
        raise
    return cluster


def main(argv: list[str] | None = None) -> int:
    """Run a local cluster in the foreground until SIGINT/SIGTERM."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", required=True, help="folder for every node's config, data, logs")
    parser.add_argument("--name", default="ranksight", help="cluster name")
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--replicas", type=int, default=1)
    args = parser.parse_args(argv)
    try:
        cluster = start_local_cluster(
            args.dir, name=args.name, shards=args.shards, replicas=args.replicas
        )
    except (StoreError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for s in range(1, cluster.shards + 1):
        for r in range(1, cluster.replicas + 1):
            print(f"shard {s} replica {r}: {cluster.url(s, r)}")
    print(f"then: ranksight db init --cluster {cluster.name} --store {cluster.url()}")
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    done.wait()
    cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
