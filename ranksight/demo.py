"""``ranksight demo``: a real hooked 3D-parallel training job, diagnosed end to end.

It starts a node agent (its own process), launches the reference trainer under torchrun
(one process per rank, gloo on CPU) with the hooks on and a fault injected, shows
progress from the store while the job runs, then analyzes the run and prints the report.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from ranksight import report as rep
from ranksight.ground import env
from ranksight.ground.words import counted
from ranksight.importer.torchrun_log import record_failures
from ranksight.launcher import processes as launch
from ranksight.trainer_hooks.config import new_run_id


@dataclass(kw_only=True, slots=True)
class DemoConfig:
    """What the demo runs."""

    inject: str = "slow:rank=5,factor=3,from_step=4"
    """Fault spec for the reference trainer (``none`` for a clean run)."""
    steps: int = 24
    """Training steps."""
    store: str | None = None
    """Store URL; None: ``$RANKSIGHT_STORE`` or ``$RANKSIGHT_HOME/store``."""
    dp: int = 2
    """Data-parallel degree."""
    tp: int = 2
    """Tensor-parallel degree."""
    pp: int = 2
    """Pipeline stages."""
    format: str = "text"
    """Report format: text, json or markdown."""
    timeout_s: float = 900.0
    """Give up on the training job after this many seconds."""
    faults: tuple = field(init=False, default=())
    """The parsed ``inject`` spec (set by validation)."""

    def __post_init__(self) -> None:
        from ranksight.reference_trainer.faults import parse_faults

        if self.format not in rep.FORMATS:
            raise ValueError(
                f"--format must be one of {', '.join(rep.FORMATS)}, got {self.format!r}"
            )
        if self.steps < 4:
            raise ValueError(f"--steps must be >= 4, got {self.steps}")
        self.faults = parse_faults([self.inject])  # raises ValueError naming the spec
        world = self.dp * self.tp * self.pp
        for f in self.faults:
            if f.rank is not None and f.rank >= world:
                raise ValueError(
                    f"--inject {self.inject!r}: rank {f.rank} is outside world size {world}"
                )

    @property
    def world_size(self) -> int:
        """dp x tp x pp."""
        return self.dp * self.tp * self.pp


def _home() -> str:
    return os.path.abspath(os.environ.get(env.HOME, env.DEFAULT_HOME))


def _describe(cfg: DemoConfig, console: Console, run_id: str, store_url: str, spool: str) -> None:
    from ranksight.ground.mesh import coords_of

    shape = {"dp": cfg.dp, "tp": cfg.tp, "pp": cfg.pp}
    console.print(
        f"[bold]ranksight demo[/] run [bold]{run_id}[/]: {counted(cfg.world_size, 'CPU rank')} "
        f"(DP{cfg.dp} x TP{cfg.tp} x PP{cfg.pp}, gloo), {counted(cfg.steps, 'step')} of a GPT on "
        "Python's own docs"
    )
    if not cfg.faults:
        console.print("injecting: nothing (a clean run: the report should name no culprit)")
    for f in cfg.faults:
        c = coords_of(f.rank, shape) if f.rank is not None else {}
        where = (
            f"rank {f.rank} (dp={c.get('dp')}, tp={c.get('tp')}, pp={c.get('pp')})"
            if f.rank is not None
            else "a different rank each time"
        )
        console.print(f"injecting: [bold red]{f.text}[/] -> {where}")
        if f.kind == "slow":
            console.print(f"  [dim]{SLOW_READS_HIGHER.format(factor=f.factor)}[/]", soft_wrap=True)
    from ranksight.store.url import redact

    console.print(f"records: ranks -> spool {spool} -> agent -> store {redact(store_url)}")


SLOW_READS_HIGHER = (
    "the fault stretches each forward/backward call to {factor:g}x its duration, the tensor-"
    "parallel all_reduces inside the call included; the report compares self time, which "
    "leaves collectives out, so the ratio it finds reads above {factor:g}x"
)
"""Why ``slow:factor=3`` is reported as more than 3x (reference_trainer/inject.py: the sleep
is ``(factor - 1)`` x the whole call, collectives in it too; the straggler test's ratio is
of self time per call, collectives excluded)."""


def _trainer_cmd(cfg: DemoConfig, run_id: str) -> list[str]:
    return launch.trainer_cmd(
        dp=cfg.dp, tp=cfg.tp, pp=cfg.pp, steps=cfg.steps, run_id=run_id, inject=[cfg.inject]
    )


def _progress_step(store, run_id: str) -> int:
    try:
        got = store.query(
            "SELECT max(step) AS s, count() AS n FROM steps WHERE run_id = %(r)s", {"r": run_id}
        )
        return int(got["s"].iloc[0]) if int(got["n"].iloc[0]) else 0
    except Exception:  # progress is cosmetic; the store may be mid-write
        return 0


def run_demo(cfg: DemoConfig, console: Console, err: Console) -> int:
    """Run the demo; returns the exit code (0 clean, 3 culprit found, 1 failure)."""
    from ranksight.analyzer import analyze
    from ranksight.analyzer.queries import resolve_attempt
    from ranksight.store import StoreError, open_store
    from ranksight.store.url import default_store_url

    if cfg.format != "text":  # keep stdout for the machine-readable report
        console = err
    home = _home()
    spool = os.path.join(home, "spool")
    store_url = cfg.store or default_store_url()
    try:
        store = open_store(store_url)
        store.init_schema()
    except (StoreError, ValueError) as e:
        err.print(f"[red]error:[/] {escape(str(e))}")
        return 1
    run_id = new_run_id()
    _describe(cfg, console, run_id, store_url, spool)
    log_path = os.path.join(home, f"{run_id}.log")
    os.makedirs(home, exist_ok=True)
    child_env = launch.job_env(run_id, spool, store_url)
    agent = launch.start_agent(
        spool, store_url, child_env, os.path.join(home, "agent.log"),
        extra=("--stall-s", f"{AGENT_STALL_S:g}"),
    )  # fmt: skip
    with open(log_path, "w") as log:
        trainer = subprocess.Popen(
            _trainer_cmd(cfg, run_id), env=child_env, stdout=log, stderr=subprocess.STDOUT
        )
        rc = _watch(cfg, trainer, store, run_id, console)
    launch.stop(agent)
    if rc == HUNG:
        err.print(
            f"[red]error:[/] the training job hung (no step ended for {STALL_S:.0f} s); "
            f"stopped it; its log: {log_path}"
        )
        _mark_failed(store, run_id, "hung")
    elif rc != 0:
        record_failures(store, run_id, log_path)
        err.print(
            "[red]error:[/] "
            + escape(
                f"the training job exited with code {rc}{launch.first_failure(log_path)}; "
                f"its log: {log_path}"
            )
        )
        _mark_failed(store, run_id)
    try:
        analysis = analyze(store, run_id)
        run_row = resolve_attempt(store, run_id, analysis.attempt)[0]
    except StoreError as e:
        err.print(f"[red]error:[/] {escape(str(e))}")
        return 1
    if cfg.format == "text":
        console.rule("root-cause report")
    from ranksight.report import emit

    emit(analysis, run_row, cfg.format, console)
    if cfg.format == "text":
        console.print(
            f"\nre-print: ranksight report --run {run_id}"
            + (f" --store {store_url}" if cfg.store else "")
        )
        console.print(
            "see it in the browser: ranksight ui"
            + (f" --store {store_url}" if cfg.store else "")
            + f" --run {run_id}"
        )
    return 1 if rc not in (0, HUNG) else rep.exit_code(analysis)


def _watch(cfg: DemoConfig, trainer: subprocess.Popen, store, run_id: str, console: Console) -> int:
    deadline = time.monotonic() + cfg.timeout_s
    columns = (
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        TextColumn("step {task.completed:.0f}/{task.total:.0f}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task(
            f"starting {counted(cfg.world_size, 'rank')} (import torch, rendezvous)",
            total=cfg.steps,
        )
        last_step, changed = -1, time.monotonic()
        while trainer.poll() is None:
            if time.monotonic() > deadline:
                launch.stop(trainer, signal.SIGTERM)
                return 124
            step = _progress_step(store, run_id)
            if step != last_step:
                last_step, changed = step, time.monotonic()
            if step:
                progress.update(task, completed=step + 1, description="training (steps stored)")
            if step and time.monotonic() - changed > STALL_S and _hung(store, run_id):
                progress.update(task, description="[red]hung: stopping the job[/]")
                launch.stop(trainer, signal.SIGTERM)
                return HUNG
            time.sleep(1.0)
        progress.update(
            task, completed=_progress_step(store, run_id) + 1, description="training done"
        )
    return trainer.returncode


AGENT_STALL_S = 10.0
"""The demo's agent takes py-spy stacks of a run's ranks once one made no progress this
long: well before :data:`STALL_S`, when the demo stops a hung job, so a hang demo shows
where every rank was (the agent's own default, 60 s, is for real jobs)."""

HUNG = -1000
"""_watch's return value when it stopped a hung job."""
STALL_S = 25.0
"""Seconds without a new step before the demo asks the analyzer whether the job hangs
(the analyzer's own threshold is HangConfig.stall_s on the records' clock)."""


def _hung(store, run_id: str) -> bool:
    from ranksight.analyzer import analyze

    try:
        found = analyze(store, run_id, save=False).findings
        return any(f.kind in ("hang", "crash") for f in found)
    except Exception:  # the run may not be readable yet
        return False


def _mark_failed(store, run_id: str, status: str = "failed") -> None:
    import json

    import pandas as pd

    now = time.time_ns()
    row = {
        "run_id": run_id,
        "attempt": 0,
        "created_ns": now,
        "updated_ns": now,
        "status": status,
        "world_size": 0,
        "dp": 0,
        "tp": 0,
        "pp": 0,
        "meta_json": json.dumps({}),
    }
    try:
        store.insert("runs", pd.DataFrame([row]))
    except Exception:
        pass
