"""The web UI: Streamlit + Plotly over the same store and analyzer results as the CLI.

Start it with ``ranksight ui [--store URL]`` (binds 127.0.0.1). Pages: runs, run
overview, rank x step heatmap, aligned timeline, mesh, hang, hosts; a run, step and rank
are linked by URL (``?page=timeline&run=RUN&step=7&rank=5``). Reads are in
``ranksight.ui.data`` (SQL aggregated in the store, sized to the screen), figures in
``ranksight.ui.figures`` (pure functions), pages in ``ranksight.ui.views``.
"""

from ranksight.ui.config import UiConfig

__all__ = ["UiConfig", "APP_PATH"]

import os as _os

APP_PATH = _os.path.join(_os.path.dirname(__file__), "app.py")
"""The Streamlit script to ``streamlit run``."""
