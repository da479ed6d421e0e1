"""The eighth batch of real posted logs (``tests/data/realworld/bk8-*``, sources in
``bk8-INDEX.md``): stacks of hung processes as faulthandler and gdb print them, data-loader
deaths and Ray actors' ranks, asserted on the reading itself."""

from __future__ import annotations

import json

from ranksight.importer.logs import read_lines
from ranksight.importer.logs.lines import split_prefix
from tests.helpers.realworld import case_events, case_findings


def test_faulthandler_and_gdb_stacks_are_read_as_stacks() -> None:
    """DeepSpeed#860 (faulthandler: ``Thread 0x... (most recent call first):``), DeepSpeed#1969
    (gdb ``py-bt``), pytorch#95944 (gdb native ``bt``, ``?? ()`` frames): all three were
    skipped as 'text with no watchdog, NCCL, torchrun, GPU or py-spy lines'."""
    for case, dump, top in (
        ("bk8-ds860_zero3_infer", "faulthandler", "synchronize (torch/cuda/streams.py:95)"),
        ("bk8-ds1969_allreduce_split", "gdb py-bt", "allreduce (<built-in>)"),
        ("bk8-pt95944_sync_last_rank", "gdb bt", "at::native::_local_scalar_dense_cuda"),
    ):
        (d,) = [json.loads(x.detail) for x in case_events(case).itertuples() if x.kind == "stack"]
        assert d["dump"] == dump and d["frames"][0].startswith(top), (case, d)
    (f,) = case_findings("bk8-ds860_zero3_infer")[0]
    assert (f.kind, f.cause) == ("hang", "communication") and "waiting on its GPU" in f.summary


def test_a_dead_data_loader_worker_is_the_ranks_input_pipeline() -> None:
    """Pai-Megatron-Patch#583 ('DataLoader worker (pid 9382) is killed by signal: Killed.')
    and LlamaFactory#8043 ('... Aborted.'): read as a generic exception."""
    for case, rank, sig in (("bk8-paimeg583_dl_killed", 0, "Killed"),
                            ("bk8-lf8043_dl_aborted", 4, "Aborted")):  # fmt: skip
        (f, *_) = case_findings(case)[0]
        assert (f.kind, f.cause, f.culprit_rank, f.evidence["signal"]) == (
            "crash", "data_loader", rank, sig)  # fmt: skip


def test_a_ray_actor_that_names_its_rank_gives_rank_and_host() -> None:
    """NeMo-RL#2937: ``(MegatronPolicyWorker[rank=8] pid=3294808, ip=10.109.19.209) Fatal
    Python error: Aborted``: rank 8 on 10.109.19.209; neither was read."""
    text, rank, _, host = split_prefix(
        "(MegatronPolicyWorker[rank=8] pid=3294808, ip=10.109.19.209) Fatal Python error: Aborted"
    )
    assert (text, rank, host) == ("Fatal Python error: Aborted", 8, "10.109.19.209")
    (f, *_) = case_findings("bk8-nemo2937_abort")[0]
    assert (f.kind, f.culprit_rank) == ("crash", 8)
    assert read_lines(["(RayWorkerWrapper pid=4009) hello"]) == []  # no rank: none taken
