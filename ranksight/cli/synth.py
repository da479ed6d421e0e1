"""``ranksight synth``: write a synthetic run (any scale, injected faults) into a store."""

from __future__ import annotations

import typer

from ranksight.cli.common import STORE_OPTION, console, fail, open_store_arg
from ranksight.ground.words import counted


def synth(
    ranks: int = typer.Option(
        None, help="world size; picks dp/tp/pp (TP8, PP4 from 64 ranks up) unless given"
    ),
    steps: int = typer.Option(100, min=1, help="training steps"),
    inject: list[str] = typer.Option(
        [], help="fault spec, repeatable (e.g. slow:rank=12,factor=1.5,from_step=20)"
    ),
    dp: int = typer.Option(None, min=1),
    tp: int = typer.Option(None, min=1),
    pp: int = typer.Option(None, min=1),
    microbatches: int = typer.Option(None, min=1, help="per step (default pp)"),
    seed: int = typer.Option(0),
    run_id: str = typer.Option(None, help="default synth-<12 hex>"),
    store: str = STORE_OPTION,
) -> None:
    """Write a synthetic DP x TP x PP run with the real schema and injected faults."""
    from ranksight.store import StoreError
    from ranksight.synthetic import SynthConfig, rows_per_rank_step, write_synthetic

    try:
        cfg = SynthConfig(
            ranks=ranks, dp=dp, tp=tp, pp=pp, steps=steps, microbatches=microbatches,
            faults=tuple(inject), seed=seed, run_id=run_id,
        )  # fmt: skip
    except ValueError as e:
        fail(str(e), 2)
    console.print(
        f"synthetic run [bold]{cfg.run_id}[/]: {counted(cfg.ranks, 'rank')} (DP{cfg.dp} x TP{cfg.tp} x "
        f"PP{cfg.pp}), {counted(cfg.steps, 'step')}, {counted(cfg.microbatches, 'microbatch', 'microbatches')}, about "
        f"{rows_per_rank_step(cfg):.0f} rows per rank and step; faults: "
        f"{', '.join(s.text for s in cfg.specs) or 'none'}"
    )
    s = open_store_arg(store)
    try:
        result = write_synthetic(s, cfg)
    except StoreError as e:
        fail(str(e))
    total = sum(result.rows.values())
    console.print(
        f"wrote {counted(total, 'row', spec=',')} ({', '.join(f'{k} {v:,}' for k, v in result.rows.items())}) "
        f"for {counted(result.steps_written, 'step')} in {result.seconds:.1f} s; "
        f"diagnose: ranksight report --run {cfg.run_id}"
    )
