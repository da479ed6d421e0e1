"""The Streamlit script ``ranksight ui`` runs: ``streamlit run ui/app.py``."""

from ranksight.ui.shell import main

main()
