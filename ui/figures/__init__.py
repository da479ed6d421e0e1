"""Plotly figures: pure functions from the frames of ``ranksight.ui.data`` to figures."""
