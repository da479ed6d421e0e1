"""Fault specs: what to inject, where and when. They double as the run's ground truth.

A spec is a string ``KIND:key=value,key=value``, or ``none``. Steps are numbered from 0,
as the trainer passes them to ``hooks.step(step)``.

========  ====================================  =================================================
kind      keys (``*`` required)                 effect
========  ====================================  =================================================
slow      rank*, factor*, from_step, until_step  compute of every microbatch forward and backward
                                                 on global ``rank`` takes ``factor`` times as long
none      --                                    nothing (a clean run)
========  ====================================  =================================================

Example: ``slow:rank=3,factor=4,from_step=5`` makes rank 3 four times slower from step 5
(the sixth step) on.

To add a kind (hang, crash, desync, data stall, ...): add an entry to :data:`FAULT_KINDS`,
any new key to :data:`_KEY_TYPES` and as a :class:`FaultSpec` field, and an injector in
:mod:`ranksight.reference_trainer.inject`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ranksight.reference_trainer.layout import coords_of


@dataclass(frozen=True, slots=True)
class FaultKind:
    """The keys one kind of fault accepts."""

    required: tuple[str, ...]
    """Keys the spec must give."""
    optional: tuple[str, ...]
    """Keys the spec may give (defaults are the FaultSpec field defaults)."""
    summary: str
    """One line saying what the fault does."""


FAULT_KINDS: dict[str, FaultKind] = {
    "slow": FaultKind(
        required=("rank", "factor"),
        optional=("from_step", "until_step"),
        summary="microbatch forward/backward compute on `rank` takes `factor` x as long",
    ),
    "crash": FaultKind(
        required=("rank",),
        optional=("from_step",),
        summary="the process of `rank` exits abruptly (code 17) in its first forward of `from_step`",
    ),
    "none": FaultKind(required=(), optional=(), summary="no fault"),
}
"""Every fault kind the trainer knows, by name."""

_KEY_TYPES: dict[str, type] = {"rank": int, "factor": float, "from_step": int, "until_step": int}


@dataclass(frozen=True, slots=True, kw_only=True)
class FaultSpec:
    """One injected fault; build it with :func:`parse_fault`."""

    kind: str
    """Fault kind, a key of :data:`FAULT_KINDS`."""
    rank: int | None = None
    """Global rank the fault hits (None for kinds that hit no single rank)."""
    factor: float | None = None
    """Slow-down factor for ``slow``: 4.0 = compute takes four times as long."""
    from_step: int = 0
    """First step (0-based, as recorded by the hooks) at which the fault is active."""
    until_step: int | None = None
    """Last step at which the fault is active (inclusive); None = until the end."""

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

    @property
    def text(self) -> str:
        """Canonical spec string; ``parse_fault(spec.text) == spec``."""
        kind = FAULT_KINDS[self.kind]
        parts = [f"{key}={getattr(self, key)}" for key in kind.required + kind.optional]
        parts = [p for p in parts if not p.endswith("=None")]
        return f"{self.kind}:{','.join(parts)}" if parts else self.kind

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
    to the end) and ``spec`` (the canonical string); with ``mesh_shape`` ({"dp", "tp", "pp"}
    degrees) also the rank's mesh coordinates ``dp``, ``tp``, ``pp``. ``none`` is left out.
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
        if mesh_shape is not None and spec.rank is not None:
            record.update(coords_of(spec.rank, mesh_shape))
        records.append(record)
    return records
