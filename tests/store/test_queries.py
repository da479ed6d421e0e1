"""The analyzer's pushdown SQL on both backends: same answers from chdb and ClickHouse 18.16."""

from __future__ import annotations

import pandas as pd
import pytest

from ranksight.agent import Agent
from ranksight.agent.config import AgentConfig
from ranksight.analyzer import list_runs, load_run
from ranksight.analyzer.queries import UnknownRun
from ranksight.store import open_store


def _load(url: str, spool: str):
    store = open_store(url)
    store.init_schema()
    agent = Agent(spool, store, config=AgentConfig(keep_spool=True))  # loaded twice
    assert agent.drain() > 0 and agent.stats.rejected == 0
    return store, load_run(store, "hooks-test")


def _canon(frame: pd.DataFrame) -> pd.DataFrame:
    cols = sorted(frame.columns)
    return frame[cols].sort_values(cols).reset_index(drop=True)


@pytest.mark.clickhouse
def test_queries_agree_on_chdb_and_clickhouse(hooked_job_spool, chdb_url, clickhouse_db_url):
    _, a = _load(chdb_url, hooked_job_spool)
    _, b = _load(clickhouse_db_url, hooked_job_spool)
    for name in ("ranks", "steps", "phase_totals", "groups", "transfer", "progress", "ends"):
        fa, fb = getattr(a, name), getattr(b, name)
        assert len(fa) > 0, name
        pd.testing.assert_frame_equal(_canon(fa), _canon(fb), check_dtype=False, obj=name)
    pairs = [(a.phases_of([0, 2]), b.phases_of([0, 2]))]
    pairs += list(zip(a.waits_for([1, 2]), b.waits_for([1, 2]), strict=True))
    for fa, fb in pairs:
        assert len(fa) > 0
        pd.testing.assert_frame_equal(_canon(fa), _canon(fb), check_dtype=False)
    assert a.run["status"] == b.run["status"] == "finished"


def test_arrivals_and_p2p_name_who_waited_for_whom(hooked_job_spool, store_url):
    _, data = _load(store_url, hooked_job_spool)
    arr, p2p = data.waits_for([0, 1, 2, 3])
    world = arr[
        arr["group_id"].map(
            dict(zip(data.groups["group_id"], data.groups["group_ranks"], strict=True))
        )
        == "0,1,2,3"
    ]
    # rank 1 sleeps 200 ms before each world all_reduce: it is the last arriver
    by_last = world.groupby("last_rank")["waited_ns"].sum()
    assert by_last.idxmax() == 1 and by_last[1] > 3 * 3 * 150e6
    # every recv found its send
    assert p2p["n"].sum() == 4 * 3 + 2 * 3
    assert sorted(data.ranks["rank"]) == [0, 1, 2, 3]
    detail = data.phases_of([1])
    assert set(detail.columns) >= {"self_ns", "wait_ns", "dur_ns", "stage"}
    assert set(detail["rank"]) == {1}
    totals = data.phase_totals.set_index(["rank", "step"])
    own = detail[detail["phase"].isin(("forward", "backward", "optimizer"))]
    assert own.groupby("step")["self_ns"].sum().to_dict() == {
        s: totals.loc[(1, s), "compute_self"] for s in own["step"].unique()
    }  # the pivot in the store sums what the detail rows hold


def test_unknown_run_is_a_clear_error(store):
    with pytest.raises(UnknownRun, match="unknown run 'nope'"):
        load_run(store, "nope")
    assert list_runs(store).empty


def test_clock_offsets_are_measured_on_both_backends(hooked_job_spool, store_url):
    from ranksight.analyzer.api import analyze

    store, _ = _load(store_url, hooked_job_spool)
    analysis = analyze(store, "hooks-test")
    assert analysis.clock["ranks"] == 4 and analysis.clock["samples_per_rank"] >= 3
    assert analysis.clock["max_abs_offset_us"] < 1e6  # one host, one clock: well under 1 s
    stored = store.query(
        "SELECT count() AS n FROM clock_offsets WHERE run_id = %(r)s", {"r": "hooks-test"}
    )
    assert int(stored["n"].iloc[0]) == 4
