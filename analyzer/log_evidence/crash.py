"""Crashes in logs: torchrun's summary of failed ranks, DeepSpeed's launcher killing a
host's workers, ranks' own exceptions, tracebacks behind pdsh's host prefixes.

torchrun's root cause is the *first failure it observed* on that node's agent, not
always the first cause: a rank torn down by its NCCL watchdog after a timeout exits with
SIGABRT (-6) and is a victim of the hang; SIGKILL (-9) is most often the OOM killer or
the scheduler; an exit code with the rank's own exception is the rank's own failure.
Ranks that all exited with one code in the same second failed each on its own: which of
them torchrun observed first is no order, and none is the culprit.
"""

from __future__ import annotations

from ranksight.ground.words import counted

from .evidence import Evidence, finding, keep, ranks_text

TEARDOWN = ("DistBackendError", "watchdog", "Watchdog", "NCCL communicator was aborted",
            "ProcessGroupNCCL", "ChildFailedError", "Signal", "SignalException")  # fmt: skip
"""Words of exceptions that follow a hang or another rank's failure, not a cause."""


NCCL_ERRORS = ("NCCL error", "ncclSystemError", "ncclInternalError", "ncclRemoteError",
               "ncclInvalidUsage", "ncclUnhandledCudaError", "unhandled system error",
               "unhandled cuda error", "remote process exited")  # fmt: skip
"""Words of NCCL's own errors raised as exceptions (nccl.h's ncclResult_t)."""


LAUNCHERS = {"mpirun": "the MPI launcher's", "horovodrun": "horovodrun's"}
"""Whose failure record a ``child_failed`` event is (``detail.source``; torchrun's else)."""


def _how(code: int, sig: str) -> str:
    if sig == "SIGKILL":
        return "killed by SIGKILL (the OOM killer, the scheduler or a person)"
    if sig == "SIGABRT":
        return "aborted (SIGABRT: NCCL's watchdog takes a timed-out rank down this way)"
    if sig:
        return f"killed by {sig}"
    return f"exited with code {code}"


def _fatal(ev: Evidence, coords) -> list:
    """A crash finding for processes that died of a fatal signal."""
    fs = ev.of("fatal_signal")
    if fs.empty:
        return []
    ranks = sorted({int(r) for r in fs["rank"] if int(r) >= 0})
    procs = sorted({f"{h}:{p}" if h else str(p) for h, p in zip(fs["host"], fs["pid"], strict=True)
                    if int(p) >= 0})  # fmt: skip
    names = sorted({str(o) for o in fs["op"] if str(o)})
    who = (
        ranks_text(ranks) if ranks else f"process {', '.join(procs[:4])}" if procs else "a process"
    )
    hosts = sorted({str(h) for h in fs["host"] if str(h)})
    conf = 0.5 if 0 < len(ranks) <= 2 else 0.35
    return [finding("crash", "signal", ranks[0] if len(ranks) == 1 else -1, conf,
                    f"crash: {who} died of {', '.join(names) or 'a fatal signal'}"
                    + (f" on {', '.join(hosts[:3])}" if hosts else "")
                    + (": killed from outside (the host's memory ran out)" if any(
                        "OOM" in n for n in names) else ": the process itself failed (a bad "
                       "address, shared memory too small, a driver fault)")
                    + "; the others were left waiting",
                    {"signals": names, "processes": procs[:16], "suspects": ranks}, coords,
                    host=hosts[0] if len(hosts) == 1 else "")]  # fmt: skip


def _ray_deaths(ev: Evidence, coords) -> tuple[list, list[str]]:
    """A Ray worker that died: the cause when it is one death; a consequence when many
    die beside timeouts (the watchdog takes them down)."""
    wd = ev.of("worker_died")
    if wd.empty:
        return [], []
    n = int(wd["code"].clip(lower=1).sum())
    where = sorted({f"pid {int(p)} on {h}" if int(p) >= 0 else str(h) for p, h in
                    zip(wd["pid"], wd["host"], strict=True)})  # fmt: skip
    hung = not ev.of("timeout", "status").empty
    if n > 2 and hung:
        return [], [f"Ray reports {n} workers died ({', '.join(where[:3])}): most likely the "
                    "watchdog's teardown after the timeouts"]  # fmt: skip
    hosts = sorted({str(h) for h in wd["host"] if str(h)})
    return [finding("crash", "worker_died", -1, 0.4,
                    f"crash: Ray reports {'a worker' if n == 1 else f'{n} workers'} died "
                    f"({', '.join(where[:3])}): killed from outside (the OOM killer) or a fatal "
                    "error in it; its rank is not in these lines"
                    + ("; the timeouts follow from it" if hung else ""),
                    {"suspects": [], "hosts": hosts}, coords,
                    host=hosts[0] if len(hosts) == 1 else "")], []  # fmt: skip


def detect(ev: Evidence, coords) -> tuple[list, list[str]]:
    """Crash findings for fatal signals, Ray worker deaths, and torchrun's root cause or a
    rank's own exception."""
    found, notes = _crashes(ev, coords)
    ray, more = _ray_deaths(ev, coords)
    return _fatal(ev, coords) + ray + found + _tracebacks(ev, coords), notes + more


def _crashes(ev: Evidence, coords) -> tuple[list, list[str]]:
    cf = ev.of("child_failed")
    hung = not ev.of("timeout", "status").empty
    srun = ev.where(cf, lambda d: d.get("source") == "srun")
    ds = ev.where(cf, lambda d: d.get("source") == "deepspeed_launcher")
    told = ev.where(cf, lambda d: d.get("source") == "agent_signal")
    cf = cf.drop(srun.index).drop(ds.index).drop(told.index)
    if not cf.empty:
        return _child_failed(ev, cf, hung, coords)
    if not told.empty and srun.empty and ds.empty:
        return _stopped_from_outside(told, hung, coords)
    if not ds.empty:
        codes = {int(c) for c in ds["code"] if int(c) != -1}
        if hung and codes <= {-6}:  # the watchdog's abort, then the launcher's tear-down
            return [], ["DeepSpeed's launcher stopped the workers after the collective "
                        "timeouts (no return code but the watchdog's SIGABRT): the hang's "
                        "consequence"]  # fmt: skip
        return _launcher_kills(ds, hung, coords), []
    if not srun.empty:
        return [_srun(srun, coords)], []
    return _exceptions(ev, hung, coords)


LOADER_SIGNALS = {"Killed": "SIGKILL, most often the OOM killer: the workers' memory (prefetch, "
                  "pinned buffers, the dataset's copies)", "Aborted": "SIGABRT: an abort inside "
                  "the worker (a C++ library's, e.g. 'LLVM ERROR')", "Segmentation fault":
                  "SIGSEGV: a native library of the dataset's"}  # fmt: skip
"""What a data-loader worker's death by each signal word means."""


def _loader_death(e, ranks: list[int], rank: int, hung: bool, coords):
    """A rank's data-loader worker died (``DataLoader worker (pid 9382) is killed by
    signal: Killed.``): the rank failed in its input pipeline, not in training or
    communication (LlamaFactory#8043, Pai-Megatron-Patch#583)."""
    sig = str(e["detail"].get("signal", ""))
    how = f"was killed by {LOADER_SIGNALS.get(sig, sig)}" if sig else "exited unexpectedly"
    who = ranks_text(ranks) if ranks else "a rank"
    return finding("crash", "data_loader", rank, 0.5 if rank >= 0 else 0.3,
                   f"crash: {who}'s DataLoader worker {how}; the rank then failed in its input "
                   "pipeline, not in training or communication"
                   + (", and the others waited for it" if hung else ""),
                   {"exception": e["op"], "suspects": ranks, "signal": sig}, coords)  # fmt: skip


def _stopped_from_outside(told, hung: bool, coords) -> tuple[list, list[str]]:
    """torchrun's agents received a death signal (``Received 15 death signal, shutting down
    workers``) and no worker failed before it in the lines: the job was stopped from
    outside (the scheduler's time limit or preemption, a person, or a job killed for a
    failure elsewhere), no rank (nvidia-resiliency-ext#18: six agents at 17:39:41). Beside
    collective timeouts, the stop is their consequence or a cure of them: a note."""
    sigs = sorted({str(d.get("signal") or "a signal") for d in told["detail"]})
    agents = told["pid"].nunique() if "pid" in told else len(told)
    if hung:
        return [], [f"torchrun's agents received {', '.join(sigs)} and shut their workers down "
                    "after the timeouts"]  # fmt: skip
    hosts = sorted({str(h) for h in told["host"] if str(h)})
    return [finding("crash", "signal", -1, 0.35,
                    f"crash: torchrun's agent{'s' if agents > 1 else ''} received {', '.join(sigs)} "
                    "from outside and shut the workers down: the scheduler (a time limit, a "
                    "preemption), a person, or a job killed for a failure elsewhere; no rank "
                    "failed first in these lines",
                    {"suspects": [], "signals": sigs, "agents": int(agents)}, coords,
                    host=hosts[0] if len(hosts) == 1 else "")], []  # fmt: skip


def _srun(srun, coords):
    """srun's ``srun: error: nid00160: tasks 1408-1418: Aborted`` lines: the tasks that
    failed (aborted, out of memory, an exit code) before those srun terminated when it
    tore the step down (``Terminated``: victims, desihub/redrock#100); out of memory where
    srun or slurmstepd says so (``task 0: Out Of Memory``, ``Detected 1 oom-kill
    event``). srun task ids are ranks only where srun starts the ranks itself, not under
    torchrun (one task a node), so no rank is named."""
    whats = [str(d.get("what", "")) for d in srun["detail"]]
    failed = [i for i, w in enumerate(whats) if w != "Terminated"]
    oom = any("Out Of Memory" in w for w in whats)
    rows = srun.iloc[failed] if failed else srun
    tasks = "; ".join(
        f"{h or 'a node'}: tasks {d['tasks']} {d.get('what', '')}"
        for h, d in zip(rows["host"], rows["detail"], strict=True) if d.get("tasks")
    )  # fmt: skip
    hosts = sorted({str(h) for h in rows["host"] if str(h)})
    torn = len(whats) - len(failed)
    after = (
        f"; {counted(torn, 'line')} of tasks srun terminated after it (the step's tear-down)"
        if torn
        else ""
    )
    why = ("ran out of memory: the step's memory limit (its cgroup) killed them, not one rank's "
           "hardware" if oom else "failed first: their own output says why")  # fmt: skip
    return finding("crash", "out_of_memory" if oom else "exit_code", -1, 0.35 if len(hosts) == 1 else 0.3,
                   f"crash: srun reports tasks that {why} ({tasks[:200] or 'no task named'}){after}; "
                   "srun task ids are ranks only where srun starts the ranks itself (not under "
                   "torchrun)", {"suspects": [], "hosts": hosts}, coords,
                   host=hosts[0] if len(hosts) == 1 else "")  # fmt: skip


def _launcher_kills(ds, hung: bool, coords) -> list:
    """DeepSpeed's launcher killed a host's workers (``Killing subprocess 249``, one line a
    worker): one of them exited with an error first, so the failure began on that host;
    which local rank, and why, is not in these lines (DeepSpeed#4510)."""
    hosts = sorted({str(h) for h in ds["host"] if str(h)})
    killed = sum(len(d.get("killed") or []) for d in ds["detail"])
    codes = sorted({int(c) for c in ds["code"] if int(c) != -1})
    said = f" (return code {', '.join(map(str, codes))})" if codes else ""
    if -9 in codes:
        said += ": killed by SIGKILL, most often the host's OOM killer (dmesg says)"
    where = ", ".join(hosts[:4]) or "its node"
    first = "the failure began there" if len(hosts) <= 1 else "the failure began on one of them"
    whom = f"killed {killed} of its workers" if killed else "stopped its workers"
    return [finding("crash", "exit_code", -1, 0.35 if len(hosts) == 1 else 0.3,
                    f"crash: DeepSpeed's launcher on {where} {whom} after one of them exited "
                    f"with an error{said}; {first}; which local rank, and why, is not in these "
                    "lines (its own traceback says)"
                    + ("; the others' timeouts follow from it" if hung else ""),
                    {"hosts": hosts, "killed": killed, "suspects": []}, coords,
                    host=hosts[0] if len(hosts) == 1 else "")]  # fmt: skip


OTHER_FAILURES = ("timeout", "status", "desync_report", "mismatch", "child_failed",
                  "nccl_warn", "fr_missing", "gpu_error", "exception", "watchdog_stuck",
                  "fatal_signal", "init_failure", "peer_gone", "nccl_error", "worker_died")  # fmt: skip
"""Events that place a failure themselves: where one is there, a bare traceback adds
nothing."""


def _tracebacks(ev: Evidence, coords) -> list:
    """Tracebacks behind pdsh's host prefixes with no exception line (cut from the post)
    and nothing else that says a failure: a crash on those hosts, no rank; on several
    hosts at once, a cause they share (the code, the build, the environment):
    azureml-assets#302 (10.0.0.6 and 10.0.0.7 in deepspeed.initialize)."""
    tb = ev.of("traceback")
    tb = tb[tb["host"].astype(str) != ""]
    if tb.empty or not ev.of(*OTHER_FAILURES).empty:
        return []
    hosts = sorted({str(h) for h in tb["host"]})
    line = str(tb.iloc[0]["text"]).strip()[:120]
    what = (f"hosts {', '.join(hosts[:4])} each print a Python traceback: a failure on "
            "more than one host, most likely a cause they share (the code, the build, the "
            "environment), not one rank" if len(hosts) > 1 else
            f"host {hosts[0]} prints a Python traceback: a process there failed; its rank is "
            "not in these lines")  # fmt: skip
    return [finding("crash", "exception", -1, 0.3,
                    f"crash: {what} (its exception line is not in these lines; e.g. {line!r})",
                    {"hosts": hosts, "suspects": []}, coords,
                    host=hosts[0] if len(hosts) == 1 else "")]  # fmt: skip


def _child_failed(ev: Evidence, cf, hung: bool, coords) -> tuple[list, list[str]]:
    root = ev.where(cf, lambda d: d.get("root_cause"))
    root = root if not root.empty else cf
    first = sorted(range(len(root)), key=lambda i: str(root.iloc[i]["detail"].get("time") or "~"))
    e = root.iloc[first[0]]  # several agents' summaries: the earliest root cause
    code, sig = int(e["code"]), str(e["detail"].get("signal", ""))
    rank, local = int(e["rank"]), int(e["local_rank"])
    note = " (one node seen: its local rank is its global rank)" if e["mapped"] else ""
    others = sorted({int(r) for r in cf["rank"] if int(r) >= 0} - {rank})
    who = f"rank {rank}" if rank >= 0 else f"local rank {local} (its global rank is not said)"
    host = f" on {e['host']}" if str(e["host"]) else ""
    after = f"; {ranks_text(others)} failed after it" if others else ""
    sigs = {str(d.get("signal", "")) for d in cf["detail"]}
    at = _same_second(cf, e)
    if _after_desync(ev, sig):
        said = f"local rank {local}" if local >= 0 else who
        return [], [f"torchrun's first observed failure ({said}{host} {_how(code, sig)}) is the "
                    "desync's consequence: the mismatch is raised on the ranks and they exit; "
                    "it is only the first child the agent noticed"]  # fmt: skip
    if sig == "SIGABRT" and sigs <= {"SIGABRT", "SIGTERM", ""}:
        summary = (f"hang: {who}{host} was the first to abort (SIGABRT){after}: NCCL's watchdog "
                   "takes a rank down this way after a collective timed out, so it was "
                   "waiting, not at fault; the rank or link it waited for is not in these lines")  # fmt: skip
        if not (hung or len(cf) > 1 and sigs == {"SIGABRT"} or not ev.of("watchdog_stuck").empty):
            summary = (f"hang: {who}{host} was the first to abort (SIGABRT){after}: most often "
                       "NCCL's watchdog taking a rank down after a collective timed out (then it "
                       "was waiting, not at fault), but an abort inside the process (a C++ "
                       "exception, a CUDA error) exits the same way, and no timeout or error "
                       "line is in these lines: its own log says which")  # fmt: skip
        kind, cause, culprit, conf = "hang", "watchdog_abort", -1, 0.3
    elif at:
        summary = (f"crash: {ranks_text(others + [rank])}{host} all exited with code {code} in "
                   f"the same second ({at}), none stopped by the agent's signal: each failed on "
                   f"its own, and torchrun's root cause ({who}) is only the first it noticed. "
                   "The cause is common to them (the code, the data, the environment) or in "
                   "each rank's own traceback, not in these lines")  # fmt: skip
        kind, cause, culprit, conf, rank = "crash", "exit_code", -1, 0.3, -1
    else:
        launcher = LAUNCHERS.get(str(e["detail"].get("source", "")), "torchrun's")
        summary = (
            f"crash: {who}{host} {_how(code, sig)}: {launcher} first observed failure{note}{after}"
        )
        kind, cause, culprit = "crash", "signal" if sig else "exit_code", rank
        conf = 0.6 if rank >= 0 and not note else 0.45 if rank >= 0 else 0.35
        if hung:
            conf = min(conf, 0.45)
    return [finding(kind, cause, culprit, conf, summary,
                    {"exitcode": code, "signal": sig, "local_rank": local,
                     "other_failures": others,
                     "suspects": [rank] if rank >= 0 and kind == "crash" else []},
                    coords, host=str(e["host"]))], []  # fmt: skip


def _after_desync(ev: Evidence, sig: str) -> bool:
    """Whether torchrun's failure is a desync's consequence: a fingerprint mismatch or a
    desync report is in the lines and the rank exited with a code (no signal from
    outside). ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` raises the mismatch on the ranks, which
    then exit 1; the agent names the first it noticed (speechbrain#2401: 'failed
    (exitcode: 1) local_rank: 0' after rank 1's all_reduce vs rank 0's broadcast #485)."""
    return not sig and not ev.of("mismatch", "desync_report").empty


def _same_second(cf, root) -> str:
    """The second torchrun gives the root cause and every other failure whose time is
    said (at least one), where they all exited with the root's own exit code (>= 0: no
    signal, so not the ranks the agent stopped after the first failure); else "". Then
    "first observed" is no order: pytorch#121209, four ranks' exit 1 at 07:01:51."""
    when, code = str(root["detail"].get("time") or ""), int(root["code"])
    others = cf.drop(root.name)
    times = {str(d.get("time") or "") for d in others["detail"]} - {""}
    if not when or code < 0 or times != {when} or set(others["code"].astype(int)) != {code}:
        return ""
    return when


def _exceptions(ev: Evidence, hung: bool, coords) -> tuple[list, list[str]]:
    exc = ev.of("exception")
    if exc.empty:
        return [], []
    told = ev.frame[~ev.frame["kind"].isin(("exception", "present", "world"))]
    said = set(zip(told["file"], told["line"], strict=True))  # lines another detector reads
    exc = keep(exc, [(f, n) not in said for f, n in zip(exc["file"], exc["line"], strict=True)])
    launcher = ("ChildFailedError", "SignalException")
    words = TEARDOWN if hung else launcher  # without a hang, an NCCL error is a cause
    exc = keep(exc, [not any(w in t for w in words) for t in exc["text"]])
    if hung:  # the others wait: the rank that raised its own error and never timed out
        waiting = {int(r) for r in ev.of("timeout", "status")["rank"]}
        exc = keep(exc, [(int(r) >= 0 or bool(d.get("oom"))) and int(r) not in waiting
                         for r, d in zip(exc["rank"], exc["detail"], strict=True)])  # fmt: skip
        if exc.empty or exc["rank"].nunique() > 2:
            return [], []
    if exc.empty:
        return [], []
    ranks = sorted({int(r) for r in exc["rank"] if int(r) >= 0})
    e = exc.iloc[0]
    nccl = any(w in str(t) for t in exc["text"] for w in NCCL_ERRORS)
    if len(ranks) > 1 and len(ranks) * 2 > len(ev.present):
        where = ("the communicator or the network (NCCL's own error)" if nccl
                 else "the code, the data or the environment")  # fmt: skip
        return [finding("crash", "nccl_error" if nccl else "exception", -1, 0.3,
                        f"crash: {ranks_text(ranks)} raised {str(e['text']).strip()[:160]}: the "
                        f"same error on most ranks, so {where}, "
                        "not one rank", {"exception": e["op"], "suspects": []}, coords)], []  # fmt: skip
    rank = ranks[0] if len(ranks) == 1 else -1
    who = ranks_text(ranks) if ranks else "a process (rank not said)"
    while_ = ", while the others waited in their collectives" if hung else ""
    oom = bool(e["detail"].get("oom"))
    if e["detail"].get("data_loader"):
        return [_loader_death(e, ranks, rank, hung, coords)], []
    if oom and rank >= 0 and bool(e["mapped"]):
        dev = str(e["detail"].get("device", "")).replace("cuda:", "GPU ")
        who = f"rank {rank} (its message names {dev or 'its GPU'}, taken as its rank on the one node seen)"
    return [finding("crash", "out_of_memory" if oom else "exception", rank,
                    (0.45 if e["mapped"] else 0.5) if rank >= 0 else 0.3,
                    f"crash: {who} raised {str(e['text']).strip()[:200]}{while_}"
                    + (": the GPU ran out of memory (the model's or the batch's size, or "
                       "another process on that GPU), so the others then waited for it" if oom and hung
                       else ": the GPU ran out of memory" if oom else ""),
                    {"exception": e["op"], "suspects": ranks,
                     **({"device": e["detail"]["device"]} if e["detail"].get("device") else {})},
                    coords)], []  # fmt: skip
