"""py-spy dumps read one rank at a time, where there are too few to compare (three or
more ranks' dumps are compared by ``postmortem.odd_stacks``: the odd stack out).

One rank's stack says where that rank is, not who holds the job: "rank 0 is idle in the
DataLoader's ``queue.get``: a data-loader stall" is one rank's view, and the confidence
says so. A dump of a rank waiting in a collective says it is a victim.
"""

from __future__ import annotations

from ..detectors.postmortem import GPU_SYNC, stack_cause
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
    if st.empty:
        return [], []
    ranked = st[st["rank"] >= 0]
    if ranked["rank"].nunique() >= MIN_COMPARED:
        pasted = ev.where(ranked, lambda d: d.get("source") == "log")  # files: postmortem's
        return (_odd_out(pasted, coords) if pasted["rank"].nunique() >= MIN_COMPARED else []), []
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
        says = SAYS.get(cause, SAYS["stuck"])
        if cause == "communication" and _gpu_sync(frames):
            says = ("waiting on its GPU (a stream sync: the work queued before it, most often "
                    "a collective's kernel, does not finish)")  # fmt: skip
        out.append(finding("hang", cause, culprit, conf,
                           f"hang: {who} {'is' if len(dumps) == 1 else 'are'} {state} in {top}: "
                           f"{says} "
                           "(one process's view: the other ranks' stacks would say more)",
                           {"frames": list(frames), "pids": pids,
                            "suspects": ranks if cause != "communication" else []}, coords))  # fmt: skip
    return out, []


def _gpu_sync(frames) -> bool:
    """Whether a stack waits on its GPU's stream rather than in a collective's call."""
    text = " ".join(frames)
    collective = ("distributed_c10d", "all_reduce", "allreduce", "all_gather", "allgather",
                  "broadcast", "barrier")  # fmt: skip
    return any(w in text for w in GPU_SYNC) and not any(w in text for w in collective)


def _odd_out(st, coords) -> list:
    """Ranks whose main-thread stack differs from the one most ranks share (more than
    half of them), each with what its stack says (``postmortem.odd_stacks``'s rule, for
    dumps pasted in a log)."""
    top = {
        int(r): tuple(d.get("frames", [])[:3])
        for r, d in zip(st["rank"], st["detail"], strict=True)
    }
    groups: dict[tuple, list[int]] = {}
    for r, frames in top.items():
        groups.setdefault(frames, []).append(r)
    common, members = max(groups.items(), key=lambda kv: len(kv[1]))
    if len(members) * 2 <= len(top):
        return []
    out = []
    for frames, ranks in groups.items():
        if frames == common:
            continue
        cause = stack_cause(" ".join(frames))
        for r in ranks:
            out.append(finding("hang", cause, r, 0.6 if len(ranks) == 1 else 0.45,
                               f"hang: rank {r}'s stack differs from that of {ranks_text(members)} "
                               f"({stack_cause(' '.join(common))}): it is {SAYS.get(cause, SAYS['stuck'])}: "
                               f"{frames[0] if frames else 'no frames'}",
                               {"frames": list(frames), "majority_ranks": sorted(members),
                                "suspects": [r]}, coords))  # fmt: skip
    return out
