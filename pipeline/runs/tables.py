"""tables: the per-trace tables whole runs are made of (`collectives`, `steps`), written beside a
flattened trace's others once it is linked; what could not be classified counted in its problems."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import orjson
import polars as pl

from pipeline import store
from pipeline.runs.collectives import collectives
from pipeline.runs.steps import steps

RUN_TABLES = ("collectives", "steps")


def write_run_tables(flat_dir: Path, row: dict, gpu_ops: pl.LazyFrame | None = None) -> Callable[[dict], None]:
    """Write collectives.parquet and steps.parquet into a linked flattened directory. Returns what
    counts them in a trace row (how many collectives; what could not be classified, in its
    problems_json), to be applied when the row's other counts are in. `gpu_ops`: its linked GPU
    ops, if not from its gpu_ops.parquet (`collectives.gpu_ops_of`: while that file is being
    rewritten); `row` is only read."""
    flat_dir = Path(flat_dir)
    meta = orjson.loads(row.get("metadata_json") or "{}")
    distributed = meta.get("distributedInfo") if isinstance(meta.get("distributedInfo"), dict) else {}
    colls, problems = collectives(flat_dir, row.get("rank"), distributed, gpu_ops)
    store.write_table(colls.to_arrow(), flat_dir / "collectives.parquet", "collectives")
    store.write_table(steps(flat_dir, colls, gpu_ops).to_arrow(), flat_dir / "steps.parquet", "steps")
    n = colls.height

    def count(row: dict):
        if problems:
            known = orjson.loads(row["problems_json"])
            known.update({f"collectives:{k}": v for k, v in problems.items()})
            row["problems_json"] = orjson.dumps(known).decode()
        row["n_collectives"] = n

    return count


def write_empty_run_tables(flat_dir: Path):
    """The run tables of a trace flattened without linking: empty, with their schema."""
    import pyarrow as pa

    from pipeline import schema

    for name in RUN_TABLES:
        store.write_table(
            pa.Table.from_pylist([], schema=schema.table(name).arrow_schema(schema.ALL_STAGES)),
            Path(flat_dir) / f"{name}.parquet",
            name,
        )
