"""Hook configuration: explicit arguments win, then environment variables, then defaults."""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field

from ranksight.ground import env

LEVELS = ("off", "default", "detailed")
"""``off`` records nothing and installs nothing. ``default`` records every step, phase,
GC pause, and every collective and P2P op called through ``torch.distributed`` or the
functional collectives (op, group, sequence, sizes, issue / end / blocked times) by
wrapping those functions: nothing runs for other ops. ``detailed`` adds a dispatch mode
that also sees collectives issued from C++ only (DDP's reducer, the backward of autograd
functional collectives), at a Python call per tensor op (8-15% of a CPU step)."""


def new_run_id() -> str:
    """A fresh run id: ``run-`` followed by 12 hex digits."""
    return "run-" + uuid.uuid4().hex[:12]


def default_spool_dir() -> str:
    """``$RANKSIGHT_SPOOL_DIR``, else ``$RANKSIGHT_HOME/spool`` (home defaults to ``./.ranksight``)."""
    home = os.environ.get(env.HOME, env.DEFAULT_HOME)
    return os.environ.get(env.SPOOL_DIR) or os.path.join(home, "spool")


@dataclass(kw_only=True, slots=True)
class HooksConfig:
    """How the trainer hooks record and where they leave records for the node agent."""

    run_id: str = field(default_factory=lambda: os.environ.get(env.RUN_ID) or new_run_id())
    """The training job launch every record is tagged with."""
    attempt: int = field(default_factory=lambda: int(os.environ.get(env.ATTEMPT, "0")))
    """Restart count of this run (0 for the first launch)."""
    level: str = field(default_factory=lambda: os.environ.get(env.LEVEL, "default"))
    """One of :data:`LEVELS`."""
    spool_dir: str = field(default_factory=default_spool_dir)
    """Node-local folder the agent reads; records go to ``<spool_dir>/<run_id>/a<attempt>/``."""
    max_buffered_records: int = 200_000
    """In-memory records waiting for the writer thread; past this, new records are dropped
    and counted (about 300 bytes each: 60 MB at the bound)."""
    spool_budget_bytes: int = 2 << 30
    """Most bytes of one rank process's spool segments on disk at once (the agent deletes
    segments once the store has them); past this, records are dropped and counted."""
    spool_segment_bytes: int = 64 << 20
    """A spool segment past this size is closed and the next one started, bytes; the
    agent deletes closed segments once the store has every record in them."""
    flush_interval_s: float = 0.25
    """How often the writer thread moves buffered records to the spool file, seconds."""
    device_timing: bool = field(
        default_factory=lambda: os.environ.get(env.DEVICE_TIMING, "1") != "0"
    )
    """On a CUDA rank, time collectives with CUDA events (``device_timing.py``)."""
    fr_ring: bool = field(default_factory=lambda: os.environ.get(env.FR_RING, "0") == "1")
    """At the default level on NCCL, read NCCL collectives from torch's Flight Recorder
    ring off the training thread (``fr_ring.py``) instead of a Python wrapper per op
    (``RANKSIGHT_FR_RING=1``). Off by default: its host-clock placement of each
    collective is coarser than the wrappers' CUDA events (:data:`ranksight.ground.env.FR_RING`)."""

    def __post_init__(self) -> None:
        """Raises TypeError naming a field of the wrong type, ValueError one out of range."""
        self._check_types()
        if self.level not in LEVELS:
            raise ValueError(f"hook level {self.level!r} is not one of {', '.join(LEVELS)}")
        if self.attempt < 0:
            raise ValueError(f"attempt must be >= 0, got {self.attempt}")
        if not self.run_id or "/" in self.run_id or self.run_id.startswith("."):
            raise ValueError(f"run id {self.run_id!r} must be non-empty with no '/' or leading '.'")
        if self.max_buffered_records < 1 or self.spool_budget_bytes < 1:
            raise ValueError("max_buffered_records and spool_budget_bytes must be positive")
        if self.spool_segment_bytes < 4096:
            raise ValueError(f"spool_segment_bytes must be >= 4096, got {self.spool_segment_bytes}")
        if not 0 < self.flush_interval_s <= MAX_FLUSH_INTERVAL_S:
            raise ValueError(
                f"flush_interval_s must be in (0, {MAX_FLUSH_INTERVAL_S}] seconds, "
                f"got {self.flush_interval_s}"
            )

    def _check_types(self) -> None:
        if isinstance(self.spool_dir, os.PathLike):
            self.spool_dir = os.fspath(self.spool_dir)
        for name, want in _TYPES.items():
            value = getattr(self, name)
            if type(value) not in want:
                kinds = " or ".join(t.__name__ for t in want)
                raise TypeError(
                    f"{name} must be {kinds}, got {type(value).__name__}: {value!r:.60}"
                )


MAX_FLUSH_INTERVAL_S = 3600.0
"""Longest writer-thread interval accepted, seconds (a longer one is a unit mistake)."""
_TYPES: dict[str, tuple[type, ...]] = {
    "run_id": (str,),
    "attempt": (int,),
    "level": (str,),
    "spool_dir": (str,),
    "max_buffered_records": (int,),
    "spool_budget_bytes": (int,),
    "spool_segment_bytes": (int,),
    "flush_interval_s": (int, float),
    "device_timing": (bool,),
    "fr_ring": (bool,),
}
"""The type each field must have (exactly: a bool is no count, a numpy number no int)."""
