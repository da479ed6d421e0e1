"""The mesh picture's numbers: each rank's slowness and the wait-for edges to victims.

Slowness is the analyzer's measure (``analyzer/straggler.py``): a rank's compute self
time per step (forward + backward + optimizer, less time blocked in collectives) over
the median of the other ranks of its pipeline stage; 1.0 is as fast as its peers, 3.0
three times as slow. Edges come from the findings' evidence: who waited for the
culprit, and how long (``waited_for_it.victims``).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ranksight.store import Store

from .run import RUN, RunView

SELF_TIME = f"""
SELECT rank, sum(end_ns - start_ns - wait_ns) AS self_sum, uniqExact(step) AS n_steps
FROM phases
WHERE {RUN} AND step >= %(s_lo)s AND phase IN ('forward', 'backward', 'optimizer')
GROUP BY rank
"""


def slowness(store: Store, run: RunView, skip_steps: int = 1) -> pd.DataFrame:
    """The run's ranks (rank, host, dp, tp, pp) with self_ms (mean compute self time per
    step from step ``skip_steps`` on) and slowness (self_ms over the median of the other
    ranks of the same pipeline stage; NaN without peers or data). Raises StoreError."""
    got = store.query(SELF_TIME, {**run.params, "s_lo": int(skip_steps)})
    ranks = run.ranks[["rank", "host", "dp", "tp", "pp"]].copy()
    per_step = got["self_sum"].astype(float) / got["n_steps"].clip(lower=1).astype(float)
    self_ms = pd.Series((per_step / 1e6).to_numpy(), index=got["rank"].astype(int).to_numpy())
    ranks["self_ms"] = ranks["rank"].astype(int).map(self_ms)
    ranks["slowness"] = _peer_ratio(ranks)
    return ranks


def _peer_ratio(ranks: pd.DataFrame) -> pd.Series:
    """self_ms over the median self_ms of the other ranks with the same pp."""
    out = pd.Series(np.nan, index=ranks.index)
    for _, members in ranks.groupby("pp"):
        values = members["self_ms"].to_numpy(float)
        total = np.nansum(values)
        for k, idx in enumerate(members.index):
            others = np.delete(values, k)
            others = others[~np.isnan(others)]
            if len(others) and not np.isnan(values[k]) and total > 0:
                out[idx] = values[k] / max(float(np.median(others)), 1e-9)
    return out


def wait_edges(run: RunView) -> pd.DataFrame:
    """Edges victim -> culprit from the findings: waiter, holder, waited_ms (the top
    victims each finding recorded)."""
    rows = []
    for f in run.findings:
        for v in (f.evidence.get("waited_for_it") or {}).get("victims", []):
            rows.append(
                {
                    "waiter": int(v["rank"]),
                    "holder": f.culprit_rank,
                    "waited_ms": float(v["waited_ms"]),
                }
            )
    return pd.DataFrame(rows, columns=["waiter", "holder", "waited_ms"])
