"""Hardware and transport errors: what the GPU, the kernel and NCCL's network code said.

A GPU error names its host and PCI bus id where the line gives them; a rank only where
the line is a rank's own (a ``[rankN]:`` prefix, an NCCL process with its init line).
NCCL's IB warnings name the host that saw them; "connection closed / reset / broken
pipe" names the *other* end, which most often went away first (a crash on that host).
"""

from __future__ import annotations

from .evidence import Evidence, finding

GPU_CONFIDENCE = {"xid": 0.8, "ecc": 0.8, "nvml": 0.8, "aer": 0.7, "cuda": 0.4}
"""How sure a GPU error makes the hardware finding (hardware XIDs; an application XID,
a corrected AER error or a CUDA error an application can cause count lower)."""
NET_CONFIDENCE = {"ib_async": 0.6, "ib_completion": 0.5, "ib_verbs": 0.45, "net_mismatch": 0.4,
                  "remote_closed": 0.35, "cuda": 0.4, "other": 0.3}  # fmt: skip


def _gpu(ev: Evidence, coords) -> list:
    g = ev.of("gpu_error")
    out = []
    if g.empty:
        return out
    keys = g.assign(cat=g["detail"].map(lambda d: d.get("category", "")),
                    dev=g["detail"].map(lambda d: d.get("device", "")))  # fmt: skip
    for (host, dev, cat), rows in keys.groupby(["host", "dev", "cat"], sort=False):
        e = rows.iloc[0]
        d = e["detail"]
        hard = bool(d.get("hardware"))
        conf = GPU_CONFIDENCE.get(cat, 0.4) if hard else 0.3
        ranks = sorted({int(r) for r in rows["rank"] if int(r) >= 0})
        rank = ranks[0] if len(ranks) == 1 else -1
        what = f"XID {int(e['code'])}" if cat == "xid" and int(e["code"]) >= 0 else cat.upper()
        where = " ".join(
            x for x in (f"on {host}" if host else "", f"GPU {dev}" if dev else "") if x
        )
        who = f"rank {rank}'s GPU" if rank >= 0 else "a GPU"
        kind = "hardware" if hard else "crash"
        summary = (f"{'hardware' if hard else 'GPU error'}: {who} {where} reported {what}: "
                   f"{d.get('message', '')}".rstrip(": ")
                   + ("" if hard else " (an application can cause this error too)"))  # fmt: skip
        out.append(finding(kind, "gpu_error" if hard else "cuda_error", rank, conf, summary,
                           {"device": dev, "category": cat, "xid": int(e["code"]),
                            "lines": int(rows["count"].sum()), "suspects": ranks},
                           coords, host=str(host)))  # fmt: skip
    return out


def _network(ev: Evidence, coords) -> list:
    w = ev.of("nccl_warn", "peer_gone")
    out = []
    if w.empty:
        return out
    cats = w.assign(cat=[d.get("category", "other") if k == "nccl_warn" else "remote_closed"
                         for k, d in zip(w["kind"], w["detail"], strict=True)])  # fmt: skip
    for cat in ("ib_async", "ib_completion", "ib_verbs", "net_mismatch", "remote_closed", "cuda"):
        rows = cats[cats["cat"] == cat]
        if rows.empty:
            continue
        hosts = sorted({str(h) for h in rows["host"] if str(h)})
        remote = sorted({str(d.get("remote")) for d in rows["detail"] if d.get("remote")})
        e = rows.iloc[0]
        ranks = sorted({int(r) for r in rows["rank"] if int(r) >= 0})
        if cat == "remote_closed":
            seen = ", ".join(hosts[:4]) or (
                f"ranks {','.join(map(str, ranks[:8]))}" if ranks else ""
            )
            summary = (f"crash: the connection to {', '.join(remote[:4]) or 'a peer'} was "
                       f"closed (seen {'on ' + seen if seen else 'here'}): the other end "
                       "most likely went away first; its own log says why")  # fmt: skip
            host = remote[0] if len(remote) == 1 else ""
            rank = -1
        else:
            summary = (f"{'network' if cat != 'cuda' else 'GPU error'}: NCCL on "
                       f"{', '.join(hosts[:4]) or 'a host'} warns: {str(e['text'])[:160]}")  # fmt: skip
            host = hosts[0] if len(hosts) == 1 else ""
            rank = ranks[0] if len(ranks) == 1 else -1
        kind = "crash" if cat in ("cuda", "remote_closed") else "hardware"
        cause = {"cuda": "cuda_error", "remote_closed": "peer_gone"}.get(cat, "network")
        out.append(finding(kind, cause, rank,
                           NET_CONFIDENCE[cat], summary,
                           {"category": cat, "hosts": hosts, "remote": remote,
                            "lines": int(rows["count"].sum()), "suspects": ranks},
                           coords, host=host))  # fmt: skip
    mm = cats[cats["cat"] == "mismatch"]
    around = sorted({int(p) for p in mm["peer"] if int(p) >= 0})
    if len(around) == 1:
        out.append(finding("desync", "mismatch", around[0], 0.45,
                           f"desync: NCCL detected mismatched collectives at and around rank "
                           f"{around[0]}", {"suspects": around}, coords))  # fmt: skip
    elif around:
        hosts = sorted({str(h) for h in mm["host"] if str(h)})
        out.append(finding("hardware", "network", -1, 0.35,
                           f"network: NCCL on {', '.join(hosts[:4]) or 'several processes'} saw "
                           f"mismatched collectives around {len(around)} ranks at once "
                           f"({','.join(map(str, around[:8]))}): data corrupted on the way "
                           "(the transport: GPUDirect RDMA, IB) rather than one rank's calls",
                           {"suspects": [], "around": around, "hosts": hosts}, coords,
                           host=hosts[0] if len(hosts) == 1 else ""))  # fmt: skip
    return out


def detect(ev: Evidence, coords) -> tuple[list, list[str]]:
    """Hardware findings of GPU errors and NCCL's network warnings."""
    return _gpu(ev, coords) + _network(ev, coords), []
