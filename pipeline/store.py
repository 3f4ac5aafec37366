"""store: where tables live on disk. Parquet settings, atomic directories, lazy scans."""

from __future__ import annotations

import enum
import os
import tempfile
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from contextvars import ContextVar
from pathlib import Path
from typing import TypeVar

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline import schema
from pipeline.errors import DatasetError
from pipeline.files import atomic_dir, atomic_file, is_flat_dir, output_of, umask  # noqa: F401 - their home before

PARQUET_OPTIONS = dict(compression="zstd", compression_level=1, write_statistics=True)
# a flatten that one report reads once and deletes (`scratch_files`): LZ4, which writes faster and
# reads back faster (209 MB trace, `analyze --section devices --section kernels`: 2.27 -> 2.15 s;
# its events.parquet 7.0 -> 13.8 MB)
SCRATCH_OPTIONS = dict(PARQUET_OPTIONS, compression="lz4", compression_level=None)
_OPTIONS: ContextVar[dict] = ContextVar("parquet_options", default=PARQUET_OPTIONS)


def parquet_options(arrow_schema: pa.Schema, dictionary: Sequence[str] = ()) -> dict:
    """The Parquet writer options of a file of this schema written here (`scratch_files` changes
    them), its `dictionary` columns dictionary-encoded: statistics on `statistics_columns` only."""
    options = {k: v for k, v in _OPTIONS.get().items() if v is not None}
    return {**options, "write_statistics": statistics_columns(arrow_schema, dictionary)}


@contextmanager
def scratch_files() -> Iterator[None]:
    """Tables written in this context (by this thread; a writer keeps the options it was made
    with) are scratch: read once and deleted, written for speed rather than size."""
    token = _OPTIONS.set(SCRATCH_OPTIONS)
    try:
        yield
    finally:
        _OPTIONS.reset(token)


ROW_GROUP_ROWS = 1 << 20
BUFFER_ROWS = 1 << 16  # rows gathered before a write: fewer, larger row groups encode faster


def frame_from_arrow(data: pa.Table | pa.RecordBatch) -> pl.DataFrame:
    """`pl.from_arrow` of an Arrow table or record batch: a DataFrame (polars types its result
    DataFrame | Series, having no types of pyarrow's to overload on)."""
    frame = pl.from_arrow(data)
    assert isinstance(frame, pl.DataFrame)
    return frame


def scalar_int(value: object) -> int:
    """An integer scalar from polars (`Series.min()`, `.max()`, `.item()`), which types it as any
    Python value: int64 ns times, depths, counts, never null here."""
    if not isinstance(value, int):
        raise TypeError(f"expected an integer, got {value!r}")
    return value


def series_from_arrow(data: pa.Array | pa.ChunkedArray) -> pl.Series:
    """`pl.from_arrow` of an Arrow array: a Series (see `frame_from_arrow`)."""
    series = pl.from_arrow(data)
    assert isinstance(series, pl.Series)
    return series


def _dictionary_columns(name: str, stages) -> list[str]:
    """Dictionary-encode only the columns declared `dict` (repeated strings); ids and JSON text
    have too many distinct values for a dictionary to pay for its encoding time."""
    return [c.name for c in schema.table(name).columns if c.stage in stages and c.type == "dict"]


_DICTIONARY = pa.dictionary(pa.int32(), pa.string())


def delta_columns(arrow_schema: pa.Schema, dictionary: list[str]) -> dict[str, str]:
    """DELTA_BINARY_PACKED for the integer columns not dictionary-encoded: event indexes, times,
    ids and correlations mostly grow by small steps, which it stores in a few bits each."""
    return {
        f.name: "DELTA_BINARY_PACKED" for f in arrow_schema if pa.types.is_integer(f.type) and f.name not in dictionary
    }


def statistics_columns(arrow_schema: pa.Schema, dictionary: Sequence[str] = ()) -> list[str]:
    """The columns given statistics: all but JSON text (`*_json`) and the `dictionary`-encoded
    columns (repeated names: `_dictionary_columns`). The bounds of neither rule out a row group
    for any filter we or a reader make (a `str.contains` cannot use them; a row group holds names
    from all over the alphabet, and a reader filtering on a name uses the column's dictionary),
    and they cost: finding them in long strings was most of the JSON text's statistics (the
    209 MB trace's events.parquet encoded in 0.293 -> 0.269 CPU-s), and for a column written from
    an Arrow dictionary Arrow computes the values a row group uses (`Unique`, `Take`) only for
    them: the rewrite of 667K GPU ops (`cost.enrich`'s pass 2) encoded in 0.56 -> 0.45 CPU-s,
    2.67M events in 1.51 -> 1.43 (medians of five, alternating)."""
    skip = set(dictionary)
    return [f.name for f in arrow_schema if not f.name.endswith("_json") and f.name not in skip]


class TableWriter:
    """Append tables of one kind to a Parquet file, conforming to its schema, in large row groups.

    `dictionaries`: the `dict` columns may come as Arrow dictionaries (read so from another
    Parquet file, or polars categoricals), which are written as they are: Parquet dictionary-encodes
    these columns anyway, and expanding the dictionaries only to hash the strings again was a third
    of the writing (pass 2 of `cost.enrich`). The file's own schema is not stored then, so that
    readers see plain strings, as in every other file."""

    def __init__(
        self, path: Path, name: str, stages=("flatten",), buffer_rows: int = BUFFER_ROWS, dictionaries: bool = False
    ):
        self.name, self.stages, self.rows, self.buffer_rows = name, stages, 0, buffer_rows
        self._schema = schema.table(name).arrow_schema(stages)
        encoded = _dictionary_columns(name, stages)
        self._dictionaries = dictionaries
        if dictionaries:
            self._schema = pa.schema([f.with_type(_DICTIONARY) if f.name in encoded else f for f in self._schema])
        self._writer = pq.ParquetWriter(
            str(path),
            self._schema,
            use_dictionary=encoded,
            column_encoding=delta_columns(self._schema, encoded),
            **parquet_options(self._schema, encoded),
            **({"store_schema": False} if dictionaries else {}),
        )
        self._pending: list[pa.Table] = []
        self._pending_rows = 0
        self._closed = False
        # per schema of the tables given: each declared column's index in them (-1: absent)
        self._plans: dict[pa.Schema, list[int]] = {}

    def _conform(self, tbl: pa.Table) -> pa.Table:
        if not self._dictionaries:
            return schema.conform(tbl, self.name, self.stages)
        if tbl.schema.equals(self._schema, check_metadata=False):
            return tbl
        plan = self._plans.get(tbl.schema)
        if plan is None:  # worked out once per kind of batch
            extra = set(tbl.column_names) - set(self._schema.names)
            if extra:
                raise ValueError(
                    f"table {self.name} has undeclared columns {sorted(extra)}: add them to schemas/{self.name}.toml"
                )
            plan = self._plans[tbl.schema] = [tbl.schema.get_field_index(f.name) for f in self._schema]
        arrays = []
        for f, i in zip(self._schema, plan):
            col = pa.nulls(tbl.num_rows, f.type) if i < 0 else tbl.column(i)
            if col.type != f.type:
                col = _as_dictionary(col) if f.type == _DICTIONARY else col.cast(f.type)
            arrays.append(col)
        return pa.Table.from_arrays(arrays, schema=self._schema)

    def write(self, tbl: pa.Table):
        if tbl.num_rows:
            self._pending.append(self._conform(tbl))
            self._pending_rows += tbl.num_rows
            self.rows += tbl.num_rows
            if self._pending_rows >= self.buffer_rows:
                self._flush()

    def _flush(self):
        if self._pending:
            tbl = pa.concat_tables(self._pending)
            # one dictionary per column and row group, or Arrow's writer falls back to PLAIN for
            # the rest of the row group at the first change: one table of several chunks (a batch
            # read across two row groups) did so for every row group of the rewritten gpu_ops
            # but the first, 58 KB -> 9.6 MB of kernel names a row group before compression
            if self._dictionaries and any(c.num_chunks > 1 for c in tbl.columns):
                tbl = tbl.unify_dictionaries()
            self._writer.write_table(tbl, row_group_size=ROW_GROUP_ROWS)
            self._pending, self._pending_rows = [], 0

    def close(self):
        self._flush()
        self._writer.close()
        self._closed = True

    def abandon(self):
        """Close without writing what is pending, errors ignored: the file is being thrown away
        (after a failure, such as a full disk, that `close` would only raise again)."""
        if not self._closed:
            self._closed, self._pending = True, []
            with suppress(OSError, ValueError, pa.ArrowException):
                self._writer.close()


def _as_dictionary(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """A column as _DICTIONARY. String views (polars' strings), which Arrow casts to no dictionary,
    are dictionary-encoded as they are and only their dictionary cast: through plain strings took
    2.6-4x as long, 0.27 s of a 1 GB trace's rewrite of 667K GPU ops (`cost.enrich`'s pass 2)."""
    if not pa.types.is_string_view(column.type):
        return column.cast(_DICTIONARY)
    try:
        return pc.dictionary_encode(column).cast(_DICTIONARY)
    except pa.ArrowNotImplementedError:  # an Arrow without the string-view kernel
        return column.cast(pa.string()).cast(_DICTIONARY)


T = TypeVar("T")


class _End(enum.Enum):
    END = enum.auto()  # what `next` gives for no more items (an enum member: mypy narrows on it)


_END = _End.END


def one_ahead(items: Iterator[T]) -> Iterator[T]:
    """The items of `items`, each made in a second thread while the caller works on the previous
    one: batch stages overlap on two cores (polars and Arrow work without the GIL), and only one
    item is made ahead. `items` is consumed by that thread alone."""
    with ThreadPoolExecutor(1) as ahead:
        coming = ahead.submit(next, items, _END)
        while (item := coming.result()) is not _END:
            coming = ahead.submit(next, items, _END)
            yield item


class WriteBehind:
    """Calls (writes, mostly) made in order in one thread of their own while the caller goes on:
    Arrow's Parquet encoding works without the GIL, so a process that both gathers tables and
    writes them keeps two cores busy. At most `ahead` calls wait, holding their tables; an error
    of a call is raised by a later `submit` or by `drain`; `ahead` = 0: each call made at once.
    Used as a context, every call is done (or its error raised) when it ends; left on an error,
    the calls waiting are dropped."""

    def __init__(self, ahead: int = 2):
        self.ahead = ahead
        self._pool = ThreadPoolExecutor(1)
        self._pending: deque = deque()

    def submit(self, fn: Callable, *args) -> None:
        if not self.ahead:
            fn(*args)
            return
        self._pending.append(self._pool.submit(fn, *args))
        while len(self._pending) > self.ahead:
            self._pending.popleft().result()

    def drain(self) -> None:
        while self._pending:
            self._pending.popleft().result()

    def __enter__(self) -> WriteBehind:
        return self

    def __exit__(self, kind, *_) -> None:
        if kind is None:
            self.drain()
        for f in self._pending:
            f.cancel()
        self._pool.shutdown(wait=True)


def write_table(tbl: pa.Table, path: Path, name: str, stages=schema.ALL_STAGES):
    tbl = schema.conform(tbl, name, stages)
    encoded = _dictionary_columns(name, stages)
    pq.write_table(
        tbl,
        str(path),
        row_group_size=ROW_GROUP_ROWS,
        use_dictionary=encoded,
        **parquet_options(tbl.schema, encoded),
    )


def write_extended(
    source: Path,
    path: Path,
    name: str,
    extend: Callable[[pl.DataFrame], pl.DataFrame],
    inputs: list[str],
    key: str = "event_idx",
    batch_rows: int = BUFFER_ROWS,
    group_rows: int | None = None,
):
    """Write table `name` (all stages) to `path`: the flatten columns of the Parquet file `source`,
    read `batch_rows` at a time and written in row groups of `group_rows` (default: a batch each),
    each batch with the columns `extend` gives for it beside them, so the wide table is never
    whole in memory. `extend` gets the batch's `inputs` columns and returns one row per row, in
    the same order (checked on `key`); the columns of `source` that it also gives are taken from
    it. The next batch is read and extended while this one is written (`one_ahead`)."""
    writer = TableWriter(path, name, schema.ALL_STAGES, buffer_rows=group_rows or batch_rows, dictionaries=True)
    for tbl in one_ahead(_extended(source, name, extend, inputs, key, batch_rows)):
        writer.write(tbl)
    writer.close()


def _extended(
    source: Path,
    name: str,
    extend: Callable[[pl.DataFrame], pl.DataFrame],
    inputs: list[str],
    key: str,
    batch_rows: int,
) -> Iterator[pa.Table]:
    """The batches of `write_extended`, their repeated text columns read as dictionaries: decoding
    them into strings is slower than expanding their dictionaries when they are written."""
    columns = schema.table(name).names()
    repeated = [c for c in _dictionary_columns(name, schema.ALL_STAGES) if c in columns]
    # threads hold more memory than they save time
    for batch in read_batches(source, batch_rows, columns, read_dictionary=repeated, use_threads=False):
        extra = extend(frame_from_arrow(_plain(batch.select(inputs))))
        if not extra[key].equals(series_from_arrow(batch.column(key))):
            raise ValueError(f"{source}: rows do not line up with the {key} of the columns to add")
        replaced = [c for c in extra.columns if c in batch.schema.names and c != key]
        tbl = batch.drop_columns(replaced)
        for col in extra.drop(key):
            tbl = tbl.append_column(col.name, col.to_arrow(compat_level=pl.CompatLevel.newest()))
        yield tbl


def read_batches(
    path: Path,
    rows: int,
    columns: list[str],
    read_dictionary: Sequence[str] = (),
    use_threads: bool = True,
    row_groups: Sequence[int] | None = None,
) -> Iterator[pa.Table]:
    """The `columns` of a Parquet file (those it has), `rows` rows at a time (the last fewer; none
    when the file has no rows); `read_dictionary` columns as dictionaries (the reader ends its
    batches at row group ends then: they are put back together). `row_groups`: only these."""
    held, have = [], 0
    parquet = pq.ParquetFile(path, read_dictionary=list(read_dictionary))
    groups = {} if row_groups is None else {"row_groups": list(row_groups)}
    for batch in parquet.iter_batches(batch_size=rows, columns=columns, use_threads=use_threads, **groups):
        while batch.num_rows:
            part = batch.slice(0, rows - have)
            batch = batch.slice(part.num_rows)
            held.append(part)
            have += part.num_rows
            if have == rows:
                yield pa.Table.from_batches(held)
                held, have = [], 0
    if held:
        yield pa.Table.from_batches(held)


def _plain(tbl: pa.Table) -> pa.Table:
    """The table with its dictionary columns as plain strings."""
    return tbl.cast(
        pa.schema([f.with_type(f.type.value_type) if pa.types.is_dictionary(f.type) else f for f in tbl.schema])
    )


def sort_by_key(path: Path, name: str, key: str = "event_idx"):
    """Rewrite the Parquet table `path` (its flatten columns) sorted by `key` unless it is already:
    the batch-by-batch stages line rows up by position. Flatten writes its tables sorted; only
    another writer would need the rewrite, which holds the table in memory."""
    ordered, last = True, None
    for batch in pq.ParquetFile(path).iter_batches(batch_size=ROW_GROUP_ROWS, columns=[key]):
        keys = series_from_arrow(batch.column(0))
        if not keys.is_empty():
            ordered = ordered and keys.is_sorted() and (last is None or keys[0] >= last)
            last = keys[-1]
    if not ordered:
        table = pl.read_parquet(path, columns=schema.table(name).names()).sort(key)
        with atomic_file(path) as tmp:
            write_table(table.to_arrow(), tmp, name, ("flatten",))


@contextmanager
def arrow_memory_returned_promptly() -> Iterator[None]:
    """Within: Arrow allocates from jemalloc told to give freed memory back at once. Its default
    pool (mimalloc) keeps freed pages for reuse, and a stage that reads and writes batch by batch
    would hold on to its largest batches' memory long after it is done with them."""
    try:
        pool = pa.jemalloc_memory_pool()
        pa.jemalloc_set_decay_ms(0)
    except (pa.ArrowNotImplementedError, AttributeError):  # a pyarrow built without jemalloc
        yield
        return
    previous = pa.default_memory_pool()
    pa.set_memory_pool(pool)
    try:
        yield
    finally:
        pa.set_memory_pool(previous)


@contextmanager
def spill_file(directory: Path, stem: str) -> Iterator[Path]:
    """A path for a temporary file in `directory` (rows a stage writes and reads back later): an
    empty file of its own (mkstemp), for `SpillWriter` to append to. Removed afterwards whatever
    happens."""
    fd, tmp = tempfile.mkstemp(prefix=f".{stem}.spill-", suffix=".arrow", dir=directory)
    os.close(fd)
    try:
        yield Path(tmp)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _write_anew(path: str) -> str:
    """The mode to open `path` with to write it from its start: appending to an empty file (a
    `spill_file`'s, made by mkstemp) rather than truncating it. ext4 writes a file truncated to
    nothing out to disk when it is closed (`auto_da_alloc`, which guards files rewritten in place):
    the link pass's spill of the 1 GB sampled_no_device_props trace (667K GPU ops, ~200 MB) took
    0.13 s to close, every core idle meanwhile, and went to disk only to be read back from the
    page cache and deleted. Closing a 200 MB spill, three runs each: 0.007-0.095 s truncated,
    0.000 appended. (Removing the empty file and making it anew would do too, but would give the
    name up for a moment in a directory others may write to.)"""
    return "ab" if os.path.isfile(path) and os.path.getsize(path) == 0 else "wb"


class SpillWriter:
    """Rows written to an Arrow IPC file, frame by frame, cast to one schema. Strings are kept as
    polars holds them (string views): converting them to plain strings on the way out was most of
    the time of a write. Once closed, the file can also be scanned (`pl.scan_ipc`)."""

    def __init__(self, path: Path, fields: list[pa.Field]):
        self._schema = pa.schema(
            [f.with_type(pa.string_view()) if f.type in (pa.string(), pa.large_string()) else f for f in fields]
        )
        self._sink = pa.OSFile(str(path), _write_anew(str(path)))
        self._writer = pa.ipc.new_file(self._sink, self._schema)

    def write(self, frame: pl.DataFrame):
        arrow = frame.select(self._schema.names).to_arrow(compat_level=pl.CompatLevel.newest())
        self._writer.write_table(arrow.cast(self._schema))

    def append(self, path: Path):
        """Write the rows of another SpillWriter's file (of the same columns) after these."""
        with pa.OSFile(str(path), "rb") as source:
            reader = pa.ipc.open_file(source)
            for i in range(reader.num_record_batches):
                self._writer.write_batch(reader.get_batch(i))

    def close(self):
        if not self._sink.closed:
            self._writer.close()
            self._sink.close()

    def __enter__(self) -> SpillWriter:
        return self

    def __exit__(self, *exc):
        self.close()


class SpillReader:
    """The rows of a SpillWriter's file, handed out in consecutive slices of any length (read, not
    memory-mapped: pages read stay out of the process once a slice is dropped)."""

    def __init__(self, path: Path):
        self._source = pa.OSFile(str(path), "rb")
        reader = pa.ipc.open_file(self._source)
        self._held = frame_from_arrow(reader.schema.empty_table())
        self._batches = (reader.get_batch(i) for i in range(reader.num_record_batches))

    def take(self, n: int) -> pl.DataFrame:
        """The next `n` rows (fewer at the end of the file)."""
        parts, have = [self._held.clear()], 0
        while have < n:
            if self._held.is_empty():
                batch = next(self._batches, None)
                if batch is None:
                    break
                self._held = frame_from_arrow(batch)
            part = self._held.head(n - have)
            self._held = self._held.slice(part.height)
            parts.append(part)
            have += part.height
        return pl.concat(parts)

    def __enter__(self) -> SpillReader:
        return self

    def __exit__(self, *exc):
        self._source.close()


def scan(flat_dir: str | os.PathLike, name: str) -> pl.LazyFrame:
    """A table of a flattened trace as a polars LazyFrame."""
    if name not in schema.TABLES:
        raise DatasetError(f"no table {name!r}; tables are {', '.join(schema.TABLES)}")
    p = Path(flat_dir) / f"{name}.parquet"
    if not p.is_file():
        raise DatasetError(f"{flat_dir}: not a flattened trace (no {name}.parquet)")
    return pl.scan_parquet(p)
