"""Hardware and transport errors: what the GPU, the kernel and NCCL's network code said.

A GPU error names its host and PCI bus id where the line gives them; a rank only where
the line is a rank's own (a ``[rankN]:`` prefix, an NCCL process with its init line).
NCCL's IB warnings name the host that saw them; "connection closed / reset / broken
pipe" names the *other* end, which most often went away first (a crash on that host).
"""

from __future__ import annotations

import re

from ..findings import Finding
from .evidence import Evidence, finding, ranks_text

GPU_CONFIDENCE = {"xid": 0.8, "ecc": 0.8, "nvml": 0.8, "aer": 0.7, "cuda": 0.4, "hsa": 0.7}
"""How sure a GPU error makes the hardware finding (hardware XIDs; an application XID,
a corrected AER error or a CUDA error an application can cause count lower)."""
NET_CONFIDENCE = {"ib_async": 0.6, "ib_completion": 0.5, "ib_verbs": 0.45, "net": 0.45,
                  "net_mismatch": 0.4, "remote_closed": 0.35, "connect_failed": 0.35, "proxy_call": 0.35, "cuda_oom": 0.45, "cuda": 0.4,
                  "launch": 0.45, "no_interface": 0.45, "other": 0.3}  # fmt: skip
NCCL_ERRORS = {
    "remote": (
        "network",
        "network",
        "a remote process exited or the network failed (NCCL's "
        "ncclRemoteError): the peer's own log, or the fabric, says which",
    ),
    "system": (
        "crash",
        "nccl_error",
        "a system call failed inside NCCL (ncclSystemError): "
        "often /dev/shm too small in a container, sockets or file limits",
    ),
    "cuda": ("crash", "cuda_error", "a CUDA call failed inside NCCL"),
    "usage": (
        "crash",
        "nccl_error",
        "NCCL was called wrongly (invalid usage or argument): the "
        "job's configuration or code, not one rank's hardware",
    ),
    "internal": ("crash", "nccl_error", "an internal NCCL error"),
    "other": ("crash", "nccl_error", "an NCCL error"),
}
"""An NCCL error class -> (finding kind, cause, what it means)."""


def _gpu(ev: Evidence, coords) -> list:
    g = ev.of("gpu_error")
    out: list[Finding] = []
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
        what = {"xid": f"XID {int(e['code'])}" if int(e["code"]) >= 0 else "an XID error",
                "ecc": "an uncorrectable ECC error", "nvml": "an NVML error",
                "aer": "a PCIe AER error", "cuda": "a CUDA error",
                "hsa": "an HSA hardware exception (ROCm)"}.get(cat, cat)  # fmt: skip
        gpu = f"GPU {dev}" if dev else "GPU"
        who = f"rank {rank}'s {gpu}" if rank >= 0 else f"the {gpu}" if dev else "a GPU"
        where = f" on {host}" if host else ""
        kind = "hardware" if hard or cat == "aer" else "crash"
        if cat == "aer":
            who = f"the PCIe device {dev}" if dev else "a PCIe device"
        message = str(d.get("message", "")).strip().rstrip(".")
        summary = (f"{'hardware' if hard else 'GPU error'}: {who}{where} reported {what}"
                   + (f" ({message})" if message else "")
                   + ("" if hard else ": the link recovered by itself; a marginal link if it "
                      "repeats" if cat == "aer" else ": an application can cause this error too"))  # fmt: skip
        cause = "gpu_error" if hard else "pcie" if cat == "aer" else "cuda_error"
        out.append(finding(kind, cause, rank, conf, summary,
                           {"device": dev, "category": cat,
                            **({"xid": int(e["code"])} if cat == "xid" and int(e["code"]) >= 0 else {}),
                            "lines": int(rows["count"].sum()), "suspects": ranks},
                           coords, host=str(host)))  # fmt: skip
    return out


def local_gpus(rows) -> list[str]:
    """``host H, GPU N (global rank not said)`` of each line whose process the lines tie to
    no global rank: NCCL's ``host:pid:tid [N]`` is the CUDA device on that host, not a
    rank (nccl#1405: ``kp-ddp-worker-0:3468:3905 [4] ... NET/IB : Got completion from
    peer``), unless a ``rank R nranks M cudaDev N`` line or a ``[rankR]:`` label of the same
    process says which (``evidence.py`` maps them)."""
    out = []
    for h, d, r in zip(rows["host"], rows["local_rank"], rows["rank"], strict=True):
        where = f"host {h}, GPU {int(d)} (global rank not said)" if str(h) else ""
        if int(r) < 0 and int(d) >= 0 and where and where not in out:
            out.append(where)
    return out


def _proxy(rows, peers: list[int]) -> str:
    """A network finding's text for NCCL's ``Proxy Call to rank 7 failed (Connect)``
    (vllm#798): the caller could not reach that rank's proxy thread (node-local: a socket
    or IPC on its host), so that rank, its host or the link to it is the suspect; the
    caller, whose rank the line does not say, only reports it."""
    who = ranks_text(peers) if peers else "a rank"
    return (f"network: NCCL's call to {who}'s proxy failed ({str(rows.iloc[0]['text'])[:80]}): "
            f"{who}, its host or the link to it is the suspect, not proven; the rank that "
            "reports it is not said")  # fmt: skip


def _unreachable(rows, hosts: list[str], remote: list[str]) -> str:
    """A network finding's text for NCCL's failed connects (``socketStartConnect: Connect
    to 10.0.0.82<38455> failed``, sglang#5594): the process that says so could not reach
    the peer, so the peer or the link to it (or the interface NCCL chose,
    ``NCCL_SOCKET_IFNAME``) is the suspect, not the process that reports it."""
    seen = ", ".join(local_gpus(rows)[:4]) or ", ".join(hosts[:4]) or "a process"
    return (f"network: NCCL on {seen} could not connect to {', '.join(remote[:4]) or 'a peer'}"
            f" ({str(rows.iloc[0]['text'])[:120]}): the remote end or the link to it (or the "
            "interface NCCL chose) is at fault, not the process that reports it")  # fmt: skip


RETURN_CONFIDENCE = 0.3
"""A network finding from NCCL's error ways out alone (no WARN of the process in the
lines): weaker than a CUDA error the same lines report (nccl#629's illegal memory access
on the same host leads; the network path failing first is the next finding)."""


IB_STATUS = {5: "IBV_WC_WR_FLUSH_ERR: work flushed after the connection had already failed",
             10: "IBV_WC_REM_ACCESS_ERR: the remote end refused the access",
             12: "IBV_WC_RETRY_EXC_ERR: retries ran out, the peer or the path to it did not answer",
             13: "IBV_WC_RNR_RETRY_EXC_ERR: the peer had no receive posted in time"}  # fmt: skip
"""ibverbs' work-completion statuses NCCL prints (``with status=5``, infiniband/verbs.h)."""


def _completion(rows, remote: list[str]) -> str:
    """A network finding's text for NCCL's ``NET/IB: Got completion from peer 10.0.1.23<34696>
    with status=5 ...`` (DeepSpeed#6875): the connection to that peer failed; the process
    that reports it is its other end, not the suspect."""
    text = str(rows.iloc[0]["text"])
    status = int(m.group(1)) if (m := re.search(r"status=(\d+)", text)) else -1
    seen = ", ".join(local_gpus(rows)[:4]) or "a process"
    said = (
        f" ({IB_STATUS[status]})"
        if status in IB_STATUS
        else f" (status {status})"
        if status >= 0
        else ""
    )
    return (f"network: the InfiniBand connection to {', '.join(remote[:3])} failed{said}, seen "
            f"by NCCL on {seen}: that peer, or the link or NIC between them, is the suspect, "
            "not the process that reports it")  # fmt: skip


LAUNCH_ERRORS = {
    "Duplicate GPU detected": "two or more ranks were given one GPU (CUDA_VISIBLE_DEVICES, "
    "the local rank's device, a launcher's GPU count)",
    "has already checked in": "two processes were given one rank (a launcher started twice, "
    "or RANK/NODE_RANK set alike on two nodes)",
    "no socket interface found": "NCCL found no network interface it may use "
    "(NCCL_SOCKET_IFNAME names none that is up, or the container has only loopback)",
}
"""NCCL's own verdicts on a job's launch (horovod#3929, Lightning#14986, MambaTree#14)."""


def _launch(rows, cat: str) -> str:
    """A finding's text for NCCL refusing a job's launch (category ``launch``: the
    configuration, not a rank, and not the processes that say so; ``no_interface``: the
    network configuration of the host that says so)."""
    text = str(rows.iloc[0]["text"])
    why = next((v for k, v in LAUNCH_ERRORS.items() if k in text), "a launch error")
    if cat == "no_interface":
        return (f"network at start-up: {why} ({text[:100]}): the network configuration of the "
                "host that says so is at fault, not the training")  # fmt: skip
    return (
        f"crash at start-up: NCCL refused the job's set-up: {why} ({text[:100]}); the "
        "launch configuration is at fault, not a rank, and not the processes that report it"
    )


def _net_return(rows) -> str:
    """A network finding's text for NCCL's error ways out through its network transport
    or proxy thread (nccl#629: ``transport/net.cc:389 -> 2`` ... ``proxy.cc:452 -> 2 [Proxy
    Thread]``): where the first of them is (the lines' order), and what fails there."""
    first = rows.sort_values(["file", "line"]).iloc[0]
    seen = ", ".join(local_gpus(rows)[:4])
    return (
        f"network: NCCL's network path failed first on host {first['host']} "
        f"({str(first['text'])[:60]}: ncclSystemError or ncclRemoteError on its proxy "
        f"thread), seen on {seen}: the NIC, the link or GPUDirect RDMA of that host, "
        "or its peer; a CUDA error on that host may be its cause or its consequence"
    )


def _network(ev: Evidence, coords) -> list:
    w = ev.of("nccl_warn", "peer_gone")
    out: list[Finding] = []
    if w.empty:
        return out
    cats = w.assign(cat=[d.get("category", "other") if k == "nccl_warn" else "remote_closed"
                         for k, d in zip(w["kind"], w["detail"], strict=True)])  # fmt: skip
    for cat in ("launch", "no_interface", "ib_async", "ib_completion", "ib_verbs", "net", "net_mismatch",
                "remote_closed", "connect_failed", "proxy_call", "cuda_oom", "cuda", "other"):  # fmt: skip
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
        elif cat == "proxy_call":
            peers = sorted({int(p) for p in rows["peer"] if int(p) >= 0})
            summary, host, rank = _proxy(rows, peers), "", -1
            ranks = peers
        elif cat == "connect_failed":
            summary = _unreachable(rows, hosts, remote)
            host, rank = (remote[0] if len(remote) == 1 else ""), -1
        elif cat == "launch":  # the configuration's, not the reporters'
            summary, host, rank, ranks = _launch(rows, cat), "", -1, []
        elif cat == "no_interface":  # the reporting host's network configuration
            summary, host, rank = _launch(rows, cat), (hosts[0] if len(hosts) == 1 else ""), -1
        elif all(d.get("return") for d in rows["detail"]):
            summary, host, rank = _net_return(rows), str(e["host"]), -1
        elif cat == "ib_completion" and remote:
            summary, host, rank = (
                _completion(rows, remote),
                (remote[0] if len(remote) == 1 else ""),
                -1,
            )
        else:
            what = {"cuda": "GPU error", "cuda_oom": "crash", "other": "crash"}.get(cat, "network")
            summary = (f"{what}: NCCL on {', '.join(local_gpus(rows)[:4]) or ', '.join(hosts[:4]) or 'a host'} warns: "
                       f"{str(e['text'])[:160]}")  # fmt: skip
            if cat == "cuda_oom":
                devs = sorted({str(d.get("device")) for d in rows["detail"] if d.get("device")})
                summary += (f" ({', '.join(devs[:4]) or 'its GPU'}): the GPU was out of memory "
                            "when NCCL allocated its buffers, so the model's memory use, not "
                            "the network or the GPU's health; connections to it then close")  # fmt: skip
            host = hosts[0] if len(hosts) == 1 else ""
            stated = sorted({int(r) for r, m in zip(rows["rank"], rows["mapped"], strict=True)
                             if int(r) >= 0 and not m})  # fmt: skip
            rank = stated[0] if len(stated) == 1 else -1
        kind = (
            "crash"
            if cat in ("cuda_oom", "cuda", "remote_closed", "other", "launch")
            else "network"
        )
        cause = {"cuda_oom": "out_of_memory", "cuda": "cuda_error", "remote_closed": "peer_gone",
                 "other": "nccl_error", "launch": "nccl_error",
                 "no_interface": "nccl_error"}.get(cat, "network")  # fmt: skip
        returns = all(d.get("return") for d in rows["detail"])
        out.append(finding(kind, cause, rank,
                           RETURN_CONFIDENCE if returns else NET_CONFIDENCE[cat], summary,
                           {"category": cat, "hosts": hosts, "remote": remote,
                            "lines": int(rows["count"].sum()), "suspects": ranks,
                            "gpus": local_gpus(rows)},
                           coords, host=host))  # fmt: skip
    mm = cats[cats["cat"] == "mismatch"]
    around = sorted({int(p) for p in mm["peer"] if int(p) >= 0})
    if len(around) == 1:
        out.append(finding("desync", "mismatch", around[0], 0.45,
                           f"desync: NCCL detected mismatched collectives at and around rank "
                           f"{around[0]}", {"suspects": around}, coords))  # fmt: skip
    elif around:
        hosts = sorted({str(h) for h in mm["host"] if str(h)})
        out.append(finding("network", "network", -1, 0.35,
                           f"network: NCCL on {', '.join(hosts[:4]) or 'several processes'} saw "
                           f"mismatched collectives around {len(around)} ranks at once "
                           f"({','.join(map(str, around[:8]))}): data corrupted on the way "
                           "(the transport: GPUDirect RDMA, IB) rather than one rank's calls",
                           {"suspects": [], "around": around, "hosts": hosts}, coords,
                           host=hosts[0] if len(hosts) == 1 else ""))  # fmt: skip
    return out


RESULT_CLASS = {1: "cuda", 2: "system", 3: "internal", 4: "usage", 5: "usage", 6: "remote"}
"""nccl.h's ``ncclResult_t`` codes (an INFO line's ``init.cc:1929 -> 3``) -> the error
class of ``importer/logs/nccl.py: ERROR_KINDS``."""


def _alike(ev: Evidence, cls: str, ranks: list[int]) -> list[str]:
    """Other processes that failed as ``ranks`` did, their NCCL error class ``cls``: a
    process whose NCCL lines end in a failed call of that class (``init.cc:1929 -> 3``)
    with another rank, and a rank that began a traceback whose exception is cut from the
    lines (vllm#10453: rank 1's ``ncclInternalError``, pid 412's ``-> 3`` chain, rank 2's
    ``Traceback (most recen``)."""
    out = []
    raised = {int(r) for r in ev.of("exception")["rank"]}
    for r in sorted({int(r) for r in ev.of("traceback")["rank"]} - set(ranks) - raised):
        out.append(f"rank {r} (a traceback, its exception cut)")
    nccl = ev.where(ev.of("present"), lambda d: isinstance(d.get("failed"), dict))
    for r, d, h, g, p, m in zip(nccl["rank"], nccl["detail"], nccl["host"], nccl["local_rank"],
                                nccl["pid"], nccl["mapped"], strict=True):  # fmt: skip
        f = d["failed"]
        if RESULT_CLASS.get(int(f.get("code", 0))) != cls or int(r) in ranks:
            continue
        who = f"rank {int(r)}" if int(r) >= 0 and not m else f"host {h}, GPU {int(g)}"
        out.append(f"{who} (pid {int(p)}: NCCL's {f.get('at')} -> {f.get('code')})")
    return out


def _nccl_errors(ev: Evidence, coords) -> list:
    """One finding per class of ``NCCL error`` raised (a network error before the crash
    the same words would make); no rank where several processes fail alike
    (:func:`_alike`): the set-up or the environment, not the first rank whose traceback
    is whole. (A remote error is another process's or the fabric's already: the others
    failing after it is no sign of a common cause, and the ranks that raise it are its
    victims, no suspects: OpenRLHF#621's rank 1 after pid 90738 on 172.19.24.110 died.)"""
    ne = ev.of("nccl_error")
    out = []
    for cls, rows in ne.groupby("op", sort=False):
        kind, cause, meaning = NCCL_ERRORS.get(str(cls), NCCL_ERRORS["other"])
        ranks = sorted({int(r) for r in rows["rank"] if int(r) >= 0})
        who = ranks_text(ranks) if ranks else "a rank"
        alike = _alike(ev, str(cls), ranks) if ranks and kind == "crash" else []  # not remote
        many = len(ranks) > 2 or bool(alike)
        said = (f"; the same failure on {', '.join(alike[:4])}: several processes fail "
                "alike, so the set-up or the environment (topology, P2P, the container), "
                "not one rank" if alike else
                " (the same on many ranks: not one rank's fault)" if many else "")  # fmt: skip
        remote = str(cls) == "remote"  # the ranks that say so are its victims
        if remote:
            said += f"; {who} only reported it and is not at fault"
        out.append(finding(kind, cause, ranks[0] if len(ranks) == 1 and not many and kind == "crash" else -1,
                           0.3 if many or remote else 0.4,
                           f"{kind}: {who} raised an NCCL error: {meaning}{said}",
                           {"nccl_error": str(cls), "suspects": [] if many or remote else ranks,
                            **({"reported_by": ranks} if remote else {}),
                            "alike": alike}, coords))  # fmt: skip
    return out


def detect(ev: Evidence, coords) -> tuple[list, list[str]]:
    """Hardware findings of GPU errors, network findings of NCCL's transport warnings and
    errors."""
    return _gpu(ev, coords) + _network(ev, coords) + _nccl_errors(ev, coords), []
