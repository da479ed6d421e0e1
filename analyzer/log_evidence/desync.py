"""Desyncs in logs: ranks on different collectives at one point of one group.

- ``TORCH_NCCL_DESYNC_DEBUG``'s report names the lagging ranks itself (PyTorch's own
  analysis of every rank's state): those ranks are the culprits; the ranks it says
  "joined but didn't finish" are waiting, not at fault.
- ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` fingerprints: a rank that differs from every other
  rank it is compared with is the odd one out; two ranks that differ from each other,
  with no third to side with one, are both suspects.
- Watchdog timeouts of one ``(group, seq)`` with different ops (or sizes of an op whose
  size is the same on every rank): the minority is the odd one out.
- gloo's transport receiving more bytes than were posted for it: a desync, sides unknown.
"""

from __future__ import annotations

from collections import Counter

from .evidence import DEFAULT_PG, Evidence, finding, ranks_text

SAME_SIZE_OPS = ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter")
"""Collectives whose element count is the same on every member (torch.distributed)."""


def _same_size(e) -> bool:
    """Whether ``e``'s op has the same input size on every member: a same-size
    collective, or a coalesced op shaped as an all-gather (NumelOut a multiple of
    NumelIn, as FSDP's coalesced all-gathers of padded shards are)."""
    if e["op"] in SAME_SIZE_OPS:
        return True
    nin, nout = int(e["numel_in"]), int(e["numel_out"])
    return e["op"] == "coalesced" and 0 < nin < nout and nout % nin == 0


def _reports(ev: Evidence, coords) -> list:
    rep = ev.of("desync_report")
    lag = ev.where(rep, lambda d: d.get("verdict") != "did_not_finish")
    if lag.empty:
        return []
    ranks = sorted({int(r) for r in lag["rank"]})
    waiting = sorted({int(r) for r in rep["rank"]} - set(ranks))
    seqs = sorted({int(s) for s in lag["seq"] if int(s) >= 0})
    where = f" (it did not join collective #{seqs[0]}, counted from 1)" if seqs else ""
    out = []
    pgs = {str(p) for p in ev.of("timeout", "status")["pg"] if str(p)}
    sub = bool(pgs) and not pgs & set(DEFAULT_PG)  # the report's ranks are of that group
    of = f" of group {sorted(pgs)[0]} (a rank of that group, not a global rank)" if sub else ""
    for r in ranks:
        summary = (
            f"desync: PyTorch's desync report names rank {r}{of} as the lagging rank{where}"
            + (f"; {ranks_text(waiting)} joined and are waiting" if waiting else "")
        )
        conf = (0.8 if len(ranks) <= 2 else 0.6) if not sub else 0.45
        out.append(finding("desync", "lagging", r, conf, summary,
                           {"seq": seqs[0] if seqs else -1, "reported_by": "desync debug",
                            "lagging": ranks, "waiting": waiting, "suspects": ranks}, coords))  # fmt: skip
    return out


def _gloo_sizes(ev: Evidence, coords) -> list:
    """gloo's ``op.preamble.length <= op.nbytes. 1046204 vs 1040256`` (prime-diloco#68): a
    peer sent more bytes than this rank posted for it, so the two are in different
    collectives or the same one with other tensors: a desync, sides unknown."""
    mm = ev.where(ev.of("mismatch"), lambda d: d.get("backend") == "gloo")
    if mm.empty:
        return []
    got, want = mm.iloc[0]["detail"].get("sizes", [-1, -1])
    ranks = sorted({int(r) for r in mm["rank"] if int(r) >= 0})
    who = ranks_text(ranks) if ranks else "a rank"
    return [finding("desync", "mismatch", -1, 0.45,
                    f"desync: gloo on {who} received a message of {got} bytes for a receive of "
                    f"{want} (pair.cc, 'op.preamble.length <= op.nbytes'): its peer sent another "
                    "collective's data, or the same collective with other tensors; which side "
                    "left the common order the lines do not say",
                    {"sizes": [got, want], "reported_by": ranks, "suspects": []}, coords)]  # fmt: skip


def _fingerprints(ev: Evidence, coords) -> list:
    mm = ev.where(ev.of("mismatch"), lambda d: d.get("backend") != "gloo")
    if mm.empty:
        return []
    halves = mm[mm["peer"] < 0]
    mm = mm[mm["peer"] >= 0]
    if mm.empty:
        e = halves.iloc[0]
        r = int(e["rank"])
        return [finding("desync", "mismatch", -1, 0.4,
                        f"desync: collective fingerprints differ: rank {r} runs {e['op'] or '?'}"
                        + (f" #{int(e['seq'])}" if int(e["seq"]) >= 0 else "")
                        + "; the other rank's fingerprint is cut off, so which side is wrong "
                        "the lines do not say", {"seq": int(e["seq"]), "op": e["op"],
                                                 "suspects": [r]}, coords)]  # fmt: skip
    pairs = {tuple(sorted((int(a), int(b)))) for a, b in zip(mm["rank"], mm["peer"], strict=True)}
    seen = Counter(r for p in pairs for r in p)
    e = mm.iloc[0]
    d = e["detail"]
    what = (f"rank {int(e['rank'])} ran {e['op'] or '?'}"
            + (f" #{int(e['seq'])}" if int(e["seq"]) >= 0 else "")
            + f", rank {int(e['peer'])} ran {d.get('peer_op') or '?'}"
            + (f" #{d['peer_seq']}" if int(d.get("peer_seq", -1)) >= 0 else ""))  # fmt: skip
    if e["op"] == d.get("peer_op") and d.get("shape") != d.get("peer_shape"):
        what += (
            f" with other tensors (shapes {d.get('shape') or '?'} vs {d.get('peer_shape') or '?'})"
        )
    elif e["op"] == d.get("peer_op") and d.get("dtype") != d.get("peer_dtype"):
        what += f" with other dtypes ({d.get('dtype') or '?'} vs {d.get('peer_dtype') or '?'})"
    ev_ = {"seq": int(e["seq"]), "op": e["op"], "peer_op": d.get("peer_op", ""),
           "pairs": sorted(pairs)[:20]}  # fmt: skip
    top, n = seen.most_common(1)[0]
    if len(pairs) >= 2 and n == len(pairs) and list(seen.values()).count(n) == 1:
        return [finding("desync", "mismatch", top, 0.65,
                        f"desync: collective fingerprints differ ({what}); rank {top} differs "
                        f"from each of the {len(pairs)} ranks it was compared with",
                        {**ev_, "suspects": [top]}, coords)]  # fmt: skip
    suspects = sorted(seen)
    return [finding("desync", "mismatch", -1, 0.45,
                    f"desync: collective fingerprints differ ({what}); with no third rank to "
                    f"side with one of them, {ranks_text(suspects)} are both suspects: the "
                    "code path that issued the other collective is the cause",
                    {**ev_, "suspects": suspects}, coords)]  # fmt: skip


def _timeouts(ev: Evidence, coords) -> list:
    t = ev.of("timeout")
    t = t[(t["rank"] >= 0) & (t["seq"] >= 0) & (t["op"] != "")]  # a line cut before its op
    out = []
    named = {q: sorted({p for p in g["pg"] if p}) for q, g in t.groupby("seq")}
    t = t.assign(pg=[p or (named[q][0] if len(named[q]) == 1 else "")
                     for p, q in zip(t["pg"], t["seq"], strict=True)])  # fmt: skip
    for (pg, seq), rows in t.groupby(["pg", "seq"]):
        by_rank = rows.drop_duplicates("rank").set_index("rank")
        sig = {int(r): (e["op"], int(e["numel_in"]) if _same_size(e) else -2)
               for r, e in by_rank.iterrows()}  # fmt: skip
        kinds = Counter(sig.values())
        if len(kinds) < 2 or len(sig) < 2:
            continue
        (common, n), *_ = kinds.most_common()
        odd = sorted(r for r, s in sig.items() if s != common)
        tie = list(kinds.values()).count(n) > 1
        ops = {r: f"{s[0]}" + (f"({s[1]})" if s[1] >= 0 else "") for r, s in sig.items()}
        group = f"group {pg}" if pg else "one group"
        what = ", ".join(f"rank {r} {o}" for r, o in sorted(ops.items())[:8])
        unseen = _unseen(ev, pg, sig)
        if not tie and len(sig) >= 3 and kinds[common] <= len(odd) + len(unseen):
            out.append(_unproven(seq, group, pg, ops, odd, common, sig, unseen, coords))
            continue
        if tie or len(sig) < 3:
            out.append(finding("desync", "mismatch", -1, 0.45,
                               f"desync: at #{seq} of {group} the ranks time out in different "
                               f"collectives ({what}); which side is wrong the lines do not say",
                               {"seq": int(seq), "group": pg, "ops": ops,
                                "suspects": sorted(sig)}, coords))  # fmt: skip
            continue
        for r in odd:
            out.append(finding("desync", "mismatch", r, 0.75 if len(odd) == 1 else 0.5,
                               f"desync: rank {r} issued {ops[r]} at #{seq} of {group} while "
                               f"{ranks_text(set(sig) - set(odd))} issued {common[0]}",
                               {"seq": int(seq), "group": pg, "ops": ops, "suspects": odd},
                               coords))  # fmt: skip
    return out


def _unseen(ev: Evidence, pg: str, sig: dict) -> list[int]:
    """Members of group ``pg`` whose op at the sequence number the lines do not show:
    the world's other ranks where ``pg`` is the default group (or no group is named) and
    the world size is known (a lower bound counts as it is); none for a subgroup, whose
    members the lines do not list."""
    if pg and pg not in DEFAULT_PG or not ev.world or ev.world > 100_000:
        return []
    return sorted(set(range(ev.world)) - set(sig))


def _unproven(seq, group, pg, ops, odd, common, sig, unseen, coords):
    """A desync whose majority the unseen members could still turn (pytorch#20630: ranks
    1,2 in all_reduce and rank 3 in broadcast at #4084 of world 4, rank 0's op not in
    the lines: with rank 0 in broadcast it is two against two). The odd ranks are the
    first suspects, the unseen ones the others; no rank is proven (0.5)."""
    first = odd[0] if len(odd) == 1 else -1
    majority = ranks_text(set(sig) - set(odd))
    return finding("desync", "mismatch", first, 0.5,
                   f"desync: {ranks_text(odd)} issued {', '.join(sorted({ops[r] for r in odd}))}"
                   f" at #{seq} of {group} while {majority} issued {common[0]}; "
                   f"{ranks_text(unseen)}'s op is not in the lines, so which side left the "
                   f"common order is not proven: {ranks_text(odd)} first, then "
                   f"{ranks_text(unseen)}",
                   {"seq": int(seq), "group": pg, "ops": ops, "unseen": unseen,
                    "suspects": [*odd, *unseen]}, coords)  # fmt: skip


def detect(ev: Evidence, coords) -> tuple[list, list[str]]:
    """Desync findings from reports, fingerprints and same-sequence timeouts."""
    found = _reports(ev, coords) + _fingerprints(ev, coords) + _gloo_sizes(ev, coords)
    return found + _timeouts(ev, coords), []
