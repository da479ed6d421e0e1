"""Run fault-matrix scenarios: a real job each, analyzed while it runs and after.

Per scenario: start a node agent, launch the reference trainer (8 gloo ranks, hooks on,
the scenario's fault) and every ``poll_s`` seconds run ``analyze(store, run, save=False)``,
noting when a finding that matches the ground truth first appears (seconds after the
fault took effect, as the injector printed it in the job's log, and steps completed since
its first step). A job that completes no step for ``grace_s`` after detection, or for
``hang_timeout_s`` at all, is stopped (a hang never ends by itself; gloo's own timeout is
30 minutes); every job is stopped at ``timeout_s``; the others run to their end. Then the
agent drains, the run is analyzed once more (findings stored), and scored.

Run one matrix at a time on a shared machine: ``flock /tmp/ranksight-cpu.lock ranksight
faultmatrix`` (8 ranks on few cores; two jobs at once would distort each other's timing).
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from ranksight.faultmatrix import SHAPE, Expectation, Scenario, expectation, matches, score
from ranksight.importer.torchrun_log import record_failures
from ranksight.launcher import processes as launch
from ranksight.reference_trainer.faults import faults_ground_truth, parse_faults

_FAULT_LINE = re.compile(r"^ranksight-fault: \S+ step=(\d+) time_ns=(\d+)", re.M)


@dataclass(kw_only=True, slots=True)
class MatrixConfig:
    """How the matrix runs."""

    home: str
    """Folder for the spool, logs and (by default) the store."""
    store: str | None = None
    """Store URL; default ``<home>/store`` (chdb)."""
    poll_s: float = 3.0
    """Seconds between analyses while a job runs."""
    grace_s: float = 6.0
    """A job that completed no step for this long after detection is stopped."""
    hang_timeout_s: float = 90.0
    """A job that completed no step for this long is stopped."""
    timeout_s: float = 300.0
    """Any job is stopped after this long."""

    def __post_init__(self) -> None:
        for name in ("poll_s", "grace_s", "hang_timeout_s", "timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")


@dataclass(slots=True)
class Row:
    """One scenario's result."""

    scenario: str
    inject: str
    expected: str
    found: str = "(none)"
    verdict: str = "ERROR"
    detect_s: float | None = None
    """Seconds from the fault taking effect to the first matching poll (None: never)."""
    detect_steps: int | None = None
    """Steps completed from the fault's first step until detection."""
    false_findings: list[str] = field(default_factory=list)
    findings: list[dict] = field(default_factory=list)
    """The final analysis' findings (as dicts)."""
    run_id: str = ""
    job_rc: int | None = None
    wall_s: float = 0.0
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form."""
        return asdict(self)


@dataclass(slots=True)
class _Watch:
    """What polling saw."""

    first_hit_ns: int | None = None
    hit_step: int | None = None
    last_step: int | None = None
    progress_ns: int = field(default_factory=time.time_ns)
    """When a new step was last seen in the store (or the job started)."""
    gap_s: float = 0.0
    """Longest time between two new steps seen so far (s)."""
    polls: int = 0
    stopped: str = ""
    extra: dict = field(default_factory=dict)


def _onset(log_path: str) -> tuple[int | None, int | None]:
    """(time_ns, step) the fault first took effect, from the injectors' log lines."""
    try:
        with open(log_path, errors="replace") as f:
            text = f.read()
    except OSError:
        return None, None
    hits = [(int(t), int(s)) for s, t in _FAULT_LINE.findall(text)]
    return min(hits) if hits else (None, None)


def _max_step(store, run_id: str) -> int | None:
    got = store.query(
        "SELECT max(step) AS s, count() AS n FROM steps WHERE run_id = %(r)s", {"r": run_id}
    )
    return int(got["s"].iloc[0]) if int(got["n"].iloc[0]) else None


def _findings(analysis) -> list[dict]:
    return [asdict(f) for f in analysis.findings]


def _poll(store, run_id: str, e: Expectation, w: _Watch) -> None:
    from ranksight.analyzer import UnknownRun, analyze

    step = _max_step(store, run_id)
    if step is not None and step != w.last_step:
        now = time.time_ns()
        if w.last_step is not None:
            w.gap_s = max(w.gap_s, (now - w.progress_ns) / 1e9)
        w.last_step, w.progress_ns = step, now
    try:
        found = _findings(analyze(store, run_id, save=False))
    except UnknownRun:
        return
    w.polls += 1
    if w.first_hit_ns is None and any(matches(f, e) for f in found):
        w.first_hit_ns, w.hit_step = time.time_ns(), w.last_step


def _should_stop(cfg: MatrixConfig, t0: float, w: _Watch, steps: int) -> str:
    """Why to stop the job now ("" to let it run). A job past its last step is finishing;
    one that stalls less than twice its slowest step so far is merely slow."""
    now = time.time_ns()
    stalled_s = (now - w.progress_ns) / 1e9
    if time.monotonic() - t0 > cfg.timeout_s:
        return f"stopped at the {cfg.timeout_s:.0f} s timeout"
    if w.last_step is not None and w.last_step >= steps - 1:
        return ""
    patience = max(cfg.grace_s, 2 * w.gap_s)
    if w.first_hit_ns is not None and min(stalled_s, (now - w.first_hit_ns) / 1e9) > patience:
        return f"stopped {stalled_s:.0f} s after its last step (detected)"
    if stalled_s > cfg.hang_timeout_s:
        return f"stopped {stalled_s:.0f} s after its last step"
    return ""


_ANALYSIS = concurrent.futures.ThreadPoolExecutor(
    1, thread_name_prefix="faultmatrix-analysis", initializer=launch.lower_thread_priority
)
"""The live analyses run in one thread at lower CPU priority: on 2 cores the analysis
itself would otherwise slow a random rank and be taken for CPU contention."""


def _watch(
    cfg: MatrixConfig, job: subprocess.Popen, store, run_id: str, e: Expectation, steps: int
) -> _Watch:
    w, t0 = _Watch(), time.monotonic()
    while job.poll() is None:
        time.sleep(cfg.poll_s)
        _ANALYSIS.submit(_poll, store, run_id, e, w).result()  # below the ranks' priority
        w.stopped = _should_stop(cfg, t0, w, steps)
        if w.stopped:
            launch.stop(job, wait_s=20.0)
            break
    return w


def _ground_truth(store, run_id: str, sc: Scenario) -> Expectation:
    """The expectation from the fault and layer split the trainer recorded in the run,
    else from the scenario's own spec."""
    from ranksight.analyzer.queries import resolve_attempt

    try:
        meta = json.loads(resolve_attempt(store, run_id, None)[0].get("meta_json") or "{}")
    except Exception:  # run never reached the store: fall back to the spec
        meta = {}
    if "faults" not in meta:
        return _expected(sc)
    split = ((meta.get("config") or {}).get("parallel") or {}).get("layer_split")
    return expectation(meta["faults"], SHAPE, layer_split=split, impact_method=sc.impact_method)


def _expected(sc: Scenario) -> Expectation:
    """The expectation from the scenario's own spec (before the run records its own)."""
    faults = faults_ground_truth(parse_faults([sc.inject]), SHAPE)
    return expectation(faults, SHAPE, layer_split=sc.layer_split, impact_method=sc.impact_method)


def run_scenario(cfg: MatrixConfig, store, store_url: str, sc: Scenario) -> Row:
    """Run one scenario end to end and score it (see the module doc)."""
    from ranksight.analyzer import analyze
    from ranksight.store import StoreError

    run_id = f"fm-{sc.name}-{uuid.uuid4().hex[:6]}"
    logs, spool = os.path.join(cfg.home, "logs"), os.path.join(cfg.home, "spool")
    os.makedirs(logs, exist_ok=True)
    log_path = os.path.join(logs, f"{sc.name}.log")
    e0 = _expected(sc)
    row = Row(sc.name, sc.inject, e0.label, run_id=run_id)
    env = launch.job_env(run_id, spool, store_url)
    t0 = time.monotonic()
    agent = launch.start_agent(spool, store_url, env, os.path.join(logs, "agent.log"))
    try:
        with open(log_path, "w") as log:
            cmd = launch.trainer_cmd(
                **SHAPE, steps=sc.steps, run_id=run_id, inject=[sc.inject], extra=sc.trainer_args
            )
            job = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
            w = _watch(cfg, job, store, run_id, e0, sc.steps)
        row.job_rc = job.returncode
        if job.returncode not in (0, None):
            record_failures(store, run_id, log_path)
    finally:
        launch.stop(agent)
    e = _ground_truth(store, run_id, sc)
    try:
        final = _findings(analyze(store, run_id))
    except StoreError as exc:  # the job left nothing (it failed before its first record)
        row.note = f"{exc}; {launch.first_failure(log_path).lstrip(': ')}".strip("; ")
        row.wall_s = round(time.monotonic() - t0, 1)
        return row
    if w.first_hit_ns is None and any(matches(f, e) for f in final):
        w.first_hit_ns, w.hit_step = time.time_ns(), _max_step(store, run_id)
        w.extra["late"] = True
    _fill(row, e, final, w, _onset(log_path), log_path)
    row.wall_s = round(time.monotonic() - t0, 1)
    return row


def _fill(row: Row, e: Expectation, final: list[dict], w: _Watch, onset, log_path) -> None:
    s = score(final, e)
    row.expected, row.found, row.verdict = e.label, s.found, s.verdict
    row.false_findings, row.findings = list(s.false_findings), final
    onset_ns, onset_step = onset
    if w.extra.get("late"):
        row.note = "found only after the job ended"
    if w.first_hit_ns is not None and onset_ns is not None:
        row.detect_s = round((w.first_hit_ns - onset_ns) / 1e9, 1)
        first = onset_step if onset_step is not None else e.from_step
        row.detect_steps = max(0, (w.hit_step if w.hit_step is not None else first - 1) - first + 1)
    notes = [row.note, w.stopped, launch.first_failure(log_path).lstrip(": ")]
    row.note = "; ".join(n for n in notes if n)


def run_matrix(
    cfg: MatrixConfig, scenarios: list[Scenario], progress: Callable[[Row], None] | None = None
) -> list[Row]:
    """Run ``scenarios`` one after another into one store; returns their rows. Raises
    StoreError if the store cannot be opened."""
    from ranksight.store import open_store

    store_url = cfg.store or os.path.join(cfg.home, "store")
    store = open_store(store_url)
    store.init_schema()
    rows = []
    for sc in scenarios:
        rows.append(run_scenario(cfg, store, store_url, sc))
        if progress:
            progress(rows[-1])
    return rows
