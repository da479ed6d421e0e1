"""A gzip'd log cut short (copied while it was written, cut to a size limit) is read up to
the cut: its file line says where it ends, and the lines before it count. It was refused
whole ('Compressed file ended before the end-of-stream marker was reached')."""

from __future__ import annotations

import gzip
import os

from ranksight.importer import ImportConfig, import_paths
from ranksight.store.memory import MemoryStore
from tests.helpers.realworld import CORPUS

LOG = os.path.join(CORPUS, "bk4-pytorch-20630", "console.log")


def _cut(tmp_path, keep: float) -> str:
    with open(LOG, "rb") as f:
        packed = gzip.compress(f.read() * 40)
    path = tmp_path / "console.log.gz"
    path.write_bytes(packed[: int(len(packed) * keep)])
    return str(path)


def test_the_lines_before_the_cut_are_read_and_the_cut_is_said(tmp_path):
    store = MemoryStore()
    try:
        result = import_paths(store, [_cut(tmp_path, 0.5)], ImportConfig(run_id="c"))
        (f,) = result.files
        assert f.ok and "the gzip ends early" in f.message, f.message
        assert result.rows["log_events"] > 0
    finally:
        store.close()


def test_a_gzip_cut_before_any_line_is_refused_by_name(tmp_path):
    store = MemoryStore()
    try:
        result = import_paths(store, [_cut(tmp_path, 0.02)], ImportConfig(run_id="c"))
        (f,) = result.files
        assert not f.ok and "a gzip that ends before its first line" in f.message, f.message
    finally:
        store.close()
