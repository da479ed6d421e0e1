"""Nothing the hooks do raises into training code (trainer_hooks/guard.py, values.py):
arbitrary values at every public entry point are recorded as numbers or dropped with one
warning per field, and the script's own exceptions pass through unchanged."""

from __future__ import annotations

import decimal
import fractions
import math
import re
import warnings

import numpy as np
import pytest
import torch
import torch.distributed as dist
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.testing._internal.distributed.fake_pg import FakeStore

from ranksight import trainer_hooks
from ranksight.trainer_hooks.hooks import Hooks, NoopHooks, _Step
from tests.helpers.spool import read_spool


class Hostile:
    """Every conversion raises (but ``repr``, which hypothesis needs to report a failure:
    :class:`Unprintable` has that too)."""

    def __float__(self):
        raise ZeroDivisionError("float")

    def __int__(self):
        raise ZeroDivisionError("int")

    def __index__(self):
        raise ZeroDivisionError("index")

    def __str__(self):
        raise ZeroDivisionError("str")

    def __repr__(self):
        return "Hostile()"

    def __bool__(self):
        raise ZeroDivisionError("bool")

    def __eq__(self, other):
        raise ZeroDivisionError("eq")

    __hash__ = object.__hash__

    @property
    def device(self):
        raise RuntimeError("device")


class Unprintable(Hostile):
    def __repr__(self):
        raise ZeroDivisionError("repr")


ODD = [
    np.float32(1.5), np.int64(7), np.float64("nan"), np.uint64(2**64 - 1), np.bool_(True),
    np.array([1.0, 2.0]), np.array(3), torch.tensor(3.0), torch.tensor(5), torch.tensor([1, 2]),
    torch.tensor(float("nan")), torch.tensor(float("-inf")), torch.empty(0),
    torch.tensor(2.0, device="meta"), torch.tensor(1.0, requires_grad=True),
    decimal.Decimal("1.5"), decimal.Decimal("nan"), fractions.Fraction(1, 3), complex(1, 2),
    Hostile(), object(), [1], {"a": 1}, 2**64, -(2**63) - 1, 10**400, float("inf"), -0.0,
]  # fmt: skip
VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=12),
    st.binary(max_size=6), st.sampled_from(ODD),
)  # fmt: skip
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def pg():
    dist.init_process_group("fake", rank=0, world_size=2, store=FakeStore())
    yield
    dist.destroy_process_group()


def _plain_int(x) -> bool:
    return type(x) is int


def _plain_real(x) -> bool:
    return type(x) in (int, float) and (type(x) is float or abs(x) < 2**1000)


class TestEveryEntry:
    """One hooks object takes all the examples (so 'once per field' is checked across
    them); the last test closes it and reads its spool back."""

    @pytest.fixture(scope="class")
    def hooks(self, pg, tmp_path_factory):
        spool = tmp_path_factory.mktemp("spool")
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            h = trainer_hooks.attach(spool_dir=str(spool), run_id="odd")
            assert isinstance(h, Hooks)
            yield h, spool, seen, []
            h.close()

    @SETTINGS
    @given(step=VALUES, loss=VALUES, tokens=VALUES, lr=VALUES, grad_norm=VALUES,
           name=VALUES, mb=VALUES, stage=VALUES, times=st.tuples(VALUES, VALUES, VALUES),
           status=VALUES)  # fmt: skip
    def test_arbitrary_values_never_raise(
        self, hooks, step, loss, tokens, lr, grad_norm, name, mb, stage, times, status
    ):
        h, _, _, steps = hooks
        with h.step(step) as s:
            s.set(loss=loss, tokens=tokens, lr=lr, grad_norm=grad_norm, accuracy=lr)
            with h.phase(name, microbatch=mb, stage=stage):
                pass
            h.record_phase(name, *times, microbatch=mb, stage=stage)
            h.instrument_ddp(loss)
            h.instrument_pipeline_stage(loss)
        valid_step = _plain_int(step) and 0 <= step < 2**32
        if valid_step:
            assert isinstance(s, _Step) and s._step == step
        if isinstance(s, _Step):
            steps.append(s._step)
            assert type(s._step) is int and 0 <= s._step < 2**32
            for field, given_value in (("loss", loss), ("lr", lr), ("grad_norm", grad_norm)):
                got = getattr(s, field)
                assert type(got) is float
                if _plain_real(given_value):
                    want = float(given_value)
                    assert got == want or (math.isnan(got) and math.isnan(want))
            assert type(s.tokens) is int and 0 <= s.tokens < 2**64
            if _plain_int(tokens) and 0 <= tokens < 2**64:
                assert s.tokens == tokens
        else:
            assert not valid_step and s is NoopHooks._NULL
        assert h._phase_stack == []  # every phase entered was left

    def test_a_collective_raises_its_own_error_unchanged(self, hooks):
        """The hooks' wrapper around a collective re-raises the collective's own error."""
        for args in (("not a tensor",), (torch.ones(2), "bogus")):
            with_hooks = _raised(lambda a=args: dist.all_reduce(*a))
            without = _raised(lambda a=args: dist.all_reduce.__wrapped__(*a))
            assert with_hooks is not None and with_hooks == without

    def test_every_record_is_accepted_and_each_field_warned_once(self, hooks):
        h, spool, seen, steps = hooks
        stats = h.close()
        assert stats["dropped"] == 0 and stats["bad_values"] > 0
        # no internal failure: every bad value was handled as a value, not by the guard's
        # catch-all (only the misuse of instrument_* on a non-model is counted there)
        assert set(h.guard.failures) <= {"instrument_ddp", "instrument_pipeline_stage"}
        ours = [str(w.message) for w in seen if str(w.message).startswith("ranksight: ")]
        fields = [re.match(r"ranksight: (.+?)=", m) for m in ours]
        names = [m.group(1) for m in fields if m]
        assert names and len(names) == len(set(names)), names  # one warning per field
        frames = read_spool(str(spool))  # asserts no record was rejected
        got = frames["steps"]
        assert sorted(got["step"].tolist()) == sorted(steps)
        for column in ("loss", "lr", "grad_norm"):
            assert got[column].dtype == np.float64
        assert got["tokens"].dtype.kind in "iu"
        ph = frames["phases"]
        assert ph["phase"].map(type).eq(str).all() and ph["microbatch"].dtype.kind == "i"


def _raised(call):
    try:
        call()
    except Exception as e:  # noqa: BLE001
        return type(e), re.sub(r"0x[0-9a-f]+", "0x", str(e))  # no object addresses
    return None


def test_attach_with_arbitrary_arguments_never_raises(pg, tmp_path):
    made = []

    @SETTINGS
    @given(mesh=VALUES | st.dictionaries(st.sampled_from(["dp", "tp", "pp", "zz"]), VALUES),
           shape=VALUES | st.dictionaries(st.sampled_from(["dp", "tp", "pp"]), VALUES),
           meta=VALUES | st.dictionaries(st.text(max_size=4) | st.integers() | st.none()
                                         | st.tuples(st.integers()), VALUES, max_size=3),
           field=st.sampled_from([None] * 6 + ["level", "attempt", "flush_interval_s", "spool_segment_bytes",
                                  "max_buffered_records", "run_id", "device_timing"]),
           value=VALUES, status=VALUES)  # fmt: skip
    def attach_once(mesh, shape, meta, field, value, status):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            kw = {"spool_dir": str(tmp_path), "run_id": "att"}
            if field is not None:  # a config field set to the value: mostly invalid
                kw[field] = value
            h = trainer_hooks.attach(mesh=mesh, mesh_shape=shape, meta=meta, **kw)
            stats = h.close(status)
        assert isinstance(h, Hooks | NoopHooks)
        assert all(type(v) is int for v in stats.values())
        assert trainer_hooks.hooks._ATTACHED is None
        made.append(isinstance(h, Hooks))

    attach_once()
    assert sum(made) > len(made) / 3, "most examples must attach for real"
    for spool_dir in (None, 123, Hostile(), b"\xff"):  # not a folder: attach declines
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            assert isinstance(trainer_hooks.attach(spool_dir=spool_dir), NoopHooks)
        assert any("spool_dir" in str(w.message) for w in seen), [str(w.message) for w in seen]
    frames = read_spool(str(tmp_path))  # every record of every attach accepted
    ranks = frames["ranks"]
    for axis in ("dp", "tp", "pp"):
        assert ranks[axis].dtype.kind == "i" and (ranks[axis] >= -1).all()


def test_a_warnings_filter_set_to_error_does_not_turn_drops_into_exceptions(pg, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        h = trainer_hooks.attach(spool_dir=str(tmp_path), run_id="err")
        with h.step(None), h.step(0) as s, h.phase(Unprintable()):
            s.set(loss=torch.tensor(1.0, device="meta"), tokens=None)
            s.set(tokens=float("nan"), lr="0.1")
        stats = h.close()
    assert stats["bad_values"] == 5 and stats["errors"] == 0


BROKEN_WAITS = r"""
import json, os, socket, sys
import torch, torch.distributed as dist
from torch.distributed import _functional_collectives as funcol
from ranksight import trainer_hooks

s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
dist.init_process_group("gloo", rank=0, world_size=1)
h = trainer_hooks.attach(spool_dir=sys.argv[1], run_id="waits")

def broken(*a, **k):
    raise RuntimeError("bookkeeping broke")

h._log.waited_on_work = broken
h._log.waited_on_tensor = broken
got = {}
work = dist.all_reduce(torch.ones(4), async_op=True)
got["work"] = work.wait()
got["after_work"] = h.stats["errors"]
out = funcol.all_reduce(torch.ones(4), "sum", dist.group.WORLD)
got["tensor"] = funcol.wait_tensor(out).tolist()
got["after_tensor"] = h.stats["errors"]
h.close()
print(json.dumps(got))
"""


def test_failing_wait_bookkeeping_stays_inside_the_hooks(tmp_path):
    """The hooks time ``Work.wait`` and functional waits; their bookkeeping failing
    (here: made to) is counted, and the script's wait returns what it would."""
    import json
    import os
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", BROKEN_WAITS, str(tmp_path)], capture_output=True, text=True,
        timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"work": True, "after_work": 1, "tensor": [1.0] * 4, "after_tensor": 2}
