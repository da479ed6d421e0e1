"""The parallel mesh axes, named once and used everywhere (code, columns, labels)."""

from __future__ import annotations

import enum


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
