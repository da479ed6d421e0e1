"""The object a training script holds: steps, phases, collectives, run identity.

Usage (after ``init_process_group``)::

    hooks = trainer_hooks.attach(mesh={"dp": 0, "tp": 1, "pp": 0})
    for step in range(n):
        with hooks.step(step) as s:
            with hooks.phase("data_wait"):
                batch = next(loader)
            ...
            s.set(loss=loss.item(), tokens=n_tokens, lr=lr)
    hooks.close()
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import json
import math
import os
import socket
import threading
import time
from typing import Any

import psutil
import torch.distributed as dist

from ranksight.ground import env

from .api_patch import instrument_ddp, patch_api
from .blackbox import BlackBox, blackbox_path
from .collective_log import BlockedClock, CollectiveLog
from .collectives import DispatchRecorder
from .completeness import DispatchCounter, write_counts
from .config import HooksConfig
from .device_timing import DeviceClock, DeviceTimer
from .exits import ExitRecorder, crash_stack_path
from .flight_recorder import DumpOnRequest
from .folders import spool_root_problem
from .fr_ring import FrRing, choose, native_groups
from .gc_pauses import GcRecorder
from .guard import SELF, Guard, guarded, warn
from .rank_mesh import RankIdentity
from .spool import SpoolWriter, spool_path
from .values import INT32, UINT32, UINT64, coordinates, name, real, whole
from .waits import patch_async_waits, patch_work_wait

KNOWN_BACKENDS = ("gloo", "nccl")
"""Backends the hooks are built and tested for; another one gets a warning at attach."""


def _cuda_module() -> Any:
    """``torch.cuda`` where CUDA is available, else None."""
    try:
        import torch

        return torch.cuda if torch.cuda.is_available() else None
    except Exception:  # noqa: BLE001 - no GPU memory in the heartbeat then
        return None


DEVICE_PHASES = frozenset({"forward", "backward", "optimizer"})
"""Phases timed on the device on a CUDA rank. Others (``data_wait``, ``checkpoint``, names
a script makes up) are host work: a start event would complete only once the GPU had
drained what was queued before, and hide a data-loader stall shorter than that. A device
span includes the time the phase's stream waited for collectives inside it (a TP
all_reduce waiting for a slow peer): its ``wait_ns`` is then their device time
(``DeviceTimer._device_wait`` in :mod:`.device_timing`)."""


class _Phase:
    """Context manager timing one phase; blocked collective time inside is its wait_ns.

    On a CUDA rank (device timing on) a compute phase (:data:`DEVICE_PHASES`) also gets
    CUDA events on the current stream at enter and exit, and its record carries the
    device's times: a GPU slowed by another process, throttled clocks or slow kernels
    shows in its compute phases, which the host, running ahead of the device, does not
    see (MegaScale, NSDI 2024, 4.1: CUDA events around critical segments). The record
    then leaves once the resolver thread has read the events."""

    __slots__ = ("_hooks", "_name", "_microbatch", "_stage", "_t0", "_w0", "_rec")

    def __init__(self, hooks: Hooks, name: str, microbatch: int, stage: int) -> None:
        self._hooks, self._name, self._microbatch, self._stage = hooks, name, microbatch, stage
        self._t0 = 0
        self._rec: dict[str, Any] | None = None
        """The record its CUDA start event is kept under (device-timed phases only)."""

    @property
    def guard(self) -> Guard:
        return self._hooks._guard

    @guarded("phase enter", default=SELF)
    def __enter__(self) -> _Phase:
        h = self._hooks
        h._phase_stack.append(self._name)
        self._w0 = h._clock.total_ns
        if h._device is not None and self._name in DEVICE_PHASES:
            try:
                rec: dict[str, Any] = {}
                h._device.start_phase(rec)
                self._rec = rec
            except Exception:  # noqa: BLE001 - host times then; never the job's error
                h._device_errors += 1
        self._t0 = time.time_ns()
        return self

    @guarded("phase exit")
    def __exit__(self, *exc: object) -> None:
        t1 = time.time_ns()
        h = self._hooks
        stack = h._phase_stack
        if stack and stack[-1] == self._name:
            stack.pop()
        elif self._name in stack:  # phases not nested (exited in another order)
            del stack[len(stack) - 1 - stack[::-1].index(self._name)]
        if not self._t0:  # its enter failed (counted there)
            return
        rec = h._phase_record(self._name, self._t0, t1, h._clock.total_ns - self._w0,
                              self._microbatch, self._stage)  # fmt: skip
        if self._rec is not None:
            self._rec.update(rec)  # the dict the start event is kept under
            try:
                if h._device is not None and h._device.end(self._rec):
                    return
            except Exception:  # noqa: BLE001 - host times then; never the job's error
                h._device_errors += 1
        h._put(rec)


class _Step:
    """Context manager for one training step; ``set()`` adds the heartbeat values."""

    __slots__ = ("_hooks", "_step", "_t0", "loss", "tokens", "lr", "grad_norm")

    def __init__(self, hooks: Hooks, step: int) -> None:
        self._hooks, self._step, self._t0 = hooks, step, 0
        self.loss, self.tokens, self.lr, self.grad_norm = math.nan, 0, math.nan, math.nan

    @property
    def guard(self) -> Guard:
        return self._hooks._guard

    @guarded("step set")
    def set(
        self,
        *,
        loss: float | None = None,
        tokens: int | None = None,
        lr: float | None = None,
        grad_norm: float | None = None,
        **others: Any,
    ) -> None:
        """Record this step's loss (None where this rank has none), tokens processed by
        this rank, learning rate, and the gradient norm (the total norm the script
        computed, e.g. ``clip_grad_norm_``'s return value; None where it has none).
        Never raises: a value that is not a number (``tokens``: not a whole number
        >= 0) is recorded as NaN (``tokens``: 0), with one warning per field
        (:mod:`.values`); a keyword it does not know is dropped the same way."""
        g = self._hooks._guard
        self.loss = real(g, "loss", loss)
        self.tokens = whole(g, "tokens", tokens, UINT64, 0)
        self.lr = real(g, "lr", lr)
        self.grad_norm = real(g, "grad_norm", grad_norm)
        for key, value in others.items():
            g.dropped(f"step value {key}", value, "is not one ranksight records "
                      "(loss, tokens, lr, grad_norm)")  # fmt: skip

    @guarded("step enter", default=SELF)
    def __enter__(self) -> _Step:
        self._hooks._step = self._step
        self._t0 = time.time_ns()
        if self._hooks._blackbox is not None:
            self._hooks._blackbox.set_step(self._step, self._t0)
        if self._hooks._ring is not None:
            self._hooks._ring.timeline.step(self._step, self._t0)
        return self

    @guarded("step exit")
    def __exit__(self, exc_type: object, *exc: object) -> None:
        t1 = time.time_ns()
        h = self._hooks
        if exc_type is not None or not self._t0:  # the step did not complete: no step
            return  # record (its loss was never set); how the rank ended goes to rank_ends
        if h._identity.pending:  # a step done: the mesh is what it will be (.rank_mesh)
            h._identity.settle()
        try:
            h._put(
                {
                    "t": "steps",
                    "step": self._step,
                    "start_ns": self._t0,
                    "end_ns": t1,
                    "loss": self.loss,
                    "tokens": self.tokens,
                    "lr": self.lr,
                    "rss_bytes": h._rss(),
                    "grad_norm": self.grad_norm,
                    **h._gpu_memory(),
                }
            )
            h._log.drain()
            h._put_stats()
        finally:
            h._step = -1


class Hooks:
    """Records one rank's steps, phases and collectives into the node's spool.

    Build it with :func:`attach`, not directly. Every method is safe to call from the
    training loop: none blocks on I/O, and bookkeeping errors are counted, not raised.
    """

    _spool: SpoolWriter
    """The rank's spool; set in ``_start`` before anything can put a record (absent only
    where ``_start`` failed before it: :meth:`_abandon` checks)."""

    def __init__(
        self,
        config: HooksConfig,
        *,
        mesh: dict[str, int] | None = None,
        mesh_shape: dict[str, int] | None = None,
        meta: dict[str, Any] | None = None,
        mesh_final: bool = True,
    ) -> None:
        self.config = config
        self._mesh_final = mesh_final
        """False: ``mesh`` is a guess (auto-attach); see :mod:`.rank_mesh`."""
        self._guard = Guard()
        self._counter: DispatchCounter | None = None
        self._mode: DispatchRecorder | None = None
        self._undo: list[Any] = []
        try:
            self._start(mesh, mesh_shape, meta)
        except BaseException:
            self._abandon()
            raise

    def _abandon(self) -> None:
        """Undo what a failed start installed (patches, signal handlers, threads)."""
        for mode in (self._counter, self._mode):
            try:
                if mode is not None:
                    mode.__exit__(None, None, None)
            except Exception:  # noqa: BLE001 - undo the rest
                pass
        for undo in reversed(self._undo):
            try:
                undo()
            except Exception:  # noqa: BLE001 - undo the rest
                pass
        spool: SpoolWriter | None = getattr(self, "_spool", None)
        if spool is not None:
            spool.close()

    def _start(self, mesh: Any, mesh_shape: Any, meta: Any) -> None:
        config, g = self.config, self._guard
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self._step = -1
        self._phase_stack: list[str] = []
        self._clock = BlockedClock()
        self._proc = psutil.Process()
        self._cuda = _cuda_module()
        self._closed = False
        header = {"run_id": config.run_id, "attempt": config.attempt, "rank": self.rank}
        path = spool_path(config.spool_dir, config.run_id, config.attempt, self.rank)
        problem = spool_root_problem(config.spool_dir)
        if problem:
            warn(f"ranksight: {problem}", stacklevel=5)
        self._spool = SpoolWriter(
            path,
            header,
            max_buffered=config.max_buffered_records,
            budget_bytes=config.spool_budget_bytes,
            flush_interval_s=config.flush_interval_s,
            segment_bytes=config.spool_segment_bytes,
            tick=self._progress,
        )
        if self._spool.error:
            warn(f"ranksight: {self._spool.error}; records will be dropped", stacklevel=5)
        backend = str(dist.get_backend()).lower()
        if not any(b in backend for b in KNOWN_BACKENDS):
            warn(
                f"ranksight: process-group backend {backend!r} is not one ranksight knows "
                f"({', '.join(KNOWN_BACKENDS)}): its collectives are recorded where the "
                "training code issues them (host times; no Flight Recorder)",
                stacklevel=5,
            )
        self._fr = DumpOnRequest(os.path.dirname(path), self.rank)
        mesh = coordinates(g, "mesh", mesh, -1)
        ranks_record = {
            "t": "ranks",
            "world_size": self.world_size,
            "host": socket.gethostname(),
            "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
            "pid": os.getpid(),
            "device": _device_name(),
            "backend": str(dist.get_backend()),
            "dp": int(mesh.get("dp", -1)),
            "tp": int(mesh.get("tp", -1)),
            "pp": int(mesh.get("pp", -1)),
            "start_ns": time.time_ns(),
        }
        self._meta = meta
        self._run_record = None
        if self.rank == 0:
            shape = coordinates(g, "mesh_shape", mesh_shape, 1)
            self._run_record = {
                "t": "runs",
                "created_ns": time.time_ns(),
                "world_size": self.world_size,
                "dp": int(shape.get("dp", 1)),
                "tp": int(shape.get("tp", 1)),
                "pp": int(shape.get("pp", 1)),
                "meta_json": _meta_json(g, meta, self._fr.meta(), config.level),
            }
        self._identity = RankIdentity(
            self._put, self._put_run, ranks_record, self._run_record, final=self._mesh_final
        )
        self._log = CollectiveLog(self._put, self._context, self._clock)
        self._blackbox = None
        try:
            self._log.blackbox = self._blackbox = BlackBox(blackbox_path(path, self.rank))
        except OSError as e:
            warn(f"ranksight: no black box for rank {self.rank}: {e}", stacklevel=5)
        self._device_errors = 0
        """Phases whose CUDA events failed (recorded with host times instead)."""
        self._device = self._device_timer() if config.device_timing else None
        self._log.device = self._device
        if self._device is not None:
            self._device.on_resolved = self._log.device_completed
            self._device.on_poll = self._log.poll_device
        self._ring: FrRing | None = None
        """NCCL collectives read from torch's Flight Recorder ring (:mod:`.fr_ring`)."""
        if choose(config.level, config.fr_ring, backend):
            self._ring = FrRing(self._log, self._put, context=self._context)
            self._log.native = native_groups()
            self._ring.start_thread()
        self._undo += [
            patch_work_wait(self._log),
            patch_async_waits(self._log),
            patch_api(self._log),
        ]
        self._gc = GcRecorder(self._put, lambda: self._step)
        self._undo.append(self._gc.install())
        self._finished = threading.Lock()
        self._last_end: tuple[str, int] | None = None
        self._exits = ExitRecorder(
            self._end_on_exit, crash_stack_path(path, self.rank), self._note_on_signal
        )
        self._undo.append(self._exits.install())
        if config.level == "detailed":
            self._mode = DispatchRecorder(self._log)
            self._mode.__enter__()
        if os.environ.get(env.VERIFY_COUNTS) == "1":
            self._counter = DispatchCounter()
            self._counter.__enter__()
            self._hook_counts: collections.Counter[str] = collections.Counter()
            self._hook_ops: collections.Counter[str] = collections.Counter()

    # ------------------------------------------------------------------ internals
    def _put(self, record: dict[str, Any]) -> None:
        if self._counter is not None and record["t"] == "collectives":
            self._hook_counts[record["group_id"]] += 1
            self._hook_ops[f"{record['group_id']} {record['op']}"] += 1
        self._spool.put(record)

    def _progress(self) -> list[dict[str, Any]]:
        log = getattr(self, "_log", None)
        fr = getattr(self, "_fr", None)
        if fr is not None:
            fr.check()
        identity = getattr(self, "_identity", None)
        if identity is not None:
            identity.settle(only_if_due=True)
        ring = getattr(self, "_ring", None)
        if ring is not None:
            ring.maybe_read()
        return log.progress_records(self._step) if log is not None else []

    def _context(self) -> tuple[int, str]:
        return self._step, (self._phase_stack[-1] if self._phase_stack else "")

    def _gpu_memory(self) -> dict[str, int]:
        """This process's CUDA caching allocator: bytes allocated to tensors and reserved
        from the device, on its current device (both 0 on a CPU rank). Reads the
        allocator's counters; never synchronizes."""
        cuda = self._cuda
        if cuda is None or not cuda.is_initialized():
            return {}
        try:
            return {
                "gpu_mem_allocated_bytes": int(cuda.memory_allocated()),
                "gpu_mem_reserved_bytes": int(cuda.memory_reserved()),
            }
        except Exception:  # noqa: BLE001 - a heartbeat without it is still a heartbeat
            return {}

    def _rss(self) -> int:
        try:
            return self._proc.memory_info().rss
        except psutil.Error:
            return 0

    def _put_stats(self) -> None:
        self._put(
            {
                "t": "hook_stats",
                "ts_ns": time.time_ns(),
                "level": self.config.level,
                "records": self._spool.records,
                "dropped": self._spool.dropped,
            }
        )

    def _put_run(self, status: str) -> None:
        if self._run_record is not None:
            self._put({**self._run_record, "status": status, "updated_ns": time.time_ns()})

    def _device_timer(self) -> DeviceTimer | None:
        """CUDA-event timing of collectives when this rank computes on a GPU, else None."""
        try:
            import torch

            on_gpu = "nccl" in str(dist.get_backend()) or torch.cuda.is_initialized()
            if not torch.cuda.is_available() or not on_gpu:
                return None
            timer = DeviceTimer(self._put, DeviceClock(torch.cuda, torch.cuda.current_device()))
        except Exception as e:  # no device timing is not a reason to stop training
            warn(f"ranksight: no CUDA-event timing: {e}", stacklevel=6)
            return None
        timer.start_thread()
        return timer

    def _put_end(self, reason: str, code: int, detail: str, final: bool = False) -> None:
        """One ``rank_ends`` record. ``final``: the process's end, skipped where it only
        repeats the signal already noted (``signal``, same number) as the last record."""
        if final and self._last_end == (reason, int(code)):
            return
        self._last_end = (reason, int(code))
        self._put(
            {
                "t": "rank_ends",
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "ts_ns": time.time_ns(),
                "source": "hooks",
                "reason": reason,
                "code": int(code),
                "detail": detail,
                "last_step": int(self._step),
            }
        )

    def _note_on_signal(self, reason: str, code: int, detail: str) -> None:
        """ExitRecorder's callback for a signal the script handles: noted, spool open."""
        if self._finished.locked():
            return
        self._put_end(reason, code, detail)
        self._spool.flush_soon()

    def _end_on_exit(self, reason: str, code: int, detail: str) -> None:
        """ExitRecorder's callback: the process is ending without ``close()``."""
        self._finish("finished" if reason == "exit" else "failed", reason, code, detail)

    def _finish(self, status: str, reason: str, code: int, detail: str) -> None:
        """Write what is in flight (``end_ns`` 0), a last progress snapshot, the stats,
        this rank's ``rank_ends`` record and (rank 0) the run's status, then close the
        spool. Once; from any thread (a SIGTERM watcher may race the training thread)."""
        if not self._finished.acquire(blocking=False):
            return

        def close_device() -> None:
            if self._device:
                self._device.close()

        def mark_blackbox_flushed() -> None:
            if self._blackbox:
                self._blackbox.mark_flushed()

        def put_progress() -> None:
            for r in self._log.progress_records(self._step):
                self._put(r)

        for write in (
            self._identity.settle,
            close_device,
            lambda: self._ring and self._ring.close(),
            self._log.flush,
            mark_blackbox_flushed,
            put_progress,
            self._put_stats,
            lambda: self._put_end(reason, code, detail, final=True),
            lambda: self._put_run(status),
        ):
            try:
                write()
            except Exception as e:  # concurrent with training: keep going, count it
                self._log.note_error(e)
        self._spool.close()
        if self._blackbox is not None and reason == "finished":
            self._blackbox.close()

    # ------------------------------------------------------------------ public API
    @property
    def guard(self) -> Guard:
        """What went wrong inside the hooks so far (:mod:`.guard`)."""
        return self._guard

    @property
    def run_id(self) -> str:
        """The run id records are tagged with."""
        return self.config.run_id

    @property
    def stats(self) -> dict[str, int]:
        """``records`` written, ``dropped`` records (``lost``: of those, records that went
        to a spool file deleted under the hooks), bookkeeping ``errors``, ``bad_values``
        the script gave that were not recorded (:mod:`.values`), ``collectives`` seen.
        ``dropped`` includes Flight Recorder entries overwritten before they were read."""
        ring = self._ring
        return {
            "records": self._spool.records,
            "dropped": self._spool.dropped + (ring.lost + ring.lost_open if ring else 0),
            "lost": self._spool.lost,
            "errors": self._log.errors
            + self._device_errors
            + self._guard.errors
            + (ring.errors if ring else 0),
            "bad_values": sum(self._guard.bad_values.values()),
            "collectives": self._log.issued,
        }

    @guarded("record_phase")
    def record_phase(
        self,
        name: str,
        start_ns: int,
        end_ns: int,
        wait_ns: int = 0,
        *,
        microbatch: int = -1,
        stage: int = -1,
    ) -> None:
        """Record a phase already timed elsewhere: host realtime ``start_ns``..``end_ns``
        (ns, ``time.time_ns()`` clock), ``wait_ns`` of it blocked on collectives, in the
        current step. :meth:`phase` is the usual way; this is for phases known only once
        they are over (e.g. the automatic attach's forward). A time that is not a whole
        number of ns >= 0 drops the record (one warning per field)."""
        g, times = self._guard, []
        for field, value in (("start_ns", start_ns), ("end_ns", end_ns), ("wait_ns", wait_ns)):
            times.append(whole(g, f"record_phase {field}", value, (0, INT64_MAX), -1))
        label = name if type(name) is str else self._name("record_phase name", name)
        if label is None or min(times) < 0:
            return
        mb, st = self._index("microbatch", microbatch), self._index("stage", stage)
        self._put(self._phase_record(label, times[0], times[1], times[2], mb, st))

    def _phase_record(
        self, name: str, start_ns: int, end_ns: int, wait_ns: int, microbatch: int, stage: int
    ) -> dict[str, Any]:
        if self._ring is not None:
            self._ring.timeline.phase(name, start_ns, end_ns)
        return {
            "t": "phases",
            "step": max(self._step, 0),
            "phase": name,
            "microbatch": microbatch,
            "stage": stage,
            "start_ns": int(start_ns),
            "end_ns": int(end_ns),
            "wait_ns": int(wait_ns),
        }

    def _index(self, field: str, x: Any) -> int:
        """A microbatch or stage index: a whole number >= -1 (-1: none)."""
        return x if type(x) is int and -1 <= x <= INT32[1] else whole(
            self._guard, field, x, (-1, INT32[1]), -1)  # fmt: skip

    def _name(self, field: str, x: Any) -> str | None:
        return name(self._guard, field, x)

    @property
    def blocked_ns(self) -> int:
        """Host time this rank has spent blocked waiting for collectives so far (ns)."""
        return self._clock.total_ns

    @guarded("step", default=lambda: NoopHooks._NULL)
    def step(self, step: int) -> _Step | NoopHooks._Null:
        """Context manager around one training step (``step`` counts from 0). A step
        number that is not a whole number in 0..2^32-1 is dropped with one warning: the
        step is then not recorded (its phases and collectives still are)."""
        number = whole(self._guard, "step", step, UINT32, -1)
        if number >= 0:
            return _Step(self, number)
        if step is None:
            self._guard.dropped("step", step, "is not a step number")
        return NoopHooks._NULL

    @guarded("phase", default=lambda: NoopHooks._NULL)
    def phase(
        self, name: str, *, microbatch: int = -1, stage: int = -1
    ) -> _Phase | NoopHooks._Null:
        """Context manager around one phase: ``data_wait``, ``forward``, ``backward``,
        ``optimizer``, ``checkpoint`` (any name is accepted; a non-str through ``str()``).
        ``microbatch`` / ``stage``: indices, -1 for none."""
        label = name if type(name) is str else self._name("phase name", name)
        if label is None:
            return NoopHooks._NULL
        return _Phase(self, label, self._index("microbatch", microbatch),
                      self._index("stage", stage))  # fmt: skip

    @guarded("instrument_pipeline_stage")
    def instrument_pipeline_stage(self, stage: Any) -> None:
        """Time every ``forward_one_chunk`` / ``backward_one_chunk`` of a
        ``torch.distributed.pipelining.PipelineStage`` as forward / backward phases with
        the microbatch and stage index. Something else: one warning, nothing timed."""
        from .pipeline import instrument_stage

        instrument_stage(self, stage)

    @guarded("instrument_ddp")
    def instrument_ddp(self, model: Any) -> None:
        """Make a DistributedDataParallel model's bucket all_reduces visible to the
        default level (installs the stock all_reduce comm hook), and the time backward
        waits for them at its end visible as blocked time. A model that is not DDP: one
        warning, nothing installed."""
        instrument_ddp(model, self._log)

    @guarded("adopt_mesh")
    def adopt_mesh(
        self,
        mesh: dict[str, int] | None,
        mesh_shape: dict[str, int] | None = None,
        meta: dict[str, Any] | None = None,
        *,
        source: str = "attach",
    ) -> None:
        """Take this rank's coordinates ``mesh`` and the degrees ``mesh_shape`` as the
        trainer built them, in place of auto-attach's guess (:mod:`.rank_mesh`: the
        trainer's own attach, ``source="attach"``, wins over ``"init_device_mesh"``);
        ``meta`` is merged into the run's meta (rank 0), which records ``mesh_from``.
        Never raises: bad values are dropped as :func:`attach` drops them."""
        g = self._guard
        coords = coordinates(g, "mesh", mesh, -1)
        shape = coordinates(g, "mesh_shape", mesh_shape, 1) if mesh_shape is not None else None
        if meta is not None:
            self._meta = {**dict(self._meta or {}), **dict(meta)}
        meta_json = None
        if self.rank == 0:
            merged = {**dict(self._meta or {}), "mesh_from": source}
            meta_json = _meta_json(g, merged, self._fr.meta(), self.config.level)
        if self._identity.adopt(coords, shape, source, meta_json) == "rewritten":
            warn(
                f"ranksight: rank {self.rank}'s mesh from {source} ({coords}) came after its "
                "records went out with other coordinates; written again, but a reader that "
                "takes any row per rank may still see the first",
                stacklevel=4,
            )

    @guarded("close", default=lambda: dict(NoopHooks.stats))
    def close(self, status: str = "finished") -> dict[str, int]:
        """Stop recording, write what is buffered, and (rank 0) mark the run ``status``.
        Returns :attr:`stats`. Safe to call twice."""
        if self._closed:
            return self.stats
        self._closed = True
        status = self._name("close status", status) or "finished"
        for mode in (self._counter, self._mode):
            if mode is not None:
                try:
                    mode.__exit__(None, None, None)
                except Exception:  # the mode stack may have been unwound by the script
                    pass
        for undo in reversed(self._undo):
            try:
                undo()
            except Exception as e:  # noqa: BLE001 - undo the rest, then finish
                self._guard.failed("close", e)
        self._finish(status, "finished", 0, "")
        if self._counter is not None:
            path = os.path.join(os.path.dirname(self._spool.path), f"counts-rank{self.rank}.json")
            write_counts(path, dict(self._hook_counts), dict(self._hook_ops), self._counter)
        _detach()
        return self.stats


INT64_MAX = (1 << 63) - 1


def _meta_json(g: Guard, meta: Any, flight_recorder: Any, level: str) -> str:
    """The run's ``meta_json``: ``meta`` (values JSON cannot hold through ``str()``),
    the Flight Recorder's settings and the hook level. A ``meta`` that is not a mapping
    or cannot be serialized (keys that are not strings, a cycle) is dropped."""
    base = {"flight_recorder": flight_recorder, "hook_level": level}
    if meta is not None:
        try:
            return json.dumps({**dict(meta), **base}, default=str)
        except Exception as e:  # noqa: BLE001 - the run is still recorded
            g.dropped("meta", meta, f"cannot be stored as JSON ({type(e).__name__}: {e})")
    return json.dumps(base, default=str)


def _device_name() -> str:
    """``"cpu"``, or the current CUDA device's UUID (``GPU-...``) where torch knows it."""
    try:
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            props = torch.cuda.get_device_properties(torch.cuda.current_device())
            uuid = getattr(props, "uuid", None)
            return f"GPU-{uuid}" if uuid else f"cuda:{torch.cuda.current_device()}"
    except Exception:  # a device query must never break attach
        pass
    return "cpu"


class NoopHooks:
    """Same API as :class:`Hooks`, records nothing (level ``off``, or attach failed)."""

    run_id = ""
    blocked_ns = 0
    stats: dict[str, int] = {
        "records": 0, "dropped": 0, "lost": 0, "errors": 0, "bad_values": 0, "collectives": 0,
    }  # fmt: skip

    class _Null:
        def __enter__(self) -> NoopHooks._Null:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

        def set(self, *args: Any, **kw: Any) -> None:
            return None

    _NULL: _Null = _Null()

    @property
    def guard(self) -> Guard:
        """Nothing goes wrong where nothing is recorded: an empty :class:`Guard`."""
        return Guard()

    def step(self, step: int) -> _Null:
        """No-op step context."""
        return self._NULL

    def phase(self, name: str, **kw: Any) -> _Null:
        """No-op phase context."""
        return self._NULL

    def record_phase(self, *args: Any, **kw: Any) -> None:
        """Does nothing."""

    def instrument_pipeline_stage(self, stage: Any) -> None:
        """Does nothing."""

    def instrument_ddp(self, model: Any) -> None:
        """Does nothing."""

    def adopt_mesh(self, *args: Any, **kw: Any) -> None:
        """Does nothing."""

    def close(self, status: str = "finished") -> dict[str, int]:
        """Does nothing."""
        return dict(self.stats)


_ATTACHED: Hooks | None = None


def _detach() -> None:
    global _ATTACHED
    _ATTACHED = None


def attach(
    *,
    mesh: dict[str, int] | None = None,
    mesh_shape: dict[str, int] | None = None,
    meta: dict[str, Any] | None = None,
    config: HooksConfig | None = None,
    mesh_final: bool = True,
    **config_kw: Any,
) -> Hooks | NoopHooks:
    """Attach ranksight to this training process; call once, after ``init_process_group``.

    ``mesh`` is this rank's coordinates (``{"dp": i, "tp": j, "pp": k}``), ``mesh_shape``
    the mesh size per axis, ``meta`` anything to keep with the run (rank 0's copy is
    stored: config, injected faults). ``config_kw`` are :class:`HooksConfig` fields.
    ``mesh_final=False`` (auto-attach) marks ``mesh`` a guess: the rank's records wait for
    the trainer's mesh (:mod:`.rank_mesh`), and the trainer's own later ``attach(mesh=...)``
    replaces it (its ``meta`` is merged) instead of being ignored.

    Never raises: attached twice returns the existing hooks with a warning; attached
    before ``init_process_group``, at level ``off``, with an invalid config value (the
    warning names it) or when attaching fails returns :class:`NoopHooks` (a warning says
    why): training goes on, unrecorded.
    """
    try:
        return _attach(mesh, mesh_shape, meta, config, config_kw, mesh_final)
    except Exception as e:  # noqa: BLE001 - never the job's error
        warn(f"ranksight: attach failed ({type(e).__name__}: {e}); nothing will be "
             "recorded, training goes on", stacklevel=2)  # fmt: skip
        return NoopHooks()


def _attach(
    mesh: Any,
    mesh_shape: Any,
    meta: Any,
    config: Any,
    config_kw: dict[str, Any],
    mesh_final: bool = True,
) -> Hooks | NoopHooks:
    global _ATTACHED
    cfg = config if config is not None else HooksConfig(**config_kw)
    if not isinstance(cfg, HooksConfig):
        raise TypeError(f"config must be a HooksConfig, got {type(cfg).__name__}")
    if cfg.level == "off":
        return NoopHooks()
    if _ATTACHED is not None:
        if not _ATTACHED._mesh_final and (mesh is not None or meta is not None):
            _ATTACHED.adopt_mesh(mesh, mesh_shape, meta, source="attach")  # the trainer's
            return _ATTACHED
        warn("ranksight hooks are already attached; reusing them", stacklevel=3)
        return _ATTACHED
    if not dist.is_available() or not dist.is_initialized():
        warn(
            "ranksight.attach() called before torch.distributed.init_process_group(); "
            "nothing will be recorded (call attach after init_process_group)",
            stacklevel=3,
        )
        return NoopHooks()
    if config is None and "run_id" not in config_kw and not os.environ.get(env.RUN_ID):
        cfg = dataclasses.replace(cfg, run_id=shared_run_id(cfg.run_id))
    _ATTACHED = Hooks(cfg, mesh=mesh, mesh_shape=mesh_shape, meta=meta, mesh_final=mesh_final)
    return _ATTACHED


RUN_ID_KEY = "ranksight/run_id"
"""Key of rank 0's run id in the process group's key-value store."""


def shared_run_id(mine: str, timeout_s: float = 60.0) -> str:
    """One run id for every rank of a job launched without ``$RANKSIGHT_RUN_ID``: rank 0
    puts ``mine`` in the default process group's key-value store (torchrun's rendezvous
    store, or the one ``init_process_group`` made) and the others read it, waiting up to
    ``timeout_s``. Where that fails (no store, rank 0 never attached) this rank keeps
    ``mine``, with a warning: its records then form a run of their own."""
    try:
        from torch.distributed import distributed_c10d as c10d

        store = c10d._get_default_store()
        if dist.get_rank() == 0:
            store.set(RUN_ID_KEY, mine)
            return mine
        store.wait([RUN_ID_KEY], datetime.timedelta(seconds=timeout_s))
        return store.get(RUN_ID_KEY).decode()
    except Exception as e:  # noqa: BLE001 - a run id of its own beats a stopped job
        warn(
            f"ranksight: could not read rank 0's run id ({e}); this rank records under "
            f"{mine}: set RANKSIGHT_RUN_ID to one id for every rank",
            stacklevel=4,
        )
        return mine
