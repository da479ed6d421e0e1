"""``ranksight demo``: the CLI over ``ranksight/demo.py``."""

from __future__ import annotations

import typer

from ranksight.cli.common import STORE_OPTION, console, err, fail


def demo(
    inject: str = typer.Option(
        "slow:rank=5,factor=3,from_step=4", help="fault to inject ('none' for a clean run)"
    ),
    steps: int = typer.Option(24, min=4, help="training steps"),
    store: str = STORE_OPTION,
    dp: int = typer.Option(2, min=1),
    tp: int = typer.Option(2, min=1),
    pp: int = typer.Option(2, min=1),
    format: str = typer.Option("text", help="report format: text, json or markdown"),
) -> None:
    """Train a real 3D-parallel GPT on CPU with an injected fault, collect, diagnose, report."""
    from ranksight.demo import DemoConfig, run_demo

    try:
        cfg = DemoConfig(
            inject=inject, steps=steps, store=store, dp=dp, tp=tp, pp=pp, format=format
        )
    except ValueError as e:
        fail(str(e), 2)
    raise typer.Exit(run_demo(cfg, console, err))
