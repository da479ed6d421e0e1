"""``progress`` snapshots of a synthetic run, as the hooks' writer thread takes them.

The hooks snapshot, every ``snapshot_s`` seconds from a thread that keeps running when
training is stuck, how far each of the rank's streams has been issued and completed: one
row per (group, direction, peer) the rank has used (``trainer_hooks/collective_log.py``).
Here a rank's streams are numbered ``rank * 6 + kind``, kind one of :data:`STREAMS`, and
the snapshot at time ``T`` is a sweep over the chunk's collectives sorted by enqueue and
by end time (numpy ``maximum.at``), carried from chunk to chunk. After a hang or a crash
the snapshots go on for ``tail_s`` with nothing moving (a crashed rank's stop at its
crash), which is what hang localization reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ranksight.synthetic.rows import Mesh

STREAMS = ("tp", "dp", "send_down", "send_up", "recv_down", "recv_up")
"""Per rank: TP group, DP group, sends to stage pp-1 / pp+1, recvs from pp-1 / pp+1."""
K = len(STREAMS)


def stream_ids(frame: pd.DataFrame) -> np.ndarray:
    """Stream number of each ``collectives`` row of a synthetic chunk."""
    rank = frame["rank"].to_numpy(np.int64)
    peer = frame["peer"].to_numpy(np.int64)
    p2p = peer >= 0
    recv = (frame["op"] == "recv").to_numpy()
    dp = (~p2p) & (frame["phase"] == "").to_numpy()
    kind = np.where(p2p, 2 + 2 * recv + (peer > rank), np.where(dp, 1, 0))
    return rank * K + kind


def _stream_table(mesh: Mesh) -> pd.DataFrame:
    """group_id, group_ranks, direction, peer, last_op of every stream (exists or not)."""
    world, ranks = mesh.world, np.arange(mesh.world)
    stage = (ranks // mesh.tp) % mesh.pp
    cols: dict[str, list[np.ndarray]] = {
        "group_id": [],
        "group_ranks": [],
        "direction": [],
        "peer": [],
        "last_op": [],
    }
    for kind, name in enumerate(STREAMS):
        p2p = kind >= 2
        gid = mesh.pp_gid if p2p else (mesh.tp_gid if kind == 0 else mesh.dp_gid)
        granks = mesh.pp_granks if p2p else (mesh.tp_granks if kind == 0 else mesh.dp_granks)
        d = 1 if name.endswith("_up") else -1
        ok = (stage + d >= 0) & (stage + d < mesh.pp)
        peer = np.where(ok, ranks + d * mesh.tp, -1)
        cols["group_id"].append(gid)
        cols["group_ranks"].append(granks)
        cols["direction"].append(np.full(world, name.split("_")[0] if p2p else "", dtype=object))
        cols["peer"].append(peer if p2p else np.full(world, -1))
        op = name.split("_")[0] if p2p else "all_reduce"
        cols["last_op"].append(np.full(world, op, dtype=object))
    # stream id = rank * K + kind: interleave the per-kind arrays
    return pd.DataFrame({k: np.stack(v, axis=1).reshape(-1) for k, v in cols.items()})


@dataclass
class Progress:
    """Snapshot state of every stream, carried across chunks."""

    mesh: Mesh
    snapshot_s: float
    next_ns: int
    """Time of the next snapshot."""
    table: pd.DataFrame = field(init=False)
    issued: np.ndarray = field(init=False)
    completed: np.ndarray = field(init=False)
    last_issue: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        n = self.mesh.world * K
        self.table = _stream_table(self.mesh)
        self.issued, self.completed = np.full(n, -1, np.int64), np.full(n, -1, np.int64)
        self.last_issue = np.zeros(n, np.int64)

    def chunk(
        self, coll: pd.DataFrame, until_ns: int, step_at, dead_after: dict[int, int]
    ) -> pd.DataFrame:
        """Snapshots up to ``until_ns`` (exclusive) over this chunk's collectives.
        ``step_at(T)`` is the step the ranks are in at ``T``; ``dead_after``: rank ->
        time its snapshots stop (a crash)."""
        sid = stream_ids(coll)
        seq = coll["group_seq"].to_numpy(np.int64)
        enq, end = coll["enqueue_ns"].to_numpy(), coll["end_ns"].to_numpy()
        by_enq = np.argsort(enq, kind="stable")
        done = np.flatnonzero(end > 0)
        by_end = done[np.argsort(end[done], kind="stable")]
        i = j = 0
        out = []
        while self.next_ns < until_ns:
            t = self.next_ns
            i2 = int(np.searchsorted(enq[by_enq], t, side="right"))
            j2 = int(np.searchsorted(end[by_end], t, side="right"))
            np.maximum.at(self.issued, sid[by_enq[i:i2]], seq[by_enq[i:i2]])
            np.maximum.at(self.last_issue, sid[by_enq[i:i2]], enq[by_enq[i:i2]])
            np.maximum.at(self.completed, sid[by_end[j:j2]], seq[by_end[j:j2]])
            i, j = i2, j2
            out.append(self._rows(t, step_at(t), dead_after))
            self.next_ns += int(self.snapshot_s * 1e9)
        np.maximum.at(self.issued, sid[by_enq[i:]], seq[by_enq[i:]])
        np.maximum.at(self.last_issue, sid[by_enq[i:]], enq[by_enq[i:]])
        np.maximum.at(self.completed, sid[by_end[j:]], seq[by_end[j:]])
        return pd.concat(out, ignore_index=True) if out else pd.DataFrame()

    def _rows(self, t: int, step: int, dead_after: dict[int, int]) -> pd.DataFrame:
        live = self.issued >= 0
        for rank, t_dead in dead_after.items():
            if t > t_dead:
                live[rank * K : (rank + 1) * K] = False
        idx = np.flatnonzero(live)
        frame = self.table.iloc[idx].reset_index(drop=True)
        frame.insert(0, "rank", idx // K)
        frame["ts_ns"], frame["step"] = t, step
        frame["issued_seq"], frame["completed_seq"] = self.issued[idx], self.completed[idx]
        frame["last_issue_ns"] = self.last_issue[idx]
        return frame

    def tail(self, until_ns: int, step: int, dead_after: dict[int, int]) -> pd.DataFrame:
        """Snapshots up to ``until_ns`` with nothing moving (after a hang or crash)."""
        out = []
        while self.next_ns < until_ns:
            out.append(self._rows(self.next_ns, step, dead_after))
            self.next_ns += int(self.snapshot_s * 1e9)
        return pd.concat(out, ignore_index=True) if out else pd.DataFrame()
