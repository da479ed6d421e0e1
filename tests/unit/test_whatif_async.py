"""A collective the rank did not wait for at once replays only until its next op."""

from __future__ import annotations

import pandas as pd

from ranksight.analyzer.impact import run_excess_pct
from ranksight.analyzer.whatif.engine import replay
from ranksight.analyzer.whatif.slice import until_next_op

_MS = 1_000_000


def ops(rows):
    return pd.DataFrame(
        [
            {"rank": r, "step": 1, "t": t * _MS, "kind": k, "dur_ns": float(d * _MS),
             "key": key, "phase": "forward" if k == "compute" else "", "microbatch": 0}
            for r, t, k, d, key in rows
        ]
    )  # fmt: skip


def test_an_async_collective_blocks_its_rank_only_until_its_next_op():
    # rank 0 issues an all_gather at 10 ms whose end was seen 9 s later, and its next
    # compute at 11 ms: it was not blocked past 11 ms (the shape of a functional
    # all_gather on gloo in the reference trainer, 9.3 s in a 0.6 s step)
    table = ops([
        (0, 0, "compute", 10, ""), (0, 10, "coll", 9000, "g#1"), (0, 11, "compute", 20, ""),
    ])  # fmt: skip
    assert replay(table)[1] == 9030 * _MS
    clipped = until_next_op(table)
    assert clipped["dur_ns"].tolist() == [10 * _MS, 1 * _MS, 20 * _MS]
    assert replay(clipped)[1] == 31 * _MS


def test_a_synchronous_collective_keeps_its_transfer_time():
    # the next op comes after the collective returned: nothing to clip; the last op of a
    # step has no next op and keeps its time
    table = ops([
        (0, 0, "compute", 10, ""), (0, 10, "coll", 3, "g#1"), (0, 14, "compute", 5, ""),
        (0, 19, "coll", 2, "g#2"),
    ])  # fmt: skip
    assert until_next_op(table)["dur_ns"].tolist() == table["dur_ns"].tolist()


def test_no_clean_step_means_no_measured_excess_to_cap_at():
    wall = pd.Series([800.0] * 10, index=range(1, 11))
    assert run_excess_pct(wall, 1) is None  # every analyzed step has the faults
    assert run_excess_pct(wall, None) == 0.0  # no onset: the 10th percentile baseline
    slow_later = pd.Series([500.0] * 4 + [800.0] * 6, index=range(1, 11))
    assert run_excess_pct(slow_later, 5) == 100.0 * 300 / 800
