"""Flight Recorder dumps into a run: the dump rows the node agent writes (``fr_dumps``,
``fr_entries``, :mod:`ranksight.collectors.fr_ingest`), plus what the analyzer reads:

- ``progress``: per rank and process group, the last enqueued and completed sequence
  number (from the group's entries, else the dump's ``pg_status``:
  :func:`group_progress`), group members from ``pg_config``. ``pg_status`` is
  keyed by pg id and ``pg_config`` by pg name; the entries pair the two where present,
  and the creation order pairs the rest (both count up as groups are created).
- ``collectives``: one row per non-P2P entry at its (group, sequence), with op, dtype and
  element count, so the desync check compares members at each sequence; ``end_ns`` is the
  completion time where the entry completed, else 0.

Dumps whose ``pg_config`` lists no members (gloo) leave ``group_ranks`` empty;
:func:`fill_members` then takes every imported rank as a member.

A group's send/recv ops get a progress row of their own (``direction = "p2p"``, in P2P
sequence numbers): members do not issue them in lockstep. Its collectives keep the
collective row (direction ""), also in a group that mixes both (DDP's default group with
a send), so a hang there is still found.
"""

from __future__ import annotations

import json
import math

from ranksight.collectors.flight_recorder import DUMP_BYTES, FrDump, read_dump
from ranksight.collectors.fr_ingest import dump_rows
from ranksight.store.fit import fit_int

from .rows import Rows, group_id, norm_op, parse_ranks, rank_from_path, ranks_text


def read(path: str, rank: int | None = None, limit: int = DUMP_BYTES, why: str = "") -> FrDump:
    """The dump at ``path`` (rank from the name: ``nccl_trace_rank_3``, ``_dump_12``), at
    most ``limit`` bytes of it decompressed (``why``: the limit's source, for messages)."""
    return read_dump(path, rank if rank is not None else rank_from_path(path), limit, why)


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
    by_pg: dict[str, list[dict]] = {}
    for e in dump.entries:
        by_pg.setdefault(e["pg_name"], []).append(e)
    descs = {str(e["pg_id"]): (e["pg_name"], e["pg_desc"]) for e in dump.entries}
    for pid, name in (
        pg_names(dump) or {i: descs[i][0] for i in dump.pg_status if i in descs}
    ).items():
        status, cfg = dump.pg_status.get(pid) or {}, _config(dump, name)
        members = parse_ranks(cfg.get("ranks", ""))  # [] (gloo dumps): filled in by the caller
        desc = str(cfg.get("desc") or descs.get(pid, ("", ""))[1] or name)
        base = {"rank": rank, "ts_ns": ts_ns, "step": -1, "group_id": group_id(desc, members),
                "group_ranks": ranks_text(members), "peer": -1, "last_issue_ns": 0}  # fmt: skip
        for direction, issued, completed, op in group_progress(
            by_pg.get(name, []), status, "PIPELINE" in desc.upper()
        ):
            out.add(
                "progress",
                {**base, "direction": direction, "issued_seq": issued, "completed_seq": completed,
                 "last_op": norm_op(op)},
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


def _done(e: dict) -> bool:
    """The entry's work completed: its state says so (NCCL, the watchdog saw it end), or it
    was retired (gloo, where the state stays ``scheduled``)."""
    return e["state"] == "completed" or bool(e["retired"])


def group_progress(
    entries: list[dict], status: dict, pipeline: bool
) -> list[tuple[str, int, int, str]]:
    """``[(direction, issued, completed, last op)]`` of one process group on one rank:
    a collective track (direction "") and, where the group carries send/recv, a P2P track
    (direction "p2p"), each in its own sequence numbers.

    ``pg_status``'s ``last_enqueued/completed_collective`` hold the sequence number of the
    group's last work, which for a send/recv is its P2P sequence (``WorkNCCL::seq_``:
    ``seqP2P_`` for P2P work, ``seqCollective_`` otherwise, torch >= 2.5): in a group that
    mixes the two (DDP's default group with a send) they are not a collective count. So
    where the group's entries are in the dump (the ring buffer holds its newest), they
    decide: issued is the highest ``collective_seq_id`` (a send/recv entry carries the
    collective count reached when it was issued), completed is one before the oldest
    collective entry not completed (:func:`_done`), else all issued. ``pg_status`` is
    also taken (the higher of the two) when the group never did P2P, and alone when the
    dump holds none of the group's entries (``direction`` "p2p" for a group described as
    a pipeline group)."""
    enq = _int(status.get("last_enqueued_collective"))
    done = _int(status.get("last_completed_collective"))
    if not entries:
        if enq < 0 and done < 0 and not status:
            return []
        return [("p2p" if pipeline else "", enq, done, "")]
    p2p = [e for e in entries if e["is_p2p"]]
    coll = [e for e in entries if not e["is_p2p"]]
    mixed = bool(p2p) or any(e["p2p_seq_id"] > 0 for e in entries)
    out = []
    issued = max(e["collective_seq_id"] for e in entries)
    if coll or not mixed or (issued > 0 and not pipeline):
        pending = [e["collective_seq_id"] for e in coll if not _done(e)]
        completed = min(pending) - 1 if pending else issued
        if not mixed:
            issued, completed = max(issued, enq), max(completed, done)
        last = coll[-1]["op"] if coll else ""
        out.append(("", issued, completed, last))
    if p2p:
        issued = max(e["p2p_seq_id"] for e in p2p)
        pending = [e["p2p_seq_id"] for e in p2p if not _done(e)]
        out.append(("p2p", issued, min(pending) - 1 if pending else issued, p2p[-1]["op"]))
    return out


def _int(value, default: int = -1) -> int:
    got = fit_int(value, "Int64")
    return default if got is None else got


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


def damaged(dump: FrDump) -> str:
    """What cut the dump short (a truncated pickle, JSON or gzip stream), or "". Such a
    dump lost its newest entries, so how far its rank got cannot be told from it."""
    return "; ".join(p for p in dump.problems if " is damaged" in p)


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
