"""The parallel mesh: its axes, named once and used everywhere (code, columns, labels), and
how global ranks are laid out on it.

Layout (pure arithmetic, no torch): how global ranks lie on the dp x pp x tp mesh.

The mesh is built with ``init_device_mesh(device, (dp, pp, tp), mesh_dim_names=("dp", "pp",
"tp"))``, the order of :data:`ranksight.ground.mesh.MESH_AXES` (outermost first), so

    rank = (dp_idx * pp + pp_idx) * tp + tp_idx

TP is innermost: the ranks of a TP group are consecutive (on GPUs: one node, NVLink). The PP
neighbours of a rank are ``tp`` ranks apart; its DP peers ``pp * tp`` ranks apart. Example,
DP2 x TP2 x PP2: ranks 0,1 are (dp0, pp0, tp0/1); 2,3 are (dp0, pp1); 4,5 (dp1, pp0); 6,7
(dp1, pp1).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

from ranksight.ground.words import counted


class MeshAxis(str, enum.Enum):
    """One axis of the parallel mesh. The value is the column name in every table."""

    DP = "dp"
    """Data parallel: replicas that all-reduce (or reduce-scatter) gradients."""
    TP = "tp"
    """Tensor parallel: shards of one layer that all-reduce activations."""
    PP = "pp"
    """Pipeline parallel: the stage index; neighbours exchange activations by send/recv."""


MESH_AXES: tuple[MeshAxis, ...] = (MeshAxis.DP, MeshAxis.PP, MeshAxis.TP)
"""Axes in the order used by ``init_device_mesh`` in the reference trainer (outermost first)."""

MORE_AXES: tuple[str, ...] = ("cp", "ep")
"""Axes some jobs add beyond dp, tp, pp: context parallel (sequence shards that exchange
keys and values) and expert parallel (MoE experts that all-to-all tokens). A finding
carries a rank's coordinate on them (``Finding.axes``) where its coordinates name them."""

MESH_DIM_NAMES: tuple[str, ...] = tuple(axis.value for axis in MESH_AXES)
"""``mesh_dim_names`` passed to ``init_device_mesh``: ("dp", "pp", "tp")."""


def _check_shape(shape: Mapping[str, int]) -> None:
    for name in MESH_DIM_NAMES:
        if shape.get(name, 0) < 1:
            raise ValueError(f"mesh shape needs {name} >= 1, got {dict(shape)}")


def world_size_of(shape: Mapping[str, int]) -> int:
    """Number of ranks in a mesh of ``shape`` ({"dp": DP, "tp": TP, "pp": PP})."""
    _check_shape(shape)
    return shape["dp"] * shape["tp"] * shape["pp"]


def coords_of(rank: int, shape: Mapping[str, int]) -> dict[str, int]:
    """Mesh coordinates {"dp", "tp", "pp"} of global ``rank``.

    Raises ValueError if ``rank`` is outside ``[0, dp*tp*pp)`` or the shape is malformed.
    """
    world = world_size_of(shape)
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is outside a mesh of {counted(world, 'rank')} {dict(shape)}")
    coords: dict[str, int] = {}
    rest = rank
    for name in reversed(MESH_DIM_NAMES):
        coords[name] = rest % shape[name]
        rest //= shape[name]
    return {"dp": coords["dp"], "tp": coords["tp"], "pp": coords["pp"]}


def rank_of(coords: Mapping[str, int], shape: Mapping[str, int]) -> int:
    """Global rank at mesh ``coords`` ({"dp", "tp", "pp"}); inverse of :func:`coords_of`."""
    _check_shape(shape)
    rank = 0
    for name in MESH_DIM_NAMES:
        if not 0 <= coords[name] < shape[name]:
            raise ValueError(f"coordinate {name}={coords[name]} outside mesh {dict(shape)}")
        rank = rank * shape[name] + coords[name]
    return rank
