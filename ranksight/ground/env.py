"""Every environment variable ranksight reads, in one place.

Explicit arguments always win over these; these win over built-in defaults.
"""

from __future__ import annotations

RUN_ID = "RANKSIGHT_RUN_ID"
"""The run id the hooks tag every record with (one training job launch)."""
ATTEMPT = "RANKSIGHT_ATTEMPT"
"""The attempt number of this launch of the run (restarts of a job are attempts)."""
SPOOL_DIR = "RANKSIGHT_SPOOL_DIR"
"""The node-local folder where hooks leave records for the node agent."""
LEVEL = "RANKSIGHT_LEVEL"
"""Hook level: ``off`` or ``default``."""
DEVICE_TIMING = "RANKSIGHT_DEVICE_TIMING"
"""``0`` turns off CUDA-event timing of collectives on GPU ranks (on by default)."""
FR_RING = "RANKSIGHT_FR_RING"
"""``1``: at the default level on NCCL, read collectives from torch's Flight Recorder ring
(``trainer_hooks/fr_ring.py``) instead of recording them with the Python wrappers. Off by
default: the ring places a collective on the host clock only when its completion is seen
(starts off by a median 2 ms on an H200, bench/RESULTS.md), too coarse for arrival order."""
STORE = "RANKSIGHT_STORE"
"""Store URL: a folder (chdb, embedded) or ``clickhouse://host:port/db``."""
HOME = "RANKSIGHT_HOME"
"""Base folder for the default store and spool (default ``./.ranksight``)."""
VERIFY_COUNTS = "RANKSIGHT_VERIFY_COUNTS"
"""``1``: also count collectives at the dispatcher and write both counts at close (a
completeness check; costs a Python call per tensor op)."""
AUTO_ATTACH = "RANKSIGHT_AUTO_ATTACH"
"""``1``: attach the hooks to torchrun workers with no code change (set by ``ranksight
launch``; see ``trainer_hooks/autoattach.py``)."""
MESH = "RANKSIGHT_MESH"
"""Mesh shape for auto-attached hooks, e.g. ``dp=2,pp=2,tp=2`` (default: every rank a DP
replica)."""
CONFIG = "RANKSIGHT_CONFIG"
"""Path of the TOML configuration file (default: ``./ranksight.toml`` if present, else
``/etc/ranksight/ranksight.toml`` if present)."""
OTLP_ENDPOINT = "RANKSIGHT_OTLP_ENDPOINT"
"""OTLP/HTTP endpoint (``http://host:4318``) the node agent exports spans and metrics to;
unset: ``$OTEL_EXPORTER_OTLP_ENDPOINT``, else no export."""
CH_USER = "RANKSIGHT_CH_USER"
"""ClickHouse user when the store URL names none (default ``default``)."""
CH_PASSWORD = "RANKSIGHT_CH_PASSWORD"
"""ClickHouse password when the store URL gives none (default empty). Never put it in a URL
on a command line: command lines are visible to every user of the host."""
CH_PASSWORD_FILE = "RANKSIGHT_CH_PASSWORD_FILE"
"""A file whose first line is the ClickHouse password (used when the URL and
``RANKSIGHT_CH_PASSWORD`` give none); it must not be readable by other users."""
CH_CA_CERTS = "RANKSIGHT_CH_CA_CERTS"
"""CA bundle (PEM) to verify a ``clickhouses://`` (TLS) server with (default: the system's)."""
CH_COMPRESSION = "RANKSIGHT_CH_COMPRESSION"
"""Compression of the data sent to and read from a ClickHouse server: ``lz4`` (default) or
``none`` (saves the node agent about a third of its client CPU where the network costs
nothing, e.g. a server on the same host: ``bench/ingest.py``)."""
CLICKHOUSE_SERVER = "RANKSIGHT_CLICKHOUSE_SERVER"
"""Path of the ``clickhouse-server`` binary for local servers (default: PATH, then
``/usr/sbin/clickhouse-server``, where Debian puts it)."""

DEFAULT_HOME = ".ranksight"
FR_DUMP_PREFIX = "RANKSIGHT_FR_DUMP_PREFIX"
"""File-name prefix of the Flight Recorder dumps the node agent ingests (the ranks'
``TORCH_FR_DUMP_TEMP_FILE``); default: the agent's own torch variables below, else torch's
default ``/tmp/nccl_trace_rank_``."""
TORCH_FR_DUMP_TEMP_FILE = "TORCH_FR_DUMP_TEMP_FILE"
"""torch's prefix for Flight Recorder dump files (newer name), read as a default."""
TORCH_NCCL_DEBUG_INFO_TEMP_FILE = "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"
"""torch's prefix for Flight Recorder dump files (older name), read as a default."""
