"""What the URL selects: page, run, attempt, step, rank and view options.

Every page reads its selection from the query string, so a run, a step and a rank can
be linked (``?page=timeline&run=RUN&step=7&rank=5``) and a page survives a reload.
Malformed values are reported (one line each) and ignored, never raised.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ranksight.ui.data.heatmap import METRICS
from ranksight.ui.data.run import ORDERS

PAGES = {
    "runs": "Runs",
    "overview": "Run overview",
    "heatmap": "Heatmap",
    "timeline": "Timeline",
    "mesh": "Mesh",
    "hang": "Hang",
    "hosts": "Hosts",
}
"""Page key (the ``page`` query parameter) -> title."""

_INTS = ("attempt", "step", "rank", "finding", "window")


@dataclass(frozen=True)
class Selection:
    """The parsed query string. ``problems`` lists what was ignored and why."""

    page: str = "runs"
    run: str | None = None
    attempt: int | None = None
    step: int | None = None
    rank: int | None = None
    finding: int | None = None
    window: int | None = None
    metric: str = "compute"
    order: str = "pp, tp, dp"
    problems: tuple[str, ...] = field(default=())

    def to_params(self) -> dict[str, str]:
        """The query parameters that reproduce this selection (unset ones left out)."""
        out = {"page": self.page}
        for name in ("run", *_INTS):
            value = getattr(self, name)
            if value is not None:
                out[name] = str(value)
        if self.metric != "compute":
            out["metric"] = self.metric
        if self.order != "pp, tp, dp":
            out["order"] = self.order
        return out

    def with_(self, **changes) -> Selection:
        """A copy with ``changes`` (problems cleared)."""
        return replace(self, problems=(), **changes)


def parse_selection(params: dict[str, str]) -> Selection:
    """A Selection from query parameters (name -> value); bad values are dropped and
    named in ``problems``."""
    problems: list[str] = []
    kw: dict = {}
    page = params.get("page", "runs")
    if page in PAGES:
        kw["page"] = page
    else:
        problems.append(f"unknown page {page!r} in the URL; showing Runs")
    run = params.get("run")
    if run:
        kw["run"] = str(run)
    for name in _INTS:
        raw = params.get(name)
        if raw in (None, ""):
            continue
        try:
            value = int(raw)
            if value < 0:
                raise ValueError
            kw[name] = value
        except (TypeError, ValueError):
            problems.append(f"URL parameter {name}={raw!r} is not a non-negative integer; ignored")
    for name, known in (("metric", METRICS), ("order", ORDERS)):
        raw = params.get(name)
        if raw is None:
            continue
        if raw in known:
            kw[name] = raw
        else:
            problems.append(
                f"URL parameter {name}={raw!r} is not one of {', '.join(known)}; ignored"
            )
    return Selection(**kw, problems=tuple(problems))
