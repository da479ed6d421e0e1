"""Which mesh axis a process group spans, from its members' coordinates."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ranksight.ground.mesh import MeshAxis
from ranksight.ground.words import span


def group_axis(member_ranks: list[int], coords: pd.DataFrame) -> str:
    """The axis a group spans: ``"tp"``, ``"dp"`` or ``"pp"`` when its members differ in
    exactly that coordinate, ``"world"`` when it holds every rank, else ``"mixed"``.
    ``coords`` is indexed by rank with columns dp, tp, pp; unknown ranks give ``"mixed"``.
    One group of :func:`group_axes`."""
    one = pd.DataFrame({"group_id": ["g"], "group_ranks": [",".join(map(str, member_ranks))]})
    return group_axes(one, coords)["g"]


def group_axes(groups: pd.DataFrame, coords: pd.DataFrame) -> dict[str, str]:
    """``{group_id: axis}`` for a frame with columns group_id, group_ranks ("0,1,..."),
    each as :func:`group_axis` says, with the coordinates looked up in numpy arrays
    (thousands of groups at 16k ranks)."""
    axes = [a.value for a in MeshAxis]
    rank_set = set(int(r) for r in coords.index)
    pos = {int(r): i for i, r in enumerate(coords.index)}
    table = coords[axes].to_numpy()
    out = {}
    for gid, ranks in zip(groups["group_id"], groups["group_ranks"], strict=True):
        members = [int(r) for r in str(ranks).split(",") if r]
        if len(members) == len(rank_set) and set(members) == rank_set:
            out[gid] = "world"
            continue
        try:
            sub = table[[pos[m] for m in members]]
        except KeyError:
            out[gid] = "mixed"
            continue
        varying = [a for j, a in enumerate(axes) if len(np.unique(sub[:, j])) > 1]
        out[gid] = varying[0] if len(varying) == 1 else "mixed"
    return out


def group_names(groups: pd.DataFrame, coords: pd.DataFrame) -> dict[str, str]:
    """``{group_id: name}`` as an engineer says it: ``"tp group of ranks 2,3"``, ``"dp
    group of ranks 0-3"``, ``"world group"`` (every rank), ``"group of ranks 0,5,9"`` (no
    single axis). ``groups`` has columns group_id, group_ranks ("0,1,..."); a group id not
    in it keeps no name (callers fall back to the id)."""
    if groups.empty:
        return {}
    axes = group_axes(groups, coords) if not coords.empty else {}
    out = {}
    for gid, ranks in zip(groups["group_id"], groups["group_ranks"], strict=True):
        axis = axes.get(gid, "mixed")
        members = span(int(r) for r in str(ranks).split(",") if r)
        out[gid] = (
            "world group"
            if axis == "world"
            else f"group of ranks {members}"
            if axis == "mixed"
            else f"{axis} group of ranks {members}"
        )
    return out
