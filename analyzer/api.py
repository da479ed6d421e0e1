"""The analyzer's facade: load a run from a store, diagnose it, keep the findings."""

from __future__ import annotations

import dataclasses
import time

import pandas as pd

from ranksight.store import Store

from . import clock, summary
from .diagnose import Analysis, diagnose
from .queries import load_run
from .straggler import StragglerConfig
from .window import StepWindow, apply_window, since_window


def save_findings(store: Store, analysis: Analysis, analyzed_ns: int | None = None) -> int:
    """Insert ``analysis.findings`` into the ``findings`` table under one analysis time
    (ns; now by default). Returns the number of rows written (0 for a clean run: the
    report then reads "no culprit" from the absence of rows)."""
    if not analysis.findings:
        return 0
    t = analyzed_ns or time.time_ns()
    rows = [
        f.to_row(analysis.run_id, analysis.attempt, t, i) for i, f in enumerate(analysis.findings)
    ]
    return store.insert("findings", pd.DataFrame(rows))


def analyze(
    store: Store,
    run_id: str,
    attempt: int | None = None,
    *,
    config: StragglerConfig | None = None,
    save: bool = True,
    window: StepWindow | None = None,
    since_s: float | None = None,
) -> Analysis:
    """Diagnose one run attempt (the latest when ``attempt`` is None); with ``save``, store
    the findings for the UI (never for a window: those would replace the whole run's), its
    clock offsets and its per-rank-step summary (analyzer/summary.py). ``window`` limits
    the analysis to some steps, ``since_s`` to the steps that started in the last that
    many seconds (analyzer/window.py). Raises UnknownRun for a run id not in the store."""
    data = load_run(store, run_id, attempt)
    if since_s is not None:
        window = since_window(data, since_s)
    if window is not None and not window.whole:
        first = int(data.steps["step"].min()) if not data.steps.empty else 0
        if window.first is not None and window.first > first:  # the warm-up is outside it
            config = dataclasses.replace(config or StragglerConfig(), skip_steps=0)
        recorded = _step_range(data.steps)
        data, save = apply_window(data, window), False
    analysis = diagnose(data, config)
    if window is not None and not window.whole:
        none = f": none of them is recorded, this run has {recorded}"
        analysis.notes.append(
            f"analyzed {window.describe()} only{none if data.steps.empty and recorded else ''}"
        )
    offsets = clock_offsets(store, data)
    analysis = dataclasses.replace(analysis, clock=clock.summarize(offsets))
    if save:
        t = time.time_ns()
        save_findings(store, analysis, t)
        if not offsets.empty:
            store.insert("clock_offsets", clock.offset_rows(offsets, run_id, data.attempt, t))
        running = str(data.run.get("status", "")) == "running"
        last = int(data.steps["step"].max()) if not data.steps.empty else None
        summary.ensure(store, run_id, data.attempt, running=running, last_step=last)
    return analysis


def _step_range(steps: pd.DataFrame) -> str:
    """``steps 0-23`` of a run's step records (``""`` without any), for a window note."""
    if steps.empty:
        return ""
    return f"steps {int(steps['step'].min())}-{int(steps['step'].max())}"


def clock_offsets(store: Store, data, last_steps: int = 10) -> pd.DataFrame:
    """Per-rank clock offsets over the run's last ``last_steps`` steps (analyzer/clock.py)."""
    since = int(data.steps["step"].max()) - last_steps if not data.steps.empty else 0
    return store.query(
        clock.OFFSETS, {"run_id": data.run_id, "attempt": data.attempt, "since_step": since}
    )
