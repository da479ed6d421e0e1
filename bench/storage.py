"""Storage per record, measured: records per rank per step by table, and bytes per record
on disk after ClickHouse's compression (LZ4, the server default), for one run in a server
store. Prints the projection to 1,000 GPUs for a day.

    python bench/storage.py clickhouse://127.0.0.1:9000/ranksight RUN_ID [STEP_S]

STEP_S: the step time the projection assumes (default 1.0 s). Bytes are read from
``system.columns`` (data_compressed_bytes of the whole table: run it on a database that
holds just the measured run); on a cluster, point it at the shard that holds the run.
"""

from __future__ import annotations

import sys

from ranksight.store import open_store
from ranksight.store.schema import RECORD_TABLES


def main(url: str, run_id: str, step_s: float = 1.0) -> None:
    store = open_store(url)
    ranks = store.query(
        "SELECT uniqExact(rank) AS r, uniqExact(step) AS s FROM steps WHERE run_id = %(r)s",
        {"r": run_id},
    )
    n_ranks, n_steps = int(ranks["r"].iloc[0]), int(ranks["s"].iloc[0])
    local = store.cluster() and "_local" or ""
    total_rows = total_bytes = 0
    print(f"run {run_id}: {n_ranks} ranks x {n_steps} steps")
    print(f"{'table':<12} {'records/rank/step':>18} {'bytes/record':>13}")
    for table in RECORD_TABLES:
        rows = int(
            store.query(f"SELECT count() AS n FROM {table} WHERE run_id = %(r)s", {"r": run_id})[
                "n"
            ].iloc[0]
        )
        size = store.admin_rows(
            "SELECT sum(data_compressed_bytes) FROM system.columns WHERE database = %(d)s AND table = %(t)s",
            {"d": store.database, "t": table + local},
        )[0][0]
        total_rows, total_bytes = total_rows + rows, total_bytes + int(size)
        per = rows / max(1, n_ranks * n_steps)
        print(f"{table:<12} {per:>18.1f} {int(size) / max(1, rows):>13.1f}")
    per_rank_step = total_rows / max(1, n_ranks * n_steps)
    per_record = total_bytes / max(1, total_rows)
    day = 1000 * per_rank_step * (86400 / step_s) * per_record
    print(f"{'all':<12} {per_rank_step:>18.1f} {per_record:>13.1f}")
    print(
        f"1,000 GPUs, {step_s:g} s steps, 24 h: {1000 * per_rank_step * 86400 / step_s / 1e9:.2f} G records, {day / 1e9:.1f} GB on disk"
    )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]) if len(sys.argv) > 3 else 1.0)
