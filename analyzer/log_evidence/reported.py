"""What another analyzer already concluded: ``fr_trace``'s missing ranks and NCCL RAS's
operation counts (``importer/logs/frtrace.py``).

``fr_trace`` compares every rank's Flight Recorder ring: "missing ranks" did not join a
collective the others did. With a few of many missing, they are the culprits; with
most missing, their dumps may simply not have been collected. RAS lists the ranks at
another operation count than the rest: the odd ones out, though which side is stuck
the counts alone do not say. A process RAS cannot reach is dead or unreachable.
"""

from __future__ import annotations

from .evidence import Evidence, finding, ranks_text


def detect(ev: Evidence, coords) -> tuple[list, list[str]]:
    """Hang findings from ``fr_missing`` events."""
    fm = ev.of("fr_missing")
    out = []
    fr = ev.where(fm, lambda d: d.get("source") == "fr_trace")
    for _, e in fr.iterrows():
        missing = sorted(e["detail"].get("missing", []))
        expected = int(e["code"]) if int(e["code"]) > 0 else ev.world
        where = f"{e['op'] or 'collective'} #{int(e['seq'])}" + (
            f" of group {e['pg']}" if e["pg"] else ""
        )
        few = expected and len(missing) * 2 <= expected
        conf = (0.7 if len(missing) == 1 else 0.55) if few else 0.3
        summary = (f"hang: fr_trace finds {ranks_text(missing)} missing from {where}"
                   + (f" ({len(missing)} of {expected} ranks)" if expected else "")
                   + ("" if few else ": most ranks missing, their dumps may not have been collected"))  # fmt: skip
        rank = missing[0] if len(missing) == 1 else -1
        out.append(finding("hang", "stuck", rank, conf, summary,
                           {"seq": int(e["seq"]), "op": e["op"], "group": e["pg"],
                            "missing": missing, "suspects": missing}, coords))  # fmt: skip
    ras = ev.where(fm, lambda d: d.get("source") == "ras")
    for comm, rows in ras.groupby("pg"):
        ranks = sorted({int(r) for r in rows["rank"] if 0 <= int(r) < 1_000_000})
        if not ranks:
            continue
        counts = rows.iloc[0]["detail"].get("counts", [])
        desc = ", ".join(f"{n} ranks at operation {op}" for n, op in counts)
        summary = (f"hang: NCCL RAS on communicator {comm}: {desc}; {ranks_text(ranks)} "
                   f"{'is' if len(ranks) == 1 else 'are'} at another count than the rest: the "
                   "odd ones out (which side is stuck the counts do not say)")  # fmt: skip
        out.append(finding("hang", "stuck", ranks[0] if len(ranks) == 1 else -1, 0.4, summary,
                           {"communicator": comm, "counts": counts, "suspects": ranks,
                            "hosts": sorted({str(h) for h in rows["host"] if str(h)})},
                           coords))  # fmt: skip
    gone = ev.where(fm, lambda d: d.get("source") == "ras_unreachable")
    if not gone.empty:
        procs = [f"process {int(p)} on {h}" for p, h in zip(gone["pid"], gone["host"], strict=True)]
        hosts = sorted({str(h) for h in gone["host"]})
        out.append(finding("crash", "unreachable", -1, 0.35,
                           f"crash: NCCL RAS got no data from {', '.join(procs[:4])}: that "
                           "process is dead or unreachable (or RAS itself failed); its host's "
                           "logs say which", {"suspects": [], "hosts": hosts}, coords,
                           host=hosts[0] if len(hosts) == 1 else ""))  # fmt: skip
    return out, []
