"""Nothing the hooks do raises into training code: one guard at every public entry.

A failure inside the hooks' own bookkeeping (a bug, an object the script handed over
that misbehaves, a full disk, a warnings filter set to ``error``) becomes a count in
``hooks.stats["errors"]`` and one warning per entry point; a value the hooks cannot
record becomes a drop counted in ``hooks.stats["bad_values"]`` and one warning per field.
The script's own exceptions (raised in a ``with hooks.step()`` body, by a collective the
hooks wrap) pass through untouched: the guard wraps only the hooks' code.
"""

from __future__ import annotations

import collections
import functools
import logging
import warnings
from collections.abc import Callable
from typing import Any

log = logging.getLogger("ranksight.trainer_hooks")

SELF = object()
"""``guarded(..., default=SELF)``: on failure, return the object itself (``__enter__``)."""


def warn(message: str, stacklevel: int = 2) -> None:
    """``warnings.warn(message)`` that never raises (a filter may turn warnings into
    errors: the message then goes to the ``ranksight.trainer_hooks`` logger)."""
    try:
        warnings.warn(message, RuntimeWarning, stacklevel=stacklevel + 1)
    except Exception:  # noqa: BLE001 - a warning must not become the job's error
        try:
            log.warning(message)
        except Exception:  # noqa: BLE001
            pass


class Guard:
    """Counts what went wrong, per entry point (``failures``) and per field
    (``bad_values``), and warns the first time each one happens."""

    def __init__(self) -> None:
        self.failures: collections.Counter[str] = collections.Counter()
        self.bad_values: collections.Counter[str] = collections.Counter()
        self.last_error = ""

    def failed(self, site: str, error: BaseException) -> None:
        """The hooks' code at ``site`` raised ``error``: counted, warned once."""
        self.last_error = f"{site}: {type(error).__name__}: {error}"[:500]
        self.failures[site] += 1
        if self.failures[site] == 1:
            warn(
                f"ranksight: {self.last_error}; training goes on, this part of the "
                "recording is skipped (counted in hooks.stats['errors'])",
                stacklevel=3,
            )

    def dropped(self, field: str, value: Any, why: str) -> None:
        """``value`` given for ``field`` is not recorded (``why``): counted, warned once."""
        self.bad_values[field] += 1
        if self.bad_values[field] == 1:
            warn(
                f"ranksight: {field}={_show(value)} {why}; not recorded (this warning is "
                "given once per field, drops are counted in hooks.stats['bad_values'])",
                stacklevel=5,
            )

    @property
    def errors(self) -> int:
        """Failures so far, all entry points."""
        return sum(self.failures.values())


def _show(value: Any) -> str:
    """A short description of ``value`` that cannot itself fail."""
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - an object whose __repr__ raises
        text = f"<{type(value).__name__}>"
    return text if len(text) <= 60 else text[:57] + "..."


def guarded(site: str, default: Any = None) -> Callable[[Callable], Callable]:
    """Method decorator: an exception in the method is :meth:`Guard.failed` on the
    instance's ``_guard`` (``guard`` property) and the call returns ``default`` (the
    instance itself for :data:`SELF`, else ``default()`` if callable, else ``default``)."""

    def wrap(method: Callable) -> Callable:
        @functools.wraps(method)
        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return method(self, *args, **kwargs)
            except Exception as e:  # noqa: BLE001 - the point of the guard
                try:
                    self.guard.failed(site, e)
                except Exception:  # noqa: BLE001
                    pass
                if default is SELF:
                    return self
                return default() if callable(default) else default

        return call

    return wrap
