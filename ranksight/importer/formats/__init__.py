"""Every format ``ranksight import`` reads, registered here and nowhere else.

The order is the order of recognition (the first format whose ``recognize`` says yes
takes the file; text logs are the fallback, last) and of ``finish`` (the Flight
Recorder's before the profiler's, which merges into its rows). Adding a format is one
module here with a :class:`~.base.Format` subclass, one line below, and its test
(docs/import-formats.md).
"""

from __future__ import annotations

from .base import Format
from .flight_recorder import FlightRecorder
from .kineto import Kineto
from .log import TextLog
from .pyspy import PySpy
from .wia import WhatIf

FORMATS: tuple[type[Format], ...] = (WhatIf, FlightRecorder, Kineto, PySpy, TextLog)
"""Every import format, in the order of recognition and finish."""

__all__ = ["FORMATS", "Format"]
