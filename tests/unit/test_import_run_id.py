"""An import names its run: never one the hooks recorded (artifacts of another job, or a
second copy of this one's, would mix with its records and change its status for good),
while an imported run takes more artifacts of its job."""

from __future__ import annotations

import os

import pandas as pd
import pytest

from ranksight.importer import ImportConfig, import_paths
from ranksight.importer.run import HookedRun
from ranksight.store import open_store
from tests.helpers.realworld import CORPUS


def test_an_import_never_adds_to_a_run_the_hooks_recorded(tmp_path) -> None:
    """Importing a console with ``--run`` of a finished hooked run filed its hang under that
    run and turned it 'crashed' for good; adding to an imported run stays allowed."""
    store = open_store(str(tmp_path / "store"))
    store.init_schema()
    row = {"run_id": "hooked", "attempt": 0, "created_ns": 1, "updated_ns": 1,
           "status": "finished", "world_size": 8, "dp": 2, "tp": 2, "pp": 2,
           "meta_json": '{"source": "demo"}'}  # fmt: skip
    store.insert("runs", pd.DataFrame([row]))
    log = os.path.join(CORPUS, "bk4-pytorch-20630", "console.log")
    with pytest.raises(HookedRun, match="recorded by ranksight's hooks"):
        import_paths(store, [log], ImportConfig(run_id="hooked"))
    assert store.query("SELECT count() AS n FROM log_events")["n"][0] == 0
    for _ in range(2):  # an imported run takes more artifacts
        assert import_paths(store, [log], ImportConfig(run_id="imported")).imported
