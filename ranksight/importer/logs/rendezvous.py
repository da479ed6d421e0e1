"""Failures before or outside NCCL: the c10d store at start-up, and gloo's transport.

- ``torch.distributed.DistStoreError: Timed out after 901 seconds waiting for clients.
  1/2 clients joined.`` (``workers`` in newer torch): ``init_failure``, ``detail``
  ``category`` store_wait, ``joined``; ``code`` the expected world size;
- ``The client socket has timed out after 1800s while trying to connect to (host, 29500)``
  and ``The client socket has failed to connect to [host]:29500 (errno: 111 - Connection
  refused)``: ``init_failure``, category store_connect, ``detail.address``;
- gloo: ``Timed out waiting 1800000ms for recv operation to complete``: a ``timeout``
  (op ``recv``, no sequence number, like NCCL's watchdog);
- gloo: ``[.../gloo/transport/tcp/pair.cc:598] Connection closed by peer [10.1.1.1]:4321``
  and ``Connection reset by peer``: ``peer_gone`` (``detail.remote`` the peer's address);
- ``[45] is setting up NCCL communicator and retrieving ncclUniqueId from [0] via c10d
  key-value store ... got error: wait timeout``: ``init_failure`` (category unique_id,
  ``peer`` the rank that should have published the id);
- torchelastic's ``RendezvousTimeoutError`` (and its kin): ``init_failure`` (rendezvous);
- ``DistStoreError: wait timeout after 300000ms, keys: /broadcast_from/0/75465`` (a get,
  barrier or object broadcast through the store that nobody answered): ``init_failure``,
  category store_key, ``detail.key``, ``code`` the wait in ms;
- c10d's ``waitForInput: socket SocketImpl(fd=11, addr=[...]:38674,
  remote=[::ffff:33.148.62.162]:23456) timed out after 900000ms`` (the store at the other
  end never answered): ``init_failure``, category store_connect, ``detail.address``;
- gloo: ``Gloo connectFullMesh failed with [...pair.h:301] Connect timeout``: ``init_failure``,
  category gloo_connect (its pairs could not connect: the network or a peer that never
  came up);
- gloo: ``[enforce fail at .../gloo/transport/tcp/pair.cc:446] op.preamble.length <=
  op.nbytes. 1046204 vs 1040256``: a ``mismatch`` (a peer sent a message of another size
  than this rank posted for it: the ranks are in different collectives, or the same one
  with other tensors), ``detail.sizes``.
"""

from __future__ import annotations

import re
from typing import Any

from ..rows import norm_op
from .events import Event
from .lines import LogLine

_STORE_WAIT = re.compile(r"Timed out after (?P<s>\d+) seconds waiting for (?:clients|workers)\. "
                         r"(?P<k>\d+)/(?P<n>\d+) (?:clients|workers) joined")  # fmt: skip
_CONNECT = re.compile(r"client socket has (?:timed out after \d+s while trying to connect|failed "
                      r"to connect) to (?:\[(?:::ffff:)?(?P<v6>[^\]]+)\]:|\(?(?P<addr>[\w.\-]+)(?:, |:))"
                      r"(?P<port>\d+)\)?")  # fmt: skip
"""A client that cannot reach the store: ``... to (node1, 29500)``, ``... to host:29500``,
``... to [::ffff:0.104.99.143]:47389`` (an IPv4 address in IPv6 form, Open-Sora#667)."""
_LISTEN = re.compile(r"server socket has failed to (?:listen on|bind to) (?P<addr>\S+?)"
                     r" \(errno: 98 - Address already in use\)")  # fmt: skip
"""The store's port is taken (pytorch#85604: ``The server socket has failed to listen on
[::]:47531 (errno: 98 - Address already in use).``)."""
_UNIQUE_ID = re.compile(r"\[(?P<rank>\d+)\] is setting up NCCL communicator and retrieving "
                        r"ncclUniqueId from \[(?P<root>\d+)\]")  # fmt: skip
_RDZV = re.compile(r"(?P<err>RendezvousTimeoutError|RendezvousClosedError|RendezvousConnectionError"
                   r"|RendezvousError)")  # fmt: skip
_GLOO_TIMEOUT = re.compile(r"Timed out waiting (?P<ms>\d+)ms for (?P<op>\w+) operation to complete")
_GLOO_PEER = re.compile(r"gloo/transport/\w+/\w+\.cc:\d+\] (?:Connection closed by peer|Read error|"
                        r"Connection reset by peer)\s*\[?(?P<addr>[\w.:\-]+?)\]?:(?P<port>\d+)")  # fmt: skip
_KEY_WAIT = re.compile(r"wait timeout after (?P<ms>\d+)ms, keys?: (?P<key>\S+)")
_SOCKET_WAIT = re.compile(r"waitForInput: socket SocketImpl\(.*?remote=\[(?:::ffff:)?(?P<addr>[^\]]+)\]"
                          r":(?P<port>\d+)\) timed out after (?P<ms>\d+)ms")  # fmt: skip
_GLOO_CONNECT = re.compile(r"Gloo connectFullMesh failed with (?P<why>.*)")
_GLOO_SIZE = re.compile(r"enforce fail at [^\]]*gloo/transport/\w+/pair\.cc:\d+\] "
                        r"op\.preamble\.length <= op\.nbytes\. (?P<got>\d+) vs (?P<want>\d+)")  # fmt: skip
MARKERS = ("waiting for clients", "waiting for workers", "client socket", "server socket", "Timed out waiting",
           "gloo/transport", "ncclUniqueId", "Rendezvous", "wait timeout", "waitForInput",
           "connectFullMesh")  # fmt: skip


def parse(line: LogLine) -> list[Event]:
    """The events of one line (see the module doc)."""
    t = line.text
    base: dict[str, Any] = dict(rank=line.rank, local_rank=line.local_rank, host=line.host, line=line.number,
                text=t)  # fmt: skip
    if m := _STORE_WAIT.search(t):
        return [Event("init_failure", **base, code=int(m.group("n")),
                      detail={"category": "store_wait", "joined": int(m.group("k")),
                              "seconds": int(m.group("s"))})]  # fmt: skip
    if m := _CONNECT.search(t):
        return [Event("init_failure", **base,
                      detail={"category": "store_connect",
                              "address": f"{m.group('v6') or m.group('addr')}:{m.group('port')}"})]  # fmt: skip
    if m := _LISTEN.search(t):
        return [Event("init_failure", **base, detail={"category": "store_listen",
                                                      "address": m.group("addr")})]  # fmt: skip
    if m := _UNIQUE_ID.search(t):
        return [Event("init_failure", **{**base, "rank": int(m.group("rank"))},
                      peer=int(m.group("root")), detail={"category": "unique_id"})]  # fmt: skip
    if m := _RDZV.search(t):
        return [Event("init_failure", **base, detail={"category": "rendezvous",
                                                      "error": m.group("err")})]  # fmt: skip
    if m := _KEY_WAIT.search(t):
        return [Event("init_failure", **base, code=int(m.group("ms")),
                      detail={"category": "store_key", "key": m.group("key")})]  # fmt: skip
    if m := _SOCKET_WAIT.search(t):
        return [Event("init_failure", **base, code=int(m.group("ms")),
                      detail={"category": "store_connect",
                              "address": f"{m.group('addr')}:{m.group('port')}"})]  # fmt: skip
    if m := _GLOO_CONNECT.search(t):
        return [Event("init_failure", **base, detail={"category": "gloo_connect",
                                                      "why": m.group("why")[:160]})]  # fmt: skip
    if m := _GLOO_SIZE.search(t):
        return [Event("mismatch", **base, detail={"backend": "gloo",
                      "sizes": [int(m.group("got")), int(m.group("want"))]})]  # fmt: skip
    if m := _GLOO_TIMEOUT.search(t):
        return [Event("timeout", **base, op=norm_op(m.group("op")), code=int(m.group("ms")),
                      detail={"backend": "gloo"})]  # fmt: skip
    if m := _GLOO_PEER.search(t):
        return [Event("peer_gone", **base, detail={"remote": m.group("addr"), "backend": "gloo"})]
    return []
