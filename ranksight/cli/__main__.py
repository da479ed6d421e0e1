"""``python -m ranksight.cli``: the ``ranksight`` command."""

from ranksight.cli import main

main()
