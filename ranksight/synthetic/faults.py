"""Faults in synthetic runs: the reference trainer's fault specs applied to the timing model.

==========  ===========================================================================
kind        effect on :class:`~ranksight.synthetic.timeline.StepInputs` and rows
==========  ===========================================================================
slow        the rank's forward/backward compute x ``factor`` on active steps
slow_link   ``group=tp``: the rank's TP group's all_reduce takes ``delay_ms`` longer;
            ``dp``: its DP group's; ``pp``: every send the rank issues leaves late
data_stall  the rank's data_wait grows by ``delay_ms``
hang        at ``from_step`` the rank never enqueues its first TP all_reduce; the run
            stops there (status ``running``)
crash       as hang, and the rank writes nothing at all in that step (status ``failed``)
desync      at ``from_step`` the rank's TP group's first all_reduce never completes:
            ``resize``: the rank enqueued it with one element more; ``skip``: the rank
            skipped it and went on to its DP all_reduce (enqueued, never completed), so
            it is one behind its TP peers and blocked in another group
nan         the last stage's loss is NaN from ``from_step`` (only on the rank itself at
            that step when it is on the last stage; everywhere after)
==========  ===========================================================================
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from ranksight.ground.mesh import coords_of
from ranksight.reference_trainer.faults import FaultSpec
from ranksight.synthetic.rows import Mesh
from ranksight.synthetic.timeline import StepInputs

if TYPE_CHECKING:
    from ranksight.synthetic import SynthConfig

SUPPORTED = ("slow", "slow_link", "data_stall", "hang", "crash", "desync", "nan")
"""Fault kinds the synthetic model applies."""
STOPPING = ("hang", "crash", "desync")
"""Kinds after which no step completes."""
_MS = 1e6


def _active(spec: FaultSpec, step0: int, S: int) -> np.ndarray:
    """[S] bool: steps ``step0 .. step0+S-1`` at which ``spec`` is on."""
    return np.array([spec.active_at(s) for s in range(step0, step0 + S)])


def rank_of(spec: FaultSpec) -> int:
    """The rank ``spec`` hits. Every kind of :data:`SUPPORTED` requires one, which
    :func:`~ranksight.reference_trainer.faults.parse_fault` checks; raises ValueError naming
    the spec for a spec built without it."""
    if spec.rank is None:
        raise ValueError(f"fault {spec.text!r}: the synthetic model needs its rank")
    return spec.rank


def _param(spec: FaultSpec, key: str) -> float:
    """``spec``'s ``factor`` or ``delay_ms`` (required by the kinds that use them); raises
    ValueError naming the spec when it is not given."""
    value = getattr(spec, key)
    if value is None:
        raise ValueError(f"fault {spec.text!r}: the synthetic model needs its {key}")
    return float(value)


def stop_of(cfg: SynthConfig) -> int | None:
    """The first step no rank completes (a hang, crash or desync), or None."""
    stops = [s.from_step for s in cfg.specs if s.kind in STOPPING and s.from_step < cfg.steps]
    return min(stops) if stops else None


def apply_faults(
    cfg: SynthConfig, x: StepInputs, step0: int
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Apply the timing faults to ``x`` (in place) for steps ``step0 ..``; return the
    ``hang`` [S, DP, PP, TP] and ``stall`` [S, DP, PP] masks for :func:`simulate`."""
    S = x.fwd.shape[0]
    hang = stall = None
    for spec in cfg.specs:
        c, on = coords_of(rank_of(spec), cfg.shape), _active(spec, step0, S)
        d, p, t = c["dp"], c["pp"], c["tp"]
        if spec.kind == "slow":
            x.fwd[on, d, p, t] *= _param(spec, "factor")
            x.bwd[on, d, p, t] *= _param(spec, "factor")
        elif spec.kind == "data_stall":
            x.data[on, d, p, t] += _param(spec, "delay_ms") * _MS
        elif spec.kind == "slow_link":
            _slow_link(spec, x, on, d, p, t)
        elif spec.kind in STOPPING and step0 <= spec.from_step < step0 + S:
            at = spec.from_step - step0
            if spec.kind == "desync":
                stall = np.zeros(x.tp_comm.shape, dtype=bool) if stall is None else stall
                stall[at, d, p] = True
            else:
                hang = np.zeros(x.data.shape, dtype=bool) if hang is None else hang
                hang[at, d, p, t] = True
    return hang, stall


def _slow_link(spec: FaultSpec, x: StepInputs, on: np.ndarray, d: int, p: int, t: int) -> None:
    delay = _param(spec, "delay_ms") * _MS
    if spec.link_group == "tp":
        x.tp_comm[on, d, p] += delay
    elif spec.link_group == "dp":
        x.dp_comm[on, p, t] += delay
    else:
        x.send_delay[on, d, p, t] += delay


def losses_for(cfg: SynthConfig, step0: int, S: int, rng: np.random.Generator) -> np.ndarray:
    """[S, world] loss: a decaying curve on the last stage's ranks, NaN elsewhere (as the
    hooks record it), and the ``nan`` faults."""
    steps = np.arange(step0, step0 + S)[:, None]
    curve = 2.0 + 3.5 * np.exp(-steps / 30.0) + 0.01 * rng.standard_normal((S, cfg.dp))
    loss = np.full((S, cfg.dp, cfg.pp, cfg.tp), np.nan)
    loss[:, :, -1, :] = curve[:, :, None]
    for spec in (s for s in cfg.specs if s.kind == "nan"):
        c = coords_of(rank_of(spec), cfg.shape)
        for i, s in enumerate(range(step0, step0 + S)):
            if s > spec.from_step:
                loss[i, :, -1, :] = np.nan
            elif s == spec.from_step and c["pp"] == cfg.pp - 1:
                loss[i, c["dp"], -1, c["tp"]] = np.nan
            elif s == spec.from_step:
                loss[i, c["dp"], -1, :] = np.nan
    return loss.reshape(S, -1)


def edit_rows(cfg: SynthConfig, table: str, frame: pd.DataFrame, mesh: Mesh) -> pd.DataFrame:
    """Row-level effects: a crashed rank writes nothing in its crash step; a desync rank's
    first TP all_reduce of that step is resized (``resize``), or skipped (``skip``: the
    rank goes on to its DP all_reduce, which it enqueues and never completes)."""
    if frame.empty or "step" not in frame.columns:
        return frame
    for spec in (s for s in cfg.specs if s.kind in ("crash", "desync")):
        at = (frame["rank"] == spec.rank) & (frame["step"] == spec.from_step)
        if spec.kind == "crash":
            frame = frame[~at]
        elif spec.kind == "desync" and table == "collectives":
            hit = at & (frame["peer"] == -1) & (frame["end_ns"] == 0) & (frame["phase"] != "")
            if spec.mode == "resize":
                frame.loc[hit, ["numel_in", "numel_out"]] += 1
            elif hit.any() and mesh.dp > 1:
                moved = frame[hit].assign(
                    phase="", group_id=mesh.dp_gid[spec.rank], group_ranks=mesh.dp_granks[spec.rank],
                    group_seq=spec.from_step, dtype="float32", numel_in=mesh.grad_numel,
                    numel_out=mesh.grad_numel, bytes=mesh.grad_numel * 4,
                )  # fmt: skip
                frame = pd.concat([frame[~hit], moved], ignore_index=True)
            else:
                frame = frame[~hit]
    return frame
