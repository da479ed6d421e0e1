"""The store's one error type, beneath everything else in the store (``base`` and
``migrate`` both raise it; importing it pulls in nothing)."""

from __future__ import annotations


class StoreError(RuntimeError):
    """A store could not be opened, reached or queried. The message is one line that
    names the store URL (never credentials) and what is wrong."""
