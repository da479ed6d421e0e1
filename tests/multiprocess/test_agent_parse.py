"""Spool record validation: the vectorized parser agrees with the record-by-record one,
and malformed records are rejected with a reason while the rest are kept."""

from __future__ import annotations

import json
import math
import random

import pyarrow as pa
import pytest

from ranksight.agent.parse import parse_chunk, parse_lines
from ranksight.agent.records import MAX_STRING, record_schema

HEADER = {"t": "_header", "run_id": "run-x", "attempt": 2, "rank": 3}


def step(i: int, **over) -> dict:
    rec = {"t": "steps", "step": i, "start_ns": 10 * i, "end_ns": 10 * i + 5, "loss": 0.5}
    rec.update(tokens=100, lr=1e-3, rss_bytes=1 << 30)
    return {**rec, **over}


def coll(i: int, **over) -> dict:
    rec = {"t": "collectives", "step": i, "phase": "forward", "group_id": "g0", "op": "send"}
    rec.update(group_ranks="0,1", group_seq=i, peer=1, dtype="float32", numel_in=4, bytes=16)
    rec.update(enqueue_ns=5 + i, start_ns=6 + i, end_ns=7 + i, wait_ns=1)
    return {**rec, **over}


def lines(*records) -> bytes:
    return b"".join(
        (r if isinstance(r, bytes) else json.dumps(r).encode()) + b"\n" for r in records
    )


def canonical(tables: dict[str, pa.Table]) -> dict[str, list[str]]:
    """Rows as sorted JSON texts (NaN as null: NaN != NaN would fail equal rows)."""

    def text(row: dict) -> str:
        plain = {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in row.items()}
        return json.dumps(plain, sort_keys=True)

    return {name: sorted(map(text, t.to_pylist())) for name, t in tables.items() if t.num_rows}


def prefix(reasons: list[str]) -> list[str]:
    return sorted(r.split(":")[0] for r in reasons)


BAD = [
    b'{"t": "steps", "step": 1, "start_ns": 3',  # truncated line
    {"t": "steps", "step": "seven"},  # wrong type
    {"t": "steps", "step": True},  # a bool is not a number
    {"t": "steps", "step": -1},  # UInt32 out of range
    {"t": "steps", "step": 1, "bogus": 4},  # unknown field
    {"t": "steps", "step": 1, "batch_id": 4},  # reserved: only the agent sets it
    {"t": "nope", "x": 1},  # unknown table
    {"step": 3},  # no table at all
    {"t": "collectives", "op": "x" * (MAX_STRING + 1)},  # huge string
    {"t": "collectives", "peer": 1 << 40},  # Int32 out of range
    {"t": "steps", "start_ns": {"nested": 1}},  # an object
    b"[1, 2, 3]",  # not an object
]


@pytest.mark.parametrize("bad", BAD, ids=range(len(BAD)))
def test_each_malformed_record_is_rejected_with_a_reason_and_the_rest_kept(bad) -> None:
    data = lines(HEADER, step(0), bad, coll(1), step(2, loss=None))
    got = parse_chunk(data, None, "rank00003-1.jsonl")
    assert len(got.rejected) == 1 and got.rejected[0], got.rejected
    assert got.tables["steps"].column("step").to_pylist() == [0, 2]
    assert got.tables["collectives"].num_rows == 1
    assert math.isnan(got.tables["steps"].column("loss")[1].as_py()), "null loss is NaN"
    assert set(got.tables["steps"].column("run_id").to_pylist()) == {"run-x"}
    assert got.tables["steps"].schema == record_schema("steps")


def test_records_take_the_header_identity_and_defaults() -> None:
    got = parse_chunk(lines(HEADER, step(4), {"t": "steps"}, step(5, rank=7)), None)
    rows = got.tables["steps"].to_pylist()
    assert [(r["run_id"], r["attempt"], r["rank"]) for r in rows] == [
        ("run-x", 2, 3),
        ("run-x", 2, 3),
        ("run-x", 2, 7),  # a record may name its own rank
    ]
    assert (rows[1]["step"], rows[1]["tokens"]) == (0, 0) and math.isnan(rows[1]["lr"])
    assert got.base == {"run_id": "run-x", "attempt": 2, "rank": 3}
    later = parse_chunk(lines(step(6)), got.base)  # a later chunk of the same file
    assert later.tables["steps"].column("rank").to_pylist() == [3]


def test_a_record_before_any_header_is_rejected() -> None:
    got = parse_chunk(lines(step(1)), None, "f.jsonl")
    assert got.rejected == ["f.jsonl: record before header"] and not got.tables


VECTORIZED_BAD = [BAD[i] for i in (3, 6, 7, 8, 9)]  # valid JSON: checked column-wise


def random_record(rng: random.Random, i: int, bad: list):
    good = [step(i), coll(i), step(i, loss=None), coll(i, peer=-1), {"t": "steps", "step": i}]
    if not bad or rng.random() < 0.85:
        return rng.choice(good)
    return rng.choice(bad)


@pytest.mark.parametrize("bad", [[], VECTORIZED_BAD, BAD], ids=["clean", "columnwise", "any"])
@pytest.mark.parametrize("seed", range(3))
def test_vectorized_parser_agrees_with_the_record_by_record_one(seed: int, bad: list) -> None:
    rng = random.Random(seed)
    records = [HEADER] + [random_record(rng, i, bad) for i in range(300)]
    data = lines(*records)
    fast, slow = parse_chunk(data, None), parse_lines(data, None)
    assert canonical(fast.tables) == canonical(slow.tables)
    assert prefix(fast.rejected) == prefix(slow.rejected)
    assert fast.count + len(fast.rejected) == len(records) - 1
    assert (len(fast.rejected) > 0) == bool(bad)


def test_the_agent_knows_the_hooks_header_without_importing_torch() -> None:
    import subprocess
    import sys

    from ranksight.agent.parse import HEADER_TABLE
    from ranksight.trainer_hooks.spool import HEADER_TABLE as hooks_header

    assert HEADER_TABLE == hooks_header
    code = "import sys, ranksight.agent.agent; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_agent_logs_and_counts_each_malformed_record_and_stores_the_rest(
    tmp_path, chdb_url, caplog
) -> None:
    import logging

    from ranksight.agent import Agent, AgentConfig
    from ranksight.store import open_store

    path = tmp_path / "spool" / "run-x" / "a2" / "rank00003-1.jsonl"
    path.parent.mkdir(parents=True)
    path.write_bytes(lines(HEADER, step(0), *BAD, coll(1), step(2), b"\x00\xff garbage"))
    store = open_store(chdb_url)
    store.init_schema()
    agent = Agent(str(tmp_path / "spool"), store, config=AgentConfig(stats_interval_s=0.001))
    with caplog.at_level(logging.WARNING, logger="ranksight.agent"):
        shipped = agent.drain()
    reasons = [r.getMessage() for r in caplog.records if "rejected record" in r.message]
    assert len(reasons) == agent.stats.rejected == len(BAD) + 1
    assert shipped >= 3 and store.query("SELECT step FROM steps ORDER BY step")[
        "step"
    ].tolist() == [0, 2]
    assert store.query("SELECT count() AS n FROM collectives")["n"].tolist() == [1]
    counted = store.query("SELECT max(rejected) AS r FROM agent_stats")["r"].tolist()
    assert counted == [len(BAD) + 1], "the count reaches the store"
