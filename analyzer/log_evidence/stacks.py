"""py-spy dumps read one rank at a time, where there are too few to compare (three or
more ranks' dumps are compared by ``postmortem.odd_stacks``: the odd stack out).

One rank's stack says where that rank is, not who holds the job: "rank 0 is idle in the
DataLoader's ``queue.get``: a data-loader stall" is one rank's view, and the confidence
says so. A dump of a rank waiting in a collective says it is a victim.
"""

from __future__ import annotations

from ..postmortem import stack_cause
from .evidence import Evidence, finding

MIN_COMPARED = 3
"""Dumps of this many ranks or more are compared with each other instead."""
SAYS = {
    "data_loader": "waits on its data loader: a data-loader stall",
    "checkpoint": "is writing a checkpoint",
    "communication": "waits in a collective: it is waiting for another rank",
    "gc": "is in Python's garbage collector",
    "stuck": "is in its own code",
}


def detect(ev: Evidence, coords) -> tuple[list, list[str]]:
    """One low-confidence hang finding per py-spy dump, when fewer than
    :data:`MIN_COMPARED` ranks' dumps are known."""
    st = ev.of("stack")
    if st.empty or st[st["rank"] >= 0]["rank"].nunique() >= MIN_COMPARED:
        return [], []
    out = []
    for _, e in st.iterrows():
        frames = e["detail"].get("frames", [])
        cause = stack_cause(" ".join(frames))
        rank = int(e["rank"])
        who = f"rank {rank}" if rank >= 0 else f"process {int(e['pid'])} (rank not given)"
        state = "idle" if not e["detail"].get("active") else "running"
        top = frames[0] if frames else "no frames"
        culprit = rank if cause not in ("communication",) else -1
        conf = 0.4 if cause == "data_loader" else 0.25
        out.append(finding("hang", cause, culprit, conf,
                           f"hang: {who} is {state} in {top}: it {SAYS.get(cause, SAYS['stuck'])} "
                           "(one rank's view: the other ranks' stacks would say more)",
                           {"frames": frames[:8], "pid": int(e["pid"]),
                            "suspects": [rank] if culprit >= 0 else []}, coords))  # fmt: skip
    return out, []
