"""Synthetic runs with the real schema, at any scale: a DP x TP x PP job with injected faults.

``ranksight synth --ranks 16384 --steps 100 --inject slow:rank=1234,factor=1.5,from_step=20``
writes one run into a store, shaped like the reference trainer's records: ranks laid out
as ``rank = (dp * PP + pp) * TP + tp``, 8 ranks (GPUs) per host, a 1F1B pipeline step
(:mod:`ranksight.synthetic.timeline`), and the rows the hooks would write
(:mod:`ranksight.synthetic.rows`).

Rows per rank and step (``m`` microbatches, default ``m = pp``; a TP all_reduce per
microbatch forward and backward stands for the several a transformer stage issues):

=============  ================================================================
table          rows per rank per step
=============  ================================================================
steps          1
phases         2m + 2 (data_wait, m forward, m backward, optimizer)
collectives    2m TP all_reduce (tp > 1) + 1 DP all_reduce (dp > 1) + send/recv:
               2m on the first and last stage, 4m on the others (pp > 1)
hook_stats     1
progress       one row per stream (TP group, DP group, each pipeline neighbour and
               direction: 4-6) every ``snapshot_s`` (2 s) of simulated time, not per step
=============  ================================================================

At the default 16,384-rank layout (DP512 x TP8 x PP4, m = 4) that is 33 rows per rank
and step on average, 54 M rows for 100 steps (34 M of them collectives), plus about 3 M
``progress`` rows (a 0.7 s step: 35 snapshots x 5 streams x 16,384 ranks).

Faults use the reference trainer's spec strings (:func:`parse_fault`); the synthetic
model supports ``slow``, ``slow_link`` (tp, dp, pp), ``data_stall``, ``hang``, ``crash``,
``desync`` (skip, resize) and ``nan``. The ground truth goes into the run's ``meta_json``
(``faults``), as the trainer does.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from dataclasses import asdict, dataclass, field

import numpy as np
import pandas as pd

from ranksight.reference_trainer.faults import FaultSpec, faults_ground_truth, parse_faults
from ranksight.synthetic.faults import (
    SUPPORTED,
    apply_faults,
    edit_rows,
    losses_for,
    rank_of,
    stop_of,
)
from ranksight.synthetic.progress import Progress
from ranksight.synthetic.rows import (
    Mesh,
    dp_collectives,
    p2p_collectives,
    phases_frame,
    steps_frame,
    tp_collectives,
)
from ranksight.synthetic.timeline import StepInputs, simulate

_MS = 1e6


def layout_for(ranks: int) -> dict[str, int]:
    """The default mesh for ``ranks``: TP 8 (one host) from 32 ranks up, else 2; PP 4 from
    64 ranks up, else 2; DP the rest. Raises ValueError if ``ranks`` does not divide."""
    tp = 8 if ranks >= 32 else 2
    pp = 4 if ranks >= 64 else 2
    if ranks < 4 or ranks % (tp * pp):
        raise ValueError(
            f"--ranks {ranks}: must be a multiple of tp*pp = {tp * pp} (tp={tp}, pp={pp})"
        )
    return {"dp": ranks // (tp * pp), "tp": tp, "pp": pp}


@dataclass(kw_only=True, slots=True)
class SynthConfig:
    """What synthetic run to write. Give ``ranks`` (mesh from :func:`layout_for`) or all of
    ``dp``, ``tp``, ``pp``. A size given as 0 or None is not given; after construction every
    size is set (>= 1)."""

    ranks: int = 0
    """World size; picks dp/tp/pp when they are not given."""
    dp: int = 0
    """Data-parallel degree."""
    tp: int = 0
    """Tensor-parallel degree (ranks of a TP group share a host when tp <= gpus_per_node)."""
    pp: int = 0
    """Pipeline stages."""
    steps: int = 100
    """Training steps, 0-based."""
    microbatches: int = 0
    """Microbatches per step (default pp, the 1F1B minimum)."""
    faults: tuple[str, ...] = ()
    """Fault spec strings (reference trainer syntax); ``none`` is dropped."""
    seed: int = 0
    """Seed of the timing noise."""
    run_id: str = ""
    """Run id; default ``synth-`` + 12 hex digits."""
    gpus_per_node: int = 8
    """Ranks per host."""
    fwd_ms: float = 30.0
    """Compute of one microbatch forward on one stage (ms)."""
    bwd_ms: float = 60.0
    """Compute of one microbatch backward (ms)."""
    tp_comm_ms: float = 1.0
    """TP all_reduce time after the last member arrives (ms)."""
    p2p_ms: float = 0.5
    """Send/recv latency (ms)."""
    dp_comm_ms: float = 40.0
    """DP gradient all_reduce time after the last member arrives (ms)."""
    optim_ms: float = 10.0
    """Optimizer step (ms)."""
    data_ms: float = 2.0
    """Data loading per step (ms)."""
    stage_cost: tuple[float, ...] = ()
    """Per pipeline stage, a factor on its forward/backward compute (one per stage; empty:
    all 1). ``(1, 1, 1, 1.5)``: the last stage holds half again as much work by design
    (pipeline imbalance, not a fault)."""
    noise: float = 0.03
    """Log-normal sigma of every duration (0.03: about 3% jitter)."""
    start_ns: int | None = None
    """Time of the first step (ns); default: now minus the run's expected length."""
    chunk_rows: int = 2_000_000
    """About this many rows are built and inserted per batch (bounds memory)."""
    snapshot_s: float = 2.0
    """Seconds between a rank's ``progress`` snapshots (the hooks' default)."""
    tail_s: float = 40.0
    """After a hang or crash, ``progress`` snapshots go on this long with nothing moving."""
    specs: tuple[FaultSpec, ...] = field(init=False, default=())
    """Parsed ``faults``."""

    def __post_init__(self) -> None:
        if not (self.dp and self.tp and self.pp):
            if not self.ranks:
                raise ValueError("give --ranks, or all of --dp, --tp and --pp")
            shape = layout_for(self.ranks)
            self.dp, self.tp, self.pp = (getattr(self, k) or shape[k] for k in ("dp", "tp", "pp"))
        if min(self.dp, self.tp, self.pp) < 1:
            raise ValueError(f"dp, tp, pp must be >= 1, got {self.dp}, {self.tp}, {self.pp}")
        if self.ranks and self.ranks != self.dp * self.tp * self.pp:
            raise ValueError(f"--ranks {self.ranks} != dp*tp*pp = {self.dp * self.tp * self.pp}")
        self.ranks = self.dp * self.tp * self.pp
        self.microbatches = self.microbatches or self.pp
        if self.steps < 1 or self.microbatches < 1 or self.gpus_per_node < 1:
            raise ValueError("steps, microbatches and gpus_per_node must be >= 1")
        if self.noise < 0 or self.chunk_rows < 1:
            raise ValueError("noise must be >= 0 and chunk_rows >= 1")
        if self.snapshot_s <= 0 or self.tail_s < 0:
            raise ValueError("snapshot_s must be > 0 and tail_s >= 0")
        self.stage_cost = tuple(float(c) for c in self.stage_cost)
        if self.stage_cost and (len(self.stage_cost) != self.pp or min(self.stage_cost) <= 0):
            raise ValueError(
                f"stage_cost {self.stage_cost}: give one factor > 0 per stage (pp={self.pp})"
            )
        self.specs = parse_faults(self.faults)
        for spec in self.specs:
            if spec.kind not in SUPPORTED:
                raise ValueError(f"fault {spec.text!r}: the synthetic model supports {SUPPORTED}")
            if spec.rank is not None and spec.rank >= self.ranks:
                raise ValueError(f"fault {spec.text!r}: rank outside world size {self.ranks}")
        self.run_id = self.run_id or "synth-" + uuid.uuid4().hex[:12]

    @property
    def shape(self) -> dict[str, int]:
        """{"dp", "tp", "pp"} degrees."""
        return {"dp": self.dp, "tp": self.tp, "pp": self.pp}


@dataclass(frozen=True, slots=True)
class SynthResult:
    """What :func:`write_synthetic` wrote."""

    run_id: str
    rows: dict[str, int]
    """Rows per table."""
    seconds: float
    """Wall time of generation and inserts."""
    steps_written: int
    """Steps generated (fewer than asked when a hang or crash stops the run)."""


def _group_id(ranks: np.ndarray) -> str:
    """The hooks' group id: ``g`` + 10 hex of sha1 of the member list (see trainer_hooks)."""
    return "g" + hashlib.sha1(",".join(map(str, ranks)).encode()).hexdigest()[:10]


def _groups(grid: np.ndarray, axis: int, world: int) -> tuple[np.ndarray, np.ndarray]:
    """Per rank, the group id and member string of its group along ``axis`` of ``grid``
    ([DP, PP, TP] rank numbers)."""
    moved = np.moveaxis(grid, axis, -1).reshape(-1, grid.shape[axis])
    gid, granks = np.empty(world, dtype=object), np.empty(world, dtype=object)
    for members in moved:
        gid[members], granks[members] = _group_id(members), ",".join(map(str, members))
    return gid, granks


def build_mesh(cfg: SynthConfig) -> Mesh:
    """Groups and payload sizes for ``cfg`` (a 4096-wide model, 4096-token microbatches)."""
    grid = np.arange(cfg.ranks).reshape(cfg.dp, cfg.pp, cfg.tp)
    (tg, tr), (dg, dr), (pg, pr) = (_groups(grid, a, cfg.ranks) for a in (2, 0, 1))
    return Mesh(
        dp=cfg.dp, tp=cfg.tp, pp=cfg.pp, m=cfg.microbatches,
        tp_gid=tg, tp_granks=tr, dp_gid=dg, dp_granks=dr, pp_gid=pg, pp_granks=pr,
        act_numel=4096 * 4096, grad_numel=7_000_000_000 // (cfg.tp * cfg.pp),
    )  # fmt: skip


def step_inputs(cfg: SynthConfig, rng: np.random.Generator, steps: int) -> StepInputs:
    """Noisy clean durations (ns) for ``steps`` steps; faults are applied separately."""
    S, m, dims = steps, cfg.microbatches, (steps, cfg.dp, cfg.pp, cfg.tp)

    def jit(shape, ms: float) -> np.ndarray:
        return ms * _MS * rng.lognormal(0.0, cfg.noise, size=shape)

    cost = np.asarray(cfg.stage_cost or (1.0,) * cfg.pp)[None, None, :, None, None]
    return StepInputs(
        fwd=jit(dims + (m,), cfg.fwd_ms) * cost,
        bwd=jit(dims + (m,), cfg.bwd_ms) * cost,
        data=jit(dims, cfg.data_ms),
        optim=jit(dims, cfg.optim_ms),
        tp_comm=jit((S, cfg.dp, cfg.pp), cfg.tp_comm_ms),
        send_delay=np.zeros(dims),
        p2p_ns=cfg.p2p_ms * _MS,
        dp_comm=jit((S, cfg.pp, cfg.tp), cfg.dp_comm_ms),
    )


def rows_per_rank_step(cfg: SynthConfig) -> float:
    """Average rows one rank writes per step (see the module table)."""
    m, pp = cfg.microbatches, cfg.pp
    p2p = 0 if pp == 1 else (2 * 2 * m + (pp - 2) * 4 * m) / pp
    return 1 + (2 * m + 2) + 2 * m * (cfg.tp > 1) + (cfg.dp > 1) + p2p + 1


def _ranks_frame(cfg: SynthConfig, start_ns: int) -> pd.DataFrame:
    r = np.arange(cfg.ranks)
    grid = {
        k: v.reshape(-1)
        for k, v in zip(("dp", "pp", "tp"), np.indices((cfg.dp, cfg.pp, cfg.tp)), strict=True)
    }
    hosts = np.array(
        [f"node{h:05d}" for h in range(-(-cfg.ranks // cfg.gpus_per_node))], dtype=object
    )
    return pd.DataFrame(
        {
            "rank": r,
            "world_size": cfg.ranks,
            "host": hosts[r // cfg.gpus_per_node],
            "local_rank": r % cfg.gpus_per_node,
            "pid": 10_000 + r % cfg.gpus_per_node,
            "device": [str(uuid.uuid5(uuid.NAMESPACE_OID, f"{cfg.run_id}/{i}")) for i in r],
            "backend": "nccl",
            **grid,
            "start_ns": start_ns,
        }
    ).assign(device=lambda f: "GPU-" + f["device"])


def _run_row(cfg: SynthConfig, status: str, created: int, updated: int) -> pd.DataFrame:
    meta = {
        "synthetic": {k: v for k, v in asdict(cfg).items() if k != "specs"},
        "faults": faults_ground_truth(cfg.specs, cfg.shape),
    }
    row = {"run_id": cfg.run_id, "attempt": 0, "created_ns": created, "updated_ns": updated,
           "status": status, "world_size": cfg.ranks, **cfg.shape, "meta_json": json.dumps(meta)}  # fmt: skip
    return pd.DataFrame([row])


def _final_status(cfg: SynthConfig) -> str:
    kinds = {s.kind for s in cfg.specs if s.from_step < cfg.steps}
    return "failed" if "crash" in kinds else "running" if kinds & {"hang", "desync"} else "finished"


def chunk_frames(
    cfg: SynthConfig,
    mesh: Mesh,
    step0: int,
    S: int,
    t_start: int,
    rng: np.random.Generator,
    progress: Progress | None = None,
    dead: dict[int, int] | None = None,
) -> tuple[dict[str, pd.DataFrame], int]:
    """Rows of steps ``step0 .. step0+S-1`` starting at ``t_start`` (ns); returns the
    frames by table (without run_id/attempt) and the start time of the next step.
    With ``progress``, also its snapshots (``dead``: rank -> crash time, filled here)."""
    x = step_inputs(cfg, rng, S)
    hang, stall = apply_faults(cfg, x, step0)
    tl = simulate(x, hang, stall)
    span = tl.step_end.reshape(S, -1).max(axis=1)
    span = np.where(np.isfinite(span), span, 0.0) + 0.5 * _MS
    t0 = t_start + np.concatenate([[0.0], np.cumsum(span)[:-1]])
    frames = {
        "steps": steps_frame(tl, t0, step0, losses_for(cfg, step0, S, rng)),
        "phases": phases_frame(mesh, tl, t0, step0),
        "collectives": pd.concat(
            [f(mesh, tl, t0, step0) for f in (tp_collectives, p2p_collectives, dp_collectives)],
            ignore_index=True,
        ),
    }
    done = frames["steps"]
    frames["hook_stats"] = pd.DataFrame(
        {"rank": done["rank"], "ts_ns": done["end_ns"], "level": "default",
         "records": (done["step"] + 1) * int(rows_per_rank_step(cfg)), "dropped": 0}
    )  # fmt: skip
    frames = {k: edit_rows(cfg, k, v, mesh) for k, v in frames.items()}
    t_next = int(t_start + span.sum())
    if progress is not None:
        dead = {} if dead is None else dead
        for spec in (
            s for s in cfg.specs if s.kind == "crash" and step0 <= s.from_step < step0 + S
        ):
            dead[rank_of(spec)] = int(t0[spec.from_step - step0])

        def step_at(t: int) -> int:
            return step0 + int(np.searchsorted(t0, t, side="right")) - 1

        frames["progress"] = progress.chunk(frames["collectives"], t_next, step_at, dead)
    return frames, t_next


def write_synthetic(store, cfg: SynthConfig, on_batch=None) -> SynthResult:
    """Generate ``cfg``'s run and insert it into ``store`` (an initialized
    :class:`~ranksight.store.Store`) in batches of about ``cfg.chunk_rows`` rows.
    ``on_batch(steps_done, steps_total)`` is called after each batch. Raises StoreError
    from the store."""
    t_begin = time.perf_counter()
    rng, mesh = np.random.default_rng(cfg.seed), build_mesh(cfg)
    stop = stop_of(cfg)
    last = cfg.steps if stop is None else stop + 1
    step_ns = (cfg.microbatches + cfg.pp) * (cfg.fwd_ms + cfg.bwd_ms) * _MS
    t = cfg.start_ns or time.time_ns() - int(last * step_ns)
    tables = ("runs", "ranks", "steps", "phases", "collectives", "hook_stats", "progress")
    rows = {name: 0 for name in tables}
    progress = Progress(mesh, cfg.snapshot_s, t + int(cfg.snapshot_s * 1e9))
    dead: dict[int, int] = {}
    tag = {"run_id": cfg.run_id, "attempt": 0}
    rows["runs"] += store.insert("runs", _run_row(cfg, "running", t, t))
    rows["ranks"] += store.insert("ranks", _ranks_frame(cfg, t).assign(**tag))
    per_chunk = max(1, int(cfg.chunk_rows // (cfg.ranks * rows_per_rank_step(cfg))))
    for step0 in range(0, last, per_chunk):
        S = min(per_chunk, last - step0)
        frames, t = chunk_frames(cfg, mesh, step0, S, t, rng, progress, dead)
        for name, frame in frames.items():
            rows[name] += store.insert(name, frame.assign(**tag)) if len(frame) else 0
        if on_batch:
            on_batch(step0 + S, last)
    if stop is not None:
        tail = progress.tail(t + int(cfg.tail_s * 1e9), stop, dead)
        rows["progress"] += store.insert("progress", tail.assign(**tag)) if len(tail) else 0
    status = _final_status(cfg)
    if status != "running":
        rows["runs"] += store.insert("runs", _run_row(cfg, status, t, t + 1))
    return SynthResult(cfg.run_id, rows, time.perf_counter() - t_begin, last)
