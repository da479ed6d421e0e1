"""What the README tells a new user to run matches what the project requires."""

from __future__ import annotations

import os

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_readme_install_gets_torch_first_in_the_range_pyproject_requires():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        deps = tomllib.load(f)["project"]["dependencies"]
    (torch,) = [d for d in deps if d.replace(" ", "").startswith("torch>")]
    with open(os.path.join(ROOT, "README.md")) as f:
        install = f.read().split("\n## Install\n", 1)[1].split("\n## ", 1)[0]
    cpu = f'pip install "{torch}" --index-url https://download.pytorch.org/whl/cpu'
    assert cpu in install
    assert install.index(cpu) < install.index("pip install -e .")
