"""GPU causes of a compute straggler, from the node agents' NVML tables.

A compute straggler whose host-side causes (GC, CPU contention; ``causes.py``) do not
explain it is checked against its GPU, over the window of its slow steps, compared with
the GPUs of its same-stage peers:

- ``gpu_throttle``: the rank's GPU reported a slowdown reason in at least ``min_share`` of
  its samples (``gpu_samples.clock_events``, the bitmask of
  ``nvmlDeviceGetCurrentClocksEventReasons``) more often than its peers' GPUs did, and its
  mean SM clock was at most ``clock_ratio`` times the median of the peers' GPUs. The
  reasons and their bits are those of the NVML API reference, "Clocks Event Reasons"
  (nvml.h; https://docs.nvidia.com/deploy/nvml-api/group__nvmlClocksEventReasons.html):
  ``HwSlowdown 0x8``, ``HwThermalSlowdown 0x40``, ``HwPowerBrakeSlowdown 0x80``,
  ``SwThermalSlowdown 0x20``, ``SwPowerCap 0x4``. A power cap every GPU hits at full load
  (as on the recorded H200 run in tests/data/nvml) is no cause: the clock test compares
  with peers that are capped too.
- ``gpu_thermal``: ``gpu_throttle`` whose most severe reason is a thermal one
  (:data:`THERMAL_REASONS`: ``HwThermalSlowdown 0x40``, ``SwThermalSlowdown 0x20``): the
  GPU ran hot (cooling, airflow, a neighbour's heat), which the evidence's
  ``max_temperature_c`` shows; a power brake, an external ``HwSlowdown`` or a power cap
  stays ``gpu_throttle``.
- ``gpu_contention``: a process that is none of the job's ranks (``gpu_procs``: not this
  run's rank, and not a rank's pid on that host) was on the rank's GPU in at least
  ``min_share`` of the process reads of that GPU in the window, while such a process was
  on fewer than half of the peers' GPUs.

The rank's GPU is ``ranks.device`` where it is a GPU UUID (``GPU-...``/``MIG-...``, as the
hooks record it), else the GPU ``gpu_procs`` saw the rank's process on. Every query is
bounded to the suspect's and its peers' hosts and GPUs and to the window; all run on
ClickHouse 18.16 and chdb.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from ranksight.collectors.nvml_read import CLOCK_EVENT_NAMES
from ranksight.ground.sql import RUN as _RUN

_BIT_OF = {name: bit for bit, name in CLOCK_EVENT_NAMES}
SLOWDOWN_REASONS: tuple[tuple[int, str], ...] = tuple(
    (_BIT_OF[name], name)
    for name in (
        "hw_power_brake_slowdown",
        "hw_thermal_slowdown",
        "hw_slowdown",
        "sw_thermal_slowdown",
        "sw_power_cap",
    )
)
"""(bit, name) of the NVML clock-event reasons that lower clocks under load, most severe
first; the bits are ``collectors/nvml_read.CLOCK_EVENT_NAMES`` (nvml.h's
``nvmlClocksEventReason*`` / ``nvmlClocksThrottleReason*``)."""
THERMAL_REASONS = ("hw_thermal_slowdown", "sw_thermal_slowdown")
"""Slowdown reasons that mean the GPU ran hot (nvml.h: ``HwThermalSlowdown`` "the GPU
temperature is too high", ``SwThermalSlowdown`` "the current clocks are lowered to keep
the GPU and memory temperature below their limits")."""
NVML_DOC = "https://docs.nvidia.com/deploy/nvml-api/group__nvmlClocksEventReasons.html"

_WHERE = """host IN %(hosts)s AND gpu_uuid IN %(gpus)s
  AND ts_ns >= %(since_ns)s AND ts_ns <= %(until_ns)s"""
_BIT_COUNTS = ",\n       ".join(
    f"countIf(clock_events >= 0 AND bitAnd(clock_events, %(bit_{n})s) != 0) AS n_{n}"
    for _, n in SLOWDOWN_REASONS
)
SAMPLES = f"""
SELECT gpu_uuid, any(host) AS gpu_host, any(gpu_index) AS index_on_host, count() AS samples,
       avgIf(sm_clock_mhz, NOT isNaN(sm_clock_mhz)) AS sm_mhz,
       countIf(NOT isNaN(sm_clock_mhz)) AS sm_known,
       maxIf(sm_clock_max_mhz, NOT isNaN(sm_clock_max_mhz)) AS sm_peak_mhz,
       avgIf(power_w, NOT isNaN(power_w)) AS watts,
       maxIf(power_limit_w, NOT isNaN(power_limit_w)) AS limit_w,
       maxIf(temperature_c, NOT isNaN(temperature_c)) AS hottest_c,
       countIf(clock_events >= 0) AS reasons_known,
       {_BIT_COUNTS}
FROM gpu_samples WHERE {_WHERE}
GROUP BY gpu_uuid
"""
"""Per GPU over the window: samples, mean SM clock (MHz), mean power (W), hottest
temperature (°C), and how many samples had each slowdown reason set."""

PROCS = f"""
SELECT gpu_uuid, pid, any(host) AS proc_host, any(run_id) AS proc_run, any(attempt) AS proc_attempt,
       max(rank) AS proc_rank, count() AS seen,
       maxIf(used_mem_bytes, NOT isNaN(used_mem_bytes)) AS mem_bytes,
       min(ts_ns) AS first_ns, max(ts_ns) AS last_ns
FROM gpu_procs WHERE {_WHERE}
GROUP BY gpu_uuid, pid
"""
"""Per (GPU, process) over the window: how many process reads saw it, its most memory."""

READS = f"""
SELECT gpu_uuid, uniqExact(ts_ns) AS reads
FROM gpu_procs WHERE {_WHERE}
GROUP BY gpu_uuid
"""
"""Per GPU: how many process reads found at least one process (the job's rank is one)."""

RANK_GPUS = f"""
SELECT rank, argMax(gpu_uuid, ts_ns) AS rank_gpu
FROM gpu_procs
WHERE {_RUN} AND rank IN %(ranks)s
  AND host IN %(hosts)s AND ts_ns >= %(since_ns)s AND ts_ns <= %(until_ns)s
GROUP BY rank
"""
"""The GPU each of ``ranks``' processes was last seen on (for ranks whose device is no
GPU UUID)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuCauseConfig:
    """Thresholds of the GPU cause tests."""

    min_share: float = 0.5
    """Share of the window's samples (or process reads) that must show the reason (or the
    foreign process): 0.5 = at least half of them."""
    clock_ratio: float = 0.85
    """The rank's mean SM clock at most this times its peers' median: 0.85 = 15% lower."""

    def __post_init__(self) -> None:
        if not 0 < self.min_share <= 1:
            raise ValueError(f"min_share must be in (0, 1], got {self.min_share}")
        if not 0 < self.clock_ratio < 1:
            raise ValueError(f"clock_ratio must be in (0, 1), got {self.clock_ratio}")


@dataclass(frozen=True, slots=True)
class GpuTables:
    """What :func:`fetch_gpu_tables` loads: ``SAMPLES``, ``PROCS`` and ``READS`` rows."""

    samples: pd.DataFrame
    procs: pd.DataFrame
    reads: pd.DataFrame
    gpus: dict[int, str] = field(default_factory=dict)
    """rank -> GPU UUID the tables were loaded for."""


def is_gpu_uuid(device: object) -> bool:
    """True for an NVML UUID (``GPU-...`` or ``MIG-...``)."""
    return isinstance(device, str) and device.startswith(("GPU-", "MIG-"))


def fetch_gpu_tables(
    query: Callable[[str, dict], pd.DataFrame],
    params: dict,
    ranks: pd.DataFrame,
    wanted: list[int],
    since_ns: int,
    until_ns: int,
) -> GpuTables:
    """Load the GPU tables for the ranks ``wanted`` (rank, host, device rows in ``ranks``)
    over ``[since_ns, until_ns]``. ``query(sql, params)`` runs one query (the store's);
    ``params`` holds run_id and attempt. Raises what ``query`` raises."""
    mine = ranks.set_index("rank").loc[[r for r in wanted if r in set(ranks["rank"])]]
    hosts = tuple(sorted(set(mine["host"].astype(str)))) or ("",)
    window = {"hosts": hosts, "since_ns": int(since_ns), "until_ns": int(until_ns)}
    gpus = {int(r): str(d) for r, d in mine["device"].items() if is_gpu_uuid(d)}
    missing = [int(r) for r in mine.index if int(r) not in gpus]
    if missing:
        found = query(RANK_GPUS, {**params, **window, "ranks": tuple(missing)})
        gpus.update({int(r): str(g) for r, g in zip(found["rank"], found["rank_gpu"], strict=True)})
    if not gpus:
        empty = pd.DataFrame()
        return GpuTables(empty, empty, empty, gpus)
    p = {**window, "gpus": tuple(sorted(set(gpus.values())))}
    bits = {f"bit_{n}": b for b, n in SLOWDOWN_REASONS}
    return GpuTables(query(SAMPLES, {**p, **bits}), query(PROCS, p), query(READS, p), gpus)


def _shares(samples: pd.DataFrame) -> pd.DataFrame:
    """GPU UUID x reason name: share of the samples with a known mask that had it set."""
    known = samples.set_index("gpu_uuid")["reasons_known"].astype(float).where(lambda k: k > 0)
    cols = {n: samples.set_index("gpu_uuid")[f"n_{n}"].astype(float) for _, n in SLOWDOWN_REASONS}
    return pd.DataFrame(cols).div(known, axis=0)


def throttle_evidence(
    own: str, peers: list[str], samples: pd.DataFrame, cfg: GpuCauseConfig
) -> tuple[bool, dict]:
    """``(throttled, evidence)`` for GPU ``own`` against the ``peers`` GPUs (UUIDs) from
    ``SAMPLES`` rows (see the module docstring)."""
    if samples.empty or own not in set(samples["gpu_uuid"]):
        return False, {}
    by = samples.set_index("gpu_uuid")
    shares = _shares(samples)
    peer_ids = [g for g in peers if g in by.index and g != own]
    clock = float(by.at[own, "sm_mhz"]) if by.at[own, "sm_known"] > 0 else float("nan")
    peer_clock = by.loc[peer_ids, "sm_mhz"].where(by.loc[peer_ids, "sm_known"] > 0).median()
    peer_share = shares.loc[peer_ids].median() if peer_ids else shares.loc[own] * 0
    mine = shares.loc[own]
    above = [
        n
        for _, n in SLOWDOWN_REASONS
        if mine[n] >= cfg.min_share and mine[n] - peer_share[n] >= 0.5 * cfg.min_share
    ]
    evidence = {
        "gpu": _gpu_info(by, own),
        "sm_clock_mhz": _round(clock),
        "peers_sm_clock_mhz": _round(peer_clock),
        "sm_clock_max_mhz": _round(by.at[own, "sm_peak_mhz"]),
        "power_w": _round(by.at[own, "watts"]),
        "power_limit_w": _round(by.at[own, "limit_w"]),
        "max_temperature_c": _round(by.at[own, "hottest_c"]),
        "samples": int(by.at[own, "samples"]),
        "peer_gpus": len(peer_ids),
        "slowdown_share": {n: _round(mine[n], 2) for _, n in SLOWDOWN_REASONS if mine[n] > 0},
        "peers_slowdown_share": {
            n: _round(peer_share[n], 2) for _, n in SLOWDOWN_REASONS if peer_share[n] > 0
        },
    }
    slow_clock = (
        clock == clock and peer_clock == peer_clock and clock <= cfg.clock_ratio * peer_clock
    )
    if not above or not slow_clock:
        return False, evidence
    bit = dict((n, b) for b, n in SLOWDOWN_REASONS)[above[0]]
    evidence["nvml_reason"] = {
        "name": above[0],
        "bit": f"{bit:#x}",
        "all": [f"{n} ({dict((m, b) for b, m in SLOWDOWN_REASONS)[n]:#x})" for n in above],
        "source": f"nvmlDeviceGetCurrentClocksEventReasons; {NVML_DOC}",
    }
    return True, evidence


def contention_evidence(
    own: str,
    peers: list[str],
    tables: GpuTables,
    job: pd.DataFrame,
    run_id: str,
    attempt: int,
    cfg: GpuCauseConfig,
) -> tuple[bool, dict]:
    """``(contended, evidence)``: another process than the job's ranks on GPU ``own``
    (see the module docstring). ``job``: the run's ranks (rank, host, pid)."""
    procs, reads = tables.procs, tables.reads
    if procs.empty or reads.empty:
        return False, {}
    foreign = _foreign(procs, job, run_id, attempt)
    n_reads = reads.set_index("gpu_uuid")["reads"].astype(float)
    reads_of = [float(n_reads.get(g, np.nan)) for g in foreign["gpu_uuid"]]
    share = (foreign["seen"].astype(float) / np.asarray(reads_of, dtype=float)).fillna(0.0)
    foreign = foreign.assign(share=share)
    busy = set(foreign.loc[foreign["share"] >= cfg.min_share, "gpu_uuid"])
    mine = foreign[foreign["gpu_uuid"] == own].sort_values("share", ascending=False)
    peer_ids = [g for g in peers if g in set(n_reads.index) and g != own]
    peers_busy = sum(g in busy for g in peer_ids)
    evidence = {
        "other_processes": [
            {
                "pid": int(r.pid),
                "present_share": round(float(r.share), 2),
                "gpu_mem_mb": _round(r.mem_bytes / 2**20, 0),
                "first_seen_ns": int(r.first_ns),
                "last_seen_ns": int(r.last_ns),
            }
            for r in mine.head(5).itertuples()
        ],
        "process_reads": int(n_reads.get(own, 0)),
        "peer_gpus_with_other_processes": f"{peers_busy} of {len(peer_ids)}",
    }
    contended = own in busy and peers_busy < 0.5 * max(len(peer_ids), 1)
    return contended, evidence


def _foreign(procs: pd.DataFrame, job: pd.DataFrame, run_id: str, attempt: int) -> pd.DataFrame:
    """``PROCS`` rows of processes that are none of the job's ranks: not recorded as this
    run's rank and not a rank's pid on the GPU's host."""
    ours = (procs["proc_run"] == run_id) & (procs["proc_attempt"] == attempt)
    ours &= procs["proc_rank"] >= 0
    pids = set(zip(job["host"].astype(str), job["pid"].astype(int), strict=True))
    on_host = [
        (str(h), int(p)) in pids for h, p in zip(procs["proc_host"], procs["pid"], strict=True)
    ]
    return procs[~ours & ~np.asarray(on_host, dtype=bool)]


def gpu_cause(
    rank: int,
    peers: list[int],
    tables: GpuTables,
    job: pd.DataFrame,
    run_id: str,
    attempt: int,
    cfg: GpuCauseConfig | None = None,
) -> tuple[str | None, dict]:
    """``(cause, evidence)`` for a compute straggler ``rank`` against its same-stage
    ``peers``: ``gpu_thermal``, ``gpu_throttle``, ``gpu_contention`` or None (no GPU cause found, or no
    GPU records). Evidence goes under ``gpu`` keys either way where there are records."""
    cfg = cfg or GpuCauseConfig()
    own = tables.gpus.get(rank)
    if own is None:
        return None, {}
    peer_gpus = [tables.gpus[p] for p in peers if p in tables.gpus]
    throttled, t_ev = throttle_evidence(own, peer_gpus, tables.samples, cfg)
    contended, c_ev = contention_evidence(own, peer_gpus, tables, job, run_id, attempt, cfg)
    evidence = {}
    if t_ev:
        evidence["gpu_clocks"] = t_ev
    if c_ev:
        evidence["gpu_processes"] = c_ev
    if throttled:
        hot = t_ev["nvml_reason"]["name"] in THERMAL_REASONS
        return ("gpu_thermal" if hot else "gpu_throttle"), evidence
    if contended:
        return "gpu_contention", evidence
    return None, evidence


def slow_window(steps: pd.DataFrame, rank: int, slow_steps: list[int]) -> tuple[int, int]:
    """``(since_ns, until_ns)``: from the start of the first of ``slow_steps`` (earliest
    rank) to the end of the rank's last one. Raises ValueError for no slow steps."""
    if not slow_steps:
        raise ValueError(f"rank {rank}: no slow steps to take a window from")
    first, last = min(slow_steps), max(slow_steps)
    since = int(steps.loc[steps["step"] == first, "start_ns"].min())
    mine = steps[(steps["rank"] == rank) & (steps["step"] == last)]
    until = int(mine["end_ns"].max()) if len(mine) else int(steps["end_ns"].max())
    return since, until


def _gpu_info(by: pd.DataFrame, uuid: str) -> dict:
    return {
        "uuid": uuid,
        "host": str(by.at[uuid, "gpu_host"]),
        "index": int(by.at[uuid, "index_on_host"]),
    }


def _round(x: Any, digits: int = 1) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return round(v, digits) if v == v and abs(v) != float("inf") else None


def slow_steps_of(s, ratio: float = 1.25) -> list[int]:
    """Steps from a straggler's onset (``straggler.SlowRank`` ``s``) at which its compute
    self time was over ``ratio`` times its peers' median."""
    own = s.self_ns.reindex(s.excess_ns.index)
    peer = s.peer_median_ns.reindex(s.excess_ns.index)
    return [int(step) for step in own.index[(own > ratio * peer).to_numpy()]]


def refine_gpu_cause(data, s, peers: list[int]) -> tuple[str | None, dict]:
    """:func:`gpu_cause` for the straggler ``s`` (``straggler.SlowRank``) of the run
    ``data`` (``queries.RunData``) over the window of its slow steps; ``(None, {})`` where
    the run has no GPU tables to read (``data.fetch_gpu`` None) or no slow step."""
    if getattr(data, "fetch_gpu", None) is None:
        return None, {}
    steps = slow_steps_of(s) or [int(i) for i in s.excess_ns.index]
    if not steps:
        return None, {}
    since, until = slow_window(data.steps, s.rank, steps)
    tables = data.fetch_gpu(data.ranks, [s.rank, *peers], since, until)
    job = data.ranks[["rank", "host", "pid"]]
    return gpu_cause(s.rank, peers, tables, job, data.run_id, data.attempt)
