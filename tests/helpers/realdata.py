"""Where the tests find the real artifacts: ``tests/data/realdata`` (see its MANIFEST.md
for each one's source, license and right answer)."""

from __future__ import annotations

import os

import pytest

REALDATA = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "realdata"
)


def realdata(*parts: str) -> str:
    """The path of a real artifact under ``tests/data/realdata``; fails the test, naming
    it, if it is missing (a checkout without its test data)."""
    path = os.path.join(REALDATA, *parts)
    if not os.path.exists(path):
        pytest.fail(f"{path} is missing from the checkout's test data", pytrace=False)
    return path
