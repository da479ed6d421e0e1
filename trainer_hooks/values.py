"""The values a training script hands the hooks, as the numbers and names the spool holds.

Each function takes whatever the script passed and returns a value of the column's type,
or the column's "none" value after :meth:`Guard.dropped` (counted, one warning per
field). ``None`` means "nothing to record" and is never warned about. Nothing here raises:
not for ``nan``, a huge int, a string, a GPU tensor, or an object whose ``__float__`` or
``__index__`` raises.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Mapping
from typing import Any

from .guard import Guard

MAX_NAME = 1024
"""Longest name (phase, status) recorded, characters; a longer one is cut."""
INT32 = (-(1 << 31), (1 << 31) - 1)
UINT32 = (0, (1 << 32) - 1)
UINT64 = (0, (1 << 64) - 1)

_TEXT = (str, bytes, bytearray)


def _on_device(x: Any) -> str:
    """The device type of a tensor not in host memory ("cuda", "meta"...), else ""."""
    device = getattr(x, "device", None)
    kind = getattr(device, "type", "cpu") if device is not None else "cpu"
    return "" if kind == "cpu" else str(kind)


def real(guard: Guard, field: str, x: Any) -> float:
    """``x`` as a float: a Python or numpy number, a one-element CPU tensor; ``nan`` and
    ``inf`` are kept (a NaN loss is a finding). NaN for None, and NaN after a drop for
    text, a tensor on a device (reading it would synchronize the device), or anything
    ``float()`` refuses."""
    if type(x) is float:
        return x
    if x is None:
        return math.nan
    try:
        if isinstance(x, _TEXT):
            guard.dropped(field, x, "is text, not a number")
            return math.nan
        device = _on_device(x)
        if device:
            guard.dropped(field, x, f"is a tensor on {device}: reading it would synchronize "
                          "the device; pass a Python number (e.g. from your own .item())")  # fmt: skip
            return math.nan
        return float(x)
    except Exception as e:  # noqa: BLE001 - whatever float() raises
        guard.dropped(field, x, f"is not a number ({type(e).__name__})")
        return math.nan


def whole(guard: Guard, field: str, x: Any, bounds: tuple[int, int], default: int) -> int:
    """``x`` as an int within ``bounds`` (inclusive): an int, a numpy integer, a
    one-element integer CPU tensor, or a float with no fraction. ``default`` for None,
    and after a drop for anything else (a bool, text, nan, inf, a fraction, out of
    range, a tensor on a device)."""
    lo, hi = bounds
    if type(x) is int and lo <= x <= hi:
        return x
    if x is None:
        return default
    try:
        if isinstance(x, (bool, *_TEXT)):
            guard.dropped(field, x, "is not a whole number")
            return default
        device = _on_device(x)
        if device:
            guard.dropped(field, x, f"is a tensor on {device}: pass a Python int")
            return default
        try:
            value = operator.index(x)
        except TypeError:
            f = float(x)
            if not f.is_integer():  # nan, inf, a fraction
                guard.dropped(field, x, "is not a whole number")
                return default
            value = int(f)
        if not lo <= value <= hi:
            guard.dropped(field, x, f"is outside {lo}..{hi}")
            return default
        return value
    except Exception as e:  # noqa: BLE001 - whatever __index__ / __float__ raises
        guard.dropped(field, x, f"is not a whole number ({type(e).__name__})")
        return default


def name(guard: Guard, field: str, x: Any) -> str | None:
    """``x`` as a name: a str (anything else through ``str()``), valid UTF-8, at most
    :data:`MAX_NAME` characters (cut beyond, with a drop counted). None after a drop if
    ``str()`` fails."""
    try:
        text = x if type(x) is str else str(x)
        if type(text) is not str:
            text = str.__str__(text)
        if not text.isascii():  # lone surrogates would not encode
            text = text.encode("utf-8", "backslashreplace").decode("utf-8")
        if len(text) > MAX_NAME:
            guard.dropped(field, x, f"is longer than {MAX_NAME} characters: cut")
            text = text[:MAX_NAME]
        return text
    except Exception as e:  # noqa: BLE001 - an object whose __str__ raises
        guard.dropped(field, x, f"has no name ({type(e).__name__})")
        return None


def coordinates(guard: Guard, field: str, x: Any, default: int) -> dict[str, int]:
    """A mesh mapping (``{"dp": 0, "tp": 1}``) with int values; a value that is not a
    whole number >= -1 is dropped (``default``), a non-mapping is dropped whole."""
    if x is None:
        return {}
    if not isinstance(x, Mapping):
        guard.dropped(field, x, "is not a mapping of axis name to int")
        return {}
    out = {}
    try:
        for axis in ("dp", "tp", "pp"):
            if axis in x:
                out[axis] = whole(guard, f"{field}[{axis!r}]", x[axis], (-1, INT32[1]), default)
    except Exception as e:  # noqa: BLE001 - a mapping whose lookups raise
        guard.dropped(field, x, f"cannot be read ({type(e).__name__})")
    return out
