"""Fault specs: what to inject, where and when. They double as the run's ground truth.

A spec is a string ``KIND:key=value,key=value``, or ``none``. Steps are numbered from 0,
as the trainer passes them to ``hooks.step(step)``.

==============  ======================================  ==========================================
kind            keys (``*`` required)                   effect
==============  ======================================  ==========================================
slow            rank*, factor*, from_step, until_step   compute of every microbatch forward and
                                                        backward on ``rank`` takes ``factor`` x as
                                                        long
slow_link       rank*, delay_ms*, group, from_step,     collectives of ``rank``'s ``group`` (tp,
                until_step                              dp; default tp) finish ``delay_ms`` late on
                                                        every member, arrivals on time; ``pp``:
                                                        ``rank``'s sends leave ``delay_ms`` late
hang            rank*, from_step                        ``rank`` blocks forever before its first
                                                        collective of ``from_step``
crash           rank*, from_step                        the process of ``rank`` exits (code 17) in
                                                        its first forward of ``from_step``
desync          rank*, mode*, from_step                 at ``from_step`` ``rank`` skips (``skip``)
                                                        or resizes (``resize``) one TP collective
data_stall      rank*, delay_ms*, from_step,            ``rank``'s data loading takes ``delay_ms``
                until_step                              longer (inside ``data_wait``)
cpu_contention  rank*, procs, from_step                 ``procs`` busy processes share ``rank``'s
                                                        pinned core (default 2)
gc_storm        rank*, from_step, until_step            allocation churn and ``gc.collect()`` per
                                                        microbatch on ``rank``
gc_pauses       delay_ms*, every, from_step,            every ``every`` steps (default 3) one
                until_step                              garbage collection of ``delay_ms`` on a
                                                        different rank in turn (0, 3, 6, ... mod
                                                        the world size): slowness that moves
slow_turns      factor*, every, from_step, until_step   every ``every`` steps (default 3) one
                                                        rank's compute is ``factor`` x slower for
                                                        that step, ranks in turn as for
                                                        ``gc_pauses``: long sequences or a hot
                                                        expert landing on another rank
nan             rank*, from_step                        the pipeline stage output of ``rank`` turns
                                                        NaN (the loss of its replica is NaN)
none            --                                      nothing (a clean run)
==============  ======================================  ==========================================

Example: ``slow:rank=3,factor=4,from_step=5`` makes rank 3 four times slower from step 5
(the sixth step) on.

To add a kind: its injector in a module of its own (``reference_trainer/inject_<kind>.py``,
an ``injector.Injector``), and its entry in :data:`FAULT_KINDS` naming it; a new key also
goes in :data:`_KEY_TYPES` and as a :class:`FaultSpec` field.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ranksight.ground.mesh import coords_of


@dataclass(frozen=True, slots=True)
class FaultKind:
    """The keys one kind of fault accepts."""

    required: tuple[str, ...]
    """Keys the spec must give."""
    optional: tuple[str, ...]
    """Keys the spec may give (defaults are the FaultSpec field defaults)."""
    summary: str
    """One line saying what the fault does."""
    injector: str = ""
    """``module:Class`` of its injector (``reference_trainer/injector.py: Injector``),
    imported only by the rank that runs it (parsing a spec needs no torch); empty: none."""


FAULT_KINDS: dict[str, FaultKind] = {
    "slow": FaultKind(
        required=("rank", "factor"),
        optional=("from_step", "until_step"),
        summary="microbatch forward/backward compute on `rank` takes `factor` x as long",
        injector="ranksight.reference_trainer.inject:SlowCompute",
    ),
    "slow_link": FaultKind(
        required=("rank", "delay_ms"),
        optional=("group", "from_step", "until_step"),
        summary="collectives of `rank`'s `group` (tp, dp) complete `delay_ms` late on every "
        "member; pp: `rank`'s sends leave `delay_ms` late",
        injector="ranksight.reference_trainer.inject_comm:SlowLink",
    ),
    "hang": FaultKind(
        required=("rank",),
        optional=("from_step",),
        summary="`rank` blocks forever before its first collective of `from_step`",
        injector="ranksight.reference_trainer.inject_comm:Hang",
    ),
    "crash": FaultKind(
        required=("rank",),
        optional=("from_step",),
        summary="the process of `rank` exits abruptly (code 17) in its first forward of `from_step`",
        injector="ranksight.reference_trainer.inject:Crash",
    ),
    "desync": FaultKind(
        required=("rank", "mode"),
        optional=("from_step",),
        summary="at `from_step` `rank` skips (mode=skip) or resizes (mode=resize) one TP collective",
        injector="ranksight.reference_trainer.inject_comm:Desync",
    ),
    "data_stall": FaultKind(
        required=("rank", "delay_ms"),
        optional=("from_step", "until_step"),
        summary="data loading on `rank` takes `delay_ms` longer per step (inside data_wait)",
        injector="ranksight.reference_trainer.inject_host:DataStall",
    ),
    "cpu_contention": FaultKind(
        required=("rank",),
        optional=("procs", "from_step"),
        summary="`procs` busy processes pinned to `rank`'s core, `rank` pinned there too",
        injector="ranksight.reference_trainer.inject_host:CpuContention",
    ),
    "gc_storm": FaultKind(
        required=("rank",),
        optional=("from_step", "until_step"),
        summary="allocation churn and gc.collect() in every microbatch forward/backward on `rank`",
        injector="ranksight.reference_trainer.inject:GcStorm",
    ),
    "gc_pauses": FaultKind(
        required=("delay_ms",),
        optional=("every", "from_step", "until_step"),
        summary="every `every` steps a garbage collection of `delay_ms` on another rank in turn",
        injector="ranksight.reference_trainer.inject:GcPauses",
    ),
    "slow_turns": FaultKind(
        required=("factor",),
        optional=("every", "from_step", "until_step"),
        summary="every `every` steps one rank's compute is `factor` x slower for that step, "
        "another rank in turn",
        injector="ranksight.reference_trainer.inject_slow_turns:SlowTurns",
    ),
    "nan": FaultKind(
        required=("rank",),
        optional=("from_step",),
        summary="the pipeline stage output of `rank` becomes NaN from `from_step` on",
        injector="ranksight.reference_trainer.inject_host:NanOutput",
    ),
    "none": FaultKind(required=(), optional=(), summary="no fault"),
}
"""Every fault kind the trainer knows, by name."""

LINK_GROUPS = ("tp", "dp", "pp")
"""Groups a ``slow_link`` can slow: the rank's TP or DP group, or its pipeline sends."""
DESYNC_MODES = ("skip", "resize")
"""How a ``desync`` rank breaks step with its TP peers."""

_KEY_TYPES: dict[str, type] = {
    "rank": int,
    "factor": float,
    "from_step": int,
    "until_step": int,
    "delay_ms": float,
    "group": str,
    "mode": str,
    "procs": int,
    "every": int,
}
_PARAMS = ("factor", "delay_ms", "group", "mode", "procs", "every")
"""Keys beyond rank and steps; ground truth records the ones a spec sets."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FaultSpec:
    """One injected fault; build it with :func:`parse_fault`."""

    kind: str
    """Fault kind, a key of :data:`FAULT_KINDS`."""
    rank: int | None = None
    """Global rank the fault hits (None for kinds that hit no single rank)."""
    factor: float | None = None
    """Slow-down factor of ``slow`` and ``slow_turns``: 4.0 = compute takes four times as long."""
    from_step: int = 0
    """First step (0-based, as recorded by the hooks) at which the fault is active."""
    until_step: int | None = None
    """Last step at which the fault is active (inclusive); None = until the end."""
    delay_ms: float | None = None
    """Added delay (ms) of ``slow_link`` (per collective or send) and ``data_stall`` (per step)."""
    group: str | None = None
    """``slow_link``: which of the rank's groups is slow, one of :data:`LINK_GROUPS` (tp)."""
    mode: str | None = None
    """``desync``: one of :data:`DESYNC_MODES`."""
    procs: int | None = None
    """``cpu_contention``: busy processes sharing the rank's core (2 when not given)."""
    every: int | None = None
    """``gc_pauses``, ``slow_turns``: steps between two turns (3 when not given)."""

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {self.kind!r}; known: {sorted(FAULT_KINDS)}")
        if self.rank is not None and self.rank < 0:
            raise ValueError(f"fault {self.kind}: rank must be >= 0, got {self.rank}")
        if self.factor is not None and not self.factor >= 1.0:
            raise ValueError(f"fault {self.kind}: factor must be >= 1, got {self.factor}")
        if self.from_step < 0:
            raise ValueError(f"fault {self.kind}: from_step must be >= 0, got {self.from_step}")
        if self.until_step is not None and self.until_step < self.from_step:
            raise ValueError(
                f"fault {self.kind}: until_step ({self.until_step}) < from_step ({self.from_step})"
            )
        self._check_params()

    def _check_params(self) -> None:
        if self.delay_ms is not None and not 0 < self.delay_ms <= 600_000:
            raise ValueError(
                f"fault {self.kind}: delay_ms must be in (0, 600000], got {self.delay_ms}"
            )
        if self.group is not None and self.group not in LINK_GROUPS:
            raise ValueError(
                f"fault {self.kind}: group must be one of {LINK_GROUPS}, got {self.group!r}"
            )
        if self.mode is not None and self.mode not in DESYNC_MODES:
            raise ValueError(
                f"fault {self.kind}: mode must be one of {DESYNC_MODES}, got {self.mode!r}"
            )
        if self.every is not None and not 1 <= self.every <= 1000:
            raise ValueError(f"fault {self.kind}: every must be in [1, 1000], got {self.every}")
        if self.procs is not None and not 1 <= self.procs <= 64:
            raise ValueError(f"fault {self.kind}: procs must be in [1, 64], got {self.procs}")

    @property
    def link_group(self) -> str:
        """The group a ``slow_link`` slows (``tp`` when not given)."""
        return self.group or "tp"

    @property
    def target_rank(self) -> int:
        """``rank`` of a kind that requires it; ValueError if the spec names no rank."""
        if self.rank is None:
            raise ValueError(f"fault {self.kind}: no rank given")
        return self.rank

    @property
    def slow_factor(self) -> float:
        """``factor`` of a ``slow``; ValueError if the spec gives none."""
        if self.factor is None:
            raise ValueError(f"fault {self.kind}: no factor given")
        return self.factor

    @property
    def delay_s(self) -> float:
        """``delay_ms`` in seconds, for kinds that require it; ValueError if not given."""
        if self.delay_ms is None:
            raise ValueError(f"fault {self.kind}: no delay_ms given")
        return self.delay_ms / 1e3

    @property
    def busy_procs(self) -> int:
        """Busy processes of a ``cpu_contention`` (2 when not given)."""
        return self.procs or 2

    @property
    def text(self) -> str:
        """Canonical spec string; ``parse_fault(spec.text) == spec``."""
        kind = FAULT_KINDS[self.kind]
        parts = [f"{key}={getattr(self, key)}" for key in kind.required + kind.optional]
        parts = [p for p in parts if not p.endswith("=None")]
        return f"{self.kind}:{','.join(parts)}" if parts else self.kind

    def paused_rank(self, step: int, world_size: int) -> int | None:
        """``gc_pauses``, ``slow_turns``: the rank whose turn it is at ``step`` (every ``every`` steps from
        ``from_step``, ranks 0, 3, 6, ... modulo ``world_size``: a different pipeline
        stage and replica each time), else None."""
        every = self.every or 3
        if not self.active_at(step) or (step - self.from_step) % every:
            return None
        turn = (step - self.from_step) // every
        return (3 * turn + turn // max(1, world_size)) % world_size

    def active_at(self, step: int) -> bool:
        """Whether the fault is on at ``step`` (0-based)."""
        if self.kind == "none" or step < self.from_step:
            return False
        return self.until_step is None or step <= self.until_step


def _parse_pairs(text: str, body: str) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in body.split(","))):
        key, sep, raw = item.partition("=")
        key, raw = key.strip(), raw.strip()
        if not sep or not key or not raw:
            raise ValueError(f"fault spec {text!r}: expected key=value, got {item!r}")
        if key in values:
            raise ValueError(f"fault spec {text!r}: key {key!r} given twice")
        if key not in _KEY_TYPES:
            raise ValueError(f"fault spec {text!r}: unknown key {key!r}")
        try:
            values[key] = _KEY_TYPES[key](raw)
        except ValueError:
            kind = _KEY_TYPES[key].__name__
            raise ValueError(f"fault spec {text!r}: {key}={raw!r} is not {kind}") from None
    return values


def parse_fault(text: str) -> FaultSpec:
    """Parse one spec string such as ``slow:rank=3,factor=4,from_step=5``.

    Raises ValueError naming the spec and the problem: unknown kind, unknown or missing key,
    a key not allowed for the kind, a value of the wrong type or out of range.
    """
    kind_name, _, body = text.strip().partition(":")
    kind_name = kind_name.strip().lower()
    if kind_name not in FAULT_KINDS:
        raise ValueError(
            f"fault spec {text!r}: unknown kind {kind_name!r}; known: {sorted(FAULT_KINDS)}"
        )
    kind = FAULT_KINDS[kind_name]
    values = _parse_pairs(text, body)
    missing = [key for key in kind.required if key not in values]
    if missing:
        raise ValueError(f"fault spec {text!r}: missing {', '.join(missing)}")
    extra = sorted(set(values) - set(kind.required) - set(kind.optional))
    if extra:
        raise ValueError(f"fault spec {text!r}: {kind_name} does not take {', '.join(extra)}")
    try:
        return FaultSpec(kind=kind_name, **values)
    except ValueError as err:
        raise ValueError(f"fault spec {text!r}: {err}") from None


def parse_faults(texts: Iterable[str]) -> tuple[FaultSpec, ...]:
    """Parse several spec strings (e.g. repeated ``--inject``), dropping ``none``."""
    specs = (parse_fault(text) for text in texts)
    return tuple(spec for spec in specs if spec.kind != "none")


def faults_ground_truth(
    specs: Iterable[FaultSpec], mesh_shape: Mapping[str, int] | None = None
) -> list[dict[str, Any]]:
    """The injected faults as records, the ground truth the analyzer is scored against.

    Each record has ``kind``, ``rank``, ``factor``, ``from_step``, ``until_step`` (None =
    to the end) and ``spec`` (the canonical string), plus each of ``delay_ms``, ``group``,
    ``mode``, ``procs`` the spec sets; with ``mesh_shape`` ({"dp", "tp", "pp"} degrees) also
    the rank's mesh coordinates ``dp``, ``tp``, ``pp``. ``none`` is left out.
    """
    records = []
    for spec in specs:
        if spec.kind == "none":
            continue
        record: dict[str, Any] = {
            "kind": spec.kind,
            "rank": spec.rank,
            "factor": spec.factor,
            "from_step": spec.from_step,
            "until_step": spec.until_step,
            "spec": spec.text,
        }
        record.update({k: getattr(spec, k) for k in _PARAMS[1:] if getattr(spec, k) is not None})
        if spec.kind == "slow_link":
            record["group"] = spec.link_group
        if spec.kind == "cpu_contention":
            record["procs"] = spec.busy_procs
        if mesh_shape is not None and spec.rank is not None:
            record.update(coords_of(spec.rank, mesh_shape))
        records.append(record)
    return records
