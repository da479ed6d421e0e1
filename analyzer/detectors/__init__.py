"""One module per finding kind: its query, what it detects, the finding it builds
(``base.py``: the seam). Registered in ``analyzer/registry.py``."""
