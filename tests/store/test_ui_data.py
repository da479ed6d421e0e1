"""The UI's store queries on both backends (chdb and ClickHouse 18.16), checked against
the same numbers computed in pandas from the raw rows of a synthetic run."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from ranksight.analyzer import analyze, summary
from ranksight.store import StoreError
from ranksight.synthetic import SynthConfig, write_synthetic
from ranksight.ui.data import (
    hang,
    heatmap,
    hosts,
    mesh,
    overview,
    runs,
    stacks,
    timeline,
)
from ranksight.ui.data.run import (
    ORDERS,
    RunMark,
    data_watermark,
    load_run_view,
    ordered_ranks,
    position_weights,
)

RUN = "ui-synth"
SLOW = "slow:rank=5,factor=3,from_step=4"
MESH = {"dp": 2, "tp": 2, "pp": 2}


@pytest.fixture
def synth_store(store):
    """A store holding one analyzed 8-rank synthetic run with rank 5 slow from step 4."""
    write_synthetic(store, SynthConfig(**MESH, steps=12, faults=(SLOW,), seed=1, run_id=RUN))
    analyze(store, RUN)
    return store


def raw(store, table: str) -> pd.DataFrame:
    return store.query(f"SELECT * FROM {table} WHERE run_id = %(r)s", {"r": RUN})


def compute_ms(store) -> pd.DataFrame:
    """rank x step compute self time (ms) from raw phase rows."""
    p = raw(store, "phases")
    p = p[p["phase"].isin(["forward", "backward", "optimizer"])]
    p = p.assign(v=(p["end_ns"] - p["start_ns"] - p["wait_ns"]) / 1e6)
    return p.pivot_table(index="rank", columns="step", values="v", aggfunc="sum")


def waits_ms(store, charge_to: str) -> pd.DataFrame:
    """rank x step wait (ms) from raw collective rows: each member waits for the last
    arriver, a receiver for its sender; charged to the waiter or to the one waited on."""
    c = raw(store, "collectives")
    coll = c[c["peer"] == -1].copy()
    key = ["group_id", "group_seq"]
    coll["max_enq"] = coll.groupby(key)["enqueue_ns"].transform("max")
    last = coll.loc[coll.groupby(key)["enqueue_ns"].idxmax(), key + ["rank"]].rename(
        columns={"rank": "last"}
    )
    coll = coll.merge(last, on=key)
    coll["w"] = coll["max_enq"] - coll["enqueue_ns"]
    coll["who"] = coll["rank"] if charge_to == "waiter" else coll["last"]
    recv = c[(c["op"] == "recv") & (c["peer"] >= 0)].rename(columns={"rank": "dst", "peer": "src"})
    send = c[(c["op"] == "send") & (c["peer"] >= 0)].rename(
        columns={"rank": "src", "peer": "dst", "enqueue_ns": "send_enq"}
    )
    p2p = recv.merge(
        send[["group_id", "src", "dst", "group_seq", "send_enq"]],
        on=["group_id", "src", "dst", "group_seq"],
    )
    p2p["w"] = (p2p["send_enq"] - p2p["enqueue_ns"]).clip(lower=0)
    p2p["who"] = p2p["dst"] if charge_to == "waiter" else p2p["src"]
    both = pd.concat([coll[["who", "step", "w"]], p2p[["who", "step", "w"]]])
    both["w"] = both["w"] / 1e6
    return both.pivot_table(index="who", columns="step", values="w", aggfunc="sum")


def as_rank_step(h: heatmap.Heatmap) -> pd.DataFrame:
    """An unbinned heatmap back as rank x step (ms)."""
    assert h.rank_bin == 1 and h.step_bin == 1
    return pd.DataFrame(h.vmax_ms, index=[r[0] for r in h.row_ranks], columns=h.col_steps)


def test_runs_table_lists_the_run_with_status_mesh_steps_and_findings(synth_store):
    table = runs.runs_table(synth_store)
    row = table.set_index("run_id").loc[RUN]
    assert (row["world_size"], row["dp"], row["tp"], row["pp"], row["steps"]) == (8, 2, 2, 2, 12)
    assert row["status"] == "finished" and row["findings"] == 1
    s = raw(synth_store, "steps").groupby("step").agg(a=("start_ns", "min"), b=("end_ns", "max"))
    assert row["step_ms"] == pytest.approx(float(((s["b"] - s["a"]) / 1e6).median()), abs=0.06)
    assert list(runs.runs_table(synth_store, "SYNTH")["run_id"]) == [RUN]  # case-insensitive
    assert runs.runs_table(synth_store, "ui_synth").empty  # _ matches itself, not any char
    assert runs.runs_table(synth_store, "x' OR 1=1 --").empty  # bound, never spliced


def test_heatmap_metrics_match_the_raw_rows(synth_store):
    run = load_run_view(synth_store, RUN)
    for metric, want in (
        ("compute", compute_ms(synth_store)),
        ("waited", waits_ms(synth_store, "waiter")),
        ("waited_on", waits_ms(synth_store, "holder")),
    ):
        h = heatmap.load_heatmap(synth_store, run, metric, ORDERS["rank"], (0, 11), 64, 64)
        got = as_rank_step(h)
        want = want.reindex(index=got.index, columns=got.columns).fillna(0.0)
        np.testing.assert_allclose(
            got.fillna(0.0).to_numpy(), want.to_numpy(), rtol=1e-6, atol=1e-3, err_msg=metric
        )
    assert h.culprit_rows == {5: 5}
    compute = as_rank_step(
        heatmap.load_heatmap(synth_store, run, "compute", ORDERS["rank"], (0, 11), 64, 64)
    )
    others = compute.drop(index=5).loc[:, 4:].median().median()
    assert compute.loc[5, 4:].min() > 2.5 * others  # the slow rank stands out


def test_heatmap_bins_keep_the_largest_value_and_follow_the_mesh_order(synth_store):
    run = load_run_view(synth_store, RUN)
    full = compute_ms(synth_store)
    h = heatmap.load_heatmap(synth_store, run, "compute", ORDERS["pp, tp, dp"], (2, 11), 3, 4)
    assert (h.rank_bin, h.step_bin, h.shape) == (3, 3, (3, 4))
    order = list(ordered_ranks(run.ranks, ORDERS["pp, tp, dp"], run.shape)["rank"])
    assert order == [0, 4, 1, 5, 2, 6, 3, 7]  # pp outermost, then tp, then dp
    for i, ranks in enumerate(h.row_ranks):
        assert ranks == order[3 * i : 3 * i + 3]
        for j, s0 in enumerate(h.col_steps):
            block = full.loc[ranks, s0 : min(s0 + 2, 11)]
            assert h.vmax_ms[i, j] == pytest.approx(block.max().max(), rel=1e-9)
            assert h.vmean_ms[i, j] == pytest.approx(block.stack().mean(), rel=1e-9)
            worst = block.stack().idxmax()
            assert (h.worst_rank[i, j], h.worst_step[i, j]) == worst
    assert h.culprit_rows == {5: 1} and h.row_labels[0] == "3 ranks pp0 tp0-1 dp0-1"


def test_the_analyzer_makes_the_summary_from_settled_steps_and_the_heatmap_only_reads_it(store):
    write_synthetic(store, SynthConfig(**MESH, steps=12, faults=(SLOW,), seed=1, run_id=RUN))
    analyze(store, RUN, save=False)  # an analysis not saved writes nothing
    finished = load_run_view(store, RUN)
    running = replace(finished, row={**finished.row, "status": "running"})
    assert summary.covered_step(store, RUN, finished.attempt) == -1

    class ReadOnly:  # the heatmap's store: any write fails the test
        url = "read-only"

        def query(self, sql, params=None):
            return store.query(sql, params)

        def insert(self, table, rows):
            raise AssertionError(f"the heatmap wrote {len(rows)} rows to {table}")

    def same_as_raw(run):
        for metric in heatmap.METRICS:
            got = heatmap.load_heatmap(ReadOnly(), run, metric, ORDERS["rank"], (3, 11), 64, 64)
            want = heatmap.load_heatmap(
                store, run, metric, ORDERS["rank"], (3, 11), 64, 64, use_summary=False
            )
            np.testing.assert_array_equal(got.vmax_ms, want.vmax_ms, err_msg=metric)
            np.testing.assert_array_equal(got.worst_rank, want.worst_rank, err_msg=metric)

    same_as_raw(running)  # no summary yet: all raw
    assert summary.covered_step(store, RUN, finished.attempt) == -1  # reading made nothing
    # running: up to the step before the slowest rank's last; the heatmap reads the rest raw
    assert summary.ensure(store, RUN, finished.attempt, running=True) == 10
    state = summary.read_state(store, RUN, finished.attempt)
    assert (state["covered"], state["n_rows"]) == (10, 8 * 11)  # made once, steps 0..10
    same_as_raw(running)
    analyze(store, RUN)  # saved, the run finished: every step
    assert summary.covered_step(store, RUN, finished.attempt) == 11
    same_as_raw(finished)
    queries = []

    class Counting:
        url = "counting"

        def query(self, sql, params=None):
            queries.append(sql)
            return store.query(sql, params)

    got = summary.ensure(Counting(), RUN, finished.attempt, running=False, last_step=11)
    assert got == 11 and len(queries) == 1
    synth_store = store
    stored = synth_store.query(
        "SELECT rank, step, compute_ns, has FROM rank_step_summary WHERE run_id = %(r)s", {"r": RUN}
    )
    assert len(stored) == 8 * 12 and not stored.duplicated(["rank", "step"]).any()
    want = compute_ms(synth_store).stack()
    got = stored.set_index(["rank", "step"])["compute_ns"] / 1e6
    np.testing.assert_allclose(got.reindex(want.index).to_numpy(), want.to_numpy(), rtol=1e-9)
    assert (stored["has"] == 31).all()  # every metric recorded for every rank and step
    synth_store.insert("rank_step_summary", stored.assign(run_id=RUN))  # stored twice
    again = heatmap.load_heatmap(synth_store, finished, "compute", ORDERS["rank"], (0, 11), 64, 64)
    np.testing.assert_allclose(as_rank_step(again).to_numpy(), compute_ms(synth_store).to_numpy())


def test_a_store_without_the_summary_table_is_read_from_the_raw_rows(synth_store):
    run = load_run_view(synth_store, RUN)

    class Older:  # the summary table is missing, as in a store not yet migrated
        url = "older"

        def query(self, sql, params=None):
            if "rank_step_summary" in sql:
                raise StoreError("older: query failed: unknown table rank_step_summary")
            return synth_store.query(sql, params)

    assert summary.covered_step(Older(), RUN, run.attempt) is None
    assert summary.ensure(Older(), RUN, run.attempt, running=False) is None
    got = heatmap.load_heatmap(Older(), run, "waited", ORDERS["rank"], (0, 11), 64, 64)
    want = waits_ms(synth_store, "waiter").reindex(index=range(8), columns=range(12))
    np.testing.assert_allclose(as_rank_step(got).fillna(0).to_numpy(), want.fillna(0).to_numpy())


def test_position_weights_reject_unknown_axes():
    assert position_weights(("pp", "tp", "dp"), MESH) == {
        "w_dp": 1,
        "w_tp": 2,
        "w_pp": 4,
        "w_rank": 0,
    }
    with pytest.raises(ValueError, match="'cp'"):
        position_weights(("cp",), MESH)


def test_overview_series_has_step_time_and_tokens_per_second(synth_store):
    run = load_run_view(synth_store, RUN)
    series = overview.step_series(synth_store, run)
    s = raw(synth_store, "steps").merge(raw(synth_store, "ranks")[["rank", "dp"]], on="rank")
    wall = s.groupby("step").agg(a=("start_ns", "min"), b=("end_ns", "max"))
    tokens = s.groupby(["step", "dp"])["tokens"].max().groupby("step").sum()
    np.testing.assert_allclose(series["step_ms"], (wall["b"] - wall["a"]) / 1e6)
    np.testing.assert_allclose(series["tokens_per_s"], tokens / ((wall["b"] - wall["a"]) / 1e9))
    assert series["mfu"].isna().all()  # no FLOPs recorded
    binned = overview.step_series(synth_store, run, max_points=4)
    assert list(binned["first_step"]) == [0, 3, 6, 9] and list(binned["n_steps"]) == [3, 3, 3, 3]


def test_mfu_from_recorded_flops():
    meta = '{"model_flops_per_token": 6e9, "peak_flops_per_rank": 1e15}'
    got = overview.mfu(pd.Series([1e5]), meta, 4)
    assert got.iloc[0] == pytest.approx(1e5 * 6e9 / (4 * 1e15))
    assert overview.mfu(pd.Series([1.0]), "{}", 4).isna().all()
    cpu = '{"model_flops_per_token": 6e9, "peak_flops_per_rank": null}'
    assert overview.mfu(pd.Series([1e5]), cpu, 4).isna().all()  # peak unknown: no MFU
    assert overview.achieved_tflops(pd.Series([1e5]), cpu).iloc[0] == pytest.approx(6e14 / 1e12)
    assert overview.flops_of("not json") == (None, None)


def test_timeline_rows_of_one_step_and_the_late_arriver(synth_store):
    run = load_run_view(synth_store, RUN)
    tl = timeline.load_timeline(synth_store, run, (6, 6), ORDERS["pp, tp, dp"], 5, 4)
    assert list(tl.ranks["rank"]) == [4, 1, 5, 2]  # 4 ranks around rank 5 in mesh order
    ph = raw(synth_store, "phases")
    assert len(tl.phases) == len(ph[(ph["step"] == 6) & ph["rank"].isin([4, 1, 5, 2])])
    assert tl.phases["t0_ms"].min() >= 0
    inst = timeline.collective_instances(synth_store, run, (6, 6))
    top = inst.iloc[0]
    members = timeline.instance_members(
        synth_store, run, top["group_id"], int(top["group_seq"]), tl.origin_ns
    )
    assert int(members.iloc[-1]["rank"]) == int(top["last_rank"]) == 5  # the slow rank arrives last
    assert float(members["enq_ms"].max() - members["enq_ms"].min()) == pytest.approx(top["skew_ms"])


def test_mesh_slowness_and_edges(synth_store):
    run = load_run_view(synth_store, RUN)
    slow = mesh.slowness(synth_store, run, skip_steps=4).set_index("rank")
    assert slow["slowness"].idxmax() == 5 and slow.loc[5, "slowness"] > 2.5
    assert slow.drop(index=5)["slowness"].max() < 1.3
    edges = mesh.wait_edges(run)
    assert set(edges["holder"]) == {5} and len(edges) >= 1 and (edges["waited_ms"] > 0).all()


def test_hang_progress_names_the_rank_that_never_entered(store):
    write_synthetic(
        store, SynthConfig(**MESH, steps=8, faults=("hang:rank=3,from_step=5",), run_id="ui-hang")
    )
    run = load_run_view(store, "ui-hang")
    progress = hang.group_progress(store, run)
    named = hang.suspects(progress, hang.open_ops(store, run))
    assert named == [3]  # the others are blocked in ops waiting for it
    summary = hang.group_summary(progress, named)
    assert "3" in summary.iloc[0]["lagging"].split(",")
    tp_group = summary[summary["group_id"] == progress[progress["rank"] == 3]["group_id"].iloc[0]]
    assert not tp_group.empty
    assert runs.runs_table(store).set_index("run_id").loc["ui-hang", "status"] in (
        "running",
        "hung",
    )
    assert stacks.aggregated_stacks(store, run).empty


def test_stacks_group_identical_stacks_odd_one_first(store):
    write_synthetic(store, SynthConfig(**MESH, steps=2, run_id="ui-stk"))
    waiting = "MainThread (idle): all_reduce (torch/distributed/c10d.py:2501)"
    odd = "MainThread (active): forward (model.py:88)"
    rows = [
        {
            "run_id": "ui-stk",
            "attempt": 0,
            "rank": r,
            "host": "h",
            "pid": 10 + r,
            "ts_ns": 1000 + r,
            "trigger": "no_progress",
            "ok": 1,
            "summary": odd if r == 3 else waiting,
            "stack_json": "[]",
        }
        for r in range(8)
    ]
    store.insert("stacks", pd.DataFrame(rows))
    got = stacks.aggregated_stacks(store, load_run_view(store, "ui-stk"))
    assert list(got["ranks"]) == ["3", "0,1,2,4,5,6,7"] and list(got["stack"]) == [odd, waiting]


def test_hosts_series_read_collector_rows_in_the_run_span(store):
    write_synthetic(store, SynthConfig(**MESH, steps=3, run_id="ui-host"))
    run = load_run_view(store, "ui-host")
    assert hosts.load_hosts(store, run).empty
    host = str(run.ranks["host"].iloc[0])
    t0 = int(raw_steps_start(store, "ui-host"))
    rows = [
        {
            "host": host,
            "ts_ns": t0 + i * 10**8,
            "gpu_index": 0,
            "gpu_uuid": "GPU-1",
            "sm_clock_mhz": 1980.0 - i,
            "power_w": 400.0 + i,
            "temperature_c": 60.0 + i,
            "clock_event_names": "sw_power_cap" if i == 2 else "",
            "ecc_corrected": 0.0,
            "ecc_uncorrected": 0.0,
        }
        for i in range(5)
    ]
    store.insert("gpu_samples", pd.DataFrame(rows))
    store.insert(
        "gpu_events",
        pd.DataFrame(
            [
                {
                    "host": host,
                    "ts_ns": t0 + 5,
                    "gpu_index": 0,
                    "kind": "xid",
                    "code": 79,
                    "detail": "GPU has fallen off the bus",
                }
            ]
        ),
    )
    got = hosts.load_hosts(store, run, points=1000)
    assert not got.empty and len(got.gpu) == 5 and got.gpu["temp"].max() == 64.0
    assert list(got.events["code"]) == [79]
    assert any("sw_power_cap" in list(r) for r in got.gpu["reasons"])


def raw_steps_start(store, run_id: str) -> int:
    return int(
        store.query("SELECT min(start_ns) AS t FROM steps WHERE run_id = %(r)s", {"r": run_id})[
            "t"
        ].iloc[0]
    )


def test_the_run_mark_moves_with_new_steps_a_new_analysis_and_a_status_change(store):
    assert data_watermark(store, "ui-mark", 0) == RunMark()  # no such run: all zero
    assert RunMark().steps is None
    write_synthetic(store, SynthConfig(**MESH, steps=12, faults=(SLOW,), run_id="ui-mark"))
    first = data_watermark(store, "ui-mark", 0)
    steps = raw_steps(store, "ui-mark")
    assert (first.step_rows, first.last_end_ns, first.rank_rows) == (
        len(steps),
        int(steps["end_ns"].max()),
        8,
    )
    span = int(steps["end_ns"].max() - steps["start_ns"].min())
    assert first.mean_step_ns == pytest.approx(span / 12)
    assert first.steps == (0, 11) == heatmap.step_range(store, load_run_view(store, "ui-mark"))
    more = steps[steps["step"] == 11].assign(step=12, start_ns=lambda f: f["end_ns"] + 1)
    store.insert("steps", more.assign(end_ns=more["start_ns"] + 10**6))
    after_step = data_watermark(store, "ui-mark", 0)
    assert (
        after_step.step_rows == first.step_rows + 8 and after_step.last_end_ns > first.last_end_ns
    )
    assert analyze(store, "ui-mark").findings  # stored, so the mark moves
    analyzed = data_watermark(store, "ui-mark", 0)
    assert analyzed.analyzed_ns > 0 and analyzed != after_step
    row = store.query("SELECT * FROM runs WHERE run_id = 'ui-mark'").iloc[[0]]
    store.insert("runs", row.assign(updated_ns=analyzed.updated_ns + 5, status="finished"))
    assert data_watermark(store, "ui-mark", 0).updated_ns == analyzed.updated_ns + 5


def test_run_list_reads_the_runs_table_only(store):
    write_synthetic(store, SynthConfig(**MESH, steps=2, run_id="ui-list-a"))
    write_synthetic(store, SynthConfig(**MESH, steps=2, run_id="ui-list-b"))
    got = runs.run_list(store)
    assert set(got["run_id"]) == {"ui-list-a", "ui-list-b"}
    assert list(got.columns) == ["run_id", "attempt", "started_ns", "stored_status"]
    assert got["started_ns"].is_monotonic_decreasing  # newest first


def raw_steps(store, run_id: str) -> pd.DataFrame:
    return store.query("SELECT * FROM steps WHERE run_id = %(r)s", {"r": run_id})


def test_snapshots_give_each_ranks_last_entered_and_completed_and_settle_on_the_rows(store):
    write_synthetic(
        store, SynthConfig(**MESH, steps=8, faults=("hang:rank=3,from_step=5",), run_id="ui-hs")
    )
    write_synthetic(store, SynthConfig(**MESH, steps=12, run_id="ui-clean"))
    run = load_run_view(store, "ui-hs")
    snap = hang.load_snapshots(store, run)
    p = store.query("SELECT * FROM progress WHERE run_id = 'ui-hs' AND direction = ''")
    newest = p.sort_values("ts_ns").groupby(["group_id", "rank"]).tail(1)
    got = snap.progress.merge(newest, on=["group_id", "rank"])
    assert len(got) == len(newest) == len(snap.progress)
    assert (got["last_entered"] == got["issued_seq"]).all()
    assert (got["last_done"] == got["completed_seq"]).all()
    settled, open_by_rank = hang.settle(store, run, snap)
    assert hang.suspects(settled, open_by_rank) == [3]
    clean = load_run_view(store, "ui-clean")
    csnap = hang.load_snapshots(store, clean)
    assert csnap.progress["stuck"].any()  # its last snapshot caught the last step in flight
    settled, open_by_rank = hang.settle(store, clean, csnap)
    assert not settled["stuck"].any() and (settled["behind"] == 0).all()
    assert hang.suspects(settled, open_by_rank) == [] and open_by_rank.sum() == 0


def test_the_evidence_table_shows_numbers_as_the_text_report_does():
    """One decimal for ms and ``1.96x`` for ratios (it showed "300.9920"), in the same
    words as the report (report.phase_rows)."""
    from ranksight.ui.views.overview import phase_table

    t = phase_table({"forward": {"rank_ms": 300.992, "peers_ms": 52.1234, "ratio": 5.7749}}, 5)
    assert t.columns.tolist() == ["phase", "rank 5 ms", "peers ms (median)", "ratio"]
    assert t.iloc[0].tolist() == ["forward", "301.0", "52.1", "5.77x"]
