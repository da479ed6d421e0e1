"""The sixth batch of real posted logs (``tests/data/realworld/bk6-*``, sources in
``bk6-INDEX.md``): what each was read wrong as, asserted on the reading itself, beyond
the corpus verdict that ``test_realworld.py`` checks."""

from __future__ import annotations

from ranksight.importer.logs import read_lines
from tests.helpers.realworld import case_findings


def test_an_out_of_memory_error_with_no_rank_is_the_cause_of_the_timeouts_after_it() -> None:
    """litgpt#303: ``torch.cuda.OutOfMemoryError: CUDA out of memory. ... GPU 1 has a total
    capacty of 22.20 GiB``, no rank prefix, then rank 3's watchdog timeout. The OOM was
    dropped and a hang reported with 'ranks 0-2 left no line'."""
    findings, notes = case_findings("bk6-litgpt303-oom-gpu1")
    (f,) = findings
    assert (f.kind, f.cause, f.culprit_rank) == ("crash", "out_of_memory", 1)
    assert f.confidence < 0.5 and f.evidence["device"] == "cuda:1"
    assert any("the hang is the crash's consequence" in n for n in notes)
    (e,) = [x for x in read_lines(["RuntimeError: CUDA out of memory. Tried to allocate 2 GiB"])
            if x.kind == "exception"]  # fmt: skip
    assert e.detail["oom"] and e.local_rank == -1  # no GPU named: no local rank


def test_deepspeeds_launcher_on_one_node_is_read_without_a_host_prefix() -> None:
    """DeepSpeed#4890: ``[launch.py:321:sigkill_handler [xxx] exits with return code =
    -9``, a console of one node with no pdsh prefix. Skipped as saying nothing."""
    (f,) = case_findings("bk6-ds4890-fingerprint-seq")[0]
    assert (f.kind, f.culprit_rank) == ("crash", -1) and "SIGKILL" in f.summary
    plain = read_lines(["[2024-01-01 00:00:00,000] [INFO] [launch.py:315:sigkill_handler] "
                        "Killing subprocess 249"])  # fmt: skip
    assert [(e.kind, e.detail["killed"]) for e in plain] == [("child_failed", [249])]
    assert read_lines(["Process 249 exits with return code = -6"]) == []  # not the launcher's


def test_the_ranks_that_raise_a_remote_error_are_its_victims() -> None:
    """OpenRLHF#621: pid 90738 on 172.19.24.110 dies (Ray's raylet), then rank 1 raises
    ncclRemoteError in the weight broadcast. It led with a network finding naming rank 1."""
    findings, _ = case_findings("bk6-openrlhf621-ray-broadcast")
    assert (findings[0].kind, findings[0].cause) == ("crash", "worker_died")
    (remote,) = [f for f in findings if f.evidence.get("nccl_error") == "remote"]
    assert remote.evidence["suspects"] == [] and remote.evidence["reported_by"] == [1]


def test_deepspeeds_launcher_killing_workers_after_timeouts_is_the_hangs_consequence() -> None:
    """DeepSpeed#5066: ranks 7 and 2 time out in _ALLGATHER_BASE #202558, then the launcher
    kills the rest (no return code said): a hang, not a crash that began on the node."""
    findings, notes = case_findings("bk4-deepspeed-5066")
    assert [f.kind for f in findings] == ["hang"]
    assert any("the hang's consequence" in n for n in notes)


def test_an_nccl_peer_address_with_no_host_seen_says_a_host() -> None:
    """Found by the fuzz test: a headless NCCL IB warning naming a peer, no host read."""
    import pandas as pd

    from ranksight.analyzer.log_evidence.evidence import several_nodes

    line = ("[default3]:H100-2:19989:20082 [1] transport/net_ib.cc:1295 0NCCL WARN NET/IB : Got "
            "completion from peer fe80::966d:ae03:8b:df78%ib0<53249> with error 4, opcode 32564")  # fmt: skip
    frame = pd.DataFrame([e.row() for e in read_lines([line])])
    frame["detail"] = [{"category": "ib_completion", "remote": "fe80::1"}] * len(frame)
    assert "NCCL on a host connects to a peer at fe80::1" in several_nodes(frame)


def test_one_rank_timing_out_in_a_collective_means_a_world_of_two_at_least() -> None:
    """stanford_alpaca#65: only rank 0 speaks, timing out in all_gather #2778; it said
    'world_size: 1', which no collective that waits can have."""
    from ranksight.analyzer.log_evidence.evidence import evidence_of
    from tests.helpers.realworld import case_events

    ev = evidence_of(case_events("bk6-alpaca65-fsdp-rank0only"))
    assert (ev.world, ev.world_exact) == (2, False) and "another member" in ev.bound


def test_an_ib_error_completion_names_the_peer_not_the_reporter() -> None:
    """DeepSpeed#6875: ``NET/IB: Got completion from peer 10.0.1.23<34696> with status=5``
    on host 50428e4af543, GPU 4: the finding was titled with the reporter's host."""
    (f, *_) = case_findings("bk6-ds6875-ib-status5")[0]
    assert (f.kind, f.host, f.culprit_rank) == ("network", "10.0.1.23", -1)
    assert "IBV_WC_WR_FLUSH_ERR" in f.summary and "not the process that reports it" in f.summary
