"""``ranksight import --memory-mb 64`` (a real CLI process) on inputs made to exhaust it:
a gzip bomb, one huge Kineto event, one huge text line, a file of zeros. Each file is
refused or cut with a message naming it and the limit, and the process's peak RSS stays
within 64 MiB of its peak on a tiny real dump (measured here, same command). The inputs
are generated at a smaller scale than the 1-2 GiB ones they stand for; the bound they
prove does not depend on the scale (the readers hold a limit, not the file)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zlib

import pytest

from tests.helpers.realdata import realdata

BUDGET_MB = 64
MIB = 1 << 20
_PEAK = (
    "import json, resource, subprocess, sys\n"
    "r = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
    "print(json.dumps({'rc': r.returncode, 'out': r.stdout, 'err': r.stderr,\n"
    "    'peak_kib': resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))\n"
)


def gzip_of(path, head: bytes, body: bytes, times: int, tail: bytes = b"") -> str:
    """A gzip file of ``head + body * times + tail``, written a block at a time."""
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    with open(path, "wb") as f:
        f.write(z.compress(head))
        for _ in range(times):
            f.write(z.compress(body))
        f.write(z.compress(tail) + z.flush())
    return str(path)


def imported(path: str, store: str) -> dict:
    """``ranksight import PATH --memory-mb 64`` in a process of its own: exit code, output
    and peak RSS (MiB, the wrapper's only child)."""
    cmd = [sys.executable, "-m", "ranksight.cli", "import", path, "--store", store,
           "--memory-mb", str(BUDGET_MB), "--no-report"]  # fmt: skip
    got = subprocess.run([sys.executable, "-c", _PEAK, *cmd], capture_output=True, text=True,
                         timeout=300, check=True)  # fmt: skip
    out = json.loads(got.stdout)
    out["peak_mib"] = out.pop("peak_kib") / 1024
    return out


@pytest.fixture(scope="module")
def baseline(tmp_path_factory) -> float:
    """Peak RSS (MiB) of the same import of a tiny real dump: the interpreter, its
    libraries and the store."""
    root = tmp_path_factory.mktemp("tiny")
    dump = shutil.copy(realdata("nvrx_fr_dumps", "gpu_error_1st", "_dump_0"), root)
    got = imported(dump, str(root / "store"))
    assert got["rc"] == 0, got["err"]
    return got["peak_mib"]


def _bounded(got: dict, baseline: float) -> None:
    assert got["peak_mib"] < baseline + BUDGET_MB, (got["peak_mib"], baseline)


def test_gzip_bomb_of_a_dump(tmp_path, baseline) -> None:
    """256 MiB inflated from 256 KiB, a pickle's first byte: refused at 2 MiB (a 32nd of
    the budget, the most a dump read whole may take)."""
    bomb = gzip_of(tmp_path / "nccl_trace_rank_0.gz", b"\x80\x04", bytes(MIB), 256)
    assert os.path.getsize(bomb) < MIB
    got = imported(bomb, str(tmp_path / "store"))
    line = next(x for x in got["err"].splitlines() if "nccl_trace_rank_0.gz" in x)
    assert "inflates to more than 2 MiB (a 32nd of --memory-mb 64)" in line, line
    assert got["rc"] == 1
    _bounded(got, baseline)


def test_one_huge_kineto_event(tmp_path, baseline) -> None:
    """One event of 96 MiB: refused past the read chunk (4 MiB at 64 MiB), the events before
    it kept."""
    ev = json.dumps({"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 1}).encode()
    trace = gzip_of(tmp_path / "trace_rank-0.json.gz",
                    b'{"traceEvents": [' + ev + b', {"name": "', b"a" * MIB, 96, b'"}]}')  # fmt: skip
    got = imported(trace, str(tmp_path / "store"))
    line = next(x for x in got["out"].splitlines() if "trace_rank-0.json.gz" in x)
    assert "an event longer than 4 MiB" in line and "kept the 1 event before it" in line, line
    _bounded(got, baseline)


def test_one_huge_text_line(tmp_path, baseline) -> None:
    """A log whose watchdog line is followed by one line of 128 MiB: the line is cut to
    1 MiB, the watchdog timeout read."""
    watchdog = (b"[rank1]:[E ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective "
                b"operation timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE, NumelIn=1, "
                b"NumelOut=1, Timeout(ms)=600000) ran for 600010 milliseconds before timing out.\n")  # fmt: skip
    log = gzip_of(tmp_path / "job.log.gz", watchdog, b"x" * MIB, 128, b"\n")
    got = imported(log, str(tmp_path / "store"))
    assert got["rc"] == 0, got["err"]
    line = next(x for x in got["out"].splitlines() if "job.log.gz" in x)
    assert "1 watchdog timeout" in line and "1 line over 1 MiB cut to it" in line, line
    _bounded(got, baseline)


def test_zeros_are_no_archive(tmp_path, baseline) -> None:
    """64 MiB of zeros and 256 MiB of zeros gzip'd: named as no artifact, not unpacked
    as an empty tar ("no files in ...")."""
    folder = tmp_path / "in"
    folder.mkdir()
    with open(folder / "zeros.bin", "wb") as f:
        for _ in range(64):
            f.write(bytes(MIB))
    gzip_of(folder / "zeros.gz", b"", bytes(MIB), 256)
    got = imported(str(folder), str(tmp_path / "store"))
    assert got["rc"] == 1 and "no files in" not in got["err"], got["err"]
    for name in ("zeros.bin", "zeros.gz"):
        line = next(x for x in (got["out"] + got["err"]).splitlines() if name in x)
        assert line.startswith(f"skipped {folder / name}: binary data of no known kind"), line
    _bounded(got, baseline)
