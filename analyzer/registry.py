"""The detectors ``diagnose`` runs, in order: the one place a finding kind is registered.

Order matters within a stage (``detectors/base.py: Stage``): each detector sees the
findings of those before it (the transient test leaves out the ranks the straggler test
flagged; the stage-imbalance test leaves out the stragglers' pipelines; a hang is looked
for only where no crash was, a recovered stall only where no hang is).
"""

from __future__ import annotations

from .detectors import (
    crash,
    desync,
    hang,
    imbalance,
    nan,
    postmortem,
    slow_comm,
    straggler,
    transient,
)
from .detectors.base import Detector

DETECTORS: tuple[Detector, ...] = (
    straggler.DETECTOR,
    slow_comm.DETECTOR,
    desync.DETECTOR,
    nan.DETECTOR,
    transient.DETECTOR,
    imbalance.DETECTOR,
    postmortem.DETECTOR,
    crash.DETECTOR,
    hang.DETECTOR,
    hang.RECOVERED,
)
