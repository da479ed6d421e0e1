"""Trainer hooks on a real 4-rank gloo job: every collective, aligned across ranks."""

from __future__ import annotations

import pytest

from tests.helpers.spool import read_spool


@pytest.fixture(scope="module")
def job(hooked_job_spool):
    return read_spool(hooked_job_spool)


def test_every_rank_records_identity_steps_and_phases(job):
    ranks = job["ranks"]
    assert sorted(ranks["rank"]) == [0, 1, 2, 3]
    assert set(ranks["backend"]) == {"gloo"}
    steps = job["steps"]
    assert len(steps) == 12 and set(steps["step"]) == {0, 1, 2}
    assert (steps["end_ns"] > steps["start_ns"]).all()
    phases = job["phases"]
    assert len(phases[phases["phase"] != "gc"]) == 4 * 3 * 2
    gc_pauses = phases[phases["phase"] == "gc"]
    assert (gc_pauses["end_ns"] - gc_pauses["start_ns"] >= 100_000).all()
    assert set(gc_pauses["microbatch"]) <= {0, 1, 2}  # the generation collected
    runs = job["runs"]
    assert list(runs["status"]) == ["running", "finished"]
    assert '"test": true' in runs["meta_json"].iloc[0]


def test_collectives_line_up_across_ranks_by_group_and_sequence(job):
    c = job["collectives"]
    coll = c[c["peer"] == -1]
    # per group, every member saw the same ops in the same order
    for gid, rows in coll.groupby("group_id"):
        members = [int(r) for r in rows["group_ranks"].iloc[0].split(",")]
        per_rank = {r: list(g.sort_values("group_seq")["op"]) for r, g in rows.groupby("rank")}
        assert sorted(per_rank) == members, gid
        seqs = {r: sorted(g["group_seq"]) for r, g in rows.groupby("rank")}
        assert all(s == list(range(len(s))) for s in seqs.values()), gid
        assert len({tuple(v) for v in per_rank.values()}) == 1, gid
    # per rank: 3 steps x (world all_reduce, tp all_gather, pair all_reduce, barrier)
    ops = coll.groupby(["rank", "op"]).size().unstack(fill_value=0)
    assert (ops["all_reduce"] == 6).all() and (ops["barrier"] == 3).all()
    assert (ops["all_gather"] >= 3).all()
    assert (coll["end_ns"] >= coll["enqueue_ns"]).all()


def test_send_and_recv_pair_up_by_peer_and_sequence(job):
    c = job["collectives"]
    sends = c[c["op"] == "send"].set_index(["group_id", "rank", "peer", "group_seq"]).index
    recvs = c[c["op"] == "recv"]
    recv_keys = set(
        zip(recvs["group_id"], recvs["peer"], recvs["rank"], recvs["group_seq"], strict=True)
    )
    assert len(sends) == len(recvs) == 4 * 3 + 2 * 3  # batched pair each step + send/recv
    assert set(sends) == recv_keys


def test_waiting_for_a_late_rank_is_measured_as_blocked_time(job):
    c = job["collectives"]
    world_ar = c[(c["op"] == "all_reduce") & (c["group_ranks"] == "0,1,2,3")]
    waited = world_ar.groupby("rank")["wait_ns"].median()
    assert waited[1] < 50e6  # the late rank itself hardly waits
    assert (waited.drop(1) > 150e6).all()  # everyone else waits ~200 ms for it
    fwd = job["phases"][job["phases"]["phase"] == "forward"]
    assert (fwd[fwd["rank"] != 1]["wait_ns"] > 150e6).all()


def test_hook_stats_report_no_drops(job):
    stats = job["hook_stats"]
    last = stats.sort_values("ts_ns").groupby("rank").tail(1)
    assert (last["dropped"] == 0).all() and (last["records"] > 0).all()


def test_progress_snapshots_end_with_everything_completed(job):
    prog = job["progress"]
    assert set(prog["rank"]) == {0, 1, 2, 3}
    last = prog.sort_values("ts_ns").groupby(["rank", "group_id", "direction", "peer"]).tail(1)
    assert (last["issued_seq"] == last["completed_seq"]).all()
    coll = job["collectives"]
    counts = coll[coll["peer"] == -1].groupby(["rank", "group_id"]).size()
    mine = last[last["direction"] == ""].set_index(["rank", "group_id"])["issued_seq"] + 1
    assert mine.sort_index().to_dict() == counts.sort_index().to_dict()


def test_flight_recorder_dump_on_request(hooked_job_spool, job):
    import glob
    import json

    from ranksight.collectors.flight_recorder import read_dump

    paths = sorted(glob.glob(f"{hooked_job_spool}/fr-rank*"))
    assert [p.rsplit("fr-rank", 1)[1] for p in paths] == ["0", "1", "2", "3"]
    dump = read_dump(paths[1], rank=1)
    assert dump.entries and not [p for p in dump.problems if "unknown" in p]
    meta = json.loads(job["runs"]["meta_json"].iloc[0])
    assert meta["flight_recorder"]["dump_prefix"] == f"{hooked_job_spool}/fr-rank"
