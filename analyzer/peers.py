"""Vectorized peer statistics: leave-one-out medians and onset of a sustained condition."""

from __future__ import annotations

import warnings

import numpy as np


def loo_median(values: np.ndarray) -> np.ndarray:
    """For a (members x steps) array, each member's per-step median over the *other*
    members (NaN when there are none). NaNs are replaced by the column median first.
    O(k log k) per column by sorting once: removing the element at sorted position p
    shifts the order statistics above p down by one."""
    k = values.shape[0]
    if k < 2:
        return np.full(values.shape, np.nan)
    col_med = None
    if np.isnan(values).any():
        with warnings.catch_warnings():  # an all-NaN column stays NaN
            warnings.simplefilter("ignore", RuntimeWarning)
            col_med = np.nanmedian(values, axis=0)
    v = np.where(np.isnan(values), col_med, values) if col_med is not None else values
    order = np.argsort(v, axis=0, kind="stable")
    s = np.take_along_axis(v, order, axis=0)
    pos = np.empty_like(order)
    np.put_along_axis(pos, order, np.arange(k)[:, None].repeat(v.shape[1], axis=1), axis=0)

    def others_at(j: int) -> np.ndarray:  # j-th smallest among the others, per member
        return np.where(j < pos, s[min(j, k - 1)], s[min(j + 1, k - 1)])

    m = k - 1
    if m % 2:
        return others_at(m // 2)
    return 0.5 * (others_at(m // 2 - 1) + others_at(m // 2))


def sustained_onset(flags: np.ndarray, min_count: int, min_fraction: float) -> np.ndarray:
    """For a (rows x steps) boolean array: per row, the first column index i that starts a
    run of ``min_count`` set columns and from which at least ``min_count`` and
    ``min_fraction`` of the columns are set; -1 where there is none. (The run keeps a lone
    noisy column just before the real onset from being taken for it.)"""
    n = flags.shape[1]
    if n < min_count:  # too few steps to see a run of slow ones
        return np.full(flags.shape[0], -1)
    tail = np.cumsum(flags[:, ::-1], axis=1)[:, ::-1]
    tail_len = np.arange(n, 0, -1)[None, :]
    run = flags.copy()
    for k in range(1, min_count):
        shifted = np.zeros_like(flags)
        shifted[:, : n - k] = flags[:, k:]
        run &= shifted
    ok = run & (tail >= min_count) & (tail >= min_fraction * tail_len)
    first = ok.argmax(axis=1)
    return np.where(ok.any(axis=1), first, -1)
