"""py-spy dumps read one rank at a time, where there are too few to compare (three or
more ranks' dumps are compared by ``postmortem.odd_stacks``: the odd stack out).

One rank's stack says where that rank is, not who holds the job: "rank 0 is idle in the
DataLoader's ``queue.get``: a data-loader stall" is one rank's view, and the confidence
says so. A dump of a rank waiting in a collective says it is a victim.
"""

from __future__ import annotations

from ..postmortem import stack_cause
from .evidence import Evidence, finding, ranks_text

MIN_COMPARED = 3
"""Dumps of this many ranks or more are compared with each other instead."""
SAYS = {
    "data_loader": "waiting on its data loader: a data-loader stall",
    "checkpoint": "writing a checkpoint",
    "communication": "waiting in a collective for another rank",
    "gc": "in Python's garbage collector",
    "stuck": "in its own code",
}


def detect(ev: Evidence, coords) -> tuple[list, list[str]]:
    """One low-confidence hang finding per distinct stack of py-spy dumps, when fewer
    than :data:`MIN_COMPARED` ranks' dumps are known (identical dumps: one finding)."""
    st = ev.of("stack")
    if st.empty or st[st["rank"] >= 0]["rank"].nunique() >= MIN_COMPARED:
        return [], []
    out = []
    by_stack: dict[tuple, list] = {}
    for _, e in st.iterrows():
        by_stack.setdefault(tuple(e["detail"].get("frames", [])[:8]), []).append(e)
    for frames, dumps in by_stack.items():
        cause = stack_cause(" ".join(frames))
        ranks = sorted({int(e["rank"]) for e in dumps if int(e["rank"]) >= 0})
        pids = sorted({int(e["pid"]) for e in dumps if int(e["pid"]) > 0})
        if ranks:
            who = ranks_text(ranks)
        elif pids:
            who = f"process {', '.join(map(str, pids[:4]))} (rank not given)"
        else:
            who = "a process (neither rank nor pid given)"
        if len(dumps) > 1 and not ranks:
            who = f"{len(dumps)} dumps of {who}"
        state = "running" if any(e["detail"].get("active") for e in dumps) else "idle"
        top = frames[0] if frames else "no frames"
        culprit = ranks[0] if len(ranks) == 1 and cause != "communication" else -1
        conf = 0.4 if cause == "data_loader" else 0.25
        out.append(finding("hang", cause, culprit, conf,
                           f"hang: {who} {'is' if len(dumps) == 1 else 'are'} {state} in {top}: "
                           f"{SAYS.get(cause, SAYS['stuck'])} "
                           "(one process's view: the other ranks' stacks would say more)",
                           {"frames": list(frames), "pids": pids,
                            "suspects": ranks if cause != "communication" else []}, coords))  # fmt: skip
    return out, []
