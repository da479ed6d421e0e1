"""Every page of the web UI in Streamlit's AppTest, against a real `ranksight demo` run
and a synthetic 32-rank run, checking the numbers shown against the stored rows; and
the pages' messages for an empty store, an unknown run, a run without data and a store
that is down."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

from ranksight.analyzer.queries import load_findings
from ranksight.store import open_store
from ranksight.ui import APP_PATH
from ranksight.ui.data.hosts import NIC_COUNTERS
from tests.ui_stores import (
    chart_spec,
    compute_ms,
    decode,
    demo_run,
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
    assert metrics["median step"] == f"{wall.iloc[1:].median():.0f} ms"
    spec = chart_spec(at, "overview_chart")
    assert list(decode(spec["data"][0]["y"]).astype(float).round(3)) == list(wall.round(3))
    headline = f"{i + 1}. straggler: rank {stored.culprit}, compute"
    assert headline in texts(at) and f"impact {finding['impact_pct']:.1f}%" in texts(at)
    at.button(key=f"ev{i}").click().run()
    assert at.query_params["finding"] in (str(i), [str(i)])
    ev = json.loads(finding["evidence_json"])
    phases = at.table[0].value.set_index("phase")
    assert float(phases.loc["forward", "ratio"]) == ev["phases"]["forward"]["ratio"] > 1.5
    assert (
        float(phases.loc["backward", f"rank {stored.culprit} ms"])
        == ev["phases"]["backward"]["rank_ms"]
    )
    victims = at.table[1].value
    assert list(victims["victim rank"].astype(int)) == [
        v["rank"] for v in ev["waited_for_it"]["victims"]
    ]


def test_heatmap_draws_every_rank_and_step_with_the_stored_numbers(monkeypatch, stored):
    at = page(monkeypatch, stored.store, page="heatmap", run=stored.run_id, order="rank")
    trace = chart_spec(at, "heatmap_chart")["data"][0]
    z = decode(trace["z"]).astype(float)
    assert z.shape == (stored.world, stored.steps)
    with open_store(stored.store) as s:
        want = compute_ms(s, stored.run_id).reindex(
            index=range(stored.world), columns=range(stored.steps)
        )
        culprits = set(load_findings(s, stored.run_id, 0)["culprit_rank"]) - {-1}
    pd.testing.assert_frame_equal(
        pd.DataFrame(z), pd.DataFrame(want.to_numpy()), rtol=1e-6, check_dtype=False
    )
    ticks = chart_spec(at, "heatmap_chart")["layout"]["yaxis"]["ticktext"]
    marked = {
        i for i, t in enumerate(ticks) if t.startswith('<span style="color:#d62728">culprit r')
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
        if t["type"] == "bar" and t["name"] not in ("collectives", "send/recv")
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


def test_hang_page_names_the_suspect_of_a_hung_run(monkeypatch, tmp_path):
    from ranksight.synthetic import SynthConfig, write_synthetic

    url = str(tmp_path / "store")
    with open_store(url) as s:
        s.init_schema()
        write_synthetic(
            s,
            SynthConfig(
                dp=2, tp=2, pp=2, steps=8, faults=("hang:rank=3,from_step=5",), run_id="hung"
            ),
        )
    at = page(monkeypatch, url, page="hang", run="hung")
    assert any("Suspect rank(s) 3:" in e.value for e in at.error)
    assert "3" in at.dataframe[0].value.iloc[0]["lagging"].split(",")
    assert "No stack dumps" in texts(at)


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
    at = page(monkeypatch, url, page="overview", run="nope")
    assert "unknown run 'nope'" in texts(at)
    for name in ("overview", "heatmap", "timeline"):
        at = page(monkeypatch, url, page=name, run="fresh")
        assert "has no step records yet" in texts(at), name
    for name in ("mesh", "hang"):
        at = page(monkeypatch, url, page=name, run="fresh")
        assert "has no" in texts(at) and "records yet" in texts(at), name


def chart_keys(at: AppTest) -> list[str]:
    return [str(getattr(el, "key", None) or el.proto.id) for el in at.get("plotly_chart")]


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
