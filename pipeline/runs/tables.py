"""tables: the per-trace tables whole runs are made of (`collectives`, `steps`), written beside a
flattened trace's others once it is linked; what could not be classified counted in its problems."""

from __future__ import annotations

from pathlib import Path

import orjson
import polars as pl

from pipeline import store
from pipeline.runs.collectives import collectives
from pipeline.runs.source import TraceTables
from pipeline.runs.steps import steps

RUN_TABLES = ("collectives", "steps")


def write_run_tables(flat_dir: Path, row: dict):
    """Write collectives.parquet and steps.parquet into a linked flattened directory; count what
    could not be classified in the trace row's problems_json."""
    flat_dir = Path(flat_dir)
    colls, steps_table = run_tables(flat_dir, row)
    store.write_table(colls.to_arrow(), flat_dir / "collectives.parquet", "collectives")
    store.write_table(steps_table.to_arrow(), flat_dir / "steps.parquet", "steps")


def run_tables(tables: TraceTables, row: dict) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The collectives and steps tables of a linked trace (its directory, or its tables in memory:
    `runs.source`); what could not be classified counted in the trace row's problems_json."""
    meta = orjson.loads(row.get("metadata_json") or "{}")
    distributed = meta.get("distributedInfo") if isinstance(meta.get("distributedInfo"), dict) else {}
    colls, problems = collectives(tables, row.get("rank"), distributed)
    if problems:
        known = orjson.loads(row["problems_json"])
        known.update({f"collectives:{k}": v for k, v in problems.items()})
        row["problems_json"] = orjson.dumps(known).decode()
    row["n_collectives"] = colls.height
    return colls, steps(tables, colls)


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
