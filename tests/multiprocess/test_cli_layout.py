"""The CLI is one package, ``ranksight/cli/``, above everything else: no library module
imports it, and the options every subcommand shares are defined once."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys

import typer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _import_graph():
    spec = importlib.util.spec_from_file_location(
        "import_graph", os.path.join(ROOT, "tools", "import_graph.py")
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _is_cli(mod: str) -> bool:
    return mod == "ranksight.cli" or mod.startswith("ranksight.cli.")


def test_no_library_module_imports_the_cli():
    tool = _import_graph()
    graph = tool.graph()
    assert "ranksight.cli.common" in graph  # the graph does read the package
    up = sorted((a, b) for a, deps in graph.items() if not _is_cli(a) for b in deps if _is_cli(b))
    assert up == []
    assert [c for c in tool.circles(graph) if any(_is_cli(m) for m in c)] == []


def _options(command, path=()):
    """(command path, click option) for every option of the ``ranksight`` tree."""
    for param in getattr(command, "params", []):
        yield path, param
    for name, sub in getattr(command, "commands", {}).items():
        yield from _options(sub, (*path, name))


def test_every_store_option_is_the_one_store_option():
    from ranksight.cli import app
    from ranksight.cli.common import STORE_OPTION

    stores = {p: o for p, o in _options(typer.main.get_command(app)) if "--store" in o.opts}
    assert set(stores) == {
        ("demo",), ("report",), ("runs",), ("agent",), ("synth",), ("faultmatrix",), ("ui",),
        ("stacks",), ("fr-import",), ("launch",), ("import",), ("db", "migrate"), ("db", "init"),
    }  # fmt: skip
    # the fault matrix's store is its own work store: default <home>/store, not $RANKSIGHT_STORE
    assert "<home>/store" in stores.pop(("faultmatrix",)).help
    assert {p: o.help for p, o in stores.items()} == {p: STORE_OPTION.help for p in stores}
    assert STORE_OPTION.help.startswith("store URL: a folder (chdb) or clickhouse://host:port/db")


def test_help_lists_every_command_in_order():
    out = subprocess.run(
        [sys.executable, "-m", "ranksight.cli", "--help"], capture_output=True, text=True,
        env={**os.environ, "COLUMNS": "200"}, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    commands = out.stdout.split("Commands")[1]  # the box after Options
    listed = [m.group(1) for m in re.finditer(r"^│ (\S+)  ", commands, re.M)]
    assert listed == [
        "demo", "report", "runs", "agent", "synth", "faultmatrix", "ui", "stacks", "fr-import",
        "launch", "import", "db", "config",
    ]  # fmt: skip
