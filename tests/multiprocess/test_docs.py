"""What the README tells a new user to run matches what the project requires."""

from __future__ import annotations

import os

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_readme_install_gets_torch_first_in_the_range_pyproject_requires():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        deps = tomllib.load(f)["project"]["dependencies"]
    (torch,) = [d for d in deps if d.replace(" ", "").startswith("torch>")]
    with open(os.path.join(ROOT, "README.md")) as f:
        install = f.read().split("\n## Install\n", 1)[1].split("\n## ", 1)[0]
    cpu = f'pip install "{torch}" --index-url https://download.pytorch.org/whl/cpu'
    assert cpu in install
    assert install.index(cpu) < install.index("pip install -e .")


def _source_files() -> list[str]:
    """Paths (relative to the checkout) of its code, docs and scripts; hidden folders,
    test data and test artifacts left out."""
    out = []
    for root, dirs, files in os.walk(ROOT):
        rel_root = os.path.relpath(root, ROOT)
        dirs[:] = [
            d for d in dirs
            if not d.startswith(".") and d != "__pycache__" and not d.endswith(".egg-info")
            and os.path.join(rel_root, d) not in ("tests/data", "tests/artifacts")
        ]  # fmt: skip
        out += [os.path.normpath(os.path.join(rel_root, f)) for f in files]
    ci = os.path.join(ROOT, ".ci")
    return out + [os.path.join(".ci", f) for f in os.listdir(ci)] if os.path.isdir(ci) else out


def test_nothing_reads_a_folder_beside_the_checkout():
    """The tests, benchmarks and docs read their real artifacts from tests/data: a clone
    has no ``shared/`` beside it."""
    beside = ("../shared", '"..", "..", "shared"', "'..', '..', 'shared'")
    hits = []
    for rel in _source_files():
        if rel == "tests/multiprocess/test_docs.py":  # the patterns themselves
            continue
        if not rel.endswith((".py", ".md", ".sh", ".toml", ".yaml", ".yml")) and not (
            rel.startswith(".ci/")
        ):
            continue
        with open(os.path.join(ROOT, rel), encoding="utf-8", errors="replace") as f:
            text = f.read()
        hits += [f"{rel}: {b}" for b in beside if b in text]
    assert not hits


def test_every_real_artifact_keeps_its_provenance():
    """Each folder of tests/data/realdata has its MANIFEST entry (source and license)."""
    base = os.path.join(ROOT, "tests", "data", "realdata")
    with open(os.path.join(base, "MANIFEST.md")) as f:
        manifest = f.read()
    folders = sorted(d for d in os.listdir(base) if os.path.isdir(os.path.join(base, d)))
    assert folders
    for d in folders:
        assert f"## {d}/" in manifest, d


def test_readme_import_example_is_what_import_prints(tmp_path):
    """The on-call section's report is the one ``ranksight import`` prints for its real
    example today (the README is regenerated when the wording changes)."""
    import subprocess
    import sys

    folder = os.path.join(
        ROOT, "tests", "data", "realworld", "cx-gcd-broadcast-timeout-rank0-silent"
    )
    out = subprocess.run(
        [sys.executable, "-m", "ranksight.cli", "import", "console.log",
         "--store", str(tmp_path / "s"), "--run", "gcd-6"],
        cwd=folder, capture_output=True, text=True, timeout=120,
        env={**os.environ, "COLUMNS": "88", "NO_COLOR": "1", "TERM": "dumb"},
    )  # fmt: skip
    assert out.returncode == 3, out.stderr
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    shown = readme.split("--run gcd-6` says of it (exit code 3):\n\n```text\n", 1)[1].split(
        "```", 1
    )[0]
    assert shown.strip().splitlines() == (out.stdout + out.stderr).strip().splitlines()


def test_the_reliability_table_names_tests_that_exist():
    """Every row of docs/reliability.md names its test, and that test file is there."""
    import re

    with open(os.path.join(ROOT, "docs", "reliability.md")) as f:
        text = f.read()
    rows = [ln for ln in text.splitlines() if ln.startswith("| ") and not ln.startswith("| -")]
    named = re.findall(r"`(tests/[\w/]+\.py)`", text)
    assert len(named) >= 20
    missing = [t for t in named if not os.path.isfile(os.path.join(ROOT, t))]
    assert not missing
    body = [r for r in rows if "what ranksight does" not in r and "what the user sees" not in r]
    assert all("tests/" in r for r in body), [r[:60] for r in body if "tests/" not in r]
