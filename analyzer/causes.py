"""Why a rank is slow in compute: refine ``compute`` with the evidence at hand.

- ``gc``: the rank's Python GC pauses (hook ``gc`` phases) explain at least half of its
  excess self time over its peers.
- ``cpu_contention``: its process was preempted (involuntary context switches per second,
  from the host collector's per-process samples) at least ``ratio`` times as often as
  its same-stage peers: another process competes for its core.
Otherwise the cause stays ``compute``.
"""

from __future__ import annotations

import pandas as pd

PROCS = """
SELECT rank, max(ctx_involuntary) - min(ctx_involuntary) AS invol,
       max(ts_ns) - min(ts_ns) AS span_ns, avg(cpu_pct) AS cpu_mean
FROM proc_samples WHERE run_id = %(run_id)s AND attempt = %(attempt)s
GROUP BY rank
"""


def gc_ms_per_step(phases: pd.DataFrame, ranks: list[int], since_step: int) -> pd.Series:
    """rank -> mean GC pause time per step (ms) from ``since_step`` on."""
    gc = phases[(phases["phase"] == "gc") & (phases["step"] >= since_step)]
    steps = max(1, phases.loc[phases["step"] >= since_step, "step"].nunique())
    per = gc.groupby("rank")["dur_ns"].sum() / steps / 1e6
    return per.reindex(ranks).fillna(0.0)


def preemption_rate(procs: pd.DataFrame) -> pd.Series:
    """rank -> involuntary context switches per second over the sampled span."""
    if procs.empty:
        return pd.Series(dtype=float)
    span_s = (procs["span_ns"].astype(float) / 1e9).where(lambda s: s > 0)
    return (procs["invol"].astype(float) / span_s).set_axis(procs["rank"].astype(int)).dropna()


def refine_cause(
    rank: int,
    peers: list[int],
    excess_ms: float,
    phases: pd.DataFrame,
    procs: pd.DataFrame,
    since_step: int,
    ratio: float = 3.0,
) -> tuple[str, dict]:
    """``(cause, evidence)`` for a compute straggler (see the module docstring)."""
    gc = gc_ms_per_step(phases, [rank, *peers], since_step)
    gc_excess = float(gc[rank] - gc[peers].median()) if peers else 0.0
    evidence = {
        "gc_ms_per_step": round(float(gc[rank]), 1),
        "peers_gc_ms_per_step": round(float(gc[peers].median()), 1) if peers else 0.0,
    }
    if excess_ms > 0 and gc_excess >= 0.5 * excess_ms:
        return "gc", evidence
    rate = preemption_rate(procs)
    if rank in rate.index and peers:
        peer_rate = float(rate.reindex(peers).median())
        evidence.update(
            preemptions_per_s=round(float(rate[rank]), 1),
            peers_preemptions_per_s=round(peer_rate, 1),
        )
        if peer_rate == peer_rate and rate[rank] >= ratio * max(peer_rate, 1.0):
            return "cpu_contention", evidence
    return "compute", evidence
