"""What ``ranksight import`` says of an import, line by line: each input's fate, why
nothing could be imported, and what the import found beyond the report's findings."""

from __future__ import annotations

from ranksight.ground.words import counted

ARTIFACTS = (
    "text logs (consoles, job logs, one rank's log, dmesg: watchdog timeouts, desync "
    "reports, torchrun/MPI/SLURM summaries, NCCL_DEBUG, fr_trace/RAS output, GPU errors, "
    "faulthandler and gdb stacks), Flight Recorder dumps, Kineto traces, py-spy dumps, "
    "What-if Analysis parquet traces"
)
"""What ``import`` reads (see :mod:`ranksight.importer.sources`)."""


def nothing_imported(paths: list[str], files: int) -> str:
    """Why an import of ``paths`` that took nothing failed, naming them and what was
    looked for; ``files``: how many files were found there."""
    where = ", ".join(paths)
    if not files:
        return (
            f"nothing to import: no files in {where} (hidden files and folders are passed "
            f"over); looked for {ARTIFACTS}, or archives of them"
        )
    return (
        f"nothing could be imported from {where}: no file there ({counted(files, 'file')} "
        f"found, listed above) is one of: {ARTIFACTS}, or an archive of them"
    )


def file_line(f) -> str:
    """What became of one input (a :class:`~ranksight.importer.run.FileResult`), as a line
    naming it: ``PATH: KIND rank N: what was read``, ``skipped PATH: why`` (no artifact),
    ``could not import PATH (KIND rank N): what is wrong``."""
    rank = "" if f.rank is None else f" rank {f.rank}"
    if f.kind is None:
        why = f.message.removeprefix("skipped: ")
        return f"skipped {f.path}{f' ({rank.strip()})' if rank else ''}: {why}"
    if not f.ok:
        return (
            f"could not import {f.path} ({f.kind}{rank}): {f.message.removeprefix(f.kind + ': ')}"
        )
    return f"{f.path}: {f.kind}{rank}: {f.message}"


def summary_lines(meta: dict) -> list[str]:
    """What the import found beyond the report's findings: communication time per
    collective type (Kineto traces) and each rank's NCCL version, topology and transport
    lines (``NCCL_DEBUG=INFO`` logs, the first 4 a rank)."""
    out = []
    comm = meta.get("comm_time_by_op") or {}
    if comm:
        parts = [
            f"{op} {int(v['kernels'])} kernels {v['total_ms']:.1f} ms"
            for op, v in sorted(comm.items(), key=lambda kv: -kv[1]["total_ms"])
        ]
        out.append("communication time per collective type (all ranks): " + ", ".join(parts))
    for rank, notes in sorted((meta.get("nccl_notes") or {}).items(), key=lambda kv: int(kv[0])):
        if notes:
            who = f"rank {rank}" if int(rank) >= 0 else "a process of no known rank"
            out.append(f"{who} NCCL: " + "; ".join(notes[:4]))
    return out
