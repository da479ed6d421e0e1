"""A slow link that a CPU-contended straggler in it explains (gloo) is a note."""

from __future__ import annotations

import pandas as pd

from ranksight.analyzer.detectors.slow_comm import explained_by_cpu
from ranksight.analyzer.findings import Finding


def straggler(rank: int, cause: str, onset: int) -> Finding:
    return Finding(kind="straggler", cause=cause, culprit_rank=rank, host="vm", dp=1, tp=0,
                   pp=0, confidence=0.99, impact_pct=45.0, summary="slow",
                   evidence={"onset_step": onset})  # fmt: skip


def slow_link(*groups: tuple[list[int], int]) -> Finding:
    # the shape of the fault matrix's cpu_contention run: rank 4's tp group at 17.6 ms
    # per collective against 7.5 ms in the other tp groups, from step 6
    slow = [{"axis": "tp", "members": m, "transfer_ms": 17.58, "peers_transfer_ms": 7.46,
             "onset_step": onset} for m, onset in groups]  # fmt: skip
    return Finding(kind="slow_communication", cause="communication", culprit_rank=-1,
                   host="", dp=-1, tp=-1, pp=-1, confidence=0.8, impact_pct=41.4,
                   summary="slow link", evidence={"slow_groups": slow})  # fmt: skip


def ranks(backend: str) -> pd.DataFrame:
    return pd.DataFrame({"rank": range(8), "backend": [backend] * 8})


def test_a_contended_rank_explains_its_groups_slow_transfers_on_gloo():
    found = [straggler(4, "cpu_contention", 4)]
    assert explained_by_cpu(slow_link(([4, 5], 6)), found, ranks("gloo")) is found[0]


def test_what_it_does_not_explain_stays_a_slow_link():
    found = [straggler(4, "cpu_contention", 4)]
    # NCCL moves bytes on the device: the host's contention is no explanation
    assert explained_by_cpu(slow_link(([4, 5], 6)), found, ranks("nccl")) is None
    # a group without the contended rank, or one of two groups without it
    assert explained_by_cpu(slow_link(([2, 3], 6)), found, ranks("gloo")) is None
    assert explained_by_cpu(slow_link(([4, 5], 6), ([2, 3], 6)), found, ranks("gloo")) is None
    # the link was slow before the contention began
    assert explained_by_cpu(slow_link(([4, 5], 2)), found, ranks("gloo")) is None
    # a straggler of another cause
    assert (
        explained_by_cpu(slow_link(([4, 5], 6)), [straggler(4, "compute", 4)], ranks("gloo"))
        is None
    )
