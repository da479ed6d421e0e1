"""Why a rank is slow in compute: refine ``compute`` with the evidence at hand.

- ``gc``: the rank's Python GC pauses (hook ``gc`` phases) explain at least half of its
  excess self time over its peers.
- ``cpu_contention``: its threads waited for a CPU (run delay, from
  ``/proc/<pid>/task/*/schedstat``, sampled by the host collector) long enough to explain
  at least half of its excess, beyond what its same-stage peers waited: another process
  competes for its core. Measured from the onset step on. Where run delay was not
  recorded, preemptions (involuntary context switches per second) at least ``ratio``
  times its peers' stand in.
Otherwise the cause stays ``compute``.
"""

from __future__ import annotations

import pandas as pd

from ranksight.ground.sql import RUN as _RUN

PROCS = f"""
SELECT rank, max(ctx_involuntary) - min(ctx_involuntary) AS invol,
       max(ts_ns) - min(ts_ns) AS span_ns, avg(cpu_pct) AS cpu_mean,
       maxIf(run_delay_ns, NOT isNaN(run_delay_ns))
         - minIf(run_delay_ns, NOT isNaN(run_delay_ns)) AS delay_ns,
       countIf(NOT isNaN(run_delay_ns)) AS delay_samples
FROM proc_samples
WHERE {_RUN} AND ts_ns >= %(since_ns)s
  AND rank IN %(ranks)s
GROUP BY rank
"""
"""Per rank, over the samples since ``since_ns``: preemptions, span, CPU, run delay."""


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


def delay_ms_per_step(procs: pd.DataFrame, step_ms: float) -> pd.Series:
    """rank -> run delay (ms) per step of ``step_ms``: the share of wall time its threads
    waited for a CPU over the sampled span, times the step time. Ranks with fewer than
    two run-delay samples are left out."""
    if procs.empty or "delay_ns" not in procs.columns:
        return pd.Series(dtype=float)
    ok = procs[(procs["delay_samples"] >= 2) & (procs["span_ns"] > 0)]
    share = ok["delay_ns"].astype(float) / ok["span_ns"].astype(float)
    return (share * step_ms).set_axis(ok["rank"].astype(int))


def refine_cause(
    rank: int,
    peers: list[int],
    excess_ms: float,
    phases: pd.DataFrame,
    procs: pd.DataFrame,
    since_step: int,
    step_ms: float = 0.0,
    ratio: float = 3.0,
) -> tuple[str, dict]:
    """``(cause, evidence)`` for a compute straggler (see the module docstring).
    ``procs``: the PROCS query's rows for the rank and its peers since the onset;
    ``step_ms``: the rank's mean step time since the onset (ms)."""
    gc = gc_ms_per_step(phases, [rank, *peers], since_step)
    gc_excess = float(gc[rank] - gc[peers].median()) if peers else 0.0
    evidence = {
        "gc_ms_per_step": round(float(gc[rank]), 1),
        "peers_gc_ms_per_step": round(float(gc[peers].median()), 1) if peers else 0.0,
    }
    if excess_ms > 0 and gc_excess >= 0.5 * excess_ms:
        return "gc", evidence
    delay = delay_ms_per_step(procs, step_ms)
    if rank in delay.index and peers and delay.reindex(peers).notna().any():
        peer_delay = float(delay.reindex(peers).median())
        evidence.update(
            run_delay_ms_per_step=round(float(delay[rank]), 1),
            peers_run_delay_ms_per_step=round(peer_delay, 1),
        )
        if excess_ms > 0 and delay[rank] - peer_delay >= 0.5 * excess_ms:
            return "cpu_contention", evidence
        return "compute", evidence
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
