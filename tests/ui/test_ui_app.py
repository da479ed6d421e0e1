"""Every page of the web UI in Streamlit's AppTest, against a real `ranksight demo` run
and a synthetic 32-rank run, checking the numbers shown against the stored rows; and
the pages' messages for an empty store, an unknown run, a run without data and a store
that is down."""

from __future__ import annotations

import json
import os
from dataclasses import replace

import pandas as pd
import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

from ranksight.analyzer.queries import load_findings
from ranksight.store import open_store
from ranksight.ui import APP_PATH
from ranksight.ui.data.hosts import NIC_COUNTERS
from ranksight.ui.figures.timeline import PAST
from ranksight.ui.views.overview import duration_text
from tests.helpers.ui_stores import (
    chart_spec,
    charts,
    compute_ms,
    decode,
    demo_run,
    echarts_spec,
    step_wall_ms,
    straggler,
    synthetic_run,
)


@pytest.fixture(params=["demo", "synthetic"])
def stored(request, tmp_path_factory):
    """Each stored run in turn (the demo's real one, the generator's)."""
    make = demo_run if request.param == "demo" else synthetic_run
    return make(tmp_path_factory)


def page(monkeypatch, store: str, **params) -> AppTest:
    """The app at ``?params`` on ``store``, run once; fails on any exception shown.
    Cached reads are cleared first (the UI caches the runs list for 2 s)."""
    monkeypatch.setenv("RANKSIGHT_STORE", store)
    st.cache_data.clear()
    at = AppTest.from_file(APP_PATH, default_timeout=120)
    for k, v in params.items():
        at.query_params[k] = str(v)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def texts(at: AppTest) -> str:
    return "\n".join(
        str(e.value)
        for kind in ("markdown", "info", "warning", "error", "success", "caption")
        for e in getattr(at, kind)
    )


def test_runs_page_lists_the_run(monkeypatch, stored):
    at = page(monkeypatch, stored.store)
    table = at.dataframe[0].value.set_index("run")
    row = table.loc[stored.run_id]
    with open_store(stored.store) as s:
        n_findings = len(load_findings(s, stored.run_id, 0))
    assert (row["status"], row["world size"], row["steps"], row["findings"]) == (
        "finished",
        stored.world,
        stored.steps,
        n_findings,
    )
    with open_store(stored.store) as s:
        assert row["step ms"] == pytest.approx(step_wall_ms(s, stored.run_id).median(), abs=0.06)
    at.text_input[0].set_value("no-such-run").run()
    assert "No run matches" in texts(at)


def test_overview_shows_step_time_and_the_finding_with_its_evidence(monkeypatch, stored):
    at = page(monkeypatch, stored.store, page="overview", run=stored.run_id)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["world size"] == str(stored.world) and metrics["steps"] == str(stored.steps)
    with open_store(stored.store) as s:
        wall = step_wall_ms(s, stored.run_id)
    i, finding = straggler(stored.store, stored.run_id)
    assert metrics["median step"] == duration_text(wall.iloc[1:].median())
    spec = echarts_spec(at, "overview_chart")
    assert spec["series"][0]["encode"]["y"] == "step time (ms)"
    drawn = spec["dataset"][0]["source"]["step time (ms)"]
    assert list(drawn.astype(float).round(3)) == list(wall.round(3))
    headline = f"{i + 1}. straggler: rank {stored.culprit}, compute"
    assert headline in texts(at) and f"impact {finding['impact_pct']:.1f}%" in texts(at)
    at.button(key=f"ev{i}").click().run()
    assert at.query_params["finding"] in (str(i), [str(i)])
    ev = json.loads(finding["evidence_json"])
    phases = at.table[0].value.set_index("phase")
    assert phases.loc["forward", "ratio"] == f"{ev['phases']['forward']['ratio']:.2f}x"
    assert ev["phases"]["forward"]["ratio"] > 1.5
    assert (
        phases.loc["backward", f"rank {stored.culprit} ms"]
        == f"{ev['phases']['backward']['rank_ms']:.1f}"
    )
    victims = at.table[1].value
    assert list(victims["victim rank"].astype(int)) == [
        v["rank"] for v in ev["waited_for_it"]["victims"]
    ]


def test_a_findings_timeline_link_opens_the_step_it_starts_at(monkeypatch, stored):
    i, finding = straggler(stored.store, stored.run_id)
    onset = json.loads(finding["evidence_json"])["onset_step"]
    at = page(monkeypatch, stored.store, page="overview", run=stored.run_id)
    at.button(key=f"tl{i}").click().run()
    assert at.query_params["step"] in (str(onset), [str(onset)])
    assert at.number_input[0].value == onset
    assert chart_spec(at, "timeline_chart")["layout"]["title"]["text"].startswith(f"step {onset}:")


def test_overview_shows_the_achieved_model_flops_of_the_demo_and_says_why_no_mfu(
    monkeypatch, tmp_path_factory
):
    from ranksight.analyzer.queries import resolve_attempt
    from ranksight.reference_trainer.config import ModelConfig
    from ranksight.reference_trainer.flops import model_flops_per_token

    run = demo_run(tmp_path_factory)
    with open_store(run.store) as s:
        meta = json.loads(resolve_attempt(s, run.run_id, None)[0]["meta_json"])
        steps = s.query(
            "SELECT step, dp, start_ns, end_ns, tokens FROM steps ALL INNER JOIN "
            "(SELECT rank, any(dp) AS dp FROM ranks WHERE run_id = %(r)s GROUP BY rank) AS k "
            "USING (rank) WHERE run_id = %(r)s",
            {"r": run.run_id},
        )
    per_token = model_flops_per_token(ModelConfig(**meta["config"]["model"]))
    assert meta["model_flops_per_token"] == per_token and meta["peak_flops_per_rank"] is None
    wall = steps.groupby("step").agg(a=("start_ns", "min"), b=("end_ns", "max"))
    tokens = steps.groupby(["step", "dp"])["tokens"].max().groupby("step").sum()
    tflops = (tokens / ((wall["b"] - wall["a"]) / 1e9) * per_token / 1e12).iloc[1:].median()
    at = page(monkeypatch, run.store, page="overview", run=run.run_id)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["model TFLOP/s"] == f"{tflops:.4g}"
    note = next(c.value for c in at.caption if c.value.startswith("Model FLOPs"))
    assert f"{per_token / 1e6:,.2f} MFLOP per token" in note and "PaLM" in note
    assert f"Achieved {tflops:.4g} TFLOP/s" in note and "MFU: not shown" in note
    assert "cpu" in note  # why: the peak FLOP/s of a CPU rank is not recorded
    spec = echarts_spec(at, "overview_chart")
    series = next(t for t in spec["series"] if t["name"] == "model TFLOP/s")
    assert (series["xAxisIndex"], series["yAxisIndex"]) == (1, 2)  # the throughput panel's
    axis = spec["yAxis"][series["yAxisIndex"]]  # second axis
    assert axis["gridIndex"] == 1 and axis["position"] == "right"
    drawn = spec["dataset"][0]["source"]["model TFLOP/s"].iloc[1:].median()
    assert f"{drawn:.4g}" == f"{tflops:.4g}"


def test_overview_shows_mfu_when_the_run_recorded_its_peak_flops(monkeypatch, tmp_path):
    from ranksight.synthetic import SynthConfig, write_synthetic
    from ranksight.ui.data import overview
    from ranksight.ui.data.run import load_run_view

    url = str(tmp_path / "store")
    meta = {"model_flops_per_token": 6e9, "peak_flops_per_rank": 1e15, "peak_flops_source": "x"}
    with open_store(url) as s:
        s.init_schema()
        write_synthetic(s, SynthConfig(dp=2, tp=2, pp=2, steps=6, run_id="gpu"))
        rows = s.query("SELECT * FROM runs WHERE run_id = 'gpu'").sort_values("updated_ns")
        meta.update(json.loads(max(rows["meta_json"], key=len) or "{}"))  # the longest wins
        row = rows.iloc[[-1]]
        s.insert("runs", row.assign(updated_ns=row["updated_ns"] + 1, meta_json=json.dumps(meta)))
        series = overview.step_series(s, load_run_view(s, "gpu"))
    want = (series["tokens_per_s"] * 6e9 / (8 * 1e15)).iloc[1:].median()
    at = page(monkeypatch, url, page="overview", run="gpu")
    assert {m.label: m.value for m in at.metric}["MFU"] == f"{100 * want:.1f}%"
    spec = echarts_spec(at, "overview_chart")
    names = [t["name"] for t in spec["series"]]
    assert "MFU %" in names and "model TFLOP/s" not in names
    mfu = spec["dataset"][0]["source"]["MFU %"].iloc[1:].median()
    assert f"{mfu:.1f}%" == f"{100 * want:.1f}%"
    assert any("MFU against 1,000.0 TFLOP/s per rank" in c.value for c in at.caption)


def test_heatmap_draws_every_rank_and_step_with_the_stored_numbers(monkeypatch, stored):
    at = page(monkeypatch, stored.store, page="heatmap", run=stored.run_id, order="rank")
    spec = echarts_spec(at, "heatmap_chart")
    assert spec["series"][0]["type"] == "heatmap" and spec["series"][0]["datasetIndex"] == 0
    cells = spec["dataset"][0]["source"]
    z = cells.pivot(index="row", columns="col", values="max ms").to_numpy(float)
    assert (
        z.shape
        == (stored.world, stored.steps)
        == (len(spec["yAxis"][0]["data"]), len(spec["xAxis"][0]["data"]))
    )
    with open_store(stored.store) as s:
        want = compute_ms(s, stored.run_id).reindex(
            index=range(stored.world), columns=range(stored.steps)
        )
        culprits = set(load_findings(s, stored.run_id, 0)["culprit_rank"]) - {-1}
    pd.testing.assert_frame_equal(  # sent rounded to 0.01 ms
        pd.DataFrame(z), pd.DataFrame(want.to_numpy()), rtol=0, atol=0.005 + 1e-9, check_dtype=False
    )
    ticks = spec["yAxis"][1]["data"]  # the rank strip's labels
    marked = {
        i
        for i, t in enumerate(ticks)
        if isinstance(t, dict)
        and t["value"].startswith("culprit r")
        and t["textStyle"]["color"] == "#d62728"
    }
    assert stored.culprit in marked and marked == culprits  # rows are ranks in rank order


def test_the_loading_placeholder_goes_once_the_page_is_drawn(monkeypatch, stored):
    for name, key in (("overview", "overview_chart"), ("heatmap", "heatmap_chart")):
        at = page(monkeypatch, stored.store, page=name, run=stored.run_id)
        keys = chart_keys(at)
        assert len(keys) == 1 and key in keys[0], keys


def test_heatmap_selection_links_to_the_timeline(monkeypatch, stored):
    at = page(
        monkeypatch, stored.store, page="heatmap", run=stored.run_id, rank=stored.culprit, step=7
    )
    assert f"rank {stored.culprit} (host" in texts(at) and "a culprit" in texts(at)
    at.button(key="hm_to_tl").click().run()
    assert (
        at.query_params["page"] in ("timeline", ["timeline"]) and "Timeline" in at.header[0].value
    )
    spec = chart_spec(at, "timeline_chart")
    assert spec["layout"]["title"]["text"].startswith("step 7:")


def test_timeline_lines_up_every_rank_and_marks_the_late_arriver(monkeypatch, stored):
    at = page(
        monkeypatch, stored.store, page="timeline", run=stored.run_id, step=8, rank=stored.culprit
    )
    spec = chart_spec(at, "timeline_chart")
    assert len(spec["layout"]["yaxis"]["categoryarray"]) == stored.world  # all ranks (<= 64)
    with open_store(stored.store) as s:
        n = s.query(
            "SELECT count() AS n FROM phases WHERE run_id = %(r)s AND step = 8",
            {"r": stored.run_id},
        )["n"].iloc[0]
    phase_bars = sum(
        len(decode(t["base"]))
        for t in spec["data"]
        if t["type"] == "bar" and t["name"] not in ("collectives", "send/recv", PAST)
    )
    assert phase_bars == n
    late = [t for t in spec["data"] if t.get("name") == "last arriver"]
    assert late and "last" in late[0]["text"][0]
    pick = next(b for b in at.selectbox if b.label.startswith("Link the members"))
    chosen = pick.options[0]
    assert chosen.split(": rank ")[1].split(" ")[0] == str(late[0]["text"][0].split(" ")[1])


def test_mesh_colors_the_culprit_slowest_and_draws_its_victims(monkeypatch, stored):
    at = page(monkeypatch, stored.store, page="mesh", run=stored.run_id)
    trace = chart_spec(at, "mesh_chart")["data"][0]
    slowness = decode(trace["marker"]["color"]).astype(float)
    assert len(slowness) == stored.world
    ranks = decode(trace["customdata"])[:, 0].astype(int)
    assert ranks[slowness.argmax()] == stored.culprit and slowness.max() > 1.5
    edges = at.dataframe[1].value
    with open_store(stored.store) as s:
        stored_findings = load_findings(s, stored.run_id, 0)
    holders = {
        int(f["culprit_rank"])
        for f in stored_findings.to_dict("records")
        if json.loads(f["evidence_json"]).get("waited_for_it", {}).get("victims")
    }
    assert stored.culprit in holders and set(edges["holder"]) == holders
    assert (edges["waited_ms"] > 0).all()


def test_hang_page_on_a_clean_run_says_no_rank_is_behind(monkeypatch, stored):
    at = page(monkeypatch, stored.store, page="hang", run=stored.run_id)
    assert any("no rank is behind" in s.value for s in at.success)
    groups = at.dataframe[0].value
    assert (groups["lagging"] == "").all() and (groups["seen"] == groups["size"]).all()


def test_hosts_page_shows_collector_data_or_says_there_is_none(monkeypatch, stored):
    with open_store(stored.store) as s:
        hosts = tuple(
            s.query("SELECT DISTINCT host FROM ranks WHERE run_id = %(r)s", {"r": stored.run_id})[
                "host"
            ]
        )
        nic = s.query(
            "SELECT count() AS n, uniqExact(device, port, counter) AS series FROM nic_samples "
            "WHERE host IN %(h)s AND counter IN %(c)s",
            {"h": hosts, "c": NIC_COUNTERS},
        ).iloc[0]
        gpu = s.query("SELECT count() AS n FROM gpu_samples WHERE host IN %(h)s", {"h": hosts})[
            "n"
        ].iloc[0]
    at = page(monkeypatch, stored.store, page="hosts", run=stored.run_id)
    if nic["n"] == 0 and gpu == 0:
        assert any("No collector data for this run" in i.value for i in at.info)
        return
    names = [t["name"] for t in chart_spec(at, "hosts_chart")["data"]]
    assert len([n for n in names if " gpu" not in n and not n.startswith("cpu")]) == nic["series"]


def hung_stores(tmp_path) -> tuple[str, str]:
    """A synthetic 8-rank (DP2 x TP2 x PP2) run where rank 3 never enters its TP
    all_reduce at step 5, snapshots going on for 40 s: as the generator stores it (every
    row), and as a live job shows it before the stuck ops end (no collective row of an
    op that never completed: the hooks write one when its op completes)."""
    from ranksight.synthetic import SynthConfig, write_synthetic

    full, live = str(tmp_path / "full"), str(tmp_path / "live")
    with open_store(full) as s, open_store(live) as t:
        s.init_schema()
        t.init_schema()
        cfg = SynthConfig(dp=2, tp=2, pp=2, steps=8, faults=("hang:rank=3,from_step=5",))
        write_synthetic(s, replace(cfg, run_id="hung"))
        for table in ("runs", "ranks", "steps", "phases", "progress"):
            t.insert(table, s.query(f"SELECT * FROM {table}"))
        t.insert("collectives", s.query("SELECT * FROM collectives WHERE end_ns > 0"))
    return full, live


def latest_progress(url: str) -> pd.DataFrame:
    """Each rank's newest snapshot per collective group, from the raw rows (pandas)."""
    with open_store(url) as s:
        p = s.query("SELECT * FROM progress WHERE run_id = 'hung' AND direction = ''")
    return p.sort_values("ts_ns").groupby(["group_id", "rank"]).tail(1).set_index("rank")


def test_hang_page_shows_a_live_hang_from_progress_snapshots(monkeypatch, tmp_path):
    full, live = hung_stores(tmp_path)
    for url in (full, live):
        at = page(monkeypatch, url, page="hang", run="hung")
        assert "From the progress snapshots" in texts(at)
        stall = next(e.value for e in at.error if e.value.startswith("Stalled"))
        assert "wait (through the mesh) for rank(s) 3" in stall
        suspect = next(e.value for e in at.error if e.value.startswith("Suspect rank(s) 3:"))
        assert "No stack dumps were taken" in suspect and "stacks (below)" not in suspect
        groups = at.dataframe[0].value
        top = groups.iloc[0]
        assert top["lagging"] == "3" and top["stuck"] != ""  # its peer waits inside
        members = at.dataframe[1].value.set_index("rank")
        want = latest_progress(url)
        want = want[want["group_id"] == top["group_id"]]
        assert set(members.index) == set(want.index)
        for rank in members.index:  # the numbers shown are the newest snapshot's
            assert members.loc[rank, "last entered"] == want.loc[rank, "issued_seq"]
            assert members.loc[rank, "last completed"] == want.loc[rank, "completed_seq"]
        stuck = int(top["stuck"].split(",")[0])
        assert members.loc[stuck, "last entered"] == members.loc[3, "last entered"] + 1
        assert members.loc[stuck, "last completed"] == members.loc[3, "last completed"]
        assert "No stack dumps" in texts(at)
        assert any("progress snapshots land" in c.value for c in at.caption)  # watched
    # a new snapshot: rank 3 entered the op its peer waits in; the next run shows it
    row = latest_progress(live)
    row = row[row["group_id"] == top["group_id"]].loc[[3]].reset_index()
    entered = int(row["issued_seq"].iloc[0]) + 1
    with open_store(live) as s:
        s.insert("progress", row.assign(ts_ns=row["ts_ns"] + 2 * 10**9, issued_seq=entered))
    at.run()
    next(b for b in at.selectbox if b.label == "Group").set_value(top["group_id"]).run()
    members = at.dataframe[1].value.set_index("rank")
    assert members.loc[3, "last entered"] == entered
    with open_store(live) as s:  # the collective rows alone show nothing wrong
        from ranksight.ui.data import hang as hang_data
        from ranksight.ui.data.run import load_run_view

        rows = hang_data.group_progress(s, load_run_view(s, "hung"))
        assert not rows["stuck"].any()


def test_hang_page_calls_a_run_seconds_into_a_stop_progressing(monkeypatch, tmp_path):
    from ranksight.synthetic import SynthConfig, write_synthetic

    url = str(tmp_path / "store")
    with open_store(url) as s:
        s.init_schema()
        cfg = SynthConfig(dp=2, tp=2, pp=2, steps=40, faults=("hang:rank=3,from_step=35",))
        write_synthetic(s, replace(cfg, run_id="hung", tail_s=0.0))  # no snapshot since
    at = page(monkeypatch, url, page="hang", run="hung")
    assert "From the progress snapshots" in texts(at)
    assert not [e.value for e in at.error if e.value.startswith(("Stalled", "Suspect"))]
    assert any("The run is progressing" in i.value for i in at.info) or any(
        "no rank is behind" in x.value for x in at.success
    )


def test_hang_page_groups_identical_stacks_with_their_ranks(monkeypatch, tmp_path):
    _, live = hung_stores(tmp_path)
    waiting = "MainThread (idle): all_reduce (torch/distributed/c10d.py:2501)"
    odd = "MainThread (active): forward (model.py:88)"
    rows = [
        {
            "run_id": "hung",
            "attempt": 0,
            "rank": r,
            "host": "h",
            "pid": 100 + r,
            "ts_ns": 10**18 + r,
            "trigger": "no_progress",
            "ok": 1,
            "summary": odd if r == 3 else waiting,
            "stack_json": "[]",
        }
        for r in range(8)
    ]
    with open_store(live) as s:
        s.insert("stacks", pd.DataFrame(rows))
    at = page(monkeypatch, live, page="hang", run="hung")
    labels = [e.label for e in at.expander]
    assert labels == ["1 ranks: 3", "7 ranks: 0,1,2,4,5,6,7"]
    suspect = next(e.value for e in at.error if e.value.startswith("Suspect rank(s) 3:"))
    assert "Their stacks (below: rank(s) 3) say where they are." in suspect
    assert at.code[0].value == odd and at.code[1].value == waiting


def test_overview_marks_a_hang_at_the_step_it_hung_in_and_links_to_it(monkeypatch, tmp_path):
    """Rank 3 never enters its all_reduce of step 5: the overview's mark and its timeline
    link sit at step 5 (the analyzer's hang finding carries no step: it was marked at
    step 0 and the timeline link offered step 1), and a button leads to the Hang page."""
    from ranksight.analyzer import analyze

    full, _ = hung_stores(tmp_path)
    with open_store(full) as s:
        kinds = [f.kind for f in analyze(s, "hung").findings]
    i = kinds.index("hang")
    at = page(monkeypatch, full, page="overview", run="hung")
    spec = echarts_spec(at, "overview_chart")
    marks = spec["series"][0]["markLine"]["data"]
    assert marks == [{"xAxis": 5, "name": "rank 3 hung in this step"}]
    assert spec["xAxis"][0]["max"] == 5  # drawn: step 5 has no step rows
    at.button(key=f"tl{i}").click().run()
    assert at.query_params["page"] in ("timeline", ["timeline"])
    assert at.query_params["step"] in ("5", ["5"]) and at.number_input[0].value == 5
    assert chart_spec(at, "timeline_chart")["layout"]["title"]["text"].startswith("step 5:")
    at = page(monkeypatch, full, page="overview", run="hung")
    at.button(key=f"hg{i}").click().run()
    assert at.query_params["page"] in ("hang", ["hang"]) and at.header[0].value.startswith("Hang")


def test_a_run_silent_for_long_says_when_it_stopped_reporting_and_is_not_live(
    monkeypatch, tmp_path
):
    """A run with no end recorded whose last record (step, snapshot, run row) is 3 h old
    is 'stopped', with the time it stopped reporting, and not watched as live (it was
    shown 'hung' and 'live: this run has not finished'); with a stored hang finding it
    stays 'hung', still not live."""
    import time

    from ranksight.analyzer import analyze
    from ranksight.synthetic import SynthConfig, write_synthetic

    url = str(tmp_path / "store")
    cfg = SynthConfig(
        dp=2, tp=1, pp=1, steps=6, faults=("hang:rank=1,from_step=4",), run_id="old",
        start_ns=time.time_ns() - 3 * 3600 * 10**9,
    )  # fmt: skip
    with open_store(url) as s:
        s.init_schema()
        write_synthetic(s, cfg)
        last = max(
            int(s.query(f"SELECT max({c}) AS t FROM {t}")["t"].iloc[0])
            for t, c in (("steps", "end_ns"), ("progress", "ts_ns"), ("runs", "updated_ns"))
        )
    at_utc = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(last / 1e9))
    for analyzed, status in ((False, "stopped"), (True, "hung")):
        if analyzed:
            with open_store(url) as s:
                analyze(s, "old")
        at = page(monkeypatch, url, page="overview", run="old")
        assert {m.label: m.value for m in at.metric}["status"] == status
        said = [w.value for w in at.warning if w.value.startswith("Stopped reporting")]
        assert said and f"Stopped reporting at {at_utc} (no end recorded)" in said[0], said
        assert not any("live:" in c.value for c in at.caption)
        runs = page(monkeypatch, url).dataframe[0].value.set_index("run")
        assert runs.loc["old", "status"] == status


def test_hosts_page_plots_collector_samples(monkeypatch, tmp_path):
    from ranksight.synthetic import SynthConfig, write_synthetic

    url = str(tmp_path / "store")
    with open_store(url) as s:
        s.init_schema()
        write_synthetic(s, SynthConfig(dp=2, tp=1, pp=1, steps=3, run_id="gpu"))
        t0 = int(s.query("SELECT min(start_ns) AS t FROM steps")["t"].iloc[0])
        host = str(s.query("SELECT any(host) AS h FROM ranks")["h"].iloc[0])
        rows = [
            {
                "host": host,
                "ts_ns": t0 + i * 10**8,
                "gpu_index": g,
                "sm_clock_mhz": 1980.0 - 100 * g,
                "power_w": 400.0,
                "temperature_c": 70.0 + g,
                "clock_event_names": "hw_thermal_slowdown" if g else "",
            }
            for i in range(4)
            for g in (0, 1)
        ]
        s.insert("gpu_samples", pd.DataFrame(rows))
    at = page(monkeypatch, url, page="hosts", run="gpu")
    spec = chart_spec(at, "hosts_chart")
    assert {t["name"] for t in spec["data"]} == {f"{host} gpu0", f"{host} gpu1"}
    table = at.dataframe[0].value.set_index("gpu")
    assert (
        table.loc[1, "throttle reasons"] == "hw_thermal_slowdown"
        and table.loc[0, "throttle reasons"] == "none"
    )
    assert table.loc[1, "peak °C"] == 71.0


def test_empty_store_unknown_run_and_run_without_data_get_a_message(monkeypatch, tmp_path):
    url = str(tmp_path / "store")
    at = page(monkeypatch, url)
    assert f"No store at {url} yet" in texts(at)
    with open_store(url) as s:
        s.init_schema()
    assert "No runs in this store yet" in texts(page(monkeypatch, url))
    fresh_run(url)
    at = page(monkeypatch, url, page="overview", run="nope")
    assert "unknown run 'nope'" in texts(at)
    for name in ("overview", "heatmap", "timeline"):
        at = page(monkeypatch, url, page=name, run="fresh")
        assert "has no step records yet" in texts(at), name
    for name in ("mesh", "hang"):
        at = page(monkeypatch, url, page=name, run="fresh")
        assert "has no" in texts(at) and "records yet" in texts(at), name


def chart_keys(at: AppTest) -> list[str]:
    return [str(getattr(el, "key", None) or el.proto.id) for el in charts(at)]


ALL_PAGES = ("runs", "overview", "heatmap", "timeline", "mesh", "hang", "hosts")


def fresh_run(url: str) -> None:
    """A run row with nothing else yet (a job that just started)."""
    with open_store(url) as s:
        s.init_schema()
        s.insert(
            "runs",
            pd.DataFrame(
                [
                    {
                        "run_id": "fresh",
                        "attempt": 0,
                        "created_ns": 1,
                        "updated_ns": 1,
                        "status": "running",
                        "world_size": 4,
                        "dp": 4,
                        "tp": 1,
                        "pp": 1,
                    }
                ]
            ),
        )


@pytest.mark.parametrize("name", ALL_PAGES)
def test_every_page_explains_an_empty_missing_or_down_store_and_an_unknown_or_new_run(
    monkeypatch, tmp_path, name
):
    url = str(tmp_path / "store")
    shown = texts(page(monkeypatch, url, page=name, run="fresh"))  # nothing written yet
    assert f"No store at {url} yet" in shown, shown
    with open_store(url) as s:
        s.init_schema()
    shown = texts(page(monkeypatch, url, page=name, run="fresh"))
    assert "No runs in this store yet" in shown and "ranksight demo --store" in shown, shown
    fresh_run(url)
    at = page(monkeypatch, url, page=name, run="fresh")
    if name != "runs":
        shown = texts(at)
        assert "has no" in shown or "No collector data" in shown, shown
        shown = texts(page(monkeypatch, url, page=name, run="nope"))
        assert "unknown run 'nope'" in shown and "fresh" in shown, shown  # names what exists
    down = "clickhouse://127.0.0.1:1/ranksight"
    at = page(monkeypatch, down, page=name, run="fresh")
    assert any("The store is unavailable" in e.value and "127.0.0.1:1" in e.value for e in at.error)
    assert chart_keys(at) == []


def test_store_down_and_bad_url_parameters_get_a_message(monkeypatch, tmp_path):
    at = page(monkeypatch, "clickhouse://127.0.0.1:1/ranksight", page="overview", run="x")
    assert any("The store is unavailable" in e.value and "127.0.0.1:1" in e.value for e in at.error)
    assert chart_keys(at) == []  # the loading placeholder went with the error
    at = page(monkeypatch, str(tmp_path / "s"), page="nowhere", step="-3")
    problems = [w.value for w in at.warning]
    assert any("unknown page 'nowhere'" in p for p in problems) and any(
        "step='-3'" in p for p in problems
    )


def test_a_running_run_is_watched_and_new_steps_show_on_the_next_run(monkeypatch, tmp_path):
    from ranksight.synthetic import SynthConfig, write_synthetic

    url = str(tmp_path / "store")
    with open_store(url) as s:
        s.init_schema()
        write_synthetic(
            s,
            SynthConfig(
                dp=2, tp=1, pp=1, steps=4, faults=("hang:rank=1,from_step=3",), run_id="live"
            ),
        )
    at = page(monkeypatch, url, page="overview", run="live")
    assert {m.label: m.value for m in at.metric}["status"] == "running"
    assert any("refreshes when new steps land" in c.value for c in at.caption)
    steps_before = int({m.label: m.value for m in at.metric}["steps"])
    with open_store(url) as s:
        last = s.query("SELECT max(end_ns) AS t FROM steps")["t"].iloc[0]
        rows = [
            {
                "run_id": "live",
                "attempt": 0,
                "rank": r,
                "step": steps_before,
                "start_ns": int(last) + 1,
                "end_ns": int(last) + 10**8,
                "tokens": 1,
            }
            for r in range(2)
        ]
        s.insert("steps", pd.DataFrame(rows))
    at.run()  # what the watcher's rerun does
    assert int({m.label: m.value for m in at.metric}["steps"]) == steps_before + 1


def test_read_ahead_serves_the_default_heatmap_and_overview(monkeypatch, tmp_path_factory):
    """The server's read-ahead (ui.warm) reads a run's default heatmap and overview with
    the pages' own cache keys: with the store reads then made to fail, both pages still
    draw, from what the read-ahead cached."""
    from ranksight.ui import warm
    from ranksight.ui.config import UiConfig
    from ranksight.ui.data import heatmap, overview

    stored = synthetic_run(tmp_path_factory)
    monkeypatch.setenv("RANKSIGHT_STORE", stored.store)
    st.cache_data.clear()
    cfg = UiConfig()
    got = warm.warm(stored.store, cfg.heatmap_rows, cfg.heatmap_cols, cfg.overview_points)
    assert stored.run_id in got

    def no_read(*args, **kwargs):
        raise AssertionError("the page read the store instead of the read-ahead's result")

    monkeypatch.setattr(heatmap, "load_heatmap", no_read)
    monkeypatch.setattr(overview, "step_series", no_read)
    for name, key in (("heatmap", "heatmap_chart"), ("overview", "overview_chart")):
        at = AppTest.from_file(APP_PATH, default_timeout=120)
        at.query_params["page"] = name
        at.query_params["run"] = stored.run_id
        at.run()
        assert not at.exception, [e.value for e in at.exception]
        assert echarts_spec(at, key)["series"], name


def test_read_ahead_of_a_store_that_is_down_returns_nothing(tmp_path):
    """A store that cannot be read: the read-ahead logs it and reads nothing (the page
    reports the error itself)."""
    from ranksight.ui import warm

    st.cache_data.clear()
    assert warm.warm("clickhouse://127.0.0.1:1/ranksight", 16, 16, 10) == []


def test_every_page_of_a_run_imported_from_a_posted_log(monkeypatch, tmp_path):
    """A run made by ``ranksight import`` of a real posted console (no steps, only what
    the lines said): every page draws without an exception, and the overview lists the
    hang the log shows (it said "no step records yet" and nothing else)."""
    from ranksight.importer import ImportConfig, import_paths
    from ranksight.store import open_store

    log = os.path.join(
        os.path.dirname(os.path.dirname(__file__)), "data", "realworld", "cx-gcd-broadcast-timeout-rank0-silent",
        "console.log",
    )  # fmt: skip
    store = str(tmp_path / "store")
    s = open_store(store)
    s.init_schema()
    import_paths(s, [log], ImportConfig(run_id="posted"))
    from ranksight.analyzer import analyze

    analyze(s, "posted")  # as `ranksight import` does: the findings are stored
    for name in ("runs", "overview", "heatmap", "timeline", "mesh", "hang", "hosts"):
        at = page(monkeypatch, store, page=name, run="posted")
        if name == "overview":
            assert "broadcast #56693" in texts(at) or any(
                "broadcast #56693" in str(e.value) for e in at.get("expander")
            ), texts(at)[:500]


def _evidence_of_a_stage_finding():
    from ranksight.analyzer.findings import Finding
    from ranksight.ui.views.overview import evidence

    evidence(Finding(kind="pipeline_imbalance", cause="stage_imbalance", culprit_rank=-1,
                     host="", dp=-1, tp=-1, pp=0, confidence=0.9, impact_pct=20.0,
                     summary="stage 0 is slowest"))  # fmt: skip


def test_evidence_of_a_finding_without_a_rank_names_what_it_names_never_rank_minus_one():
    at = AppTest.from_function(_evidence_of_a_stage_finding, default_timeout=60).run()
    assert not at.exception, at.exception
    shown = "\n".join(m.value for m in at.markdown)
    assert "Evidence for stage 0** (pp 0)" in shown, shown
    assert "-1" not in shown, shown
