"""tables: the per-trace tables whole runs are made of (`collectives`, `steps`), written beside a
flattened trace's others once it is linked; what could not be classified counted in its problems."""

from __future__ import annotations

from pathlib import Path

import orjson

from pipeline import store
from pipeline.runs.collectives import collectives
from pipeline.runs.steps import steps

RUN_TABLES = ("collectives", "steps")


def write_run_tables(flat_dir: Path, row: dict):
    """Write collectives.parquet and steps.parquet into a linked flattened directory; count what
    could not be classified in the trace row's problems_json."""
    flat_dir = Path(flat_dir)
    meta = orjson.loads(row.get("metadata_json") or "{}")
    distributed = meta.get("distributedInfo") if isinstance(meta.get("distributedInfo"), dict) else {}
    colls, problems = collectives(flat_dir, row.get("rank"), distributed)
    store.write_table(colls.to_arrow(), flat_dir / "collectives.parquet", "collectives")
    store.write_table(steps(flat_dir, colls).to_arrow(), flat_dir / "steps.parquet", "steps")
    if problems:
        known = orjson.loads(row["problems_json"])
        known.update({f"collectives:{k}": v for k, v in problems.items()})
        row["problems_json"] = orjson.dumps(known).decode()
    row["n_collectives"] = colls.height


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
