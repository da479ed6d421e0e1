"""Flight Recorder dumps into a run: the dump rows the node agent writes (``fr_dumps``,
``fr_entries``, :mod:`ranksight.collectors.fr_ingest`), plus what the analyzer reads:

- ``progress``: per rank and process group, the last enqueued and completed sequence
  number (the dump's ``pg_status``), group members from ``pg_config``. ``pg_status`` is
  keyed by pg id and ``pg_config`` by pg name; the entries pair the two where present,
  and the creation order pairs the rest (both count up as groups are created).
- ``collectives``: one row per non-P2P entry at its (group, sequence), with op, dtype and
  element count, so the desync check compares members at each sequence; ``end_ns`` is the
  completion time where the entry completed, else 0.

Dumps whose ``pg_config`` lists no members (gloo) leave ``group_ranks`` empty;
:func:`fill_members` then takes every imported rank as a member.

Groups whose ops are P2P (pipeline groups: send/recv entries, or a description naming
the pipeline) get ``direction = "p2p"``: their members do not issue in lockstep.
"""

from __future__ import annotations

import json
import math

from ranksight.collectors.flight_recorder import FrDump, read_dump
from ranksight.collectors.fr_ingest import dump_rows

from .rows import Rows, group_id, norm_op, parse_ranks, rank_from_path, ranks_text


def read(path: str, rank: int | None = None) -> FrDump:
    """The dump at ``path`` (rank from the name: ``nccl_trace_rank_3``, ``_dump_12``)."""
    return read_dump(path, rank if rank is not None else rank_from_path(path))


def pg_names(dump: FrDump) -> dict[str, str]:
    """pg id (``pg_status`` key) -> pg name (``pg_config`` key)."""
    known = {str(e["pg_id"]): e["pg_name"] for e in dump.entries if e["pg_id"] >= 0}
    ids = sorted(dump.pg_status, key=_num)
    names = sorted(dump.pg_config, key=_num)
    if len(ids) == len(names):
        paired = dict(zip(ids, names, strict=True))
        if all(paired.get(i) == n for i, n in known.items()):
            return paired
    return {i: n for i, n in known.items() if n in dump.pg_config}


def _num(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return math.inf


def rows_of(dump: FrDump, host: str, ts_ns: int) -> Rows:
    """Every row of one dump (``run_id``/``attempt`` added by the caller)."""
    out = Rows()
    agent = dump_rows(dump, run_id="", attempt=0, host=host, ts_ns=ts_ns)
    for table, rows in agent.items():
        out.extend(
            table, [{k: v for k, v in r.items() if k not in ("run_id", "attempt")} for r in rows]
        )
    if dump.rank is None:
        return out
    rank = dump.rank
    world = parse_ranks(_config(dump, "0").get("ranks", ""))
    out.add("ranks", {"rank": rank, "world_size": len(world), "host": host, "backend": "",
                      "dp": -1, "tp": -1, "pp": -1, "start_ns": 0})  # fmt: skip
    p2p_pgs = {e["pg_name"] for e in dump.entries if e["is_p2p"]}
    last_op = {}
    for e in dump.entries:
        last_op[e["pg_name"]] = e["op"]
    descs = {str(e["pg_id"]): (e["pg_name"], e["pg_desc"]) for e in dump.entries}
    for pid, name in (
        pg_names(dump) or {i: descs[i][0] for i in dump.pg_status if i in descs}
    ).items():
        status, cfg = dump.pg_status.get(pid) or {}, _config(dump, name)
        members = parse_ranks(cfg.get("ranks", ""))  # [] (gloo dumps): filled in by the caller
        desc = str(cfg.get("desc") or descs.get(pid, ("", ""))[1] or name)
        p2p = name in p2p_pgs or "PIPELINE" in desc.upper()
        out.add(
            "progress",
            {"rank": rank, "ts_ns": ts_ns, "step": -1, "group_id": group_id(desc, members),
             "group_ranks": ranks_text(members), "direction": "p2p" if p2p else "", "peer": -1,
             "issued_seq": int(status.get("last_enqueued_collective", -1)),
             "completed_seq": int(status.get("last_completed_collective", -1)),
             "last_op": norm_op(last_op.get(name, "")), "last_issue_ns": 0},
        )  # fmt: skip
    for e in dump.entries:
        if e["is_p2p"] or e["collective_seq_id"] < 0:
            continue
        cfg = _config(dump, e["pg_name"])
        members = parse_ranks(cfg.get("ranks", ""))
        sizes, dtypes = json.loads(e["input_sizes"]), json.loads(e["input_dtypes"])
        out.add(
            "collectives",
            {"rank": rank, "step": -1, "group_id": group_id(str(cfg.get("desc") or e["pg_desc"]), members),
             "group_ranks": ranks_text(members), "group_seq": e["collective_seq_id"],
             "op": norm_op(e["op"]), "peer": -1, "dtype": str(dtypes[0]).lower() if dtypes else "",
             "numel_in": _numel(sizes), "numel_out": _numel(json.loads(e["output_sizes"])),
             "enqueue_ns": e["time_created_ns"], "start_ns": e["time_started_ns"] or e["time_created_ns"],
             "end_ns": e["time_completed_ns"] if e["state"] == "completed" else 0},
        )  # fmt: skip
    return out


def _config(dump: FrDump, name: str) -> dict:
    cfg = dump.pg_config.get(name)
    return cfg if isinstance(cfg, dict) else {}


def _numel(sizes: list) -> int:
    total = 0
    for shape in sizes or []:
        n = 1
        for d in shape if isinstance(shape, list) else [shape]:
            n *= int(d) if isinstance(d, (int, float)) else 1
        total += n
    return total


def dump_time(dump: FrDump, fallback_ns: int) -> int:
    """The newest time in the dump (its entries' creation/completion), else ``fallback_ns``."""
    times = [max(e["time_created_ns"], e["time_completed_ns"]) for e in dump.entries]
    return max(times) if times else fallback_ns


def fill_members(rows: Rows, ranks: list[int]) -> None:
    """Give rows with no known members (``group_ranks`` "") the members ``ranks``."""
    text = ranks_text(ranks)
    for table in ("progress", "collectives"):
        for r in rows.tables.get(table, []):
            if r.get("group_ranks") == "" and r.get("group_id", "").endswith("[]"):
                r["group_ranks"] = text
                r["group_id"] = r["group_id"][:-2] + f"[{text}]"
