"""The C heap of the agent's processes: kept while busy, given back when idle (glibc only).

Each batch the agent reads (joined column arrays, about 70 MB for 500,000 records) and
each insert a shipper encodes (clickhouse-driver writes the whole block, about 60 MB for
400,000 ``collectives`` rows, into a growing ``BytesIO`` before it compresses it) takes
tens of megabytes of fresh memory and frees it again moments later. With glibc's
defaults that memory goes back to the kernel at once, and the next batch pays a page fault
for each 4 KiB page it touches again. Keeping a pad of free heap (``M_TOP_PAD``, see
``mallopt(3)``) cut the shipper's CPU per ``collectives`` row from 0.52 to 0.40-0.41 µs and the
reader's from 0.27 to 0.20 µs per record on the 2-core test VM (``bench/RESULTS.md``,
"Agent ingest"); resident memory while busy is unchanged within a few percent, as the
pad is reused by the next batch rather than added to it.

Once the agent is idle :func:`release` gives free heap back (``malloc_trim(0)``), so an
idle agent stays at its usual size. Both do nothing where the C library is not glibc
(musl, macOS): they return False.
"""

from __future__ import annotations

import ctypes
import logging
import sys

log = logging.getLogger("ranksight.agent")

PAD_BYTES = 256 << 20
"""Free heap added and kept at the top whenever the heap grows, bytes (``M_TOP_PAD``): more
than one batch's allocations, so that the next batch's large buffers are carved from
memory already faulted in instead of being mapped afresh."""
TRIM_BYTES = 512 << 20
"""Free heap at the top that is kept rather than trimmed, bytes (``M_TRIM_THRESHOLD``)."""
MMAP_BYTES = 32 << 20
"""Allocations at least this large get a mapping of their own if the heap's top cannot
hold them (``M_MMAP_THRESHOLD``; 32 MiB is glibc's most on 64-bit). Setting any of these
turns off glibc's own adaptive threshold, which otherwise rises to the size of the last
large block freed (up to 32 MiB) and trims at twice that."""

_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3  # <malloc.h>


def _glibc() -> ctypes.CDLL | None:
    """The process's C library if it is glibc (has ``gnu_get_libc_version``), else None."""
    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return None
    if not hasattr(libc, "gnu_get_libc_version") or not hasattr(libc, "mallopt"):
        return None
    return libc


def keep(pad_bytes: int = PAD_BYTES) -> bool:
    """Have this process's heap keep free memory for reuse instead of returning it to the
    kernel after each large free: ``mallopt`` of ``M_MMAP_THRESHOLD`` (:data:`MMAP_BYTES`),
    ``M_TOP_PAD`` (``pad_bytes``) and ``M_TRIM_THRESHOLD`` (:data:`TRIM_BYTES`, at least
    twice the pad). Returns whether all were set (False where the C library is not glibc,
    or it refused one). Raises ValueError for a negative or over-1-GiB pad."""
    if not 0 <= pad_bytes <= 1 << 30:
        raise ValueError(f"heap pad must be 0..1 GiB in bytes, got {pad_bytes}")
    libc = _glibc()
    if libc is None:
        return False
    done = True
    for option, value in (
        (_M_MMAP_THRESHOLD, MMAP_BYTES),
        (_M_TOP_PAD, pad_bytes),
        (_M_TRIM_THRESHOLD, max(TRIM_BYTES, 2 * pad_bytes)),
    ):
        if not libc.mallopt(option, ctypes.c_int(value)):
            log.debug("mallopt(%d, %d) refused", option, value)
            done = False
    return done


def release() -> bool:
    """Give this process's free memory back to the kernel: Arrow's memory pool's unused
    pages (``MemoryPool.release_unused``; its jemalloc purges only while it allocates, so
    an idle process would keep them) and the C heap's (``malloc_trim(0)``: the top of the
    heap and whole free pages inside it). Returns whether the C heap released any (False
    also where the C library is not glibc)."""
    if "pyarrow" in sys.modules:
        sys.modules["pyarrow"].default_memory_pool().release_unused()
    libc = _glibc()
    if libc is None or not hasattr(libc, "malloc_trim"):
        return False
    return bool(libc.malloc_trim(ctypes.c_size_t(0)))
