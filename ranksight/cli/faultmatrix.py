"""``ranksight faultmatrix``: score the analyzer on every injectable fault."""

from __future__ import annotations

import os
import sys

import typer

from ranksight.cli.common import console, fail


def faultmatrix(
    scenarios: str = typer.Option(None, help="comma-separated scenario names (default: all)"),
    quick: bool = typer.Option(False, "--quick", help="the CI subset (clean, slow, crash)"),
    home: str = typer.Option(
        None, help="work folder: spool, logs, store (default $RANKSIGHT_HOME/faultmatrix)"
    ),
    store: str = typer.Option(None, "--store", help="store URL (default <home>/store)"),
    out: str = typer.Option("docs/fault-matrix.md", help="Markdown result ('' to skip)"),
    json_out: str = typer.Option(
        "docs/fault-matrix.json", "--json", help="JSON result ('' to skip)"
    ),
    poll: float = typer.Option(3.0, min=0.5, help="seconds between analyses of a running job"),
    hang_timeout: float = typer.Option(90.0, min=5, help="stop a job this long after its fault"),
    list_only: bool = typer.Option(False, "--list", help="list the scenarios and exit"),
) -> None:
    """Run each fault scenario (and clean runs) on 8 CPU ranks; exit 0 only if all are right."""
    from ranksight.faultmatrix import pick
    from ranksight.faultmatrix.report import passed, print_table, to_json, to_markdown
    from ranksight.faultmatrix.run import MatrixConfig, run_matrix
    from ranksight.ground import env
    from ranksight.store import StoreError

    try:
        chosen = pick(scenarios, quick)
        base = home or os.path.join(os.environ.get(env.HOME, env.DEFAULT_HOME), "faultmatrix")
        cfg = MatrixConfig(home=os.path.abspath(base), store=store, poll_s=poll,
                           hang_timeout_s=hang_timeout)  # fmt: skip
    except ValueError as e:
        fail(str(e), 2)
    if list_only:
        for sc in chosen:
            console.print(f"{sc.name:16s} {sc.inject}{'  (quick)' if sc.quick else ''}")
        return

    def show(row) -> None:
        console.print(f"{row.scenario}: {row.verdict} (found {row.found}; {row.wall_s:.0f} s)")

    try:
        rows = run_matrix(cfg, chosen, progress=show)
    except StoreError as e:
        fail(str(e))
    print_table(rows, console)
    command = "ranksight faultmatrix " + " ".join(sys.argv[2:])
    for path, text in ((out, to_markdown(rows, command.strip())), (json_out, to_json(rows))):
        if path:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            with open(path, "w") as f:
                f.write(text)
            console.print(f"wrote {path}")
    raise typer.Exit(0 if passed(rows) else 1)
