"""Crashes: the rank whose process ended first, abnormally, and why.

When one rank dies, the job dies with it: its peers fail in the next collective
(``Connection closed by peer``) or block until the launcher stops them (torchrun sends
SIGTERM, then SIGKILL). Every rank's end is therefore abnormal, and naming the right one
means ordering them. The evidence, per rank (``rank_ends`` rows and its last records):

- what the rank recorded itself (``trainer_hooks/exits.py``): ``finished``, an uncaught
  ``exception``, a ``signal`` (SIGTERM from the launcher), interpreter ``exit``; a rank
  killed outright (SIGKILL, OOM killer, segfault, ``os._exit``) recorded nothing: its
  records simply stop (``gone``);
- what the launcher saw (``ranksight/importer/torchrun_log.py``): exit codes, and its root cause
  (the first failure it observed);
- when its records stopped (progress snapshots every 2 s from the writer thread, steps),
  and what its black box says once it is gone (``collectors/postmortem.py``: the step it
  was in and its last op).

The culprit is the launcher's root cause when one is known, else the earliest abnormal
end that is not a teardown signal: a ``gone`` rank ends at its last record, an
``exception`` at the time it was recorded. Ranks that ended later are victims.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pandas as pd

from ranksight.ground.sql import RUN as _RUN
from ranksight.ground.vocab import Kind, cause_of

from ..findings import Finding, coords_at, finding_at, rank_place
from ..folds import each_crash
from .base import Detector, RunContext, Stage

if TYPE_CHECKING:
    from ..queries import RunData

ENDS = f"""
SELECT rank, source, reason, code, detail, last_step, ts_ns
FROM rank_ends WHERE {_RUN}
ORDER BY ts_ns
"""

CRASH_STACKS = f"""
SELECT rank, argMaxIf(summary, ts_ns, trigger = 'crash') AS crash_stack,
       maxIf(ts_ns, trigger = 'stopped') AS stopped_ns,
       argMaxIf(summary, ts_ns, trigger = 'stopped') AS stopped_state,
       maxIf(ts_ns, trigger = 'continued') AS continued_ns
FROM stacks WHERE {_RUN}
  AND trigger IN ('crash', 'stopped', 'continued')
GROUP BY rank
"""
"""Per rank: the Python stack written on a fatal signal (``crash_stack``, "" if none),
and the agent's view of its process state (``agent/stall.py``): when it was last seen
stopped (``stopped_ns``, 0 never) and in which state, and when it last ran again
(``continued_ns``, 0 never)."""

TEARDOWN_SIGNALS = (15, 2)
"""SIGTERM, SIGINT: how launchers stop the surviving ranks (not a cause)."""


@dataclass(frozen=True)
class RankEnd:
    """How one rank ended, merged from every source."""

    rank: int
    how: str
    """finished | exception | signal | exit | gone | exit_code"""
    at_ns: int
    """When it ended (ns): its own record's time, else its last record's."""
    code: int = -1
    """Exit code (launcher) or signal number, -1 unknown."""
    detail: str = ""
    last_step: int = -1
    root_cause: bool = False
    """The launcher observed this rank's failure first."""

    @property
    def abnormal(self) -> bool:
        """Ended by itself in a way that is not a clean end or a teardown signal."""
        if self.root_cause:
            return True
        if self.how in ("finished", "exit"):
            return False
        if self.how == "signal":
            return self.code not in TEARDOWN_SIGNALS
        if self.how == "exit_code":
            return self.code != 0 and -self.code not in TEARDOWN_SIGNALS
        return True  # exception, gone


@dataclass(frozen=True)
class CrashReport:
    """The rank that failed first, how, and how the others ended."""

    culprit: RankEnd
    ends: dict[int, RankEnd] = field(default_factory=dict)
    victims: list[int] = field(default_factory=list)


def rank_ends(ends: pd.DataFrame, last_seen: pd.Series, last_step: pd.Series) -> dict[int, RankEnd]:
    """How every rank ended. ``ends``: the ENDS query's rows; ``last_seen``: rank -> its
    newest record (ns); ``last_step``: rank -> the last step it began."""
    out: dict[int, RankEnd] = {}
    hooks = ends[ends["source"] == "hooks"] if not ends.empty else ends
    launcher = ends[ends["source"] == "launcher"] if not ends.empty else ends
    by_launcher = {int(r.rank): r for r in launcher.itertuples()} if not ends.empty else {}
    agent = ends[ends["source"] == "agent"] if not ends.empty else ends
    by_agent = {int(r.rank): r for r in agent.itertuples()} if not ends.empty else {}
    for r in hooks.itertuples() if not ends.empty else ():
        how, code, detail = _own_end(str(r.reason), int(r.code), str(r.detail),
                                     by_launcher.get(int(r.rank)))  # fmt: skip
        out[int(r.rank)] = RankEnd(int(r.rank), how, int(r.ts_ns), code, detail, int(r.last_step))
    for rank, seen in last_seen.items():
        rank = int(rank)
        lr = by_launcher.get(rank)
        root = lr is not None and "root cause" in str(lr.detail)
        step = int(last_step.get(rank, -1))
        box = by_agent.get(rank)  # its black box: the step it was in, its last op
        if box is not None and rank not in out:  # records lost with the process
            step, seen = max(step, int(box.last_step)), max(int(seen), int(box.ts_ns))
        if rank in out:
            e = out[rank]
            out[rank] = RankEnd(
                rank, e.how, e.at_ns, e.code, e.detail, max(e.last_step, step), root
            )
        elif lr is not None and int(lr.code) >= 0:  # exited with a code, said nothing
            detail = f"exit code {int(lr.code)}"
            out[rank] = RankEnd(rank, "exit_code", int(seen), int(lr.code), detail, step, root)
        else:  # no record of its own: killed outright, or by the launcher's SIGKILL
            code = int(lr.code) if lr is not None else -1
            detail = str(lr.detail) if lr is not None else "no end recorded; its records stopped"
            out[rank] = RankEnd(rank, "gone", int(seen), code, detail, step, root)
    return out


CLEAN_EXIT = "ended cleanly at interpreter exit (its hooks closed there)"
"""How a rank that ended at interpreter exit is worded when nothing says it failed: a
script under zero-code attach that never calls ``destroy_process_group`` (Lightning and
the Hugging Face Trainer on gloo) ends so on every rank."""


def _own_end(reason: str, code: int, detail: str, launcher: object) -> tuple[str, int, str]:
    """(how, code, detail) of a rank's own end record. An interpreter ``exit`` is a clean
    end (:data:`CLEAN_EXIT`) unless the launcher saw the process exit with a code other
    than 0 (``sys.exit(N)`` also ends at interpreter exit): then it is ``exit_code``."""
    if reason != "exit":
        return reason, code, detail
    exit_code = int(getattr(launcher, "code", -1)) if launcher is not None else -1
    if exit_code > 0:
        return "exit_code", exit_code, f"exit code {exit_code} at interpreter exit"
    return reason, code, CLEAN_EXIT


def find_crash(
    ends: pd.DataFrame, last_seen: pd.Series, last_step: pd.Series, run_status: str
) -> CrashReport | None:
    """The crash in a run that is over, or None (a finished run, no abnormal end, no end
    known for any rank while the run still runs, or, while it runs, every end clean but
    for ranks whose records merely stopped and whose process no one saw end: their ends
    may still be on the way)."""
    if run_status == "finished" or last_seen.empty:
        return None
    merged = rank_ends(ends, last_seen, last_step)
    if ends.empty and run_status == "running":
        return None  # a live run without ends: the hang analysis judges it
    abnormal = [e for e in merged.values() if e.abnormal]
    boxed = set(ends.loc[ends["source"] == "agent", "rank"].astype(int)) if not ends.empty else ()
    ended = [e for e in merged.values() if e.how != "gone"]
    if (
        run_status == "running"
        and all(e.how in ("finished", "exit") for e in ended)
        and all(e.how == "gone" and e.code == -1 and e.rank not in boxed for e in abnormal)
    ):
        # live, every end recorded so far clean: a rank without one, whose process no one
        # saw end, may be ending now (its last records not stored yet); its own end, the
        # agent's look at its black box, or the launcher's end decides
        return None
    if not abnormal:
        return None
    roots = [e for e in abnormal if e.root_cause]
    culprit = roots[0] if roots else min(abnormal, key=lambda e: (e.at_ns, e.rank))
    victims = sorted(r for r in merged if r != culprit.rank and merged[r].how != "finished")
    return CrashReport(culprit=culprit, ends=merged, victims=victims)


def _how(e: RankEnd) -> tuple[str, str]:
    """(cause, words) for the culprit's end."""
    if e.how == "exception":
        return "exception", f"raised {e.detail}"
    if e.how == "signal":
        return "signal", f"was killed by {e.detail or f'signal {e.code}'}"
    if e.code > 0:
        return "exit_code", f"exited with code {e.code} without an exception"
    if e.code < -1 and e.how in ("gone", "exit_code"):  # -1: no code known
        return "signal", f"was killed by signal {-e.code} ({e.detail})"
    return "gone", "stopped without a trace (killed outright: SIGKILL, the OOM killer, a segfault)"


def crash_finding(
    report: CrashReport,
    coords: pd.DataFrame,
    progress: pd.DataFrame,
    stacks: pd.DataFrame,
) -> Finding:
    """The Finding for ``report``: the culprit's end, its last step and last collectives
    (entered, completed), how the others ended, its crash stack if one was written.
    Impact 100%: the job stopped."""
    e = report.culprit
    c = coords_at(coords, e.rank)
    cause, words = _how(e)
    inflight = []
    if not progress.empty:
        # what it was blocked in: a collective or a recv (an isend completes on its own)
        mine = progress[
            (progress["rank"] == e.rank)
            & (progress["issued"] > progress["completed"])
            & (progress["direction"] != "send")
        ]
        inflight = [
            {"group_id": r.group_id, "op": r.op, "seq": int(r.issued), "members": r.members}
            for r in mine.itertuples()
        ]
    others: dict[str, list[int]] = {}
    for r in report.victims:
        how = report.ends[r].how
        key = (
            "stopped by the launcher"
            if how in ("signal", "exit_code") or report.ends[r].code in (-15, -9)
            else "failed after it"
            if how == "exception"
            else CLEAN_EXIT
            if how == "exit"
            else how
        )
        others.setdefault(key, []).append(r)
    stack = ""
    if not stacks.empty and "crash_stack" in stacks.columns:
        s = stacks[stacks["rank"] == e.rank]
        stack = str(s["crash_stack"].iloc[0]) if not s.empty else ""
    where = f" inside {inflight[0]['op']} #{inflight[0]['seq']}" if inflight else ""
    step = f" in step {e.last_step}" if e.last_step >= 0 else ""
    summary = (
        f"{rank_place(e.rank, c)} "
        f"failed first: its process {words}{step}{where}; "
        + "; ".join(f"{len(v)} rank(s) {k}" for k, v in others.items())
    )
    evidence = {
        "how": e.how,
        "code": e.code,
        "detail": e.detail,
        "last_step": e.last_step,
        "ended_ns": e.at_ns,
        "root_cause_by_launcher": e.root_cause,
        "inflight": inflight,
        "others": others,
        "ends": {
            str(r): {"how": x.how, "code": x.code, "detail": x.detail[:300]}
            for r, x in sorted(report.ends.items())
        },
    }
    if stack:
        evidence["crash_stack"] = stack[:20_000]
    return finding_at(
        Kind.CRASH,
        cause_of(cause),
        int(e.rank),
        coords,
        confidence=0.95 if e.root_cause or e.how == "exception" else 0.8,
        impact_pct=100.0,
        summary=summary,
        evidence=evidence,
    )


def crash_of(data: RunData) -> CrashReport | None:
    """The crash in ``data`` (:func:`find_crash`), from its rank ends and last records."""
    if data.ends.empty and data.run.get("status") == "running":
        return None
    seen = data.steps.groupby("rank")["end_ns"].max() if not data.steps.empty else pd.Series()
    if not data.progress.empty:
        seen = (
            pd.concat([seen, data.progress.groupby("rank")["seen_ns"].max()]).groupby(level=0).max()
        )
    if not data.ends.empty:  # a rank known only from its end (no step, no snapshot)
        seen = seen.combine_first(data.ends.groupby("rank")["ts_ns"].min())
    last_step = data.steps.groupby("rank")["step"].max() if not data.steps.empty else pd.Series()
    if not data.progress.empty and "at_step" in data.progress.columns:  # the step it was in
        last_step = (
            pd.concat([last_step, data.progress.groupby("rank")["at_step"].max()])
            .groupby(level=0)
            .max()
        )
    return find_crash(data.ends, seen, last_step, str(data.run.get("status", "")))


def crash_report(run: RunContext) -> CrashReport | None:
    """The run's crash (:func:`crash_of`), computed once; None for an imported run."""
    return run.once("crash", lambda: None if run.imported else crash_of(run.data))


def detect(run: RunContext, found: list[Finding]) -> tuple[list[Finding], list[str]]:
    """The crash finding of a hooked run, if a rank ended abnormally."""
    report = crash_report(run)
    if report is None:
        return [], []
    d = run.data
    return [crash_finding(report, run.coords, d.progress, d.crash_stacks)], []


DETECTOR = Detector(Kind.CRASH, Stage.STOP, detect, hooked_only=True, fold=each_crash)
