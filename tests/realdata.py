"""Where the tests find ``shared/realdata`` (CI puts a copy of shared/ beside the checkout)."""

from __future__ import annotations

import os

import pytest

REALDATA = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "realdata"
)


def realdata(*parts: str) -> str:
    """The path of a real artifact; fails the test, naming it, if it is missing."""
    path = os.path.join(REALDATA, *parts)
    if not os.path.exists(path):
        pytest.fail(
            f"{path} is missing: CI puts a copy of shared/ beside the checkout", pytrace=False
        )
    return path
