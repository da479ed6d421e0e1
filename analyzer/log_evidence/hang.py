"""Watchdog timeouts: a hang, always. Which op of which group the ranks are blocked in,
who is not there, and who is not where the others are.

Read the way an expert reads a console of timeouts:

1. A sequence number counts inside one process group: timeouts and status lines are
   compared only within ``(group, seq)``. Which group a line is in, and which global rank
   it is, ``evidence.py`` decides once for every detector (a timeout takes its status
   line's group; lines that name no group are one "unnamed" group only at one sequence
   number, or one op a few apart).
2. In one group, the op most blocked ranks timed out in is where the job stands. A rank
   at another sequence number, or whose status says it never enqueued that op, is the
   odd one out; a rank ahead of the others is a desync (:func:`_ahead`), a different op
   at the same sequence number too (``desync.py``).
3. Ranks of the world that left no line are the first suspects; a rank that printed but
   never timed out, while the others did, is the next. Neither is certain: a posted log
   is an excerpt.
4. With everyone present and blocked in the same op, no rank is behind: the communicator
   or the transport is (at op #1: it never worked).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ranksight.ground.words import counted, span

from .evidence import Evidence, finding, ranks_text

CONFIDENCE = {
    "never_entered": 0.8,  # a status line says the rank never enqueued the blocked op
    "odd_seq": 0.6,  # the rank timed out at another sequence number of the same group
    "only_silent": 0.55,  # the one rank of a known world that left no line or no timeout
    "silent": 0.3,  # one of several ranks that left no line
    "nobody_behind": 0.5,  # every rank present and blocked in one op: communicator/transport
}
"""How sure each kind of evidence makes the hang finding (0..1)."""


def _key(e: pd.Series) -> str:
    return str(e["pg"]) or "?"


def _groups(ev: Evidence) -> dict[str, pd.DataFrame]:
    """Timeouts and status lines per group key ("?": lines that name no group)."""
    t = ev.of("timeout", "status")
    if t.empty:
        return {}
    return {k: g for k, g in t.groupby(t.apply(_key, axis=1))}


def _position(rows: pd.DataFrame) -> dict[int, dict]:
    """global rank -> {seq it is blocked at, op, numel, enqueued, completed}."""
    out: dict[int, dict] = {}
    for _, e in rows[rows["rank"] >= 0].sort_values("seq").iterrows():
        r = int(e["rank"])
        p = out.setdefault(r, {"seq": -1, "op": "", "numel": -1, "enq": -1, "done": -1})
        if e["kind"] == "timeout" and (p["seq"] < 0 or 0 <= int(e["seq"]) < p["seq"]):
            p.update(seq=int(e["seq"]), op=str(e["op"]), numel=int(e["numel_in"]))
        if e["kind"] == "status":
            p["enq"], p["done"] = int(e["enqueued"]), int(e["completed"])
            if p["seq"] < 0:
                p["seq"] = int(e["seq"])
    return out


def _stuck_at(pos: dict[int, dict]) -> tuple[int, str, list[int]]:
    """(seq most ranks are blocked at, its op, those ranks)."""
    by_seq: dict[int, list[int]] = {}
    for r, p in pos.items():
        if p["seq"] >= 0:
            by_seq.setdefault(p["seq"], []).append(r)
    if not by_seq:
        return -1, "", sorted(pos)
    seq, ranks = max(by_seq.items(), key=lambda kv: (len(kv[1]), -kv[0]))
    ops = {pos[r]["op"] for r in ranks if pos[r]["op"]}
    return seq, (ops.pop() if len(ops) == 1 else ""), sorted(ranks)


def _group_name(key: str, rows: pd.DataFrame) -> str:
    names = {str(n) for n in rows["pg_name"] if str(n)}
    if key == "?":
        return "an unnamed group"
    return f"group {key}" + (f" ({names.pop()})" if len(names) == 1 else "")


AFTER_TIMEOUTS = 0.25
"""Confidence of a stuck watchdog beside collective timeouts that locate the hang: the
watchdog most often sticks in the abort that follows a timeout (verl#1158: ranks 2,4's
watchdog stuck 480 s, reported 11 min after the all_to_all they waited in timed out), so
it ranks after the timeouts' finding, a consequence more than a cause."""


def _stuck_watchdog(ev: Evidence, coords, beside_timeouts: bool = False) -> list:
    """Ranks whose NCCL watchdog thread itself got stuck (the heartbeat monitor's word).
    One rank: that rank (0.45). Several: no single rank; where they are every rank that
    left a line, the whole group is blocked and no rank stands out (sglang#1691: ranks
    0-2,6,7 of 8, each with 121 works queued). ``beside_timeouts``: collective timeouts
    place the hang, and this finding follows theirs (:data:`AFTER_TIMEOUTS`)."""
    st = ev.of("watchdog_stuck")
    if st.empty:
        return []
    ranks = sorted({int(r) for r in st["rank"] if int(r) >= 0})
    secs = max(int(c) for c in st["code"])
    held = (
        f" (up to {secs} s)"
        if secs > 0 and len(ranks) > 1
        else f" for {secs} s"
        if secs > 0
        else ""
    )
    everyone = len(ranks) > 1 and set(ranks) >= ev.present
    if everyone:
        summary = (
            f"hang: every rank that left a line ({ranks_text(ranks)}) reports its NCCL "
            f"watchdog thread stuck{held}: the whole group is blocked, as when its "
            "collectives never complete on the devices; no rank stands out"
        )
    else:
        who = ranks_text(ranks) if ranks else "a rank"
        summary = (
            f"hang: {who}'s NCCL watchdog thread got stuck{held}: a CUDA or NCCL call "
            "on that rank does not return (the GPU or its driver, or another thread "
            "holding the GIL inside a CUDA call)"
        )
    conf = 0.45 if len(ranks) == 1 else 0.3
    fewer, queued = _fewer_queued(st)
    if everyone and fewer:
        summary = summary.replace("; no rank stands out", "")
        summary += (f"; but {ranks_text(fewer)} tracked fewer works than the others "
                    f"({_queued_text(queued)}): it enqueued fewer collectives, so it is behind, "
                    "the first place to look")  # fmt: skip
    evidence = {
        "suspects": fewer if everyone else ranks,
        "stuck_ranks": ranks,
        "alternatives": ["a hang elsewhere can block CUDA event queries too"],
    }
    if secs > 0:
        evidence["stuck_s"] = secs
    if beside_timeouts:
        conf = min(conf, AFTER_TIMEOUTS)
        summary += "; collective timeouts came first, and a watchdog often sticks in the abort that follows them"
    return [finding("hang", "watchdog_stuck", ranks[0] if len(ranks) == 1 else -1, conf,
                    summary, evidence, coords)]  # fmt: skip


def _fewer_queued(st: pd.DataFrame) -> tuple[list[int], dict[int, int]]:
    """(ranks whose heartbeat monitor counted fewer works in flight than most ranks did,
    rank -> that count). Works are enqueued in one order on every rank, so a rank with
    fewer has not reached the collectives the others wait in (DEIM#105: rank 0 at 84,
    ranks 1,2 at 103); none where the counts agree (sglang#1691: 121 on every rank) or
    no majority holds one count, or the lines are of more than one group."""
    queued: dict[int, int] = {}
    if st["pg"].astype(str).nunique() > 1:  # each group has its own works in flight
        return [], queued
    for r, d in zip(st["rank"], st["detail"], strict=True):
        if int(r) >= 0 and isinstance(d.get("queued"), int):
            queued.setdefault(int(r), d["queued"])
    counts = pd.Series(queued, dtype=int)
    if len(counts) < 3 or counts.nunique() < 2:
        return [], queued
    common = counts.mode()
    if len(common) > 1 or (counts == common[0]).sum() * 2 <= len(counts):
        return [], queued
    return sorted(int(r) for r in counts.index[counts < common[0]]), queued


def _queued_text(queued: dict[int, int]) -> str:
    """``rank 0: 84; ranks 1,2: 103`` (works in flight per rank)."""
    by: dict[int, list[int]] = {}
    for r, n in queued.items():
        by.setdefault(n, []).append(r)
    return "; ".join(f"{ranks_text(sorted(rs))}: {n}" for n, rs in sorted(by.items()))


def detect(ev: Evidence, coords: pd.DataFrame) -> tuple[list, list[str]]:
    """The hang finding(s) of the watchdog lines, and notes: the timeouts' first, a stuck
    watchdog beside them after."""
    found, notes = _timeouts(ev, coords)
    located = any(f.evidence.get("seq", -1) >= 0 for f in found)
    stuck = _stuck_watchdog(ev, coords, beside_timeouts=located)
    return (found + stuck if located else stuck + found), notes


def _timeouts(ev: Evidence, coords: pd.DataFrame) -> tuple[list, list[str]]:
    """The hang finding of the timeout and status lines."""
    groups = _groups(ev)
    if not groups:
        return [], []
    notes: list[str] = []
    summaries, blocked, odd, behind, evidence = [], set(), {}, {}, {}
    for key, rows in sorted(groups.items(), key=lambda kv: -kv[1]["rank"].nunique()):
        pos = _position(rows)
        if not pos:  # ranks of this group only: [PG 1 Rank 3] and no launcher prefix
            inner = _position(rows.assign(rank=rows["group_rank"]))
            if inner:
                seq, op, at = _stuck_at(inner)
                where = f"{op or 'op'} #{seq}" if seq >= 0 else "an op"
                name = _group_name(key, rows)
                summaries.append(f"{ranks_text(at)} of {name} (their global ranks are not in "
                                 f"the lines) blocked in {where}")  # fmt: skip
                evidence[name] = {"seq": seq, "op": op, "group_ranks": at}
            continue
        seq, op, at = _stuck_at(pos)
        name = _group_name(key, rows)
        blocked |= set(at)
        for r, p in pos.items():
            if 0 <= p["seq"] != seq:
                odd[r] = (name, p["seq"], p["op"], seq)
            elif 0 <= p["enq"] < seq:
                behind[r] = (name, p["enq"], seq)
        where = f"{op or 'op'} #{seq}" if seq >= 0 else "an op"
        summaries.append(f"{ranks_text(at)} blocked in {where} of {name}")
        evidence[name] = {"seq": seq, "op": op, "blocked": at,
                          "positions": {str(r): p for r, p in sorted(pos.items())[:64]}}  # fmt: skip
    if ev.assumed:
        notes.append(ev.assumed)
    if not summaries or not blocked:
        return [_unmapped(ev, coords, summaries)], notes
    return [_finding(ev, coords, summaries, blocked, odd, behind, evidence)], notes


SETUP = ("nccl_info", "world", "nodes")
"""Event kinds that say nothing of a rank's progress (with the ``present`` event of a
process whose NCCL lines are all set-up lines: ``detail.setup_only``)."""


def _setup_only(ev: Evidence) -> set[int]:
    """Ranks whose only lines are NCCL's set-up (``cudaDriverVersion``, ``Bootstrap :
    Using ...``, plugin and topology lines): they say nothing of whether the rank reached
    the op the others are blocked in, so it is no rank that "printed no timeout"
    (lightning#20434: rank 2's set-up lines, out of order beside rank 3's timeout)."""
    f = ev.frame[ev.frame["rank"] >= 0]
    nccl = [k == "present" and bool(d.get("setup_only"))
            for k, d in zip(f["kind"], f["detail"], strict=True)]  # fmt: skip
    setup = f["kind"].isin(SETUP).to_numpy(dtype=bool) | np.asarray(nccl, dtype=bool)
    other = {int(r) for r in f.loc[~setup, "rank"]}
    return {int(r) for r in f.loc[setup, "rank"]} - other


def _finding(ev, coords, summaries, blocked, odd, behind, evidence):
    one = len(ev.present) <= 1  # one rank's log: the others' silence says little
    aborted = _aborted(ev)
    cut = {int(r) for r in ev.of("timeout")["rank"] if int(r) >= 0} - blocked
    setup = _setup_only(ev) - blocked - set(odd) - set(behind) - aborted - cut
    silent = sorted(set(ev.missing()) | setup)
    quiet = sorted(ev.present - blocked - set(odd) - set(behind) - aborted - cut - setup)
    main = next(iter(evidence.values()))
    base = {"seq": main["seq"], "op": main["op"], "groups": evidence, "silent": silent,
            "no_timeout": quiet, "world_size": ev.world, "world_exact": ev.world_exact}  # fmt: skip
    if aborted:
        base["comm_aborted"] = sorted(aborted)
    if cut:  # a timeout line cut before its op (FunASR#2006: rank 3's SeqNum=1573 cut)
        base["timeout_cut"] = sorted(cut)
    if setup:
        base["setup_only"] = sorted(setup)
    if ev.assumed:
        base["ranks_assumed"] = ev.assumed
    head = "; ".join(summaries[:4]) + (
        f"; and {len(summaries) - 4} more groups" if len(summaries) > 4 else ""
    )
    ahead = {r: v for r, v in odd.items() if v[1] > v[3]}
    if ahead and len(ahead) <= len(blocked):
        return _ahead(ahead, blocked, base, coords)
    if behind or odd:
        culprits = sorted(set(behind) | set(odd))
        why = [f"rank {r} never enqueued #{s} of {g} (its last enqueued is #{e})"
               for r, (g, e, s) in sorted(behind.items())]  # fmt: skip
        why += [f"rank {r} is at #{s} ({o or 'op'}) of {g}, the others at #{at}"
                for r, (g, s, o, at) in sorted(odd.items())]  # fmt: skip
        conf = CONFIDENCE["never_entered"] if behind else CONFIDENCE["odd_seq"]
        if len(culprits) > 2 or len(blocked) < 2:
            conf = min(conf, 0.45)
        summary = f"hang: {head}. " + "; ".join(why[:6])
        rank = culprits[0] if len(culprits) == 1 else -1
        return finding("hang", "stuck", rank, conf, summary,
                       {**base, "suspects": culprits, "alternatives": _alts(silent, quiet)},
                       coords)  # fmt: skip
    suspects = silent or quiet
    if suspects:
        who = ranks_text(suspects).capitalize()
        said = "left no line" if silent else "printed no timeout while the others did"
        if setup & set(suspects):
            said = (f"left no line past NCCL's set-up ({ranks_text(setup)} only those, printed "
                    "before the hang)")  # fmt: skip
        exact = ev.world_exact or bool(silent)
        conf = CONFIDENCE["only_silent"] if len(suspects) == 1 and exact and len(blocked) >= 2 \
            else CONFIDENCE["silent"]  # fmt: skip
        nobody = "none of them is behind" if len(blocked) > 1 else "it waits for the others"
        own = (
            "its own log, its host, its GPU"
            if len(suspects) == 1
            else "their own logs, hosts, GPUs"
        )
        summary = (
            f"hang: {head}; {nobody}. {who} {said}: the first place to look ({own}). "
            f"{ev.world_note()}"
        )
        if silent and len(silent) > max(8, 2 * len(ev.present)):  # a few ranks' excerpt
            conf = min(conf, 0.2)
            summary = (
                f"hang: {head}; {nobody}. Only {ranks_text(ev.present)} logged here: the other "
                f"{len(silent)} ranks left no line in these lines, so which one holds the others "
                f"cannot be told from them. {ev.world_note()}"
            )
        rank = suspects[0] if len(suspects) == 1 else -1
        alts = ["the log is an excerpt: a rank may have printed its timeout outside it"]
        if main["op"] in ("broadcast", "scatter", "reduce", "gather"):
            alts.append(f"in a {main['op']} the root may finish its part and move on: a silent "
                        "root is not proof that it never entered")  # fmt: skip
        return finding("hang", "stuck", rank, conf, summary,
                       {**base, "suspects": suspects, "alternatives": alts}, coords)  # fmt: skip
    if one:
        who = f"; {ranks_text(silent)} left no line here" if silent else ""
        summary = (f"hang: {head}. One rank's view{who}: which rank or link it waits for, "
                   "the other ranks' logs (or their Flight Recorder dumps) would say")  # fmt: skip
        alts = ["the others may have logged elsewhere: only one rank's lines are here"]
        if main["op"] in ("broadcast", "scatter", "reduce", "gather"):
            alts.append(f"a {main['op']} waits on its root (rank 0 of the group unless the "
                        "job chose another)")  # fmt: skip
        return finding("hang", "stuck", -1, 0.2, summary,
                       {**base, "suspects": silent, "alternatives": alts}, coords)  # fmt: skip
    first = main["seq"] in (0, 1)
    cause = "communication"
    tail = (
        "the communicator never completed an op: NCCL set-up or the transport (IB, sockets, "
        "P2P, a firewall)" if first else
        "every rank is waiting, so look at the communicator or the transport (a link, a NIC, "
        "a GPU that stopped completing work), or at ranks outside this log"
    )  # fmt: skip
    nobody = "none of them is behind" if len(blocked) > 1 else "it waits for the others"
    summary = f"hang: {head}; {nobody}: {tail}. {ev.world_note()}"
    return finding("hang", cause, -1, CONFIDENCE["nobody_behind"], summary,
                   {**base, "suspects": [], "alternatives": [tail]}, coords)  # fmt: skip


def _aborted(ev: Evidence) -> set[int]:
    """Ranks that aborted an NCCL communicator (``comm_abort``: ``... - Abort COMPLETE``):
    torn down by their own watchdog like the ranks that timed out, not ranks that printed
    nothing of the hang."""
    return {int(r) for r in ev.of("comm_abort")["rank"] if int(r) >= 0}


def _alts(silent: list[int], quiet: list[int]) -> list[str]:
    out = []
    if silent:
        out.append(f"ranks {span(silent)} left no line: they may be the ones holding the others")
    if quiet:
        out.append(f"{counted(len(quiet), 'rank')} ({span(quiet)}) printed no timeout")
    return out


def _unmapped(ev: Evidence, coords, summaries: list[str]) -> object:
    """Timeouts whose ranks cannot be mapped to global ranks: still a hang, no rank named."""
    t = ev.of("timeout")
    seqs = sorted({int(q) for q in t["seq"] if int(q) >= 0})
    ops = sorted({str(o) for o in t["op"] if str(o)})
    said = "; ".join(summaries[:4]) or (
        f"{counted(int(t['count'].sum()), 'watchdog timeout')} ({', '.join(ops) or 'ops'}"
        + (f" at sequence numbers {', '.join(map(str, seqs[:6]))}" if seqs else "")
        + ") in process groups the lines do not name"
    )
    summary = (
        f"hang: {said}: which rank holds the others cannot be told from these lines, whose "
        "ranks do not map to global ranks (each rank's full log, with its [rankN]: prefix, "
        "or Flight Recorder dumps can)"
    )
    return finding("hang", "stuck", -1, 0.3, summary,
                   {"seqs": seqs[:20], "ops": ops, "suspects": []}, coords)  # fmt: skip


def _ahead(ahead: dict, blocked: set, base: dict, coords) -> object:
    """Ranks at a later sequence number of a group than the others: a desync, the odd
    ones out (the ranks behind them are waiting in the op the odd ones skipped)."""
    ranks = sorted(ahead)
    tie = len(ranks) >= len(blocked)  # two ranks, one ahead: which is wrong is not said
    conf = 0.6 if len(ranks) == 1 and len(blocked) >= 3 else 0.4
    if tie:  # accelerate#3250: rank 1 at #126, rank 0 at #122, no majority
        why = [f"rank {r} is at #{s} ({o or 'op'}) of {g} while {ranks_text(blocked)} "
               f"{'is' if len(blocked) == 1 else 'are'} at #{at}"
               for r, (g, s, o, at) in sorted(ahead.items())]  # fmt: skip
        return finding("desync", "ahead", -1, conf,
                       "desync: " + "; ".join(why[:6]) + ": one side skipped or issued an "
                       "extra collective, and with no majority the lines do not say which",
                       {**base, "suspects": sorted(set(ranks) | set(blocked))}, coords)  # fmt: skip
    why = [f"rank {r} is at #{s} ({o or 'op'}) of {g} while the others are at #{at}"
           for r, (g, s, o, at) in sorted(ahead.items())]  # fmt: skip
    return finding("desync", "ahead", ranks[0] if len(ranks) == 1 else -1, conf,
                   "desync: " + "; ".join(why[:6]) + ": it skipped or issued an extra "
                   "collective, the odd one out (the others wait for it in the op it passed)",
                   {**base, "suspects": ranks}, coords)  # fmt: skip
