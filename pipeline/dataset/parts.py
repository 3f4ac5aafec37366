"""parts: a dataset's part files, one per table per commit: whole traces in trace_id order, each
trace's rows in their `flatten` order, `trace_id` a real column of every row."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline import schema, store
from pipeline.dataset.layout import KEY, TABLES

PART_ROW_GROUP_ROWS = 1 << 16  # rows of a row group in a part file (about: whole traces)


def part_schema(name: str) -> pa.Schema:
    """A table's schema in a dataset part: its declared columns (every stage), `trace_id` first."""
    s = schema.table(name).arrow_schema(schema.ALL_STAGES)
    if KEY in s.names:
        s = s.remove(s.get_field_index(KEY))
    return pa.schema([pa.field(KEY, pa.string()), *s])


def dictionary_columns(name: str) -> list[str]:
    """The columns a part file dictionary-encodes: trace_id and those declared `dict`."""
    return [KEY, *(c.name for c in schema.table(name).columns if c.type == "dict" and c.name != KEY)]


def conform_part(tbl: pa.Table, name: str) -> pa.Table:
    """A table (with its trace_id) cast to its part schema, columns in order, missing ones null."""
    want = part_schema(name)
    if tbl.schema.equals(want, check_metadata=False):
        return tbl
    return schema.cast_to(tbl, want)


class PartWriter:
    """The part files of a task, one per table (`part_schema`) in STAGE/<table>.parquet, written
    in trace_id order, in row groups of about PART_ROW_GROUP_ROWS rows."""

    def __init__(self, stage: Path):
        self.paths = {name: stage / f"{name}.parquet" for name in TABLES}
        self._writers = {
            name: pq.ParquetWriter(
                str(path),
                part_schema(name),
                use_dictionary=dictionary_columns(name),
                column_encoding=store.delta_columns(part_schema(name), dictionary_columns(name)),
                **store.PARQUET_OPTIONS,
            )
            for name, path in self.paths.items()
        }
        self._pending: dict[str, list[pa.Table]] = {name: [] for name in TABLES}
        self._rows = dict.fromkeys(TABLES, 0)

    def add(self, name: str, tbl: pa.Table, trace_ids: pa.Array):
        """Rows of table `name` (its declared columns) and the trace_id of each."""
        if not tbl.num_rows:
            return
        if KEY in tbl.column_names:
            tbl = tbl.drop_columns([KEY])
        self._pending[name].append(conform_part(tbl.add_column(0, KEY, trace_ids), name))
        self._rows[name] += tbl.num_rows
        if self._rows[name] >= PART_ROW_GROUP_ROWS:
            self._flush(name)

    def _flush(self, name: str):
        if self._pending[name]:
            self._writers[name].write_table(pa.concat_tables(self._pending[name]), row_group_size=1 << 30)
            self._pending[name], self._rows[name] = [], 0

    def close(self):
        for name, w in self._writers.items():
            self._flush(name)
            w.close()

    def abandon(self):
        for w in self._writers.values():
            with contextlib.suppress(OSError, ValueError, pa.ArrowException):
                w.close()
