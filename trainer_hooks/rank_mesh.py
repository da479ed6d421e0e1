"""This rank's place in the parallel mesh, as the trainer builds it.

Auto-attach (``autoattach.py``) attaches at ``init_process_group``, before the trainer has
said anything about its mesh: its coordinates (``dp = rank``, or ``$RANKSIGHT_MESH``) are
a guess. The trainer's own mesh comes later, from one of two places, and wins:

- ``init_device_mesh(...)`` (torch's DeviceMesh): :func:`mesh_coordinates` reads this
  rank's coordinates and the degrees from the mesh it returned;
- the trainer's own ``ranksight.trainer_hooks.attach(mesh=..., mesh_shape=...)``, which
  wins over a DeviceMesh too (:data:`SOURCES`, weakest first).

Until then :class:`RankIdentity` holds back the rank's identity records (the ``ranks`` row
and rank 0's ``runs`` rows, which carry the coordinates and the degrees) so that the store
never sees the guess: they go out when the trainer's mesh arrives, when the first step
completes, at the end, or :data:`MESH_WAIT_S` after attach, whichever comes first. A mesh that arrives
after they went out is written again as newer rows (``start_ns`` of the ``ranks`` row
unchanged, a later ``updated_ns`` on ``runs``), with one warning that readers taking any
row per rank may still see the first one.

Mesh dimension names map to ranksight's three axes (``ranksight.ground.mesh.MeshAxis``) by
prefix: ``pp*``/``pipe*`` -> pp, ``tp*``/``tensor*`` -> tp, any other (``dp``,
``dp_replicate``, ``dp_shard``, ``cp``, ``ep``, unnamed) -> dp. Several dimensions of one
axis are combined row-major in mesh order (torchtitan's ``("dp_replicate", "dp_shard")``
gives ``dp = replicate * shard_size + shard``), so the degree of an axis is the product of
its dimensions' sizes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

AXES = ("dp", "tp", "pp")
"""ranksight's mesh axes, as the ``ranks`` and ``runs`` columns name them."""
SOURCES = ("guess", "init_device_mesh", "attach")
"""Where a rank's coordinates came from, weakest first: a later source wins only if it is
stronger (the trainer's own attach over its DeviceMesh over auto-attach's guess)."""
MESH_WAIT_S = 10.0
"""Seconds auto-attach's identity records wait for the trainer's mesh before they go out
with the guess (most trainers build their mesh right after ``init_process_group``)."""


def axis_of(dim_name: str | None) -> str:
    """The ranksight axis (``dp``, ``tp``, ``pp``) a DeviceMesh dimension name maps to."""
    name = (dim_name or "").lower()
    if name.startswith(("pp", "pipe")):
        return "pp"
    if name.startswith(("tp", "tensor")):
        return "tp"
    return "dp"


def mesh_coordinates(mesh: Any, world_size: int) -> tuple[dict[str, int], dict[str, int]] | None:
    """``(coords, shape)`` of this rank in a torch ``DeviceMesh`` over all ``world_size``
    ranks (``{"dp", "tp", "pp"}`` each), or None for a mesh of fewer ranks (a sub-mesh) or
    one this rank is not in."""
    sizes = [int(n) for n in mesh.mesh.shape]
    if int(mesh.mesh.numel()) != world_size:
        return None
    where = mesh.get_coordinate()
    if where is None:
        return None
    names = list(mesh.mesh_dim_names or [None] * len(sizes))
    coords, shape = dict.fromkeys(AXES, 0), dict.fromkeys(AXES, 1)
    for name, size, index in zip(names, sizes, where, strict=True):
        axis = axis_of(name)
        coords[axis] = coords[axis] * size + int(index)
        shape[axis] *= size
    return coords, shape


class RankIdentity:
    """The rank's ``ranks`` record and rank 0's ``runs`` record template, held back while
    the coordinates are a guess (see the module doc). ``put`` writes a record; the run
    template (None on other ranks) is the dict ``Hooks._put_run`` copies, updated in place.
    Thread-safe: the training thread and the spool's writer thread both call it."""

    def __init__(
        self,
        put: Callable[[dict[str, Any]], None],
        put_run: Callable[[str], None],
        ranks_record: dict[str, Any],
        run_record: dict[str, Any] | None,
        *,
        final: bool,
    ) -> None:
        self._put, self._put_run = put, put_run
        self.ranks_record, self.run_record = ranks_record, run_record
        self.source = SOURCES[-1] if final else SOURCES[0]
        self._pending = not final
        self._deadline = time.monotonic() + MESH_WAIT_S
        self._lock = threading.Lock()
        if final:
            self._write()

    @property
    def pending(self) -> bool:
        """Whether the identity records are still held back."""
        return self._pending

    def _write(self) -> None:
        self._put(dict(self.ranks_record))
        self._put_run("running")

    def settle(self, *, only_if_due: bool = False) -> None:
        """Write the held-back records now (``only_if_due``: only past the deadline)."""
        if not self._pending or (only_if_due and time.monotonic() < self._deadline):
            return
        with self._lock:
            if self._pending:
                self._pending = False
                self._write()

    def adopt(
        self,
        coords: Mapping[str, int],
        shape: Mapping[str, int] | None,
        source: str,
        meta_json: str | None = None,
    ) -> str:
        """Take ``coords`` (and the degrees ``shape``, and rank 0's new ``meta_json``) from
        ``source`` (one of :data:`SOURCES`) if it is at least as strong as the current one;
        returns what happened: ``ignored`` (a weaker source), ``same`` (records had gone out
        with these values), ``settled`` (records written with these) or ``rewritten``
        (records had gone out with others; written again). Raises ValueError for an
        unknown source."""
        if source not in SOURCES:
            raise ValueError(f"mesh source {source!r} is not one of {SOURCES}")
        with self._lock:
            if SOURCES.index(source) < SOURCES.index(self.source):
                return "ignored"
            self.source = source
            before = (dict(self.ranks_record), dict(self.run_record or {}))
            self.ranks_record.update({a: int(coords[a]) for a in AXES if a in coords})
            if self.run_record is not None:
                self.run_record.update({a: int(shape[a]) for a in AXES if shape and a in shape})
                if meta_json is not None:
                    self.run_record["meta_json"] = meta_json
            if not self._pending and before == (self.ranks_record, self.run_record or {}):
                return "same"
            was_pending, self._pending = self._pending, False
            self._write()
        return "settled" if was_pending else "rewritten"
