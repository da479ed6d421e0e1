"""Read spool files back into per-table frames (what the agent would ship)."""

from __future__ import annotations

import pandas as pd

from ranksight.agent import SpoolTailer


def read_spool(spool_dir: str) -> dict[str, pd.DataFrame]:
    """Every record in ``spool_dir`` as one frame per table; asserts none was rejected."""
    batch = SpoolTailer(spool_dir).read()
    assert batch.rejected == [], batch.rejected
    return batch.frames()
