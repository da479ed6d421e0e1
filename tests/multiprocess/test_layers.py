"""The house's shape: no import circle and no import against the layer order
(tools/import_graph.py, docs/architecture.md). That no library module imports the CLI is
tests/multiprocess/test_cli_layout.py's."""

from __future__ import annotations

from tests.multiprocess.test_cli_layout import _import_graph as _tool


def test_no_import_circle_and_no_arrow_against_the_layers():
    tool = _tool()
    g = tool.graph()
    assert len(g) > 200 and "ranksight.store.base" in g and "ranksight.cli" in g
    assert tool.circles(g) == []
    assert tool.against_layers(g) == []
    assert tool.ground_and_roof(sorted(g)) == []


def test_the_checker_sees_a_circle_and_an_arrow_up():
    """The checks can fail: a made-up circle and an upward arrow are found."""
    tool = _tool()
    assert tool.circles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]
    up = {"ranksight.store.base": {"ranksight.analyzer.api"}, "ranksight.analyzer.api": set()}
    assert tool.against_layers(up) == [("ranksight.store.base", "ranksight.analyzer.api")]
    mixed = ["ranksight.ground", "ranksight.ground.env", "ranksight.ground.report"]
    assert tool.ground_and_roof(mixed) == []  # ranksight.ground.report is still ground
    assert tool.ground_and_roof(["ranksight", "ranksight.report", "ranksight.ground.env"]) == []
    tool.LAYERS.append((1, "ranksight.made_up_env"))
    try:
        assert tool.ground_and_roof(["ranksight", "ranksight.report", "ranksight.made_up_env"]) == [
            "ranksight"
        ]
    finally:
        tool.LAYERS.remove((1, "ranksight.made_up_env"))


def test_a_wheel_holds_every_module_of_the_checkout(tmp_path):
    """pyproject lists its packages one by one (``package-dir`` maps folders to import
    paths): a new sub-package left off that list works in an editable install and is
    missing from a wheel. Built here with pip, as a user's non-editable install is."""
    import os
    import shutil
    import subprocess
    import sys
    import zipfile

    tool = _tool()
    src = tmp_path / "src"  # a clean copy: a build/ folder left in the checkout would hide it
    skip = shutil.ignore_patterns("__pycache__", "build", "*.egg-info")
    for folder in {f.split("/")[0] for f in tool.package_dirs().values()}:
        shutil.copytree(os.path.join(tool.ROOT, folder), src / folder, ignore=skip)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(os.path.join(tool.ROOT, name), src / name)
    out = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path), str(src)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    (wheel,) = tmp_path.glob("ranksight-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    want = {mod.replace(".", "/") + (".py" if not path.endswith("__init__.py") else "/__init__.py")
            for mod, path in tool.modules().items()}  # fmt: skip
    assert want - names == set()
