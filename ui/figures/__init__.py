"""Chart options (ECharts) and figures (Plotly): pure functions from the frames of
``ranksight.ui.data`` to what the pages draw."""
