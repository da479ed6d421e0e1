"""Readers of one node signal each, run by the node agent (``agent/collect.py``).

- ``nvml``: GPU health per GPU (:class:`~ranksight.collectors.nvml.NvmlCollector`), XID
  events (``nvml_events``), record/replay of NVML answers (``nvml_replay``,
  ``nvml_record``);
- ``rdma``, ``netdev``: NIC counters from sysfs with rates (``counters``); ``topology``:
  which NIC serves which GPU;
- ``host``: host and rank-process samples; ``local_ranks``: which processes are ranks;
- ``pyspy``: Python stacks of rank processes;
- ``flight_recorder``: PyTorch Flight Recorder dumps; ``fr_ingest``: into the store.

Every collector implements :class:`~ranksight.collectors.base.Collector`; modules are
imported on use (no GPU library is loaded by importing this package).
"""
