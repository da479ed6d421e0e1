"""Opt-in start-up hook for ranksight's zero-code attach (``trainer_hooks/autoattach.py``).

Python imports ``sitecustomize`` at start-up from the first folder on ``sys.path`` that has
one; ``ranksight launch`` puts this folder first on ``PYTHONPATH`` and sets
``RANKSIGHT_AUTO_ATTACH=1``. Another ``sitecustomize`` further down the path (a site's or a
virtualenv's) still runs: it is loaded after ours. Nothing here raises.
"""

import os
import sys


def _ranksight_install() -> None:
    if os.environ.get("RANKSIGHT_AUTO_ATTACH") != "1":
        return
    try:
        from ranksight.trainer_hooks.autoattach import install

        install()
    except Exception as exc:  # never stop the interpreter from starting
        sys.stderr.write(f"ranksight auto-attach disabled: {exc}\n")


def _next_sitecustomize() -> None:
    """Run the next ``sitecustomize`` on ``sys.path`` after this folder, if any."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    try:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.stderr.write(f"sitecustomize {spec.origin} failed: {exc}\n")


_ranksight_install()
_next_sitecustomize()
