"""Type-check the whole ranksight package with mypy, laid out by import path.

Usage: ``python tools/typecheck.py [mypy arguments]``. Exit code: mypy's (0 when there
are no errors, 1 on errors, 2 on a usage or crash error); 2 also when mypy is not
installed (``pip install -e '.[test]'`` pins it).

pyproject's ``[tool.setuptools] package-dir`` maps import paths to folders
(``ranksight.store`` is ``store/``), which mypy cannot follow in place. This script builds
a temporary tree of symlinks, ``<tmp>/ranksight/store -> <repo>/store`` and so on, from the
same table (:func:`import_graph.package_dirs`), runs ``mypy -p ranksight`` on it with the
settings of pyproject's ``[tool.mypy]``, and prints each error under the file's path in the
repository (``store/base.py``), not the temporary one. mypy's cache stays in
``<repo>/.mypy_cache`` between runs.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from import_graph import ROOT, package_dirs  # noqa: E402


def lay_out(dest: str) -> None:
    """Make ``dest/ranksight`` a tree of symlinks by import path.

    Each package-dir folder becomes a folder under ``dest`` at its import path, whose
    entries are symlinks to the folder's entries; a sub-package with its own package-dir
    entry (``ranksight.store`` inside ``ranksight``) is placed there instead of a link.

    Raises:
        FileNotFoundError: a package-dir folder is missing from the checkout.
    """
    dirs = package_dirs()
    for pkg in sorted(dirs, key=len):
        folder = os.path.join(ROOT, dirs[pkg])
        if not os.path.isdir(folder):
            raise FileNotFoundError(f"pyproject.toml package-dir {pkg!r}: no folder {folder}")
        target = os.path.join(dest, *pkg.split("."))
        os.makedirs(target, exist_ok=True)
        for name in os.listdir(folder):
            if name == "__pycache__" or ".".join([pkg, name]) in dirs:
                continue
            os.symlink(os.path.join(folder, name), os.path.join(target, name))


def repo_paths(text: str, dest: str) -> str:
    """``text`` with each path under ``dest`` rewritten to its file in the repository."""
    prefix = re.escape(dest.rstrip(os.sep) + os.sep)

    def real(m: re.Match[str]) -> str:
        return os.path.relpath(os.path.realpath(os.path.join(dest, m.group(1))), ROOT)

    text = re.sub(prefix + r"(\S+?\.py)", real, text)
    return re.sub(r"(?m)^(ranksight/\S+?\.py)", lambda m: real(m), text)


def main(argv: list[str]) -> int:
    try:
        import mypy  # noqa: F401
    except ImportError:
        print("tools/typecheck.py: mypy is not installed (pip install -e '.[test]')")
        return 2
    with tempfile.TemporaryDirectory(prefix="ranksight-typecheck-") as dest:
        lay_out(dest)
        cmd = [
            sys.executable, "-m", "mypy",
            "--config-file", os.path.join(ROOT, "pyproject.toml"),
            "--cache-dir", os.path.join(ROOT, ".mypy_cache"),
            "-p", "ranksight", *argv,
        ]  # fmt: skip
        env = dict(os.environ, MYPYPATH=dest)
        done = subprocess.run(cmd, cwd=dest, env=env, capture_output=True, text=True)
        sys.stdout.write(repo_paths(done.stdout, dest))
        sys.stderr.write(repo_paths(done.stderr, dest))
        return done.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
