"""Fuzzing the agent's spool reader with hypothesis, seeded from segments the hooks' own
writer wrote (``trainer_hooks/spool.py``): flipped, inserted and cut bytes, bad
checksums, and frames whose checksum holds but whose content does not (any row count,
kind, name or payload, nested JSON). Nothing may escape the reader, what it rejects stays
within the bytes read, and every frame (or line) the mutation left alone is decoded."""

from __future__ import annotations

import functools
import json
import os
import tempfile
from collections import Counter
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ranksight.agent.tailer import SpoolTailer
from ranksight.trainer_hooks import spool_format as sf
from ranksight.trainer_hooks.spool import SpoolWriter, spool_path
from tests.multiprocess.test_agent_parse import coll, step

RUN = "run-f"
HEADER = {"run_id": RUN, "attempt": 0, "rank": 0}
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def records(k: int) -> list[dict]:
    """Flush ``k``'s records: steps, collectives (strings, some not ASCII) and records of
    one table with different keys (the writer makes those a JSON-lines frame)."""
    base = 1000 * k
    out = [step(base + i) for i in range(20)] + [coll(base + 20 + i) for i in range(20)]
    out[25]["phase"] = "前向"
    out += [{"t": "steps", "step": base + 40}, {"t": "steps", "step": base + 41, "loss": 1.0}]
    return out


@functools.cache
def seed_segment() -> bytes:
    """A closed segment written by the hooks' writer: four flushes of :func:`records`."""
    with tempfile.TemporaryDirectory() as spool:
        writer = SpoolWriter(spool_path(spool, RUN, 0, 0), HEADER, max_buffered=10**6,
                             budget_bytes=1 << 30, flush_interval_s=3600)  # fmt: skip
        for k in range(4):
            for rec in records(k):
                writer.put(rec)
            writer._drain()
        writer.close()
        return Path(writer.path).read_bytes()


def seed_frames() -> list[bytes]:
    data = seed_segment()
    return [data[f.start : f.end] for f in sf.frames(data)]


def frame_steps(raw: bytes) -> list[int]:
    """The ``step`` of every record in one frame (decoded independently of the agent)."""
    item = next(sf.frames(raw))
    if item.kind == sf.JSON_LINES:
        return [json.loads(line)["step"] for line in bytes(item.payload).splitlines()]
    if item.kind != sf.COLUMNS:
        return []
    columns = {name: a for name, _, a, _ in sf.decode_columns(item.payload, item.rows)}
    return columns["step"].tolist()


def read(data: bytes, name: str = f"rank00000-{os.getpid()}-0000{sf.SUFFIX}"):
    """What the agent's tailer reads from a spool holding ``data`` as rank 0's file
    ``name``; it never raises, and counts at most a rejection per line (2 bytes)."""
    with tempfile.TemporaryDirectory() as spool:
        path = Path(spool, RUN, "a0", name)
        path.parent.mkdir(parents=True)
        path.write_bytes(data)
        got = SpoolTailer(spool).read()
    assert len(got.rejected) <= len(data) // 2 + 1, "rejections beyond the bytes"
    return got


def decoded_steps(got) -> Counter:
    return Counter(v for t in got.tables.values() for v in t.column("step").to_pylist())


def assert_kept(got, frames: list[bytes]) -> None:
    missing = Counter(s for f in frames for s in frame_steps(f)) - decoded_steps(got)
    assert not missing, f"records of untouched frames lost: {sorted(missing)[:10]}"


mutation = st.sampled_from(["flip", "insert", "cut"])


@FUZZ
@given(
    kind=mutation, at=st.floats(0, 1, exclude_max=True), noise=st.binary(min_size=1, max_size=64)
)
def test_damaged_bytes_never_escape_and_the_frames_before_them_are_read(kind, at, noise) -> None:
    data = seed_segment()
    pos = int(at * len(data))
    if kind == "flip":
        flipped = bytes(a ^ b for a, b in zip(data[pos:], noise))  # noqa: B905 - to the end
        changed = data[:pos] + flipped + data[pos + len(flipped) :]
    elif kind == "insert":
        changed = data[:pos] + noise + data[pos:]
    else:
        changed = data[:pos]
    got = read(changed)
    assert_kept(got, [f for f in seed_frames() if data.index(f) + len(f) <= pos])


def payloads() -> st.SearchStrategy[bytes]:
    """Any bytes, JSON nested up to 200k deep, headers of any identity."""
    deep = st.integers(1, 200_000).map(lambda n: b"[" * n + b"]" * n)
    nested = st.integers(1, 50_000).map(
        lambda n: b'{"t":"steps","x":' + b'{"a":' * n + b"1" + b"}" * n + b"}"
    )
    header = st.builds(
        lambda run, rank: json.dumps({"run_id": run, "attempt": 0, "rank": rank}).encode(),
        st.one_of(st.text(max_size=8), st.integers()), st.integers(-(2**70), 2**70),
    )  # fmt: skip
    return st.one_of(st.binary(max_size=256), deep, nested, header)


@FUZZ
@given(
    which=st.integers(0, 9),
    rows=st.one_of(
        st.none(), st.sampled_from([0, 1, 7, 1 << 20, 0xFFFFFFFF]), st.integers(0, 0xFFFFFFFF)
    ),
    kind=st.one_of(st.none(), st.sampled_from(sf.KINDS)),
    name=st.one_of(st.none(), st.sampled_from(["steps", "collectives", "_header", "nope", ""])),
    payload=st.one_of(
        st.none(), payloads(), st.tuples(st.integers(0, 4096), st.binary(min_size=1, max_size=8))
    ),
)
def test_a_frame_with_a_valid_checksum_and_any_content_costs_only_itself(
    which, rows, kind, name, payload
) -> None:
    frames = seed_frames()
    item = next(sf.frames(frames[which]))
    body = bytes(item.payload)
    if isinstance(payload, tuple):  # a few bytes of the real payload changed
        at, noise = payload
        at %= max(len(body), 1)
        body = body[:at] + noise + body[at + len(noise) :]
    elif payload is not None:
        body = payload
    frames[which] = sf.frame(
        kind or item.kind, item.name if name is None else name,
        item.rows if rows is None else rows, body,
    )  # fmt: skip
    got = read(b"".join(frames))
    assert_kept(got, [f for i, f in enumerate(frames) if i != which])


@FUZZ
@given(
    at=st.floats(0, 1, exclude_max=True),
    line=st.one_of(
        st.binary(max_size=200),
        st.integers(1, 200_000).map(lambda n: b"[" * n + b"]" * n),
        st.integers(1, 5_000).map(
            lambda n: b'{"t":"steps","step":' + b"[" * n + b"1" + b"]" * n + b"}"
        ),
    ),
)
def test_a_json_spool_line_of_any_bytes_costs_only_itself(at, line) -> None:
    good = [json.dumps({"t": "_header", **HEADER}).encode()]
    good += [json.dumps(r).encode() for k in range(3) for r in records(k)]
    pos = 1 + int(at * (len(good) - 1))
    lines = [*good[:pos], line.replace(b"\n", b" ").replace(b"\r", b" "), *good[pos:]]
    got = read(b"\n".join(lines) + b"\n", name=f"rank00000-{os.getpid()}.jsonl")
    want = Counter(json.loads(raw)["step"] for raw in good[1:])
    missing = want - decoded_steps(got)
    assert not missing, sorted(missing)[:10]
