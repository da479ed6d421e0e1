"""The web UI's settings: one small config, validated on construction."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(kw_only=True, slots=True)
class UiConfig:
    """How much the UI reads and draws, and how often a live run refreshes."""

    refresh_s: float = 5.0
    """Seconds between checks for new data on a running run's pages."""
    hang_after_s: float = 300.0
    """A ``running`` run with no new step for this long (and 20x its median step) is shown
    as hung."""
    stopped_after_s: float = 300.0
    """A run with no end recorded and nothing from it (no step, no progress snapshot, no
    run row update) for this long is shown as having stopped reporting, not as live:
    the hooks snapshot every 2 s and the agent ships every 1 s, so 5 minutes is 150
    missed snapshots (an agent buffering through a store outage catches up later)."""
    heatmap_rows: int = 128
    """Most rank rows the heatmap draws; more ranks are binned (max and mean per bin).
    128 rows fill the chart's 860 px at 6-7 px each."""
    heatmap_cols: int = 100
    """Most step columns the heatmap draws; more steps are binned (the Steps slider
    narrows the range down to one step a column). 100 columns fill the heatmap's width
    (about 950 px in a 1,400 px window) at 9-10 px each. The browser's drawing time grows
    with the cells: at 128 x 200 it spent about 0.25 s more of its main thread than at
    128 x 100 (ECharts builds one element per cell; bench/RESULTS.md), at 256 x 400 the
    page sent 1.45 MB of figure."""
    timeline_ranks: int = 64
    """Most ranks one timeline draws (a window of the mesh order around the selection)."""
    overview_points: int = 1000
    """Most points per series on the overview (steps are binned above this)."""
    skip_steps: int = 1
    """First steps left out of per-rank summaries (connection set-up, warm-up), as the
    analyzer's ``StragglerConfig.skip_steps``."""

    def __post_init__(self) -> None:
        if self.refresh_s <= 0:
            raise ValueError(f"refresh_s must be > 0, got {self.refresh_s}")
        for name in ("hang_after_s", "stopped_after_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("heatmap_rows", "heatmap_cols", "timeline_ranks", "overview_points"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.skip_steps < 0:
            raise ValueError(f"skip_steps must be >= 0, got {self.skip_steps}")
