"""What every page gets: the store URL, the config, the selection, and the run."""

from __future__ import annotations

from dataclasses import dataclass

import streamlit as st

from ranksight.ui.config import UiConfig
from ranksight.ui.data.run import ORDERS, RunMark, RunView
from ranksight.ui.guard import NoData
from ranksight.ui.state import Selection


@dataclass(frozen=True)
class PageContext:
    """A page's inputs. ``run`` is None on the Runs page and when no run is selected."""

    url: str
    cfg: UiConfig
    sel: Selection
    run: RunView | None = None
    mark: RunMark = RunMark()
    """The run's data version: cached reads key on it."""
    status: str = ""
    """The run's status as the Runs page shows it (running, finished, hung, crashed)."""

    @property
    def selected_run(self) -> RunView:
        """``run``, for the pages of one run. Raises NoData when no run is selected (the
        shell selects one for every page but the Runs page)."""
        if self.run is None:
            raise NoData("No run is selected.")
        return self.run

    @property
    def order(self) -> tuple[str, ...]:
        """The selected rank order's axes (outermost first; () = global rank)."""
        return ORDERS[self.sel.order]


def go(sel: Selection, **changes) -> None:
    """Navigate: set the query string to ``sel`` with ``changes`` and rerun the app."""
    target = sel.with_(**changes)
    st.query_params.from_dict(target.to_params())
    st.rerun()


def link_button(label: str, sel: Selection, key: str, **changes) -> None:
    """A button that navigates to ``sel`` with ``changes`` (see :func:`go`)."""
    if st.button(label, key=key):
        go(sel, **changes)
