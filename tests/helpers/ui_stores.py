"""Stored runs for the UI tests, made once per test session and shared by the AppTest
and browser tests: a real `ranksight demo` run (8 gloo ranks, rank 5 slowed 3x from step
4) and a synthetic 32-rank run (rank 12 slowed 3x from step 5), each analyzed.
Also helpers to read what a Plotly or ECharts chart in an AppTest holds."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from dataclasses import dataclass

import numpy as np
import pandas as pd

_made: dict[str, object] = {}
"""Runs made so far this session (or the error making one raised, raised again at once)."""


@dataclass(frozen=True)
class StoredRun:
    """A store folder holding one analyzed run."""

    store: str
    run_id: str
    world: int
    steps: int
    culprit: int
    """The rank the run's strongest straggler finding names."""


def _once(name: str, make) -> StoredRun:
    """``make()`` on first use; later calls return its run, or raise its error again."""
    if name not in _made:
        try:
            _made[name] = make()
        except BaseException as exc:  # noqa: BLE001 - remembered so each test fails fast
            _made[name] = exc
            raise
    got = _made[name]
    if isinstance(got, BaseException):
        raise AssertionError(f"making the {name} run failed earlier: {got}")
    return got


def straggler_of(findings: list[dict]) -> int:
    """The culprit rank of the straggler finding with the largest impact (the analyzer
    may add weaker findings on a noisy shared machine; the UI shows whatever is stored)."""
    ranked = sorted(
        (f for f in findings if f["kind"] == "straggler"), key=lambda f: -f["impact_pct"]
    )
    assert ranked, [(f["kind"], f["culprit_rank"]) for f in findings]
    return int(ranked[0]["culprit_rank"])


def demo_run(tmp_path_factory) -> StoredRun:
    """The `ranksight demo --steps 10` run (made on first use, about a minute on 2 cores)."""
    return _once("demo", lambda: _make_demo(tmp_path_factory))


def _make_demo(tmp_path_factory) -> StoredRun:
    home = str(tmp_path_factory.mktemp("ui_demo"))
    store = os.path.join(home, "store")
    env = {**os.environ, "RANKSIGHT_HOME": home}
    env.pop("RANKSIGHT_STORE", None)
    cmd = [
        sys.executable,
        "-m",
        "ranksight.cli",
        "demo",
        "--steps",
        "10",
        "--store",
        store,
        "--format",
        "json",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    assert out.returncode in (0, 3), out.stderr[-4000:]
    doc = json.loads(out.stdout)
    assert straggler_of(doc["findings"]) == 5
    return StoredRun(store, doc["run_id"], 8, 10, 5)


def synthetic_run(tmp_path_factory) -> StoredRun:
    """A 32-rank (DP2 x TP8 x PP2) synthetic run of 12 steps, rank 12 slow from step 5."""
    return _once("synth", lambda: _make_synthetic(tmp_path_factory))


def _make_synthetic(tmp_path_factory) -> StoredRun:
    from ranksight.analyzer import analyze
    from ranksight.store import open_store
    from ranksight.synthetic import SynthConfig, write_synthetic

    store = str(tmp_path_factory.mktemp("ui_synth") / "store")
    with open_store(store) as s:
        s.init_schema()
        cfg = SynthConfig(
            ranks=32,
            steps=12,
            faults=("slow:rank=12,factor=3,from_step=5",),
            seed=3,
            run_id="synth-ui",
        )
        write_synthetic(s, cfg)
        findings = [
            {"kind": f.kind, "culprit_rank": f.culprit_rank, "impact_pct": f.impact_pct}
            for f in analyze(s, "synth-ui").findings
        ]
    assert straggler_of(findings) == 12
    return StoredRun(store, "synth-ui", 32, 12, 12)


def decode(value):
    """A Plotly JSON array: a list, or ``{"dtype", "bdata"[, "shape"]}`` (base64 typed
    array, as plotly.py 6+ writes numpy arrays) -> numpy array."""
    if isinstance(value, dict) and "bdata" in value:
        arr = np.frombuffer(base64.b64decode(value["bdata"]), dtype=np.dtype(value["dtype"]))
        shape = value.get("shape")
        if shape:
            arr = arr.reshape([int(x) for x in str(shape).split(",")])
        return arr
    return np.asarray(value, dtype=object) if value is not None else None


CHART_KINDS = ("plotly_chart", "echarts_chart")
"""The chart elements the UI draws (Plotly on some pages, ECharts on others)."""


def charts(at):
    """Every chart element in an AppTest, Plotly and ECharts."""
    return [el for kind in CHART_KINDS for el in at.get(kind)]


def chart_spec(at, key: str) -> dict:
    """The figure JSON of the Plotly chart with widget key ``key`` in an AppTest."""
    for el in at.get("plotly_chart"):
        if getattr(el, "key", None) == key or key in getattr(el.proto, "id", ""):
            return json.loads(el.proto.spec)
    raise AssertionError(f"no plotly chart {key!r} on the page")


def echarts_spec(at, key: str) -> dict:
    """The ECharts option of the ``st.echarts_chart`` with key ``key`` in an AppTest, as
    the browser gets it, each ``dataset.source`` read into a pandas DataFrame (a
    dataframe source is sent as Arrow beside the JSON; JSON rows are named by the
    dataset's ``dimensions``)."""
    for el in at.get("echarts_chart"):
        if key in getattr(el.proto, "id", ""):
            return with_frames(json.loads(el.proto.spec), el.proto.datasets)
    raise AssertionError(f"no echarts chart {key!r} on the page")


def with_frames(spec: dict, arrow_sets=()) -> dict:
    """``spec`` with each dataset's source as a DataFrame: Arrow ones (``arrow_sets``:
    the element's named Arrow datasets) and JSON rows with ``dimensions``."""
    import pyarrow as pa

    tables = {d.name: pa.ipc.open_stream(d.data.data).read_all().to_pandas() for d in arrow_sets}
    sets = spec.get("dataset") or []
    for d in sets if isinstance(sets, list) else [sets]:
        src = d.get("source")
        if isinstance(src, dict) and "name" in src:
            d["source"] = tables[src["name"]]
        elif isinstance(src, list) and "dimensions" in d:
            d["source"] = pd.DataFrame(src, columns=d["dimensions"])
    return spec


def compute_ms(store, run_id: str):
    """rank x step compute self time (ms) of forward, backward and optimizer, from the
    raw phase rows (pandas, independent of the UI's SQL)."""
    p = store.query("SELECT * FROM phases WHERE run_id = %(r)s", {"r": run_id})
    p = p[p["phase"].isin(["forward", "backward", "optimizer"])]
    p = p.assign(v=(p["end_ns"] - p["start_ns"] - p["wait_ns"]) / 1e6)
    return p.pivot_table(index="rank", columns="step", values="v", aggfunc="sum")


def step_wall_ms(store, run_id: str):
    """step -> wall time (first start to last end over all ranks, ms), from raw rows."""
    s = store.query("SELECT step, start_ns, end_ns FROM steps WHERE run_id = %(r)s", {"r": run_id})
    g = s.groupby("step").agg(a=("start_ns", "min"), b=("end_ns", "max"))
    return (g["b"] - g["a"]) / 1e6


def straggler(store: str, run_id: str) -> tuple[int, dict]:
    """(index on the overview, stored row) of the run's straggler finding; the overview
    lists findings by impact, largest first."""
    from ranksight.analyzer.queries import load_findings
    from ranksight.store import open_store

    with open_store(store) as s:
        rows = load_findings(s, run_id, 0).sort_values("impact_pct", ascending=False, kind="stable")
    rows = rows.reset_index(drop=True)
    i = int(rows.index[rows["kind"] == "straggler"][0])
    return i, rows.iloc[i].to_dict()
