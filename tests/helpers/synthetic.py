"""Synthetic cross-rank tables with a known answer, for pure analyzer tests.

A DP x TP x PP job laid out like the reference trainer (rank = (dp*PP + pp)*TP + tp):
every rank computes ``base_ms`` per step in forward/backward (with a little noise);
a slow rank computes ``factor`` times as long from ``onset``. Collective arrivals follow:
in each TP all_reduce the slow rank arrives last and its TP peers wait the difference.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ranksight.analyzer.queries import RunData

MS = 1_000_000


def coords(rank: int, dp: int, tp: int, pp: int) -> dict[str, int]:
    """(dp, tp, pp) of a rank in the reference trainer's layout."""
    return {"dp": rank // (pp * tp), "pp": (rank // tp) % pp, "tp": rank % tp}


def make_run(
    *,
    dp: int = 2,
    tp: int = 2,
    pp: int = 2,
    steps: int = 20,
    slow_rank: int | None = 5,
    factor: float = 3.0,
    onset: int = 4,
    base_ms: float = 100.0,
    noise: float = 0.05,
    seed: int = 0,
) -> RunData:
    """A RunData for the job above (times in ns)."""
    rng = np.random.default_rng(seed)
    world = dp * tp * pp
    ranks = pd.DataFrame(
        [
            {
                "rank": r,
                "host": f"node{r // 4}",
                "local_rank": r % 4,
                "pid": 100 + r,
                "device": "cpu",
                "backend": "gloo",
                "world_size": world,
                **coords(r, dp, tp, pp),
            }
            for r in range(world)
        ]
    )
    phases, steps_rows, arrivals = [], [], []
    t = 0
    for s in range(steps):
        comp = {}
        for r in range(world):
            ms = base_ms * (1 + noise * rng.standard_normal())
            if r == slow_rank and s >= onset:
                ms *= factor
            comp[r] = ms * MS
        step_ns = max(comp.values()) + 20 * MS
        for r in range(world):
            for phase, share in (("forward", 0.4), ("backward", 0.6)):
                phases.append(
                    {
                        "rank": r,
                        "step": s,
                        "phase": phase,
                        "n": 4,
                        "dur_ns": comp[r] * share,
                        "wait_ns": 0.0,
                        "self_ns": comp[r] * share,
                        "stage": coords(r, dp, tp, pp)["pp"],
                    }
                )
            steps_rows.append(
                {
                    "rank": r,
                    "step": s,
                    "start_ns": t,
                    "end_ns": t + step_ns,
                    "loss": 1.0,
                    "tokens": 1000,
                }
            )
        for r in range(world):  # TP groups: consecutive ranks
            group = [g for g in range(world) if g // tp == r // tp]
            last = max(group, key=lambda g: comp[g])
            arrivals.append(
                {
                    "rank": r,
                    "last_rank": last,
                    "group_id": f"tp{r // tp}",
                    "step": s,
                    "op": "all_reduce",
                    "n": 1,
                    "waited_ns": comp[last] - comp[r],
                    "after_last_ns": MS,
                }
            )
        t += step_ns
    groups = pd.DataFrame(
        [
            {
                "group_id": f"tp{i}",
                "group_ranks": ",".join(str(i * tp + j) for j in range(tp)),
                "n": steps,
                "op": "all_reduce",
            }
            for i in range(world // tp)
        ]
    )
    return RunData(
        run_id="synthetic",
        attempt=0,
        run={"status": "finished"},
        ranks=ranks,
        steps=pd.DataFrame(steps_rows),
        phases=pd.DataFrame(phases),
        arrivals=pd.DataFrame(arrivals),
        p2p=pd.DataFrame(columns=["rank", "peer", "step", "n", "waited_ns"]),
        groups=groups,
    )
