"""The fourth batch of real posted logs (``tests/data/realworld/bk4-*``, sources in
``bk4-INDEX.md``): what each was read wrong as, asserted on the reading itself, beyond
the corpus verdict (kind and ranks) that ``test_realworld.py`` checks."""

from __future__ import annotations

import os

from ranksight.analyzer.log_evidence.evidence import evidence_of
from tests.helpers.realworld import CORPUS, case_events, case_findings


def test_a_desync_whose_majority_an_unseen_rank_could_turn_is_not_proven() -> None:
    """pytorch#20630: ranks 1,2 all_reduce and rank 3 broadcast at #4084 of world 4 (NCCL's
    ``nranks 4``); rank 0's op is not in the lines. It said rank 3 at 0.75, and a second
    finding blamed silent rank 0 for the hang."""
    findings, notes = case_findings("bk4-pytorch-20630")
    (f,) = findings
    assert (f.kind, f.culprit_rank) == ("desync", 3) and f.confidence < 0.7
    assert sorted(f.evidence["suspects"]) == [0, 3] and f.evidence["unseen"] == [0]
    assert any("the hang is the desync's consequence" in n for n in notes)


def test_an_nccl_channel_over_the_network_names_ranks_of_another_node() -> None:
    """sglang#3836: ``Channel 07/0 : 15[7] -> 7[7] [receive] via NET/IBext_v8/7/GDRDMA``
    puts communicator rank 15 on another node: the world is at least 16 and no local rank
    is a global one. It said 'one node seen' and 'at least 8', suspects 0-6."""
    ev = evidence_of(case_events("bk4-sglang-3836"))
    assert ev.world == 16 and not ev.world_exact and "one node seen" not in ev.assumed
    (f,) = case_findings("bk4-sglang-3836")[0]
    assert set(range(8, 16)) <= set(f.evidence["suspects"])


def test_a_stuck_watchdog_after_located_timeouts_follows_them() -> None:
    """verl#1158: ranks 3,7 time out in all_to_all #4486; ranks 2,4's watchdog is
    reported stuck 11 minutes later. The stuck watchdog led the report as the cause."""
    findings, _ = case_findings("bk4-verl-1158")
    assert [f.cause for f in findings] == ["stuck", "watchdog_stuck"]
    assert findings[1].confidence < findings[0].confidence


def test_a_watchdog_stuck_on_every_rank_that_speaks_is_the_whole_group() -> None:
    """sglang#1691 (ranks 0-2,6,7 of PG 3, 121 works queued on each) and Fuser#3055
    (``[PG ID 0 PG GUID  Rank 3]``, an empty GUID: its ranks were not read)."""
    for case, ranks in (("bk4-sglang-1691", [0, 1, 2, 6, 7]), ("bk4-fuser-3055", [2, 3])):
        (f, *_) = case_findings(case)[0]
        assert (f.cause, f.culprit_rank, f.evidence["stuck_ranks"]) == (
            "watchdog_stuck",
            -1,
            ranks,
        ), case
        assert "the whole group is blocked" in f.summary and f.evidence["suspects"] == []


def test_a_lone_sigabrt_says_the_lines_cannot_tell_the_watchdog_from_a_crash() -> None:
    """ms-swift#9191: torchrun's 'failed (exitcode: -6) local_rank: 1' and nothing else. It
    said the rank 'was waiting, not at fault' as if a timeout were in the lines."""
    (f,) = case_findings("bk4-msswift9191-sigabrt-multinode")[0]
    assert (f.kind, f.cause, f.culprit_rank) == ("hang", "watchdog_abort", -1)
    assert "no timeout or error line is in these lines" in f.summary
    (g, *_) = case_findings("bk4-accelerate-3861")[0]  # beside a timeout it is the watchdog's
    assert (g.cause, "no timeout or error line" in g.summary) == ("watchdog_abort", False)


def test_an_nccl_error_way_out_in_the_network_path_is_read() -> None:
    """nccl#629: host A03-R28-I49-2's proxy thread on GPU 0 returns ncclSystemError through
    ``transport/net.cc`` with no WARN of its own in the lines: a network finding, after
    the same host's CUDA error. A process that has its own WARN keeps only that
    (nccl#795: 'Broken pipe', then ``transport/net.cc:517 -> 6``), and socket helpers
    failing at a clean tear-down (Fuser#3055's ``misc/socket.cc:47 -> 3``) say nothing."""
    findings, _ = case_findings("dx-nccl-cuda-failure-peer-reset")
    assert [f.cause for f in findings] == ["cuda_error", "peer_gone", "network"]
    assert findings[2].host == "A03-R28-I49-2-6000166"
    gpu = "host A03-R28-I49-2-6000166, GPU 0 (global rank not said)"
    assert findings[2].evidence["gpus"] == [gpu]
    for case in ("dx-socket-broken-pipe-remote-crash", "bk4-fuser-3055"):
        assert all(f.kind != "network" for f in case_findings(case)[0]), case


def test_a_rank_takes_the_host_its_nccl_lines_name(tmp_path) -> None:
    """pytorch#20630: ``dlciwpwqw7kd1h3y-master-0:301:315 [3] NCCL INFO comm 0x12fd4c240
    rank 3 nranks 4 ... Abort COMPLETE`` ties rank 3 to its host; the finding said none."""
    from ranksight.analyzer import analyze
    from ranksight.importer import ImportConfig, import_paths
    from ranksight.store import open_store

    store = open_store(str(tmp_path / "store"))
    store.init_schema()
    import_paths(store, [os.path.join(CORPUS, "bk4-pytorch-20630", "console.log")],
                 ImportConfig(run_id="c"))  # fmt: skip
    (f,) = analyze(store, "c").findings
    assert (f.culprit_rank, f.host) == (3, "dlciwpwqw7kd1h3y-master-0")


def test_a_rank_with_fewer_works_in_flight_is_behind_the_others() -> None:
    """DEIM#105: every rank's heartbeat monitor times out, rank 0 with
    ``workMetaList_.size()=84`` against 103 on ranks 1,2: rank 0 enqueued fewer
    collectives, the first place to look (no odd count on sglang#1691: 121 on each)."""
    (f, *_) = case_findings("bk-deim105-heartbeat-monitor-pg0-ranks0-2-stuck-600s")[0]
    assert (f.culprit_rank, f.evidence["suspects"]) == (-1, [0]) and f.confidence < 0.5
    assert "rank 0: 84; ranks 1,2: 103" in f.summary
