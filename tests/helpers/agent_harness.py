"""Real processes for the agent's fault tests: a paced hooked gloo job, a `ranksight agent`
process, and the exactly-once check of the store against the ranks' own spool records and
counters (read here with the spool format's frame decoder and plain ``json``,
independently of the agent's parser and validation).

The agent deletes spool segments once they are stored, so :func:`start_job` also starts a
keeper thread that hard-links every segment into ``<spool>.kept/`` as soon as it appears:
the ranks' records stay readable for the check, and the agent's deletions are real."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

from ranksight.store import Store, schema
from ranksight.trainer_hooks import spool_format as sf

WORKER = os.path.join(os.path.dirname(os.path.dirname(__file__)), "workers", "paced_job.py")


def key_columns(table: str) -> tuple[str, ...]:
    """The columns compared per record: all but Float64 ones (NaN != NaN) and batch_id."""
    spec = schema.table(table)
    return tuple(c for c, t in spec.columns if t != "Float64" and c != "batch_id")


def _default(table: str, column: str):
    return "" if schema.table(table).type_of(column) == "String" else 0


def child_env() -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("RANKSIGHT_STORE", None)
    return env


SEGMENT_BYTES = 16 << 10
"""Spool segment size of the paced job: small, so segments are closed and deleted mid-run."""


def start_job(spool: str, run_id: str, steps: int, pace_s: float, out: str, ranks: int = 2):
    """torchrun the paced job in the background (spool segments of ``SEGMENT_BYTES``),
    and keep a hard link of each of its spool segments (:func:`keep_spool`)."""
    keep_spool(spool)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    cmd += [f"--nproc-per-node={ranks}", WORKER, spool, run_id, str(steps), str(pace_s), out]
    log = open(os.path.join(out, "job.log"), "w")  # noqa: SIM115 - closed with the process
    env = {**child_env(), "RANKSIGHT_TEST_SEGMENT_BYTES": str(SEGMENT_BYTES)}
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)


_keepers: dict[str, threading.Thread] = {}


def keep_spool(spool: str, every_s: float = 0.01) -> None:
    """Hard-link every spool file under ``spool`` into ``<spool>.kept/`` (same relative
    path) as soon as it appears, from a daemon thread, for the life of this process."""
    if spool in _keepers:
        return

    def run() -> None:
        while True:
            for path in glob.glob(os.path.join(spool, "*", "a*", "rank*")):
                kept = os.path.join(spool + ".kept", os.path.relpath(path, spool))
                if not os.path.exists(kept):
                    os.makedirs(os.path.dirname(kept), exist_ok=True)
                    try:
                        os.link(path, kept)
                    except (FileNotFoundError, FileExistsError):
                        pass
            time.sleep(every_s)

    _keepers[spool] = threading.Thread(target=run, daemon=True, name=f"keep {spool}")
    _keepers[spool].start()


def spool_files(spool: str, run_id: str) -> list[str]:
    """The run's spool files: the kept link of each (the same file, which the agent may
    delete from the spool at any moment once it is stored), else the spool's own."""
    found = {}
    for folder in (spool, spool + ".kept"):  # a kept link wins
        for path in glob.glob(os.path.join(folder, run_id, "a*", "rank*")):
            found[os.path.relpath(path, folder)] = path
    return sorted(found.values())


def read_segment(path: str) -> list[dict]:
    """Every record of a binary spool segment as a dict (the header's identity included),
    decoded frame by frame; asserts the segment is undamaged."""
    data = Path(path).read_bytes()
    header, out = {}, []
    for item in sf.frames(data):
        assert isinstance(item, sf.Frame), f"{path}: {item}"
        if item.kind == sf.HEADER:
            header = json.loads(bytes(item.payload))
        elif item.kind == sf.JSON_LINES:
            out += [{**header, **json.loads(line)} for line in bytes(item.payload).splitlines()]
        elif item.kind == sf.COLUMNS:
            columns = {}
            for name, kind, a, b in sf.decode_columns(item.payload, item.rows):
                if kind in "iuf":
                    columns[name] = a.tolist()
                else:
                    raw = bytes(b)
                    columns[name] = [raw[i:j].decode() for i, j in zip(a[:-1], a[1:], strict=True)]
            for i in range(item.rows):
                out.append({**header, "t": item.name, **{k: v[i] for k, v in columns.items()}})
    return out


def start_agent(spool: str, url: str, log_path: str, *extra: str) -> subprocess.Popen:
    """`ranksight agent` in the background, logging to ``log_path`` (appended)."""
    cmd = [sys.executable, "-m", "ranksight.cli", "agent", "--spool", spool, "--store", url]
    cmd += ["--interval", "0.2", "--batch-rows", "3000", "--collectors", "none", *extra]
    log = open(log_path, "a")  # noqa: SIM115 - closed with the process
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=child_env())


def spool_records(spool: str, run_id: str) -> dict[str, list[tuple]]:
    """Every record the ranks wrote for ``run_id``, as :func:`key_columns` tuples per
    table (the rank's first, for tables with a rank; ``runs`` has none)."""
    out: dict[str, list[tuple]] = {}
    for path in spool_files(spool, run_id):
        if path.endswith(sf.SUFFIX):
            recs = read_segment(path)
        else:
            lines = Path(path).read_bytes().splitlines()
            header = json.loads(lines[0])
            recs = [{**header, **json.loads(raw)} for raw in lines[1:]]
        for rec in recs:
            t = rec["t"]
            row = tuple(rec.get(c, _default(t, c)) for c in key_columns(t))
            out.setdefault(t, []).append(row)
    return out


def store_records(store: Store, run_id: str, tables=None) -> dict[str, list[tuple]]:
    """Every stored row of ``run_id`` in ``tables`` (default: every table ranks write),
    as :func:`key_columns` tuples."""
    out = {}
    for table in tables or ("runs", *schema.RECORD_TABLES):
        keys = key_columns(table)
        frame = store.query(
            f"SELECT {', '.join(keys)} FROM {table} WHERE run_id = %(r)s", {"r": run_id}
        )
        out[table] = [
            tuple(v.item() if hasattr(v, "item") else v for v in row)
            for row in frame.itertuples(index=False)
        ]
    return out


def counters(out: str) -> dict[int, dict]:
    """The ranks' own counters (``hooks.close()``), by rank."""
    found = {}
    for path in glob.glob(os.path.join(out, "rank*.json")):
        stats = json.loads(Path(path).read_text())
        found[stats["rank"]] = stats
    return found


def stored_count(store: Store, run_id: str) -> int:
    """Rows of ``run_id`` across the record tables (0 if the store cannot answer)."""
    try:
        return sum(len(v) for v in store_records(store, run_id).values())
    except Exception:  # noqa: BLE001 - the store may be down on purpose
        return 0


def wait_for(predicate, timeout_s: float, what: str, every_s: float = 0.5) -> None:
    """Poll ``predicate`` until true; AssertionError naming ``what`` on timeout."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        time.sleep(every_s)


def assert_exactly_once(store: Store, spool: str, run_id: str, out: str, ranks: int) -> int:
    """Every record the ranks produced is stored exactly once; returns the record count.

    Checked three ways: each rank's counter of records written equals its spool lines and
    it dropped none; the spool's keys are distinct; the stored keys equal the spool's as
    multisets (a duplicate or a loss shows as a difference)."""
    written = spool_records(spool, run_id)
    stats = counters(out)
    assert sorted(stats) == list(range(ranks)), f"rank counters missing: {sorted(stats)}"
    at = {t: key_columns(t).index("rank") for t in written if t != "runs"}
    per_rank = Counter(k[at[t]] for t, keys in written.items() if t != "runs" for k in keys)
    per_rank[0] += len(written.get("runs", []))  # rank 0 writes the run records
    for rank, s in stats.items():
        assert s["dropped"] == 0, f"rank {rank} dropped {s['dropped']} records"
        assert per_rank[rank] == s["records"], (rank, per_rank[rank], s)
    stored = store_records(store, run_id, written)
    for table, keys in written.items():
        assert len(set(keys)) == len(keys), f"{table}: spool keys are not distinct"
        extra = Counter(stored[table]) - Counter(keys)
        missing = Counter(keys) - Counter(stored[table])
        assert not extra and not missing, (
            f"{table}: {sum(extra.values())} duplicated/unknown rows, "
            f"{sum(missing.values())} missing of {len(keys)}"
        )
    return sum(len(v) for v in written.values())
