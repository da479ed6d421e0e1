"""The fault matrix's result as a rich table, a Markdown page and a JSON document."""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from ranksight.faultmatrix.run import Row

COLUMNS = ("scenario", "fault", "expected", "found", "verdict", "detect s", "detect steps",
           "false findings")  # fmt: skip


def _cells(r: Row) -> tuple[str, ...]:
    return (
        r.scenario,
        r.inject,
        r.expected,
        r.found,
        r.verdict,
        "-" if r.detect_s is None else f"{r.detect_s:.1f}",
        "-" if r.detect_steps is None else str(r.detect_steps),
        ", ".join(r.false_findings) or "0",
    )


def machine() -> dict[str, str]:
    """Where the matrix ran: host, CPU count, OS, Python and torch versions."""
    torch_version: str
    try:
        import torch

        torch_version = str(torch.__version__)
    except ImportError:  # pragma: no cover
        torch_version = "?"
    return {
        "host": platform.node(),
        "cpus": str(os.cpu_count()),
        "os": platform.platform(),
        "python": platform.python_version(),
        "torch": torch_version,
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
    }


def passed(rows: Sequence[Row]) -> bool:
    """Whether every row is ``right``."""
    return bool(rows) and all(r.verdict == "right" for r in rows)


def print_table(rows: Sequence[Row], console: Console) -> None:
    """The matrix as a rich table, verdicts coloured."""
    table = Table(title="ranksight fault matrix (8 CPU ranks, DP2 x TP2 x PP2)")
    for col in COLUMNS:
        table.add_column(col, overflow="fold")
    for r in rows:
        cells = list(_cells(r))
        cells[4] = f"[{'green' if r.verdict == 'right' else 'red'}]{r.verdict}[/]"
        table.add_row(*cells)
    console.print(table)
    right = sum(r.verdict == "right" for r in rows)
    console.print(f"{right}/{len(rows)} right")


def to_json(rows: Sequence[Row]) -> str:
    """Machine, rows (with every finding) and the overall result."""
    doc = {"machine": machine(), "passed": passed(rows), "rows": [r.to_dict() for r in rows]}
    return json.dumps(doc, indent=1, default=str)


def to_markdown(rows: Sequence[Row], command: str) -> str:
    """``docs/fault-matrix.md``: what ran where, the table, and per-scenario notes."""
    m = machine()
    right = sum(r.verdict == "right" for r in rows)
    lines = [
        "# Fault matrix",
        "",
        f"`{command}` on {m['host']} ({m['cpus']} CPUs, {m['os']}, Python {m['python']}, "
        f"torch {m['torch']}), {m['date']}. Every scenario is a real training job: 8 CPU "
        "ranks (DP2 x TP2 x PP2, gloo) of the reference trainer with the hooks and a node "
        "agent, analyzed every few seconds while it runs and once after. "
        f"**{right}/{len(rows)} right.**",
        "",
        "Verdicts and expected findings: see `ranksight/faultmatrix/__init__.py`. *detect s*: seconds "
        "from the fault taking effect (the injector's log line) to the first analysis that "
        "made the expected finding; *detect steps*: steps completed from the fault's first "
        "step until then.",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    lines += ["| " + " | ".join(c.replace("|", "/") for c in _cells(r)) + " |" for r in rows]
    lines += ["", "## Notes", ""]
    for r in rows:
        found = "; ".join(f"{f['kind']}/{f['cause']} @ {f['culprit_rank']}" for f in r.findings)
        lines.append(
            f"- **{r.scenario}** (run `{r.run_id}`, job exit {r.job_rc}, {r.wall_s:.0f} s): "
            f"findings: {found or 'none'}" + (f"; {r.note}" if r.note else "")
        )
    return "\n".join(lines) + "\n"
