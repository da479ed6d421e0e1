"""What-if analysis, one home: how long would the steps take with some ranks' work as
their peers'?

- ``engine.py``: the replay of one step's dependency graph (after Lin et al., OSDI 2025);
- ``slice.py``: a bounded replay of one pipeline slice of a hooked run, loaded from the
  store, checked against the measured step;
- ``impact.py``: straggler impacts from those replays (hooked runs: the slice; imported
  runs: the whole run).

The engine's names are importable from here.
"""

from .engine import (
    OPS_COLUMNS,
    ReplayError,
    WhatIf,
    balanced_stages,
    ops_from_tables,
    peer_median_durations,
    replay,
    whatif_slowdown,
)

__all__ = [
    "OPS_COLUMNS",
    "ReplayError",
    "WhatIf",
    "balanced_stages",
    "ops_from_tables",
    "peer_median_durations",
    "replay",
    "whatif_slowdown",
]
