"""The text-log reader (ranksight/importer/logs) on real posted lines from the corpus
(tests/data/realworld: each case's case.json names its thread): what a line says, read
the way it is written."""

from __future__ import annotations

import os

from ranksight.importer.logs import read_file
from ranksight.importer.logs.lines import logical_lines, split_prefix
from tests.helpers.realworld import CORPUS


def _case(name: str, file: str = "console.log") -> str:
    return os.path.join(CORPUS, name, file)


def _lines(name: str, file: str = "console.log") -> list[str]:
    with open(_case(name, file), encoding="utf-8") as f:
        return f.read().splitlines()


def test_group_rank_is_not_the_global_rank() -> None:
    """nccl#1610: global rank 15 prints [Rank 1] and [PG ID 11 PG GUID 112 Rank 0]."""
    ev = read_file(_case("wd-nccl1610-timestamp-prefix-two-pgguids-alltoall"))
    status = {(e.rank, e.pg): e for e in ev if e.kind == "status"}
    assert status[(15, "112")].group_rank == 0 and status[(15, "112")].seq == 57
    assert status[(13, "119")].group_rank == 1 and status[(13, "119")].seq == 216
    assert {e.rank for e in ev if e.kind == "timeout"} == {13, 15}


def test_prefixes_of_real_consoles() -> None:
    """Prefixes as posted: a viewer's line numbers, Ray's actor tag, torchrun's rank."""
    first = _lines("wd-llamafactory7396-lineno-prefix-pg1-allreduce", "part1.log")[0]
    text, rank, _, _ = split_prefix(first)
    assert rank == 0 and text.startswith("[E321")
    ray = _lines("wd-vllm6042-ray-prefix-gather-pg1")[1]
    assert split_prefix(ray)[1] == 1


def test_fixed_width_wrap_is_joined() -> None:
    """VLM-R1#257: a terminal wrapped the heartbeat monitor's message at 116 columns."""
    lines = list(logical_lines(_lines("ho-vlmr1-257-heartbeat-stuck-hardwrapped-rank6")))
    assert "ProcessGroupNCCL's watchdog got stuck for 480 seconds" in lines[0].text
    ev = read_file(_case("ho-vlmr1-257-heartbeat-stuck-hardwrapped-rank6"))
    (stuck,) = [e for e in ev if e.kind == "watchdog_stuck"]
    assert stuck.rank == 6 and stuck.code == 480


def test_blocking_wait_is_the_same_timeout() -> None:
    """diffusers#12422: each rank prints the watchdog line and the blocking-wait line."""
    ev = read_file(_case("wd-diffusers12422-blocking-wait-allreduce"))
    timeouts = [e for e in ev if e.kind == "timeout"]
    assert len({(e.rank, e.seq) for e in timeouts}) == len(timeouts)


def test_unsigned_numel_is_stored_as_unknown() -> None:
    """nccl#1504: COALESCED P2P prints NumelIn=18446744073709551615 (-1 as unsigned)."""
    ev = read_file(_case("wd-nccl1504-pipelining-coalesced-p2p-seq1", "part1.log"))
    rows = [e.row() for e in ev if e.kind == "timeout"]
    assert rows and all(-(1 << 63) <= r["numel_in"] < (1 << 63) for r in rows)


def test_torchrun_summary_and_fatal_signals() -> None:
    ev = read_file(_case("cx-robomamba-sigkill-local5"))
    (cf,) = [e for e in ev if e.kind == "child_failed"]
    assert cf.local_rank == 5 and cf.code == -9 and cf.detail["signal"] == "SIGKILL"
    ucx = read_file(_case("ho-megatron516-ucx-bus-error-signal7-during-nccl-init"))
    assert {(e.pid, e.code) for e in ucx if e.kind == "fatal_signal"} == {(5283, 7), (5279, 7)}


def test_a_file_name_never_overrides_the_line(tmp_path) -> None:
    """open-r1#620's part3.log holds rank 2's lines: saved as rank5.log it is still rank
    2; lines that name only ranks of a group ([Rank 3]) do not take the file's number
    either; a file whose lines name no rank at all does."""
    import shutil

    from ranksight.importer import ImportConfig, import_paths
    from ranksight.store import open_store

    shutil.copy(
        _case("wd-openr1-620-hardwrapped-broadcast-seq4", "part3.log"), tmp_path / "rank5.log"
    )
    shutil.copy(_case("cx-returnn1500-aer-fatal-cmplto", "dmesg.txt"), tmp_path / "rank9.log")
    shutil.copy(_case("cx-gcd-broadcast-timeout-rank0-silent"), tmp_path / "rank7.log")
    store = open_store(str(tmp_path / "store"))
    store.init_schema()
    result = import_paths(store, [str(tmp_path / "rank5.log")], ImportConfig(run_id="a"))
    assert [f.rank for f in result.imported] == [2]
    ranks = store.query("SELECT DISTINCT rank FROM log_events WHERE run_id = 'a' AND rank >= 0")
    assert 5 not in set(ranks["rank"])
    result = import_paths(store, [str(tmp_path / "rank9.log")], ImportConfig(run_id="b"))
    assert [f.rank for f in result.imported] == [9]  # a kernel log: its lines name no rank
    import_paths(store, [str(tmp_path / "rank7.log")], ImportConfig(run_id="c"))
    q = "SELECT DISTINCT rank FROM log_events WHERE run_id = 'c' AND kind = 'timeout'"
    assert list(store.query(q)["rank"]) == [-1]  # [Rank 1..3] of a group, not rank 7


def test_nothing_imported_leaves_no_run(tmp_path) -> None:
    """An import of files that are no artifact writes no run (it would be listed as a
    finished run of world size 0)."""
    from ranksight.importer import ImportConfig, import_paths
    from ranksight.store import open_store

    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "random.bin").write_bytes(bytes(range(256)) * 64)
    store = open_store(str(tmp_path / "store"))
    store.init_schema()
    result = import_paths(store, [str(tmp_path / "in")], ImportConfig(run_id="x"))
    assert not result.imported
    assert store.query("SELECT count() AS n FROM runs WHERE run_id = 'x'")["n"].iloc[0] == 0


def _store(tmp_path):
    from ranksight.store import open_store

    store = open_store(str(tmp_path / "store"))
    store.init_schema()
    return store


def test_fifo_and_undecodable_names_are_handled(tmp_path) -> None:
    """A FIFO in the folder is named and skipped (reading it would block forever); a file
    whose name is not UTF-8 is imported under a printable name."""
    import shutil

    from ranksight.importer import ImportConfig, import_paths

    folder = tmp_path / "in"
    folder.mkdir()
    os.mkfifo(folder / "pipe")
    odd = os.fsdecode(b"console-\xff.log")
    shutil.copy(_case("cx-gcd-broadcast-timeout-rank0-silent"), os.path.join(folder, odd))
    store = _store(tmp_path)
    result = import_paths(store, [str(folder)], ImportConfig(run_id="f"))
    by = {os.path.basename(f.path): f for f in result.files}
    assert "not a regular file" in by["pipe"].message and by["pipe"].kind is None
    (name,) = [f.path for f in result.imported]
    name.encode("utf-8")  # valid text: stored and printed as it is
    assert "\ufffd" in name
    files = store.query("SELECT DISTINCT file FROM log_events WHERE run_id = 'f'")["file"]
    assert list(files) == [name]


def test_a_file_that_breaks_a_reader_is_named_and_the_rest_imported(tmp_path, monkeypatch) -> None:
    from ranksight.importer import ImportConfig, import_paths
    from ranksight.importer.formats.pyspy import PySpy

    def broken(self, path, rank):
        raise TypeError("frames is not a list")

    monkeypatch.setattr(PySpy, "read", broken)
    folder = tmp_path / "in"
    folder.mkdir()
    dump = os.path.join(os.path.dirname(CORPUS), "realdata", "handed", "pyspy_loader_stall_8r")
    (folder / "pyspy.txt").write_bytes(open(os.path.join(dump, "rank0.txt"), "rb").read())
    (folder / "console.log").write_bytes(
        open(_case("cx-gcd-broadcast-timeout-rank0-silent"), "rb").read()
    )
    store = _store(tmp_path)
    result = import_paths(store, [str(folder)], ImportConfig(run_id="b"))
    (bad,) = result.failed
    assert bad.path.endswith("pyspy.txt") and "TypeError: frames is not a list" in bad.message
    assert [os.path.basename(f.path) for f in result.imported] == ["console.log"]


def test_pyspy_pasted_in_a_log_is_read_with_the_log(tmp_path) -> None:
    """A console with a py-spy dump pasted after its timeouts is a log: the timeouts and
    the dump are both read (it was taken for one py-spy dump, its timeouts dropped)."""
    from ranksight.importer import ImportConfig, import_paths

    mixed = tmp_path / "mixed.log"
    mixed.write_bytes(open(_case("cx-gcd-broadcast-timeout-rank0-silent"), "rb").read()
                      + open(_case("cx-pt135703-pyspy-zero3-stuck", "pyspy.txt"), "rb").read())  # fmt: skip
    store = _store(tmp_path)
    import_paths(store, [str(mixed)], ImportConfig(run_id="m"))
    kinds = store.query(
        "SELECT kind, count() AS n FROM log_events WHERE run_id = 'm' GROUP BY kind"
    )
    got = dict(zip(kinds["kind"], kinds["n"], strict=True))
    assert got["timeout"] == 3 and got["stack"] == 1


def test_a_console_opening_with_a_dict_repr_is_text() -> None:
    """axolotl#1473: HF Trainer's metrics lines ``{'loss': 0.1146, ...}`` open the console;
    it is read as text (it was refused as JSON), while JSON cut at 64 KiB is still JSON."""
    from ranksight.importer.formats.base import json_prefix
    from ranksight.importer.sources import sniff

    case = "bk-axolotl1473-dict-repr-first-line-illegal-memory-rank7"
    assert sniff(_case(case)) == ("log", "")
    (err,) = [e for e in read_file(_case(case)) if e.kind == "gpu_error"]
    assert err.rank == 7
    assert json_prefix('{"traceEvents": [{"ph": "X", "dur": 1.') and json_prefix('{"a": tr')
    assert not json_prefix("{'loss': 0.1146}") and not json_prefix('{"a" 1}')


def test_a_cut_watchdog_line_and_a_comm_abort_are_read() -> None:
    """UniWorld#46: ``[Rank 6] Watchdog caught co`` (cut inside "collective") is rank 6's
    timeout; NCCL's ``comm ... rank 6 nranks 8 cudaDev 2 ... Abort COMPLETE`` its abort."""
    ev = read_file(_case("bk-uniworld46-cut-watchdog-comm-abort-rank6-cudadev2"))
    (t,) = [e for e in ev if e.kind == "timeout"]
    assert (t.rank, t.pg, t.detail) == (6, "1", {"cut": True})
    (a,) = [e for e in ev if e.kind == "comm_abort"]
    assert (a.rank, a.local_rank, a.code) == (6, 2, 8)


def test_the_import_message_says_whose_lines_each_count_is(tmp_path) -> None:
    """transformers#26724: the timeouts are [Rank 0,2] of a group the lines do not name;
    ranks 2,4 are NCCL's communicator aborts (it said "2 watchdog timeouts (ranks 2,4)")."""
    from ranksight.importer import ImportConfig, import_paths

    case = _case("bk-hf26724-allgather-seq1-timeouts-rank0-2-comm-abort-rank2-4")
    result = import_paths(_store(tmp_path), [case], ImportConfig(run_id="h"))
    (msg,) = [f.message for f in result.imported]
    assert "2 watchdog timeouts ([Rank 0,2] of a group" in msg
    assert "2 NCCL communicator aborts (ranks 2,4)" in msg


def test_a_cut_failure_record_is_read_and_one_second_is_no_order() -> None:
    """pytorch#121209: rank 1's record is cut before its ``host`` line; ranks 0-3 all exit
    1 at 07:01:51, so torchrun's root cause (rank 0) is named culprit of nothing."""
    import pandas as pd

    from ranksight.analyzer.log_evidence import log_findings

    ev = read_file(_case("bk-pt121209-childfailed-cut-record-all-exit1-same-second"))
    failed = {e.rank: e for e in ev if e.kind == "child_failed"}
    assert sorted(failed) == [0, 1, 2, 3] and failed[0].detail["root_cause"]
    assert failed[1].code == 1 and failed[1].detail["time"] == ""
    coords = pd.DataFrame(columns=["dp", "tp", "pp", "host"])
    (f, *_) = log_findings(pd.DataFrame([e.row() for e in ev]), coords)[0]
    assert (f.kind, f.culprit_rank, f.evidence["suspects"]) == ("crash", -1, [])
    assert "same second" in f.summary


def test_a_gpu_error_in_the_default_groups_bracket_is_the_global_rank() -> None:
    """lmdeploy#3258: ``what():  [PG ID 0 PG GUID 0(default_pg) Rank 2] ... CUDA error: an
    illegal memory access`` with no launcher prefix is global rank 2's error."""
    ev = read_file(_case("bk-lmdeploy3258-what-default-pg-illegal-memory-rank2"))
    (err,) = [e for e in ev if e.kind == "gpu_error"]
    assert (err.rank, err.group_rank, err.detail["category"]) == (2, 2, "cuda")


def test_sglang_tp_labels_are_ranks_only_in_a_tp_only_log() -> None:
    """sglang#3368: ``[2025-02-07 01:19:40 TP0] Load weight end`` is TP rank 0's line, taken
    as global rank 0 (the log has no DP/PP label) and saying so; with a DP label it is not."""
    from ranksight.importer.logs import read_lines, sglang

    ev = read_file(_case("bk-sglang3368-tp-prefix-allreduce-seq2-rank6-tp2-tp4-silent"))
    tp = [e for e in ev if e.kind == "present" and e.pg == "tp"]
    assert [e.rank for e in tp] == [0, 1, 3, 5, 7]
    assert all(e.detail["assumed"] == sglang.ASSUMED for e in tp)
    lines = ["[2025-02-07 01:19:40 DP1 TP3] Load weight end.", "[2025-02-07 01:19:41 TP2] x"]
    tp = [e for e in read_lines(lines) if e.kind == "present"]
    assert [(e.rank, e.group_rank) for e in tp] == [(-1, 2), (-1, 3)]


def test_nccl_cuda_failure_out_of_memory_is_an_oom() -> None:
    """Open-Sora-Plan#386 and nccl#1235: NCCL's ``Cuda failure 'out of memory'`` is the GPU
    out of memory (category ``cuda_oom``, cause ``out_of_memory``), not a generic CUDA error."""
    import pandas as pd

    from ranksight.analyzer.log_evidence import log_findings

    ev = read_file(_case("bk-opensora386-nccl-warn-cuda-failure-out-of-memory-dev0"))
    (w,) = [e for e in ev if e.kind == "nccl_warn"]
    assert w.detail["category"] == "cuda_oom" and w.local_rank == 0
    oom = read_file(_case("ho-nccl1235-socket-closed-by-peer-caused-by-cuda-oom-dev3"))
    coords = pd.DataFrame(columns=["dp", "tp", "pp", "host"])
    (f, *_) = log_findings(pd.DataFrame([e.row() for e in oom]), coords)[0]
    assert (f.kind, f.cause, f.evidence["suspects"]) == ("crash", "out_of_memory", [3])


def test_a_rank_named_in_a_mismatch_raises_the_world_bound() -> None:
    """OpenDDE#23: rank 1's fingerprint error names rank 2, so the world is at least 3
    (the note said "at least 2")."""
    import pandas as pd

    from ranksight.analyzer.log_evidence.evidence import evidence_of

    ev = read_file(_case("bk-opendde23-mismatch-allgather-base-shape-rank1-vs-rank2"))
    got = evidence_of(pd.DataFrame([e.row() for e in ev]))
    assert (got.world, got.world_exact, got.present) == (3, False, {1})


def test_an_nccl_device_on_a_worker_host_is_no_global_rank() -> None:
    """nccl#1405 and nccl#1029: ``kp-ddp-worker-0:3468:3905 [4] ... NCCL WARN NET/IB`` is
    GPU 4 of host kp-ddp-worker-0, not global rank 4 (a host named as one node of several:
    no "one node seen" rule); it said "suspects 4" and "suspects 0"."""
    import pandas as pd

    from ranksight.analyzer.log_evidence import log_findings
    from ranksight.analyzer.log_evidence.evidence import several_nodes

    coords = pd.DataFrame(columns=["dp", "tp", "pp", "host"])
    for case, gpu in (
        ("bk2-nccl1405-ib-status12-peer-worker0-gpu4-no-rank", "host kp-ddp-worker-0, GPU 4"),
        ("bk2-nccl1029-pdsh-worker1-nvls-cuda-init-error-gpu0-no-rank",
         "host rdma-test-gpu-worker-1, GPU 0"),
    ):  # fmt: skip
        frame = pd.DataFrame([e.row() for e in read_file(_case(case))])
        findings, _ = log_findings(frame, coords)
        assert all(f.culprit_rank < 0 and not f.evidence["suspects"] for f in findings), case
        assert gpu in findings[0].summary and gpu in findings[0].evidence["gpus"][0]
    one = pd.DataFrame({"host": ["ins-7df6eojsifuykig9"], "kind": ["present"], "rank": [-1]})
    assert several_nodes(one) == ""
    assert several_nodes(one.assign(host="liangxianchen-funasr-15wh-train-lxc0-w-0"))
    from ranksight.importer.logs import read_lines

    (n,) = [e for e in read_lines(["torchrun --nnodes=1:4 train.py"]) if e.kind == "nodes"]
    assert n.code == 4 and several_nodes(pd.concat([one, pd.DataFrame([n.row()])]))
    pdsh = pd.DataFrame({"host": ["10.0.0.6"], "kind": ["traceback"], "rank": [-1], "detail": [{}]})
    assert "pdsh" in several_nodes(pdsh)


def test_a_crash_takes_in_the_hang_that_names_a_rank_for_its_silence() -> None:
    """FunASR#2006: rank 2's OOM, rank 5's timeout and rank 3's timeout cut at
    ``WorkNCCL(SeqNum=1573`` (a timeout, its sequence number unknown): one crash of rank 2,
    the hang folded into it; a hang that named a silent rank beside a crash is folded too
    (it said "hang: rank 1 — cause: stuck")."""
    import pandas as pd

    from ranksight.analyzer.findings import Finding
    from ranksight.analyzer.log_evidence import _fold, log_findings

    ev = read_file(_case("bk2-funasr2006-oom-rank2-worker0-cut-watchdog-rank3"))
    cut = [e for e in ev if e.kind == "timeout" and e.rank == 3]
    assert [(e.seq, e.op, e.detail) for e in cut] == [(-1, "", {"cut": True})]
    coords = pd.DataFrame(columns=["dp", "tp", "pp", "host"])
    findings, notes = log_findings(pd.DataFrame([e.row() for e in ev]), coords)
    assert [(f.kind, f.culprit_rank) for f in findings] == [("crash", 2)]
    assert any("the hang is the crash's consequence" in n for n in notes)
    crash = Finding("crash", "exception", 2, "", -1, -1, -1, 0.5, 100.0, "", {"suspects": [2]})
    hang = Finding("hang", "stuck", 1, "", -1, -1, -1, 0.3, 100.0, "h",
                   {"suspects": [1], "silent": [1], "no_timeout": [0, 4]})  # fmt: skip
    (folded,) = _fold([crash, hang], [])
    assert folded.culprit_rank == 2 and folded.evidence["hang"] == ["h"]
    odd = Finding("hang", "stuck", 1, "", -1, -1, -1, 0.6, 100.0, "h", {"suspects": [1]})
    assert len(_fold([crash, odd], [])) == 2  # rank 1 at another seq: a finding of its own


def test_several_processes_failing_one_nccl_setup_name_no_rank() -> None:
    """vllm#10453: rank 1's ``ncclInternalError``, pid 412's ``init.cc:1929 -> 3`` and rank
    2's cut ``Traceback (most recen``: the same set-up failure on several processes, no
    culprit (it said "crash: rank 1")."""
    import pandas as pd

    from ranksight.analyzer.log_evidence import log_findings

    ev = read_file(_case("bk2-vllm10453-internal-error-init-rank1-rank2-cut-pid412-no-rank"))
    assert sorted(e.rank for e in ev if e.kind == "traceback") == [1, 2]
    (p,) = [e for e in ev if e.kind == "present" and e.pid == 412]
    assert p.detail["failed"] == {"at": "init.cc:1929", "code": 3}
    coords = pd.DataFrame(columns=["dp", "tp", "pp", "host"])
    (f, *rest), _ = log_findings(pd.DataFrame([e.row() for e in ev]), coords)
    assert (f.kind, f.culprit_rank, f.evidence["suspects"], rest) == ("crash", -1, [], [])
    assert "several processes fail alike" in f.summary


def test_a_rank_with_only_nccl_setup_lines_stays_a_suspect() -> None:
    """lightning#20434: device [2]'s only lines are NCCL's set-up (``cudaDriverVersion``,
    ``Bootstrap``), so it is no rank that "printed no timeout": suspects 0,1,2 (it said 0,1);
    a service thread's ``Connection closed`` is no set-up line."""
    import pandas as pd

    from ranksight.analyzer.log_evidence import log_findings
    from ranksight.importer.logs import read_lines

    ev = read_file(_case("bk2-lightning20434-broadcast-seq1-rank3-rank2-setup-lines-only"))
    setup = {e.pid: e.detail.get("setup_only") for e in ev if e.kind == "present" and e.pid > 0}
    assert setup == {2324238: True, 2324239: True}
    coords = pd.DataFrame(columns=["dp", "tp", "pp", "host"])
    (f, *_), _ = log_findings(pd.DataFrame([e.row() for e in ev]), coords)
    assert (f.kind, f.culprit_rank, f.evidence["suspects"]) == ("hang", -1, [0, 1, 2])
    line = "h:1:2 [6] NCCL INFO [Service thread] Connection closed by localRank 2"
    (p,) = [e for e in read_lines([line]) if e.kind == "present"]
    assert "setup_only" not in p.detail


def test_a_two_rank_desync_and_a_group_bound_say_what_they_are() -> None:
    """accelerate#3250: two ranks, one ahead: no "odd one out" of "the others"; DeepEP#411:
    the world's bound 16 is PG 1's NumelOut / NumelIn, not "the highest rank seen"."""
    import pandas as pd

    from ranksight.analyzer.log_evidence import log_findings

    coords = pd.DataFrame(columns=["dp", "tp", "pp", "host"])
    ev = read_file(_case("bk2-accel3250-fsdp-two-ranks-reduce-scatter-122-vs-allgather-126"))
    (f, *_), _ = log_findings(pd.DataFrame([e.row() for e in ev]), coords)
    assert (f.kind, f.culprit_rank, f.evidence["suspects"]) == ("desync", -1, [0, 1])
    assert "while rank 0 is at #122" in f.summary and "odd one" not in f.summary
    ev = read_file(_case("bk2-deepep411-internode-allgather-seq1-pg1-ranks3-7-node0-only"))
    (f, *_), notes = log_findings(pd.DataFrame([e.row() for e in ev]), coords)
    assert "at least 16, the size of a group's all_gather" in f.summary
    assert "highest rank" not in " ".join([f.summary, *notes])


def test_pdsh_prefixed_launcher_kills_and_tracebacks_are_read() -> None:
    """DeepSpeed#4510: ``192.169.83.120: [...] [launch.py:315:sigkill_handler] Killing
    subprocess 249`` is that host's launcher killing its workers (a crash there, no rank);
    azureml-assets#302: tracebacks behind ``10.0.0.6: `` and ``10.0.0.7: `` are a crash on
    both hosts, no culprit (both were skipped as saying nothing)."""
    import pandas as pd

    from ranksight.analyzer.log_evidence import log_findings

    coords = pd.DataFrame(columns=["dp", "tp", "pp", "host"])
    ev = read_file(_case("bk2-ds4510-pdsh-ip-prefix-sigkill-handler-killing-subprocess-host-120"))
    (k,) = [e for e in ev if e.kind == "child_failed"]
    assert (k.host, k.detail["killed"][:2], len(k.detail["killed"])) == (
        "192.169.83.120",
        [249, 250],
        8,
    )
    (f,), _ = log_findings(pd.DataFrame([e.row() for e in ev]), coords)
    assert (f.kind, f.culprit_rank, f.host) == ("crash", -1, "192.169.83.120")
    ev = read_file(_case("bk2-azureml302-pdsh-ip-prefix-tracebacks-two-hosts-no-exception"))
    assert sorted(e.host for e in ev if e.kind == "traceback") == ["10.0.0.6", "10.0.0.7"]
    (f,), _ = log_findings(pd.DataFrame([e.row() for e in ev]), coords)
    assert (f.kind, f.culprit_rank, f.evidence["hosts"]) == ("crash", -1, ["10.0.0.6", "10.0.0.7"])


def test_torchrun_failure_after_a_desync_is_its_consequence() -> None:
    """speechbrain#2401: rank 1's all_reduce vs rank 0's broadcast #485, then torchrun's
    ``[ts] torch.distributed.elastic.multiprocessing.api: [ERROR] failed (exitcode: 1)
    local_rank: 0``: one desync, no crash of rank 0 (it said "crash: rank 0" at 0.45), and
    the logger's name is no host."""
    import pandas as pd

    from ranksight.analyzer.log_evidence import log_findings

    ev = read_file(_case("bk3-speechbrain2401-mismatch-bcast-vs-allreduce-seq485-torchrun-local0"))
    (cf,) = [e for e in ev if e.kind == "child_failed"]
    assert cf.host == "" and cf.local_rank == 0
    coords = pd.DataFrame(columns=["dp", "tp", "pp", "host"])
    findings, notes = log_findings(pd.DataFrame([e.row() for e in ev]), coords)
    assert [(f.kind, f.culprit_rank, f.evidence["suspects"]) for f in findings] == [
        ("desync", -1, [0, 1])
    ]
    assert any("the desync's consequence" in n for n in notes)
    assert split_prefix("gr064: [rank3]: x")[3] == "gr064"


def test_a_failed_connect_names_the_peer_not_the_reporter() -> None:
    """sglang#5594: ``h100-15:139:1092 [7] ... socketStartConnect: Connect to
    10.0.0.82<38455> failed``: a network finding on the peer 10.0.0.82, no rank (it said
    "suspects 7" and "world size at least 8": devices 0, 5, 7 of h100-15 taken as ranks)."""
    import pandas as pd

    from ranksight.analyzer.log_evidence import log_findings

    ev = read_file(_case("bk3-sglang5594-socketstartconnect-peer-10.0.0.82-h100-15-gpus-0-5-7"))
    coords = pd.DataFrame(columns=["dp", "tp", "pp", "host"])
    (f, *_), notes = log_findings(pd.DataFrame([e.row() for e in ev]), coords)
    assert (f.kind, f.culprit_rank, f.evidence["suspects"], f.host) == (
        "network",
        -1,
        [],
        "10.0.0.82",
    )
    assert "host h100-15, GPU 7" in f.summary and not any("at least 8" in n for n in notes)


def test_a_process_driving_several_devices_has_no_rank() -> None:
    """nccl#1283: pid 2657296 prints NCCL lines on devices [0] and [1], then device 0's
    ``Cuda failure 1 'invalid argument'``: host n176-080-198, GPU 0, no rank (it said
    "suspects 0")."""
    import pandas as pd

    from ranksight.analyzer.log_evidence import log_findings

    ev = read_file(_case("bk3-nccl1283-ray-one-pid-devices-0-1-cuda-invalid-argument-cut"))
    (p,) = [e for e in ev if e.kind == "present"]
    assert p.detail["devices"] == [0, 1]
    coords = pd.DataFrame(columns=["dp", "tp", "pp", "host"])
    (f,), _ = log_findings(pd.DataFrame([e.row() for e in ev]), coords)
    assert (f.kind, f.culprit_rank, f.evidence["suspects"]) == ("crash", -1, [])
    assert "host n176-080-198, GPU 0" in f.summary


def test_a_cut_watchdog_exception_and_an_fr_wait_are_timeouts() -> None:
    """LlamaFactory#8261 (line numbers ``[1830] ``): rank 3's ``timed out after waiting for
    60000ms flight recorder dumps to finish`` and rank 4's ``watchdog thread terminated
    with exception: [Rank 4] Watchdog`` (cut) are timeouts of PG 1, op unknown: a hang,
    no culprit (the file was skipped as saying nothing)."""
    import pandas as pd

    from ranksight.analyzer.log_evidence import log_findings

    ev = read_file(_case("bk3-llamafactory8261-lineno-prefix-pg1-rank3-fr-wait-rank4-watchdog-cut"))
    t = sorted((e.rank, e.pg, e.detail.get("fr_wait", False)) for e in ev if e.kind == "timeout")
    assert t == [(3, "1", True), (4, "1", False)]
    coords = pd.DataFrame(columns=["dp", "tp", "pp", "host"])
    (f, *_), _ = log_findings(pd.DataFrame([e.row() for e in ev]), coords)
    assert (f.kind, f.culprit_rank) == ("hang", -1) and not {3, 4} & set(f.evidence["suspects"])


def test_a_failed_proxy_call_suspects_that_rank() -> None:
    """vllm#798 (behind Ray's prefix): ``ncclInternalError: Internal check failed.`` and
    ``Last error: Proxy Call to rank 7 failed (Connect)``: a network finding suspecting
    rank 7, no culprit (the file was skipped as saying nothing)."""
    import pandas as pd

    from ranksight.analyzer.log_evidence import log_findings

    ev = read_file(_case("bk3-vllm798-ray-llmengine-internal-error-proxy-call-rank7-connect"))
    assert {e.kind for e in ev} >= {"nccl_error", "nccl_warn"}
    coords = pd.DataFrame(columns=["dp", "tp", "pp", "host"])
    (f, *_), _ = log_findings(pd.DataFrame([e.row() for e in ev]), coords)
    assert (f.kind, f.culprit_rank, f.evidence["suspects"]) == ("network", -1, [7])


def test_a_closed_rendezvous_is_no_join_timeout() -> None:
    """kubeflow trainer#1638: ``RendezvousClosedError`` in torchelastic's error JSON after a
    pod was deleted: a launcher's failure at start-up, no rank, not "not every node joined
    in time" (it said "hang at start-up")."""
    import pandas as pd

    from ranksight.analyzer.log_evidence import log_findings

    ev = read_file(_case("bk3-kftrainer1638-etcd-rendezvous-closed-error-handler-json-pod-deleted"))
    coords = pd.DataFrame(columns=["dp", "tp", "pp", "host"])
    (f,), _ = log_findings(pd.DataFrame([e.row() for e in ev]), coords)
    assert (f.kind, f.cause, f.culprit_rank, f.evidence["suspects"]) == (
        "crash",
        "rendezvous",
        -1,
        [],
    )
    assert "closed" in f.summary and "in time" not in f.summary


def test_a_time_and_host_prefix_and_torchruns_command_line_are_read() -> None:
    """chitu#80: ``2025-03-27 17:31:09.952  sm228-a100-40g-23 [rank1]:`` is rank 1 on host
    sm228-a100-40g-23, and both nodes' ``torchrun --nnodes=2 --nproc_per_node=1`` fix the
    world at 2: a hang in recv #3313, silent rank 0 the suspect at low confidence."""
    import pandas as pd

    from ranksight.analyzer.log_evidence import log_findings
    from ranksight.importer.logs.presence import launched_world

    ev = read_file(
        _case("bk3-chitu80-recv-seq3313-rank1-ts-host-prefix-torchrun-2nodes-rank0-silent")
    )
    assert {e.host for e in ev if e.kind == "status"} == {"sm228-a100-40g-23"}
    coords = pd.DataFrame(columns=["dp", "tp", "pp", "host"])
    (f, *_), _ = log_findings(pd.DataFrame([e.row() for e in ev]), coords)
    assert (f.kind, f.evidence["suspects"], f.evidence["world_exact"]) == ("hang", [0], True)
    assert f.confidence < 0.5
    assert launched_world("torchrun --nnodes=1:4 --nproc_per_node=8 x.py") == 0
    assert launched_world("torchrun --nproc_per_node=auto --nnodes=2 x.py") == 0


def test_pdsh_host_before_a_cpp_abort_is_read() -> None:
    """DeepSpeed#2119: ``gr064:   what():  CUDA error: an illegal memory access was
    encountered`` is host gr064's (it said "a GPU", no host); an exception's ``Name: `` is
    still no host."""
    import pandas as pd

    from ranksight.analyzer.log_evidence import log_findings

    ev = read_file(_case("bk3-ds2119-pdsh-gr064-cuda-error-terminate-illegal-memory-at-exit"))
    (g,) = [e for e in ev if e.kind == "gpu_error"]
    assert g.host == "gr064" and g.text.startswith("what():")
    coords = pd.DataFrame(columns=["dp", "tp", "pp", "host"])
    (f,), _ = log_findings(pd.DataFrame([e.row() for e in ev]), coords)
    assert (f.kind, f.culprit_rank, f.host) == ("crash", -1, "gr064")
    assert split_prefix("RuntimeError: CUDA error: x")[3] == ""
