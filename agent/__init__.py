"""Per-node agent: reads the ranks' spool and ships records to the store in batches,
through a bounded disk buffer, each record stored once."""

from .agent import Agent, AgentStats
from .config import DROP_POLICIES, AgentConfig
from .tailer import SpoolTailer

__all__ = ["DROP_POLICIES", "Agent", "AgentConfig", "AgentStats", "SpoolTailer"]
