"""Vectorized peer statistics against their plain definitions."""

from __future__ import annotations

import numpy as np
import pytest

from ranksight.analyzer.peers import loo_median, sustained_onset


@pytest.mark.parametrize("k", [2, 3, 4, 5, 8, 33])
def test_loo_median_equals_the_median_of_the_others(k):
    rng = np.random.default_rng(k)
    values = rng.normal(size=(k, 7)).round(1)  # ties included
    got = loo_median(values)
    for i in range(k):
        others = np.delete(values, i, axis=0)
        np.testing.assert_allclose(got[i], np.median(others, axis=0))


def test_loo_median_of_one_member_is_nan():
    assert np.isnan(loo_median(np.ones((1, 3)))).all()


def test_sustained_onset():
    flags = np.array(
        [
            [0, 0, 1, 1, 1, 1, 0, 1],  # from index 2: 5 of 6 set
            [1, 0, 0, 0, 0, 0, 0, 0],  # one blip
            [0, 0, 0, 0, 0, 1, 1, 1],  # 3 at the end
        ],
        dtype=bool,
    )
    assert sustained_onset(flags, min_count=3, min_fraction=0.8).tolist() == [2, -1, 5]
