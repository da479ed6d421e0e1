"""The words of a diagnosis, named once: finding kinds and causes.

A finding's ``kind`` says what went wrong (a straggler, a hang); its ``cause`` says why or
how (GC pauses, a signal). Both are string enums: a member compares equal to its word and
formats as it (``f"{Kind.HANG}" == "hang"``), which is what the ``findings`` table, the
JSON report and the UI hold. An unknown word raises ``ValueError`` naming it
(:func:`kind_of`, :func:`cause_of`), so a typo cannot become a new kind.
"""

from __future__ import annotations

import enum
from typing import TypeVar


class _Word(str, enum.Enum):
    """A string enum that prints as its value on every Python (3.10's ``str, Enum`` mixin
    prints ``Kind.HANG`` under ``format`` from 3.11 on; ``enum.StrEnum`` is 3.11+)."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class Kind(_Word):
    """What a finding is."""

    STRAGGLER = "straggler"
    """A rank slower than its same-stage peers over many steps (a chronic culprit)."""
    TRANSIENT_STRAGGLER = "transient_straggler"
    """Slow steps on whichever rank, in turn (GC pauses, long sequences): no chronic culprit."""
    SLOW_COMMUNICATION = "slow_communication"
    """A group's collectives or a pipeline link slower than its peers' while arrival skew is low."""
    HANG = "hang"
    """The job stopped making progress (or stalled and recovered)."""
    CRASH = "crash"
    """A rank's process ended abnormally."""
    DESYNC = "desync"
    """A group's members issued different collectives at one sequence number."""
    NAN = "nan"
    """A rank's loss turned NaN/Inf after finite values."""
    PIPELINE_IMBALANCE = "pipeline_imbalance"
    """The job's own split of the layers over its pipeline stages: not a failing rank."""
    HARDWARE = "hardware"
    """A device or bus error a job's logs report (Xid, ECC, PCIe AER)."""
    NETWORK = "network"
    """A network error a job's logs report (IB/RoCE, sockets, rendezvous store)."""


NOT_FAULTS: tuple[Kind, ...] = (Kind.PIPELINE_IMBALANCE,)
"""Finding kinds that name no failing rank: the job's own split of the work."""

STOPS: tuple[Kind, ...] = (Kind.HANG, Kind.CRASH, Kind.DESYNC)
"""Finding kinds that stop the job (beside them, milder slowness is only noted)."""


class Cause(_Word):
    """Why or how: the root cause a finding names."""

    # slowness of a rank (hooked runs)
    COMPUTE = "compute"
    DATA_LOADER = "data_loader"
    OPTIMIZER = "optimizer"
    GC = "gc"
    CPU_CONTENTION = "cpu_contention"
    GPU_THROTTLE = "gpu_throttle"
    """Its GPU's clocks slowed for a power or hardware reason (NVML clock-event bits)."""
    GPU_THERMAL = "gpu_thermal"
    """Its GPU's clocks slowed because it ran hot (NVML's thermal clock-event bits)."""
    GPU_CONTENTION = "gpu_contention"
    DATA_IMBALANCE = "data_imbalance"
    STAGE_IMBALANCE = "stage_imbalance"
    COMMUNICATION = "communication"
    NUMERICS = "numerics"
    MISMATCHED_COLLECTIVE = "mismatched_collective"
    UNKNOWN = "unknown"
    # hangs and crashes (hooked runs and imported artifacts)
    STUCK = "stuck"
    STOPPED = "stopped"
    ALL_BLOCKED = "all_blocked"
    CRASH = "crash"
    GONE = "gone"
    STOPPED_COMPLETING = "stopped_completing"
    CHECKPOINT = "checkpoint"
    # what a job's logs say (analyzer/log_evidence)
    WATCHDOG_ABORT = "watchdog_abort"
    WATCHDOG_STUCK = "watchdog_stuck"
    RENDEZVOUS = "rendezvous"
    LAGGING = "lagging"
    MISMATCH = "mismatch"
    AHEAD = "ahead"
    SIGNAL = "signal"
    EXIT_CODE = "exit_code"
    EXCEPTION = "exception"
    NCCL_ERROR = "nccl_error"
    GPU_ERROR = "gpu_error"
    CUDA_ERROR = "cuda_error"
    OUT_OF_MEMORY = "out_of_memory"
    PCIE = "pcie"
    NETWORK = "network"
    PEER_GONE = "peer_gone"
    UNREACHABLE = "unreachable"
    WORKER_DIED = "worker_died"


_W = TypeVar("_W", bound="_Word")


def _word_of(words: type[_W], word: str, what: str) -> _W:
    """``word`` as a member of ``words``. Raises ValueError naming it, ``what`` it should
    be, and the known words."""
    try:
        return words(word)
    except ValueError:
        known = ", ".join(w.value for w in words)
        raise ValueError(f"unknown {what} {word!r} (known: {known})") from None


def kind_of(word: str) -> Kind:
    """``word`` as a :class:`Kind`. Raises ValueError naming it and the known kinds."""
    return _word_of(Kind, word, "finding kind")


def cause_of(word: str) -> Cause:
    """``word`` as a :class:`Cause`. Raises ValueError naming it and the known causes."""
    return _word_of(Cause, word, "cause")
