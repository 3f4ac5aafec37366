"""Table schemas, declared once in `schemas/*.toml` (column, type, unit, meaning).

The writer, the validation and the documentation's table reference all derive from these files.
A column may name the `stage` that fills it (`flatten` by default, else `link` or `cost`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import pyarrow as pa

from pipeline.resources import find_dir, read_toml

TABLES = ("events", "gpu_ops", "flows", "devices", "trace", "collectives", "steps")  # of one flattened trace
MANIFEST = "traces"  # a batch dataset's manifest (`pipeline.dataset.layout`)
DOCUMENTED = (*TABLES, MANIFEST)

ARROW_TYPES = {
    "int64": pa.int64(),
    "float64": pa.float64(),
    "string": pa.string(),
    "dict": pa.string(),  # string with many repeats: Parquet dictionary-encodes it
    "bool": pa.bool_(),
    "timestamp": pa.timestamp("ms", tz="UTC"),
}


SCHEMA_DIR = find_dir("schemas")
DATA_DIR = find_dir("data")


@dataclass(frozen=True)
class Column:
    name: str
    type: str
    meaning: str
    unit: str = ""
    stage: str = "flatten"

    @property
    def arrow_type(self) -> pa.DataType:
        return ARROW_TYPES[self.type]


@dataclass(frozen=True)
class Table:
    name: str
    description: str
    columns: tuple[Column, ...]

    def names(self, stages=("flatten",)) -> list[str]:
        return [c.name for c in self.columns if c.stage in stages]

    def arrow_schema(self, stages=("flatten",)) -> pa.Schema:
        return pa.schema([pa.field(c.name, c.arrow_type) for c in self.columns if c.stage in stages])

    def column(self, name: str) -> Column:
        for c in self.columns:
            if c.name == name:
                return c
        raise KeyError(f"{self.name} has no column {name!r}")


@cache
def table(name: str) -> Table:
    raw = read_toml(SCHEMA_DIR / f"{name}.toml")
    cols = tuple(Column(**c) for c in raw["columns"])
    for c in cols:
        if c.type not in ARROW_TYPES:
            raise ValueError(f"schemas/{name}.toml: column {c.name} has unknown type {c.type!r}")
    return Table(raw["name"], raw["description"], cols)


ALL_STAGES = ("flatten", "link", "cost")


@cache
def _arrow_schema(name: str, stages: tuple) -> pa.Schema:
    return table(name).arrow_schema(stages)


def conform(tbl: pa.Table, name: str, stages=ALL_STAGES) -> pa.Table:
    """Cast a table to its declared schema: declared columns in order, missing ones null.

    Columns that the schema does not declare are an error: every column is declared once.
    """
    schema = _arrow_schema(name, tuple(stages))
    if tbl.schema.equals(schema, check_metadata=False):
        return tbl  # built to the schema already (the flatten workers' tables)
    extra = set(tbl.column_names) - set(schema.names)
    if extra:
        raise ValueError(f"table {name} has undeclared columns {sorted(extra)}: add them to schemas/{name}.toml")
    return cast_to(tbl, schema)


def cast_to(tbl: pa.Table, schema: pa.Schema) -> pa.Table:
    """`tbl` with the columns of `schema` in its order, each cast to its type, missing ones null."""
    arrays = []
    at = {n: i for i, n in enumerate(tbl.column_names)}  # a name's lookup in a table is a linear search
    for f in schema:
        if f.name in at:
            col = tbl.column(at[f.name])
            arrays.append(col if col.type == f.type else col.cast(f.type))
        else:
            arrays.append(pa.nulls(tbl.num_rows, f.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def markdown(name: str) -> str:
    """The documentation section for one table."""
    t = table(name)
    lines = [
        f"#### `{t.name}`",
        "",
        t.description,
        "",
        "| column | type | unit | stage | meaning |",
        "|---|---|---|---|---|",
    ]
    for c in t.columns:
        lines.append(f"| `{c.name}` | {c.type} | {c.unit} | {c.stage} | {c.meaning} |")
    return "\n".join(lines)
