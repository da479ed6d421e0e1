"""A job that never got going: the c10d store at start-up (``importer/logs/rendezvous.py``).

"1/2 workers joined" means the other workers never reached rank 0's store: they did not
start, or cannot reach ``MASTER_ADDR:MASTER_PORT`` (a wrong address, a firewall, a node
that is down). A client that cannot connect to the store says the same from the other
side: the store's host (rank 0's) is down or unreachable. No rank's training code is at
fault, so no rank is named with confidence.
"""

from __future__ import annotations

from .evidence import Evidence, finding, ranks_text


def detect(ev: Evidence, coords) -> tuple[list, list[str]]:
    """A hang finding (cause ``rendezvous``) for start-up failures; a crash of the
    launcher for a rendezvous that was closed (:func:`_closed`)."""
    init = ev.of("init_failure")
    out = []
    waits = ev.where(init, lambda d: d.get("category") == "store_wait")
    if not waits.empty:
        e = waits.iloc[0]
        n, k = int(e["code"]), int(e["detail"].get("joined", -1))
        out.append(finding("hang", "rendezvous", -1, 0.4,
                           f"hang at start-up: only {k} of {n} workers reached the store (rank 0's "
                           f"TCPStore): the other {n - k} never started or cannot reach "
                           "MASTER_ADDR:MASTER_PORT (the address, a firewall, a node down)",
                           {"joined": k, "expected": n, "suspects": []}, coords))  # fmt: skip
    conn = ev.where(init, lambda d: d.get("category") == "store_connect")
    if not conn.empty:
        addrs = sorted({str(d.get("address")) for d in conn["detail"]})
        ranks = sorted({int(r) for r in conn["rank"] if int(r) >= 0})
        who = f"ranks {','.join(map(str, ranks[:8]))}" if len(ranks) > 1 else (
            f"rank {ranks[0]}" if ranks else "a rank")  # fmt: skip
        out.append(finding("network", "rendezvous", -1, 0.35,
                           f"network: {who} cannot reach the store at {', '.join(addrs[:3])}: "
                           "the store's host (rank 0's) is down, not started yet, or unreachable "
                           "from here", {"addresses": addrs, "suspects": [0] if 0 not in ranks else []},
                           coords))  # fmt: skip
    uid = ev.where(init, lambda d: d.get("category") == "unique_id")
    if not uid.empty:
        roots = sorted({int(p) for p in uid["peer"] if int(p) >= 0})
        waiting = sorted({int(r) for r in uid["rank"] if int(r) >= 0} - set(roots))
        rank = roots[0] if len(roots) == 1 else -1
        out.append(finding("hang", "rendezvous", rank, 0.45,
                           f"hang at start-up: {ranks_text(waiting) if waiting else 'ranks'} waited "
                           f"for {ranks_text(roots)} to publish the NCCL unique id of a new "
                           "communicator: it never reached that communicator's creation (stuck "
                           "before it, or dead)", {"suspects": roots, "waiting": waiting}, coords))  # fmt: skip
    out += _key_waits(ev, init, coords) + _gloo_connect(init, coords) + _port_taken(init, coords)
    rdzv = ev.where(init, lambda d: d.get("category") == "rendezvous")
    closed = ev.where(rdzv, lambda d: d.get("error") == "RendezvousClosedError")
    if not closed.empty:
        out.append(_closed(coords))
    elif not rdzv.empty:
        err = str(rdzv.iloc[0]["detail"].get("error", "RendezvousError"))
        out.append(finding("hang", "rendezvous", -1, 0.35,
                           f"hang at start-up: torchelastic's rendezvous failed ({err}): not every "
                           "node joined in time (a node that did not start, a wrong --rdzv-endpoint, "
                           "a firewall)", {"suspects": []}, coords))  # fmt: skip
    return out, []


def _closed(coords):
    """torchelastic's ``RendezvousClosedError``: the rendezvous of this run id was closed
    (a node left or its pod was deleted, the job is being torn down), and a closed one
    stays closed, so agents restarted into it fail again; not a join that timed out
    (``RendezvousTimeoutError``). No worker started: no rank (kubeflow trainer#1638, etcd
    backend: both pods' agents raise it after one pod was deleted)."""
    return finding("crash", "rendezvous", -1, 0.35,
                   "crash at start-up: torchelastic's rendezvous was closed "
                   "(RendezvousClosedError): a node left or was deleted, or the job is being "
                   "torn down, and agents that join a closed rendezvous (a restarted pod, the "
                   "same run id) fail again; no worker started, so no rank is at fault",
                   {"suspects": []}, coords)  # fmt: skip


def _key_waits(ev: Evidence, init, coords) -> list:
    """``DistStoreError: wait timeout after 300000ms, keys: /broadcast_from/0/75465``
    (ms-swift#4906): the rank that raised it waited in the c10d store for a key that no
    process wrote (a barrier, an object broadcast, a group's set-up): it is a waiter; the
    one that should have written the key stopped, hung or never got there."""
    keys = ev.where(init, lambda d: d.get("category") == "store_key")
    if keys.empty:
        return []
    e = keys.iloc[0]
    ranks = sorted({int(r) for r in keys["rank"] if int(r) >= 0})
    who = ranks_text(ranks) if ranks else "a process"
    secs = f" after {int(e['code']) // 1000} s" if int(e["code"]) > 0 else ""
    key = str(e["detail"].get("key", ""))
    return [finding("hang", "stuck", -1, 0.3,
                    f"hang: {who} timed out{secs} waiting in the c10d store for key {key!r}: "
                    "another process never wrote it (it stopped, hung or never got that far), so "
                    "the rank that waited is not at fault; the key names the exchange (a "
                    "barrier, an object broadcast, a group's set-up)",
                    {"key": key, "waiting": ranks, "suspects": []}, coords)]  # fmt: skip


def _gloo_connect(init, coords) -> list:
    """``Gloo connectFullMesh failed with [...pair.h:301] Connect timeout`` (dmlcloud#47):
    creating a gloo group, the rank could not connect to its peers: a peer that never came
    up, or the network between them (the interface gloo picked, a firewall)."""
    gloo = (
        init[[d.get("category") == "gloo_connect" for d in init["detail"]]] if len(init) else init
    )
    if gloo.empty:
        return []
    ranks = sorted({int(r) for r in gloo["rank"] if int(r) >= 0})
    who = ranks_text(ranks) if ranks else "a rank"
    why = str(gloo.iloc[0]["detail"].get("why", ""))[:100]
    return [finding("network", "rendezvous", -1, 0.35,
                    f"network at start-up: {who} could not connect gloo's pairs to its peers "
                    f"({why}): a peer that never came up, or the network between them (the "
                    "interface gloo chose: GLOO_SOCKET_IFNAME, a firewall)",
                    {"suspects": []}, coords)]  # fmt: skip


def _port_taken(init, coords) -> list:
    """``The server socket has failed to listen on [::]:47531 (errno: 98 - Address already in
    use)`` (pytorch#85604): the store could not be started on its port, so no worker could
    join it: another job or a leftover process holds MASTER_PORT, or the script starts a
    store of its own beside the launcher's. No rank is at fault."""
    taken = (
        init[[d.get("category") == "store_listen" for d in init["detail"]]] if len(init) else init
    )
    if taken.empty:
        return []
    addrs = sorted({str(d.get("address")) for d in taken["detail"]})
    return [finding("network", "rendezvous", -1, 0.45,
                    f"network at start-up: the c10d store could not listen on {', '.join(addrs[:3])} "
                    "(address already in use): another job or a leftover process holds that port, "
                    "or the script starts a second store beside the launcher's; no rank is at fault",
                    {"addresses": addrs, "suspects": []}, coords)]  # fmt: skip
