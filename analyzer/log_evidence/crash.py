"""Crashes in logs: torchrun's summary of failed ranks, and ranks' own exceptions.

torchrun's root cause is the *first failure it observed* on that node's agent, not
always the first cause: a rank torn down by its NCCL watchdog after a timeout exits with
SIGABRT (-6) and is a victim of the hang; SIGKILL (-9) is most often the OOM killer or
the scheduler; an exit code with the rank's own exception is the rank's own failure.
"""

from __future__ import annotations

from .evidence import Evidence, finding, ranks_text

TEARDOWN = ("DistBackendError", "watchdog", "Watchdog", "NCCL communicator was aborted",
            "ProcessGroupNCCL", "ChildFailedError", "Signal", "SignalException")  # fmt: skip
"""Words of exceptions that follow a hang or another rank's failure, not a cause."""


def _how(code: int, sig: str) -> str:
    if sig == "SIGKILL":
        return "killed by SIGKILL (the OOM killer, the scheduler or a person)"
    if sig == "SIGABRT":
        return "aborted (SIGABRT: NCCL's watchdog takes a timed-out rank down this way)"
    if sig:
        return f"killed by {sig}"
    return f"exited with code {code}"


def detect(ev: Evidence, coords) -> tuple[list, list[str]]:
    """A crash finding for torchrun's root cause, or a rank's own exception."""
    cf = ev.of("child_failed")
    hung = not ev.of("timeout", "status").empty
    if not cf.empty:
        root = ev.where(cf, lambda d: d.get("root_cause"))
        e = (root if not root.empty else cf).iloc[0]
        code, sig = int(e["code"]), str(e["detail"].get("signal", ""))
        others = sorted({int(r) for r in cf["rank"] if int(r) >= 0} - {int(e["rank"])})
        rank, local = int(e["rank"]), int(e["local_rank"])
        who = f"rank {rank}" if rank >= 0 else f"local rank {local} (global rank not given)"
        host = f" on {e['host']}" if str(e["host"]) else ""
        conf = 0.6
        if sig == "SIGABRT" and hung:
            conf = 0.25  # the watchdog's teardown: the hang finding says who
        if rank < 0:
            conf = min(conf, 0.4)
        summary = (f"crash: {who}{host} {_how(code, sig)}: torchrun's first observed failure"
                   + (f"; {ranks_text(others)} failed after it" if others else ""))
        return [finding("crash", "signal" if sig else "exit_code", rank, conf, summary,
                        {"exitcode": code, "signal": sig, "local_rank": local,
                         "other_failures": others, "suspects": [rank] if rank >= 0 else []},
                        coords, host=str(e["host"]))], []  # fmt: skip
    exc = ev.of("exception")
    own = exc[[r >= 0 and not any(w in t for w in TEARDOWN)
                for r, t in zip(exc["rank"], exc["text"], strict=True)]] if len(exc) else exc
    if own.empty or hung:
        return [], []
    ranks = sorted({int(r) for r in own["rank"]})
    e = own.iloc[0]
    if len(ranks) > 1 and len(ranks) * 2 > len(ev.present):
        return [], [f"{ranks_text(ranks)} raised {e['op']}: the same error on most ranks "
                    "(the code or the data, not one rank)"]  # fmt: skip
    rank = ranks[0] if len(ranks) == 1 else -1
    return [finding("crash", "exception", rank, 0.5,
                    f"crash: {ranks_text(ranks)} raised {e['op']}: {str(e['text'])[:160]}",
                    {"exception": e["op"], "suspects": ranks}, coords)], []  # fmt: skip
