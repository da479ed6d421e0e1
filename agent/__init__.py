"""Per-node agent: reads the ranks' spool and ships records to the store in batches."""

from .agent import Agent, AgentStats
from .tailer import SpoolTailer

__all__ = ["Agent", "AgentStats", "SpoolTailer"]
