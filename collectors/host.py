"""Host CPU, load, memory and disk, and each local rank process's CPU, memory, threads,
context switches, I/O (psutil) and CPU run delay (``/proc/<pid>/task/*/schedstat``).

CPU percentages are over the time since the previous sample (psutil's ``cpu_percent(None)``
semantics), so the first sample after start has none: its ``cpu_pct`` is NaN. A process
field the agent may not read (``io_counters`` of another user's process) is NaN.
"""

from __future__ import annotations

import math
import os

import psutil

from .base import EMPTY, Collector, NodeContext, Rows
from .local_ranks import LocalRank, LocalRanks
from .sysfs import BAD, parse_uint, read_text


class HostCollector(Collector):
    """``host_samples`` (one row per sample) and ``proc_samples`` (one per local rank)."""

    name = "host"
    tables = ("host_samples", "proc_samples")

    def __init__(
        self, ctx: NodeContext, *, interval_s: float = 1.0, local_ranks: LocalRanks | None = None
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"host interval_s must be > 0, got {interval_s}")
        self.ctx = ctx
        self.interval_s = interval_s
        self.local_ranks = local_ranks or LocalRanks(ctx.spool_dir)
        self._procs: dict[int, psutil.Process] = {}
        self._primed = False

    def open(self) -> None:
        """Start the CPU time window."""
        psutil.cpu_percent(percpu=True)

    def collect(self, now_ns: int) -> Rows:
        """A host row and a row per live local rank."""
        ranks = self.local_ranks.get()
        for pid in set(self._procs) - {lr.pid for lr in ranks}:
            del self._procs[pid]
        return {
            "host_samples": [self._host_row(now_ns)],
            "proc_samples": [r for lr in ranks if (r := self._proc_row(lr, now_ns))],
        }

    def _host_row(self, now_ns: int) -> dict:
        cores = psutil.cpu_percent(percpu=True)
        first, self._primed = not self._primed, True
        mem, swap = psutil.virtual_memory(), psutil.swap_memory()
        load = psutil.getloadavg()
        try:
            disk = psutil.disk_usage(self.ctx.data_dir)
            total, free = disk.total, disk.free
        except OSError:
            total = free = 0
        return {
            "host": self.ctx.host,
            "ts_ns": now_ns,
            "cpu_pct": EMPTY if first or not cores else sum(cores) / len(cores),
            "cpu_core_pct": ",".join(f"{c:.1f}" for c in cores),
            "cpu_cores": len(cores),
            "load1": load[0],
            "load5": load[1],
            "load15": load[2],
            "mem_total_bytes": mem.total,
            "mem_used_bytes": mem.total - mem.available,
            "mem_available_bytes": mem.available,
            "swap_used_bytes": swap.used,
            "disk_path": self.ctx.data_dir,
            "disk_total_bytes": total,
            "disk_free_bytes": free,
        }

    def _process(self, pid: int) -> tuple[psutil.Process, bool]:
        """The cached Process for ``pid`` and whether it was new (no CPU window yet)."""
        proc = self._procs.get(pid)
        if proc is not None and proc.is_running():
            return proc, False
        proc = psutil.Process(pid)
        proc.cpu_percent(None)
        self._procs[pid] = proc
        return proc, True

    def _proc_row(self, lr: LocalRank, now_ns: int) -> dict | None:
        """A ``proc_samples`` row for one rank, or None if its process is gone."""
        try:
            proc, new = self._process(lr.pid)
            with proc.oneshot():
                cpu = proc.cpu_percent(None)
                rss = proc.memory_info().rss
                threads = proc.num_threads()
                ctx = proc.num_ctx_switches()
                io = _io(proc)
        except psutil.Error:
            self._procs.pop(lr.pid, None)
            return None
        return {
            "run_id": lr.run_id,
            "attempt": lr.attempt,
            "rank": lr.rank,
            "host": self.ctx.host,
            "pid": lr.pid,
            "ts_ns": now_ns,
            "cpu_pct": EMPTY if new else cpu,
            "rss_bytes": rss,
            "threads": threads,
            "ctx_voluntary": ctx.voluntary,
            "ctx_involuntary": ctx.involuntary,
            "io_read_bytes": io[0],
            "io_write_bytes": io[1],
            "run_delay_ns": run_delay_ns(lr.pid),
        }


def run_delay_ns(pid: int, proc_root: str = "/proc") -> float:
    """Time (ns) the threads of ``pid`` have spent runnable but waiting for a CPU, summed
    over its threads: the second field of ``/proc/<pid>/task/<tid>/schedstat``
    (Documentation/scheduler/sched-stats.rst). A process that shares its core with busy
    neighbours accumulates it at up to 1 s per second. NaN where not readable; a thread
    whose file holds no unsigned 64-bit number there is left out (and counted once in
    ``sysfs.BAD``)."""
    total, found = 0, False
    try:
        tids = os.listdir(f"{proc_root}/{pid}/task")
    except OSError:
        return math.nan
    for tid in tids:
        path = f"{proc_root}/{pid}/task/{tid}/schedstat"
        fields = (read_text(path) or "").split()
        value = parse_uint(fields[1]) if len(fields) == 3 else None
        if value is None:
            if fields:
                BAD.note(path, f"{' '.join(fields)[:60]!r} is no schedstat line: not read")
            continue
        total += value
        found = True
    return float(total) if found else math.nan


def _io(proc: psutil.Process) -> tuple[float, float]:
    """(read bytes, write bytes) of ``proc``, NaN where not readable."""
    try:
        io = proc.io_counters()
        return float(io.read_bytes), float(io.write_bytes)
    except (psutil.AccessDenied, AttributeError, NotImplementedError):
        return math.nan, math.nan
