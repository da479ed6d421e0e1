"""One Streamlit page per module: each has ``render(ctx)`` (see ``ranksight.ui.context``)."""
