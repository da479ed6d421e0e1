"""The synthetic run generator: real schema, 1F1B structure, injected faults the analyzer
finds (``ranksight.synthetic``)."""

from __future__ import annotations

import pytest

from ranksight.analyzer import analyze
from ranksight.synthetic import SynthConfig, layout_for, rows_per_rank_step, write_synthetic
from ranksight.synthetic.timeline import stage_order, topo_order


def _write(store, *faults: str, steps: int = 16, **kw):
    cfg = SynthConfig(dp=2, tp=2, pp=2, steps=steps, faults=faults, run_id="syn", **kw)
    return cfg, write_synthetic(store, cfg)


def test_analyzer_names_the_injected_slow_rank(store):
    _, result = _write(store, "slow:rank=5,factor=2.5,from_step=4")
    assert result.steps_written == 16
    (finding,) = analyze(store, "syn", save=False).findings
    assert (finding.culprit_rank, finding.kind, finding.cause) == (5, "straggler", "compute")
    assert (finding.dp, finding.tp, finding.pp) == (1, 1, 0)
    assert finding.evidence["onset_step"] == 4


def test_clean_synthetic_run_has_no_findings(chdb_url):
    from ranksight.store import open_store

    store = open_store(chdb_url)
    store.init_schema()
    for seed in range(3):
        cfg = SynthConfig(dp=2, tp=2, pp=2, steps=16, seed=seed, run_id=f"clean{seed}")
        write_synthetic(store, cfg)
        assert analyze(store, cfg.run_id, save=False).findings == []


def test_rows_follow_the_schema_and_the_1f1b_structure(chdb_url):
    from ranksight.store import open_store

    store = open_store(chdb_url)
    store.init_schema()
    cfg = SynthConfig(ranks=64, steps=3, run_id="shape")  # DP2 x TP8 x PP4, m = 4
    result = write_synthetic(store, cfg)
    per_rank_step = sum(v for k, v in result.rows.items() if k not in ("runs", "ranks", "progress"))
    assert per_rank_step == pytest.approx(64 * 3 * rows_per_rank_step(cfg))
    ops = store.query(
        "SELECT op, phase, count() AS n, uniqExact(group_id) AS groups FROM collectives "
        "GROUP BY op, phase ORDER BY op, phase"
    )
    got = {(r.op, r.phase): (r.n, r.groups) for r in ops.itertuples()}
    # per step: every rank 4 fwd + 4 bwd TP all_reduces (8 TP groups), 1 DP all_reduce
    # (32 DP groups); sends = recvs = 2 directions x 4 microbatches x 3 stage boundaries x 16
    assert got[("all_reduce", "forward")] == (64 * 4 * 3, 8)
    assert got[("all_reduce", "")] == (64 * 3, 32)
    assert got[("send", "")][0] == got[("recv", "")][0] == 2 * 4 * 3 * 16 * 3
    unmatched = store.query(
        "SELECT count() AS n FROM (SELECT group_id, rank AS src, toUInt32(peer) AS dst, group_seq "
        "FROM collectives WHERE op = 'send') AS s ANY LEFT JOIN (SELECT group_id, "
        "toUInt32(peer) AS src, rank AS dst, group_seq, 1 AS hit FROM collectives "
        "WHERE op = 'recv') AS r USING (group_id, src, dst, group_seq) WHERE hit = 0"
    )
    assert int(unmatched["n"].iloc[0]) == 0
    phases = store.query("SELECT phase, count() AS n FROM phases GROUP BY phase")
    assert dict(zip(phases["phase"], phases["n"], strict=True)) == {
        "data_wait": 192, "forward": 768, "backward": 768, "optimizer": 192,
    }  # fmt: skip


def test_slow_link_keeps_arrivals_on_time_and_completes_late(chdb_url):
    from ranksight.store import open_store

    store = open_store(chdb_url)
    store.init_schema()
    cfg = SynthConfig(
        dp=2, tp=2, pp=2, steps=8, run_id="link", faults=("slow_link:rank=3,delay_ms=20,group=tp",)
    )
    write_synthetic(store, cfg)
    per_group = store.query(
        "SELECT group_ranks, avg(skew) AS skew_ms, avg(tail) AS tail_ms FROM ("
        " SELECT group_ranks, group_seq, (max(enqueue_ns) - min(enqueue_ns)) / 1e6 AS skew,"
        " (max(end_ns) - max(enqueue_ns)) / 1e6 AS tail FROM collectives"
        " WHERE op = 'all_reduce' AND phase != '' GROUP BY group_ranks, group_seq)"
        " GROUP BY group_ranks ORDER BY group_ranks"
    ).set_index("group_ranks")
    assert per_group.loc["2,3", "tail_ms"] > 20
    assert per_group.drop(index="2,3")["tail_ms"].max() < 2
    assert per_group["skew_ms"].max() < 10  # arrivals stay within compute jitter


def test_hang_stops_the_run_with_the_rank_missing_from_its_group(chdb_url):
    from ranksight.store import open_store

    store = open_store(chdb_url)
    store.init_schema()
    cfg = SynthConfig(
        dp=2, tp=2, pp=2, steps=12, run_id="hang", faults=("hang:rank=2,from_step=6",)
    )
    result = write_synthetic(store, cfg)
    assert result.steps_written == 7
    steps = store.query("SELECT max(step) AS s FROM steps")
    assert int(steps["s"].iloc[0]) == 5
    open_ops = store.query(
        "SELECT rank, op, group_ranks FROM collectives WHERE end_ns = 0 AND step = 6 "
        "AND op = 'all_reduce' AND phase != ''"
    )
    assert list(open_ops["rank"]) == [3] and list(open_ops["group_ranks"]) == ["2,3"]
    status = store.query("SELECT argMax(status, updated_ns) AS s FROM runs")
    assert status["s"].iloc[0] == "running"
    # progress snapshots go on after the stop with nothing moving; rank 2 is one behind
    snap = store.query(
        "SELECT rank, max(ts_ns) AS last_ns, argMax(issued_seq, ts_ns) AS issued "
        "FROM progress WHERE group_ranks = '2,3' GROUP BY rank ORDER BY rank"
    )
    last_step = store.query("SELECT max(end_ns) AS t FROM steps")["t"].iloc[0]
    assert (snap["last_ns"] - last_step > 30e9).all()
    assert snap["issued"].tolist()[1] == snap["issued"].tolist()[0] + 1


def test_crashed_rank_stops_reporting_progress(chdb_url):
    from ranksight.store import open_store

    store = open_store(chdb_url)
    store.init_schema()
    cfg = SynthConfig(
        dp=2, tp=2, pp=2, steps=16, run_id="crash", faults=("crash:rank=6,from_step=12",)
    )
    write_synthetic(store, cfg)
    last = store.query("SELECT rank, max(ts_ns) AS t FROM progress GROUP BY rank")
    last = dict(zip(last["rank"].astype(int), last["t"], strict=True))
    assert sorted(last) == list(range(8))
    assert all(t - last[6] > 30e9 for r, t in last.items() if r != 6)
    assert store.query("SELECT count() AS n FROM phases WHERE rank = 6 AND step = 12")["n"][0] == 0
    status = store.query("SELECT argMax(status, updated_ns) AS s FROM runs")
    assert status["s"].iloc[0] == "failed"


def test_1f1b_order_and_layout():
    assert stage_order(2, 4, 0) == [("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1),
                                    ("F", 3), ("B", 2), ("B", 3)]  # fmt: skip
    assert stage_order(2, 4, 1) == [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2),
                                    ("B", 2), ("F", 3), ("B", 3)]  # fmt: skip
    assert len(topo_order(4, 4)) == 32
    assert layout_for(16384) == {"dp": 512, "tp": 8, "pp": 4}
    assert layout_for(1024) == {"dp": 32, "tp": 8, "pp": 4}
    assert layout_for(8) == {"dp": 2, "tp": 2, "pp": 2}


@pytest.mark.parametrize(
    ("kw", "problem"),
    [
        ({"ranks": 100}, "multiple of tp\\*pp"),
        ({}, "give --ranks"),
        ({"ranks": 8, "faults": ("gc_storm:rank=1",)}, "synthetic model supports"),
        ({"ranks": 8, "faults": ("slow:rank=8,factor=2",)}, "outside world size 8"),
        ({"ranks": 8, "dp": 4}, "!= dp\\*tp\\*pp"),
    ],
)
def test_config_errors_name_the_problem(kw, problem):
    with pytest.raises(ValueError, match=problem):
        SynthConfig(**kw)
