"""The per-op trace released with the What-if Analysis paper (Lin et al., "Understanding
Stragglers in Large Model Training Using What-if Analysis", OSDI 2025;
github.com/ByteDance-Seed/StragglerAnalysis, ``data/trace-*.parquet``).

One row per op of one recorded rank per (dp_rank, stage): ``dp_rank, stage, rank, step,
optype, start_ts`` (s from the step's start), ``duration`` (s), ``seq_id`` (per optype),
``mc, mb_id, gmc`` (model chunk, microbatch). ``meta-*.yaml`` beside it gives dp/pp/tp.

Mapped to the store: compute ops -> ``phases`` (``forward-compute`` -> forward per
microbatch, ``backward-compute`` -> backward, ``optimizer`` -> optimizer); pipeline
send/recv -> ``collectives`` P2P rows between the neighbouring stages of one pipeline
(``group_seq`` counts on over the steps: step order x ops per step + ``seq_id``); data-parallel collectives (``params-all-gather``,
``grads-reduce-scatter``) -> one collective over the stage's dp ranks;
``embedding-grads-all-reduce`` over the first and last stage of a pipeline;
``optimizer-clip-main-grad`` over every recorded rank; ``layernorm-grads-all-reduce``
over the rank's tensor-parallel group, of which only the rank itself is recorded. Steps
are laid end to end from a fixed epoch (their times are relative to each step's start).
"""

from __future__ import annotations

import os
import re

import numpy as np
import pandas as pd

from .rows import Rows, group_id, ranks_text

REQUIRED = ("dp_rank", "stage", "rank", "step", "optype", "start_ts", "duration", "seq_id")
EPOCH_NS = 1_700_000_000_000_000_000
"""Where the first imported step starts (the trace holds only times within a step)."""
_PHASE = {"forward-compute": "forward", "backward-compute": "backward", "optimizer": "optimizer"}
_P2P = {
    "forward-send": ("send", +1),
    "forward-recv": ("recv", -1),
    "backward-send": ("send", -1),
    "backward-recv": ("recv", +1),
}
_DP_COLL = {"params-all-gather": "all_gather", "grads-reduce-scatter": "reduce_scatter"}


_INTS = ("dp_rank", "stage", "rank", "step", "seq_id")
_SECONDS = ("start_ts", "duration")
_MAX_S = 1e5
"""Largest time (s) within a step taken (a day: steps are laid end to end in int64 ns)."""


def read_meta(path: str) -> dict[str, int]:
    """``meta-*.yaml``'s sizes (``dp_size: 4`` lines) as ``{"dp": 4, "pp": 4, ...}``; a size
    of 0 or past 2**31 (no mesh has it) is left out."""
    out = {}
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = re.match(r"\s*(dp|pp|tp|world)_size\s*:\s*(\d{1,10})\s*$", line[:200])
            if m and 0 < int(m.group(2)) < 1 << 31:
                out[m.group(1)] = int(m.group(2))
    return out


def load(path: str, limit: int = 1 << 62) -> tuple[pd.DataFrame, int]:
    """(the trace as a frame, rows left out): rows whose ranks, stage, step or sequence
    number are no integer in ``[0, 2**31)`` or whose times are no finite seconds are
    left out (a time past :data:`_MAX_S` too). Raises ValueError naming the file: the missing columns, or data past
    ``limit`` bytes uncompressed (the memory budget)."""
    import pyarrow.parquet as pq

    meta = pq.ParquetFile(path).metadata
    names = meta.schema.to_arrow_schema().names
    missing = [c for c in REQUIRED if c not in names]
    if missing:
        raise ValueError(f"{path}: not a What-if Analysis trace (no column {', '.join(missing)})")
    size = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
    if size > limit:
        raise ValueError(f"{path}: {size:,} bytes uncompressed, past the {limit:,} it may take")
    frame = pd.read_parquet(path)
    frame["optype"] = frame["optype"].astype(str)
    good = pd.Series(True, index=frame.index)
    for col in (*_INTS, *_SECONDS, *(["mb_id"] if "mb_id" in frame.columns else [])):
        frame[col] = pd.to_numeric(frame[col], errors="coerce").astype(np.float64)
        v = frame[col]
        ok = v.abs() < _MAX_S if col in _SECONDS else (v >= 0) & (v < 1 << 31) & (v % 1 == 0)
        good &= ok if col != "mb_id" else ok | (v == -1)
    dropped = int((~good).sum())
    frame = frame[good].copy()
    for col in (*_INTS, *(["mb_id"] if "mb_id" in frame.columns else [])):
        frame[col] = frame[col].astype(np.int64)
    if frame.empty:
        raise ValueError(f"{path}: no op with integer ranks and finite times")
    return frame, dropped


def meta_beside(path: str) -> dict[str, int]:
    """Sizes from a ``meta-*.yaml`` in the trace's folder (the one whose suffix matches,
    ``trace-AR.parquet`` -> ``meta-AR.yaml``, else any), or ``{}``."""
    folder = os.path.dirname(path) or "."
    tag = os.path.basename(path).removeprefix("trace-").rsplit(".", 1)[0]
    for name in (f"meta-{tag}.yaml", *sorted(os.listdir(folder))):
        if name.startswith("meta") and name.endswith((".yaml", ".yml")):
            full = os.path.join(folder, name)
            if os.path.exists(full):
                return read_meta(full)
    return {}


def rows_of(frame: pd.DataFrame, meta: dict[str, int] | None = None) -> tuple[Rows, dict]:
    """Store rows of a loaded trace, and the run's mesh ``{"dp", "tp", "pp", "world_size"}``."""
    meta = meta or {}
    workers = frame.groupby(["dp_rank", "stage"])["rank"].first()
    rank_of = {(int(d), int(s)): int(r) for (d, s), r in workers.items()}
    pp = int(meta.get("pp") or frame["stage"].max() + 1)
    dp = int(meta.get("dp") or frame["dp_rank"].max() + 1)
    mesh = {"dp": dp, "pp": pp, "tp": int(meta.get("tp") or 1)}
    mesh["world_size"] = int(meta.get("world") or dp * pp * mesh["tp"])
    steps = sorted(int(s) for s in frame["step"].unique())
    span = float((frame["start_ts"] + frame["duration"]).max())
    step_ns = int(np.ceil(span * 1.2 + 1)) * 1_000_000_000
    base = {s: EPOCH_NS + i * step_ns for i, s in enumerate(steps)}
    out = Rows()
    for (d, s), r in sorted(rank_of.items(), key=lambda kv: kv[1]):
        out.add(
            "ranks",
            {"rank": r, "world_size": mesh["world_size"], "host": "", "device": "",
             "backend": "", "dp": d, "tp": 0, "pp": s, "start_ns": EPOCH_NS},
        )  # fmt: skip
    f = frame.assign(
        t0=(frame["step"].map(base).astype(np.int64) + (frame["start_ts"] * 1e9).astype(np.int64)),
    )
    f["t1"] = f["t0"] + (f["duration"].astype(np.float64) * 1e9).astype(np.int64)
    _steps(out, f, base)
    _phases(out, f)
    _collectives(out, f, rank_of, pp)
    return out, mesh


def _steps(out: Rows, f: pd.DataFrame, base: dict[int, int]) -> None:
    ends = f.groupby(["rank", "step"])["t1"].max()
    out.extend(
        "steps",
        [
            {"rank": int(r), "step": int(s), "start_ns": base[int(s)], "end_ns": int(e),
             "loss": float("nan")}
            for (r, s), e in ends.items()
        ],
    )  # fmt: skip


def _phases(out: Rows, f: pd.DataFrame) -> None:
    sub = f[f["optype"].isin(list(_PHASE))]
    mb = sub["mb_id"] if "mb_id" in sub.columns else pd.Series(-1, index=sub.index)
    out.extend(
        "phases",
        [
            {"rank": int(r), "step": int(s), "phase": _PHASE[o],
             "microbatch": int(m) if _PHASE[o] != "optimizer" else -1, "stage": int(st),
             "start_ns": int(a), "end_ns": int(b), "wait_ns": 0}
            for r, s, o, m, st, a, b in zip(
                sub["rank"], sub["step"], sub["optype"], mb, sub["stage"], sub["t0"], sub["t1"],
                strict=True,
            )
        ],
    )  # fmt: skip


def _collectives(out: Rows, f: pd.DataFrame, rank_of: dict, pp: int) -> None:
    dps = sorted({d for d, _ in rank_of})
    stages = sorted({s for _, s in rank_of})
    pipes = {d: [rank_of[(d, s)] for s in stages if (d, s) in rank_of] for d in dps}
    dpg = {s: [rank_of[(d, s)] for d in dps if (d, s) in rank_of] for s in stages}
    everyone = sorted(rank_of.values())
    order = {s: i for i, s in enumerate(sorted(int(x) for x in f["step"].unique()))}
    width = int(f["seq_id"].max()) + 1
    rows = []
    for r in f.itertuples(index=False):
        d, s, o = int(r.dp_rank), int(r.stage), r.optype
        seq = order[int(r.step)] * width + int(r.seq_id)  # unique per group over the steps
        row = {"rank": int(r.rank), "step": int(r.step), "phase": "", "group_seq": seq,
               "peer": -1, "dtype": "", "enqueue_ns": int(r.t0), "start_ns": int(r.t0),
               "end_ns": int(r.t1), "wait_ns": 0}  # fmt: skip
        if o in _P2P:
            kind, delta = _P2P[o]
            peer = rank_of.get((d, s + delta))
            if peer is None:
                continue
            members = pipes[d]
            row.update(op=kind, peer=peer)
        elif o in _DP_COLL:
            members, row["op"] = dpg[s], _DP_COLL[o]
        elif o == "embedding-grads-all-reduce":
            members = [m for m in (rank_of.get((d, 0)), rank_of.get((d, pp - 1))) if m is not None]
            row["op"] = "all_reduce"
        elif o == "optimizer-clip-main-grad":
            members, row["op"] = everyone, "all_reduce"
        elif o == "layernorm-grads-all-reduce":
            members, row["op"] = [int(r.rank)], "all_reduce"
        else:
            continue
        desc = "pp" if o in _P2P else o
        row["group_id"] = group_id(desc, members)
        row["group_ranks"] = ranks_text(members)
        rows.append(row)
    out.extend("collectives", rows)
