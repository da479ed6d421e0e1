"""Communication faults: slow link, hang, desync.

Where they sit, and why
-----------------------
The hooks record collectives either by wrapping ``torch.distributed``'s and the
functional collectives' Python functions (level ``default``) or in a
``TorchDispatchMode`` entered in ``attach`` (level ``detailed``). A Python wrapper runs
before any dispatch; dispatch modes form a stack where the mode entered last sees an op
first and its ``func(*args)`` passes the op down to the modes entered before it.

- :class:`SlowLink` is a dispatch mode entered *before* the hooks attach, so it sits
  *under* them at either level: the hooks take the op's enqueue time, then the op reaches :class:`SlowLink`, which makes the
  transfer take ``delay_ms`` longer. Every member of the slow group does this, so all
  members enqueue on time (arrival skew stays low) and the op completes late: the
  signature of a slow link, not of a slow rank. The delay is spent where the training
  thread waits for the op, so the hooks count it as blocked time and no phase's self time
  grows:

  * functional collectives (DTensor TP: ``_c10d_functional.*``) complete when waited on,
    through ``wait_tensor`` (seen here) or ``AsyncCollectiveTensor.wait`` /
    ``trigger_wait`` (DTensor waits inside other ops' dispatch, where no mode is active;
    :class:`SlowLink` patches them before the hooks wrap them, so the hooks time the
    delay): the wait returns ``delay_ms`` after the transfer is done;
  * c10d collectives (FSDP2's DP gradient all_reduce, issued in ``perform_reduce_grad``
    outside every phase): the issue is held ``delay_ms``; the hooks' enqueue time was
    taken before, their completion time (the Work's future) comes after. A
    simplification: the issuing thread sleeps, where a real slow NIC would let it go on.
  * ``group=pp``, the link out of ``rank``: its pipeline neighbours count the recvs they
    post from ``rank`` (``batch_isend_irecv``, ``irecv``, ``recv`` wrapped under the
    hooks; no dispatch mode, whose per-op cost would slow the neighbours' compute and
    make them look like stragglers); ``Work.wait`` (patched before the hooks wrap it)
    returns ``delay_ms`` after the transfer for each of them. ``rank`` itself sends on
    time and goes on, as over a slow NIC.

- :class:`Desync` wraps ``funcol.all_reduce`` (what DTensor's TP calls) *after* the
  hooks attach, so it sits *over* them, whether they record at the Python API or in a
  dispatch mode: what it changes is what they see, as in a real program bug.

  * ``skip``: the rank drops its first TP all_reduce of ``from_step`` (it returns the
    input unreduced); its later TP collectives pair with its peers' earlier ones, and its
    TP group's sequence numbers disagree from there on.
  * ``resize``: that all_reduce is issued with one element more; the hooks record the
    larger size; gloo aborts both sides ("Received data size doesn't match expected
    size"), NCCL would hang or corrupt.

- :class:`Hang`: the rank blocks forever after loading its data in ``from_step``, before
  its first collective or send/recv of the step (the trainer calls
  :meth:`Hang.before_compute`); the hooks never see it enter one, the other ranks wait
  for it in theirs.
"""

from __future__ import annotations

import functools
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from ranksight.ground.mesh import coords_of, rank_of
from ranksight.reference_trainer.faults import FaultSpec
from ranksight.reference_trainer.injector import FaultContext, Injector

if TYPE_CHECKING:
    from torch.distributed.distributed_c10d import GroupName

_PG_TYPE = "__torch__.torch.classes.c10d.ProcessGroup"
_COLLECTIVE_C10D = {
    "allreduce_", "allreduce_coalesced_", "allgather_", "_allgather_base_",
    "allgather_coalesced_", "allgather_into_tensor_coalesced_", "reduce_scatter_",
    "_reduce_scatter_base_", "reduce_scatter_tensor_coalesced_", "broadcast_", "reduce_",
    "gather_", "scatter_", "alltoall_", "alltoall_base_", "barrier",
}  # fmt: skip


def group_members(spec: FaultSpec, shape: dict[str, int]) -> frozenset[int]:
    """Global ranks that install a :class:`SlowLink` for ``spec``: ``spec.rank``'s TP group
    (same dp, pp) or DP group (same pp, tp); for ``pp`` its pipeline neighbours (same dp,
    tp, stage one up or down), the receivers of its sends."""
    c = coords_of(spec.target_rank, shape)
    axis = spec.link_group
    if axis == "pp":
        near = [c["pp"] + d for d in (-1, 1) if 0 <= c["pp"] + d < shape["pp"]]
        return frozenset(rank_of({**c, "pp": p}, shape) for p in near)
    return frozenset(rank_of({**c, axis: i}, shape) for i in range(shape[axis]))


def op_ranks(func: Any, args: tuple, kwargs: dict) -> tuple[int, ...] | None:
    """Member global ranks of the group a c10d or functional collective runs on (None if
    none is found)."""
    from torch.distributed import distributed_c10d as c10d

    if func.namespace == "_c10d_functional":
        names = [a for a in list(args) + list(kwargs.values()) if isinstance(a, str)]
        if not names:
            return None
        pg = c10d._resolve_process_group(cast("GroupName", names[-1]))
    else:
        boxed = next(
            (a for a in args if isinstance(a, torch.ScriptObject)
             and a._type().qualified_name() == _PG_TYPE),
            None,
        )  # fmt: skip
        if boxed is None:
            return None
        pg = torch._C._distributed_c10d.ProcessGroup.unbox(boxed)
    return tuple(dist.get_process_group_ranks(pg))


def _storage_key(t: Any) -> int | None:
    if not isinstance(t, torch.Tensor):
        return None
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return id(t)


def announce(spec: FaultSpec, step: int, what: str) -> None:
    """Print the moment a fault takes effect: ``ranksight-fault: <spec> step=<n>
    time_ns=<t> <what>`` on stderr (the fault matrix reads it)."""
    print(
        f"ranksight-fault: {spec.text} step={step} time_ns={time.time_ns()} {what}",
        file=sys.stderr,
        flush=True,
    )


@dataclass(eq=False)
class SlowLink(TorchDispatchMode, Injector):
    """Under the hooks: every op of the slow group completes ``delay_ms`` late (see the
    module doc). ``members``: the group's global ranks; install on members only."""

    spec: FaultSpec
    clock: Any
    """The trainer's StepClock."""
    members: frozenset[int]
    injected_s: float = 0.0
    """Total seconds held so far."""
    _slow: set[int] = field(default_factory=set)
    """Storage keys of issued functional collectives of the group not yet waited on."""
    _recvs: int = 0
    """Recvs posted from the slow sender (``pp``) whose wait is not yet held."""
    _undo: list[Callable[[], None]] = field(default_factory=list)
    _told: bool = False
    entered: bool = False
    """Whether the dispatch mode is entered (not for ``pp``)."""

    def __post_init__(self) -> None:
        super().__init__()

    @classmethod
    def for_rank(cls, spec: FaultSpec, ctx: FaultContext) -> SlowLink | None:
        """Every member of the slowed group (:func:`group_members`)."""
        members = group_members(spec, ctx.shape)
        return cls(spec=spec, clock=ctx.clock, members=members) if ctx.rank in members else None

    def enter_below(self) -> None:
        """Patch the work waits and, but for ``pp`` (the patched waits and posts suffice),
        enter the dispatch mode under the hooks."""
        self.patch_waits()
        if self.spec.link_group != "pp":
            self.__enter__()
            self.entered = True

    def close(self) -> None:
        """Leave the dispatch mode (after the hooks close) and unpatch the waits."""
        if self.entered:
            self.__exit__(None, None, None)
            self.entered = False
        self.unpatch()

    def _on(self) -> bool:
        return self.spec.active_at(self.clock.step)

    def _hold(self, seconds: float, what: str) -> None:
        if not self._told:
            announce(self.spec, self.clock.step, what)
            self._told = True
        if seconds > 0:
            time.sleep(seconds)
            self.injected_s += seconds

    def _after_wait(self, tensor: Any) -> None:
        """Hold ``delay_ms`` after the transfer of a slow-group functional op is done."""
        key = _storage_key(tensor)
        if self._slow and key in self._slow:
            self._slow.discard(key)
            self._hold(self.spec.delay_s, "collective completes late")

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        ns, name = func.namespace, func._opname
        if ns == "_c10d_functional" and name == "wait_tensor":
            out = func(*args, **kwargs)
            self._after_wait(args[0] if args else None)
            return out
        if ns not in ("c10d", "_c10d_functional") or not self._on():
            return func(*args, **kwargs)
        delay = self.spec.delay_s
        if ns == "c10d" and self.spec.link_group == "pp":
            if name == "recv_" and self._peer(func, args, kwargs) == self.spec.rank:
                self._recvs += 1
            return func(*args, **kwargs)
        if ns == "c10d" and self._targets_c10d(func, name, args, kwargs):
            self._hold(delay, f"held {name} {self.spec.delay_ms} ms")
            return func(*args, **kwargs)
        out = func(*args, **kwargs)
        if ns == "_c10d_functional":
            keys = {_storage_key(t) for t in (out if isinstance(out, (list, tuple)) else [out])}
            slow = (
                self.spec.link_group != "pp"
                and set(op_ranks(func, args, kwargs) or ()) == self.members
            )
            self._slow = (self._slow | keys) if slow else (self._slow - keys)
            if len(self._slow) > 10_000:  # outputs never waited on: forget them
                self._slow.clear()
        return out

    def _targets_c10d(self, func, name: str, args, kwargs) -> bool:
        return name in _COLLECTIVE_C10D and set(op_ranks(func, args, kwargs) or ()) == self.members

    @staticmethod
    def _peer(func, args, kwargs) -> int:
        """Global rank of a recv's source (``c10d.recv_(tensors, group, src, tag)``)."""
        ranks = op_ranks(func, args, kwargs) or ()
        src = next((a for a in args if isinstance(a, int)), -1)
        return ranks[src] if 0 <= src < len(ranks) else -1

    def patch_waits(self) -> None:
        """Hold ``AsyncCollectiveTensor`` waits, and (``pp``) ``Work.wait`` of recvs from
        the slow sender; call before the hooks attach, so their wrappers time the hold."""
        from torch.distributed._functional_collectives import AsyncCollectiveTensor as ACT

        originals = {"trigger_wait": ACT.trigger_wait, "wait": ACT.wait}

        def held(original):
            def wait(act, *a, **k):
                out = original(act, *a, **k)
                self._after_wait(act.elem)
                return out

            return wait

        def restore() -> None:
            for n, f in originals.items():
                setattr(ACT, n, f)

        for name, fn in originals.items():
            setattr(ACT, name, held(fn))
        self._undo.append(restore)
        if self.spec.link_group == "pp":
            self._patch_work_wait()
            self._patch_recv_posts()

    def _patch_recv_posts(self) -> None:
        """Count the recvs posted from the slow sender, at the ``torch.distributed`` API
        (what pipelining calls), below the hooks' wrappers."""
        import torch.distributed as dist
        from torch.distributed import distributed_c10d as c10d

        def counting(original, is_batch: bool):
            @functools.wraps(original)  # P2POp.op is matched by name
            def post(*a, **k):
                if self._on():
                    if is_batch:
                        ops = a[0] if a else k.get("p2p_op_list", [])
                        self._recvs += sum(
                            1
                            for op in ops
                            if getattr(op.op, "__name__", "") in ("irecv", "recv")
                            and op.peer == self.spec.rank
                        )
                    else:
                        src = a[1] if len(a) > 1 else k.get("src")
                        self._recvs += int(src == self.spec.rank)
                return original(*a, **k)

            return post

        for name, is_batch in (("batch_isend_irecv", True), ("irecv", False), ("recv", False)):
            original = getattr(c10d, name)
            wrapped = counting(original, is_batch)
            for module in (c10d, dist):
                if getattr(module, name, None) is original:
                    setattr(module, name, wrapped)
                    self._undo.append(functools.partial(setattr, module, name, original))

    def _patch_work_wait(self) -> None:
        work_cls = torch._C._distributed_c10d.Work
        original = work_cls.wait

        def wait(work, *a, **k):
            out = original(work, *a, **k)
            if self._recvs > 0:
                self._recvs -= 1
                self._hold(self.spec.delay_s, "recv from the slow sender completes late")
            return out

        setattr(work_cls, "wait", wait)  # noqa: B010 - patching a torch method
        self._undo.append(lambda: setattr(work_cls, "wait", original))

    def unpatch(self) -> None:
        """Undo :meth:`patch_waits`."""
        while self._undo:
            self._undo.pop()()


@dataclass(eq=False)
class Desync(Injector):
    """Over the hooks, on ``spec.rank`` only: wraps ``funcol.all_reduce`` (what DTensor's TP
    calls) after the hooks have wrapped it, and skips or resizes the rank's first TP
    all_reduce of ``from_step`` (module doc)."""

    spec: FaultSpec
    clock: Any
    tp_members: frozenset[int]
    """The rank's TP group."""
    injected_s: float = 0.0
    done: bool = False
    """Whether the fault has fired (it fires once)."""
    _original: Callable[..., Any] | None = None

    @classmethod
    def for_rank(cls, spec: FaultSpec, ctx: FaultContext) -> Desync | None:
        if spec.rank != ctx.rank:
            return None
        probe = FaultSpec(kind="slow_link", rank=ctx.rank, delay_ms=1.0, group="tp")
        return cls(spec=spec, clock=ctx.clock, tp_members=group_members(probe, ctx.shape))

    def enter_above(self) -> None:
        self.install()

    def exit_above(self) -> None:
        self.uninstall()

    def install(self) -> None:
        """Wrap ``torch.distributed._functional_collectives.all_reduce`` (after attach)."""
        from torch.distributed import _functional_collectives as funcol

        self._original = original = funcol.all_reduce

        @functools.wraps(original)
        def all_reduce(tensor, reduceOp, group, tag=""):  # noqa: N803 - torch's names
            if self.done or not self.spec.active_at(self.clock.step):
                return original(tensor, reduceOp, group, tag)
            if set(_funcol_ranks(group, tag)) != self.tp_members:
                return original(tensor, reduceOp, group, tag)
            self.done = True
            announce(self.spec, self.clock.step, f"{self.spec.mode} funcol.all_reduce")
            if self.spec.mode == "skip":
                return tensor.clone()
            big = torch.cat([tensor.reshape(-1), tensor.new_zeros(1)])
            return original(big, reduceOp, group, tag)[:-1].view_as(tensor)

        setattr(funcol, "all_reduce", all_reduce)  # noqa: B010 - patching a torch function

    def uninstall(self) -> None:
        """Put back the function :meth:`install` wrapped (before the hooks close)."""
        from torch.distributed import _functional_collectives as funcol

        if self._original is not None:
            funcol.all_reduce, self._original = self._original, None


def _funcol_ranks(group: Any, tag: str) -> tuple[int, ...]:
    """Member global ranks of a functional-collective ``group`` argument."""
    from torch.distributed import _functional_collectives as funcol
    from torch.distributed import distributed_c10d as c10d

    name = funcol._resolve_group_name(group, tag)
    return tuple(dist.get_process_group_ranks(c10d._resolve_process_group(name)))


@dataclass(slots=True)
class Hang(Injector):
    """``spec.rank`` blocks forever once its data is loaded in ``from_step``: before its
    first collective or send/recv of the step, so the hooks never see it enter one."""

    spec: FaultSpec
    injected_s: float = 0.0

    def before_compute(self, step: int) -> None:
        """Call after the data_wait phase, before the pipeline schedule runs."""
        if self.spec.active_at(step):
            announce(self.spec, step, "blocks before its first collective of the step")
            threading.Event().wait()  # forever; the job is killed from outside
