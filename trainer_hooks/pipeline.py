"""Per-microbatch forward/backward timing for ``torch.distributed.pipelining`` stages."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .hooks import Hooks

_MARK = "_ranksight_instrumented"


def _microbatch(args: tuple, kwargs: dict, key: str) -> int:
    value = kwargs.get(key, args[0] if args else -1)
    return int(value) if isinstance(value, int) else -1


def instrument_stage(hooks: Hooks, stage: Any) -> None:
    """Wrap ``stage.forward_one_chunk(fwd_chunk_id, ...)`` and
    ``stage.backward_one_chunk(bwd_chunk_id, ...)`` (torch.distributed.pipelining's
    ``_PipelineStageBase`` methods the schedules call) so each call is a ``forward`` /
    ``backward`` phase tagged with the microbatch and ``stage.stage_index``. Raises
    TypeError if ``stage`` has neither method. Instrumenting twice is a no-op."""
    if getattr(stage, _MARK, False):
        return
    if not hasattr(stage, "forward_one_chunk") or not hasattr(stage, "backward_one_chunk"):
        raise TypeError(
            f"{type(stage).__name__} is not a pipelining stage (no *_one_chunk methods)"
        )
    index = int(getattr(stage, "stage_index", -1))
    for method, phase, key in (
        ("forward_one_chunk", "forward", "fwd_chunk_id"),
        ("backward_one_chunk", "backward", "bwd_chunk_id"),
    ):
        original = getattr(stage, method)

        @functools.wraps(original)
        def timed(*args: Any, _orig=original, _phase=phase, _key=key, **kwargs: Any) -> Any:
            with hooks.phase(_phase, microbatch=_microbatch(args, kwargs, _key), stage=index):
                return _orig(*args, **kwargs)

        setattr(stage, method, timed)
    setattr(stage, _MARK, True)
