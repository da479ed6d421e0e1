"""Faults injected into a running job from outside it, as an operator (or a noisy
neighbour) would: a CPU quota on one rank's cgroup, SIGSTOP/SIGCONT, SIGKILL. The job's
code knows nothing of them. Ranks are found by their process's environment
(``LOCAL_RANK``) and command line, as torchrun and PyTorch Lightning's launcher start them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator

import psutil

CPU_CGROUP_ROOTS = ("/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct")
"""cgroup v1 mounts of the cpu controller (the v2 unified tree is tried after them)."""


def rank_process(
    marker: str, local_rank: int, timeout_s: float = 120.0, within: int | None = None
) -> psutil.Process:
    """The running process whose command line contains ``marker`` and whose environment
    has ``LOCAL_RANK=local_rank``, waiting up to ``timeout_s``; with ``within`` (a pid)
    only that process's descendants count, so a rank left behind by an earlier job of
    the same script is never taken. Raises TimeoutError naming both when none shows up."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for p in _candidates(within):
            try:
                if marker in " ".join(p.info["cmdline"] or ()) and p.environ().get(
                    "LOCAL_RANK"
                ) == str(local_rank):
                    return p
            except psutil.Error:
                continue
        time.sleep(0.2)
    raise TimeoutError(f"no process with {marker!r} and LOCAL_RANK={local_rank} in {timeout_s} s")


def _candidates(within: int | None) -> list[psutil.Process]:
    """Every process (``within`` None), or the descendants of pid ``within`` (none once
    it is gone); each with its ``cmdline`` in ``info``."""
    if within is None:
        return list(psutil.process_iter(["cmdline"]))
    try:
        found = psutil.Process(within).children(recursive=True)
    except psutil.Error:
        return []
    for p in found:
        try:
            p.info = {"cmdline": p.cmdline()}
        except psutil.Error:
            p.info = {"cmdline": None}
    return found


def kill_tree(pid: int) -> None:
    """SIGKILL process ``pid`` and every descendant of it (those it started and left
    running: torchrun's ranks when a launcher is killed on a timeout). Quiet about
    processes already gone."""
    try:
        root = psutil.Process(pid)
        family = [*root.children(recursive=True), root]
    except psutil.Error:
        return
    for p in family:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(family, timeout=10)


def _cpu_cgroup_root() -> tuple[str, str] | None:
    """(folder, version) of a writable cpu cgroup hierarchy, or None."""
    for root in CPU_CGROUP_ROOTS:
        if os.access(os.path.join(root, "cpu.cfs_quota_us"), os.W_OK):
            return root, "v1"
    unified = "/sys/fs/cgroup"
    controllers = os.path.join(unified, "cgroup.subtree_control")
    if os.path.isfile(controllers) and "cpu" in open(controllers).read().split():
        return unified, "v2"
    return None


def cgroup_available() -> bool:
    """Whether a CPU quota can be put on a process here (root, a writable cpu cgroup)."""
    return _cpu_cgroup_root() is not None


@contextlib.contextmanager
def cpu_quota(pid: int, percent: float) -> Iterator[str]:
    """Move process ``pid`` (all its threads) into a new cpu cgroup allowed ``percent`` of
    one CPU (CFS quota over a 100 ms period) for the ``with`` block; yields the cgroup's
    folder. Raises OSError if no writable cpu cgroup exists."""
    found = _cpu_cgroup_root()
    if found is None:
        raise OSError("no writable cpu cgroup (needs root and /sys/fs/cgroup/cpu)")
    root, version = found
    folder = os.path.join(root, f"ranksight-test-{uuid.uuid4().hex[:8]}")
    os.mkdir(folder)
    quota = int(100_000 * percent / 100)
    try:
        if version == "v1":
            _write(os.path.join(folder, "cpu.cfs_period_us"), "100000")
            _write(os.path.join(folder, "cpu.cfs_quota_us"), str(quota))
        else:
            _write(os.path.join(folder, "cpu.max"), f"{quota} 100000")
        _write(os.path.join(folder, "cgroup.procs"), str(pid))
        yield folder
    finally:
        with contextlib.suppress(OSError):
            _write(os.path.join(root, "cgroup.procs"), str(pid))
        for _ in range(50):
            try:
                os.rmdir(folder)
                break
            except OSError:
                time.sleep(0.1)


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


@contextlib.contextmanager
def duty_cycle(pid: int, run_ms: float, stop_ms: float) -> Iterator[None]:
    """SIGSTOP/SIGCONT ``pid`` from a thread for the ``with`` block: it runs ``run_ms``,
    then is stopped ``stop_ms``, over and over (the fallback slowdown where no cgroup can
    be written). Leaves it running."""
    done = threading.Event()

    def cycle() -> None:
        while not done.is_set():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
            done.wait(stop_ms / 1000)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
            done.wait(run_ms / 1000)

    t = threading.Thread(target=cycle, daemon=True)
    t.start()
    try:
        yield
    finally:
        done.set()
        t.join()
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


@contextlib.contextmanager
def slowed(pid: int, percent: float = 3.0) -> Iterator[str]:
    """Leave ``pid`` about ``percent`` % of one CPU for the ``with`` block: a CPU quota
    where a cgroup can be written, else a SIGSTOP/SIGCONT duty cycle (runs ``percent``
    of each 200 ms); yields which (``"cgroup"`` or ``"sigstop"``). A few percent slows
    a rank even on a machine whose other processes already leave it a small share."""
    if cgroup_available():
        with cpu_quota(pid, percent):
            yield "cgroup"
    else:
        with duty_cycle(pid, run_ms=2 * percent, stop_ms=2 * (100 - percent)):
            yield "sigstop"
