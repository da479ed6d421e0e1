"""The analyzer's facade: load a run from a store, diagnose it, keep the findings."""

from __future__ import annotations

import time

import pandas as pd

from ranksight.store import Store

from .diagnose import Analysis, diagnose
from .queries import load_run
from .straggler import StragglerConfig


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
) -> Analysis:
    """Diagnose one run attempt (the latest when ``attempt`` is None); with ``save``, store
    the findings for the UI. Raises UnknownRun for a run id not in the store."""
    analysis = diagnose(load_run(store, run_id, attempt), config)
    if save:
        save_findings(store, analysis)
    return analysis
