"""tables: the per-trace tables whole runs are made of (`collectives`, `steps`), written beside a
flattened trace's others once it is linked; what could not be classified counted in its problems."""

from __future__ import annotations

from pathlib import Path

import orjson
import polars as pl

from pipeline import schema, store
from pipeline.runs.collectives import SLICE_ROWS, collective_slices, collectives
from pipeline.runs.source import TraceTables
from pipeline.runs.steps import steps

RUN_TABLES = ("collectives", "steps")


def write_run_tables(flat_dir: Path, row: dict):
    """Write collectives.parquet (a slice at a time: `collective_slices`) and steps.parquet into a
    linked flattened directory; count what could not be classified in the trace row's problems_json."""
    flat_dir = Path(flat_dir)
    problems: dict[str, int] = {}
    # slices come with their repeated strings as categoricals (`collective_slices`), written as the
    # dictionaries they are: a 256-rank group's rank list is ~1.2 KB, 75 MB a slice as strings
    writer = store.TableWriter(
        flat_dir / "collectives.parquet", "collectives", schema.ALL_STAGES, buffer_rows=SLICE_ROWS, dictionaries=True
    )
    try:
        for part in collective_slices(flat_dir, row.get("rank"), distributed_info(row), problems):
            writer.write(part.to_arrow())
    except BaseException:
        writer.abandon()
        raise
    writer.close()
    count_problems(row, problems, writer.rows)
    # a trace without kernels measures its steps by its collectives, read back from their table
    store.write_table(steps(flat_dir).to_arrow(), flat_dir / "steps.parquet", "steps")


def run_tables(tables: TraceTables, row: dict) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The collectives and steps tables of a linked trace (its directory, or its tables in memory:
    `runs.source`); what could not be classified counted in the trace row's problems_json."""
    colls = collectives_table(tables, row)
    return colls, steps(tables, colls)


def collectives_table(tables: TraceTables, row: dict) -> pl.DataFrame:
    """`run_tables`' collectives alone (a trace with kernels measures its steps by them only)."""
    colls, problems = collectives(tables, row.get("rank"), distributed_info(row))
    count_problems(row, problems, colls.height)
    return colls


def distributed_info(row: dict) -> dict:
    """The trace's `distributedInfo` (world size, rank, process groups), {} when it has none."""
    meta = orjson.loads(row.get("metadata_json") or "{}")
    return meta.get("distributedInfo") if isinstance(meta.get("distributedInfo"), dict) else {}


def count_problems(row: dict, problems: dict, n_collectives: int):
    """Count what the collectives could not classify (`problems`, by reason) and how many they
    are in the trace row."""
    if problems:
        known = orjson.loads(row["problems_json"])
        known.update({f"collectives:{k}": v for k, v in problems.items()})
        row["problems_json"] = orjson.dumps(known).decode()
    row["n_collectives"] = n_collectives


def write_empty_run_tables(flat_dir: Path):
    """The run tables of a trace flattened without linking: empty, with their schema."""
    import pyarrow as pa

    for name in RUN_TABLES:
        store.write_table(
            pa.Table.from_pylist([], schema=schema.table(name).arrow_schema(schema.ALL_STAGES)),
            Path(flat_dir) / f"{name}.parquet",
            name,
        )
