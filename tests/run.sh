#!/usr/bin/env bash
# Set up and run the whole test suite: installs ranksight with its test dependencies
# (CPU torch 2.13.0), Debian's clickhouse-server (the tests start their own private
# server from it on loopback ports), a lint pass, a type check (mypy), then pytest.
# Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v clickhouse-server >/dev/null && [ ! -x /usr/sbin/clickhouse-server ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq clickhouse-server >/dev/null
fi

# Debian's ZooKeeper (with a Java runtime) for the replicated-cluster test
# (tests/store/test_cluster_replicated.py starts its own on a loopback port)
if [ ! -x /usr/share/zookeeper/bin/zkServer.sh ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends zookeeper >/dev/null
fi

# Debian's Chromium for the web UI's browser test (Playwright drives the system binary;
# it cannot download its own browsers here)
if [ ! -x /usr/bin/chromium ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
fi

python3 -m pip install -q torch==2.13.0
python3 -m pip install -q -e '.[test]'

python3 -m ruff check .
python3 tools/typecheck.py  # mypy on the package by import path; non-zero on any error
# every tier: tests/{unit,multiprocess,store,ui,e2e} (one of them: bash tests/run.sh -m unit)
python3 -m pytest -q -ra "$@"
