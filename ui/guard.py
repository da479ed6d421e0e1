"""Pages never show a traceback: store and input problems become one clear message."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import streamlit as st

from ranksight.analyzer import UnknownRun
from ranksight.store import StoreError
from ranksight.store.url import redact

log = logging.getLogger("ranksight.ui")


class NoData(Exception):
    """A page has nothing to draw yet; the message says what is missing."""


@contextlib.contextmanager
def page_guard(url: str) -> Iterator[None]:
    """Run a page; show UnknownRun and NoData as warnings, StoreError as "store
    unavailable", anything else as a one-line internal error (the traceback goes to the
    server log). Streamlit's own control-flow exceptions (rerun, stop) pass through."""
    try:
        yield
    except UnknownRun as e:
        st.warning(str(e))
    except NoData as e:
        st.info(str(e))
    except StoreError as e:
        if "no store here" in str(e):  # a chdb folder nothing was written to yet
            shown = redact(url)
            st.info(f"No store at {shown} yet. Start a run with: ranksight demo --store {shown}")
        else:
            st.error(f"The store is unavailable: {e}")
    except ValueError as e:
        st.warning(f"Cannot show this: {e}")
    except Exception as e:  # noqa: BLE001 - the page must explain, not crash
        if type(e).__module__.startswith("streamlit"):
            raise
        log.exception("page failed")
        st.error(
            f"Internal error while drawing this page ({type(e).__name__}: {e}); details are in the UI server's log."
        )
