#!/bin/sh
# A ClickHouse cluster on this machine, for trying the cluster schema: SHARDS x REPLICAS
# Debian clickhouse-server processes on free loopback ports (and a private ZooKeeper when
# REPLICAS > 1), all state under DIR. Prints each node's store URL; Ctrl-C stops them.
#
#   deploy/clickhouse/cluster/start_local_cluster.sh DIR [SHARDS] [REPLICAS]
#   ranksight db init --cluster ranksight --store <a printed URL>
set -eu
exec python3 -m ranksight.store.local_cluster --dir "$1" --shards "${2:-2}" --replicas "${3:-1}"
