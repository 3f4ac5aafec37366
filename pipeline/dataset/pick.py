"""pick: one trace out of a batch dataset or a folder of flattened traces, for the commands that
read one trace (`analyze`, `diff`) and for `query --trace`.

A selector names a trace by its `trace_id`, its stem (the file name without .json[.gz]), or a
part of its source path; it must match exactly one trace (a collection of one trace needs none).
A trace of a batch dataset is copied, table by table, into a temporary flattened-trace directory
(streamed: memory stays bounded by polars' batches), so every analysis reads it as it reads a
trace flattened on its own.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import polars as pl

from pipeline import schema, store
from pipeline.dataset.layout import KEY
from pipeline.dataset.tables import flat_dirs, is_dataset, tables
from pipeline.errors import UsageError
from pipeline.files import path_key
from pipeline.version import __version__

SHOWN = 5  # candidates named in an error
ORIGIN = "origin.json"  # in a trace copied out of a dataset: {"dataset": path, "trace_id": id}


def traces_in(path: Path) -> pl.DataFrame:
    """(trace_id, stem, source_path) of every trace in a dataset or folder of flattened traces."""
    return tables(path, ["trace"])["trace"].select(KEY, "stem", "source_path").collect()


def matching(rows: pl.DataFrame, selector: str | None) -> pl.DataFrame:
    """The rows the selector names: by trace_id, else stem, else a part of the source path."""
    if selector is None:
        return rows
    for rule in (pl.col(KEY) == selector, pl.col("stem") == selector):
        found = rows.filter(rule)
        if found.height:
            return found
    return rows.filter(pl.col("source_path").str.contains(selector, literal=True))


def choose(path: Path, selector: str | None) -> str:
    """The trace_id of the one trace in `path` that `selector` names (a UsageError otherwise)."""
    rows = traces_in(path)
    found = matching(rows, selector)
    if found.height == 1:
        return found[KEY][0]
    if not rows.height:
        raise UsageError(f"{path}: holds no trace")
    if selector is None:
        msg = f"{path} holds {rows.height} traces: choose one with --trace ID, STEM or part of its path"
    elif not found.height:
        msg = f"{path}: no trace matches {selector!r}"
    else:
        msg = f"{path}: {found.height} traces match {selector!r}: give its trace_id"
    raise UsageError(f"{msg} ({listing(found if found.height else rows)})")


def listing(rows: pl.DataFrame) -> str:
    """A few traces as `id (stem)`, and how many more."""
    named = ", ".join(f"{r[KEY]} ({r['stem']})" for r in rows.head(SHOWN).iter_rows(named=True))
    return named + (f" and {rows.height - SHOWN} more" if rows.height > SHOWN else "")


@contextmanager
def one_trace(path: str | Path, selector: str | None = None) -> Iterator[Path]:
    """A flattened-trace directory holding the trace `selector` names in `path`: `path` itself
    (a flattened trace), one of its sub-directories (a folder of them), or a temporary copy (a
    batch dataset), removed afterwards."""
    path = Path(path)
    if store.is_flat_dir(path):
        yield path
        return
    dirs = flat_dirs(path)
    if not dirs and not is_dataset(path):  # a run folder of trace files: the one named, flattened once
        yield cached_flat(path, selector)
        return
    trace_id = choose(path, selector)
    if dirs:
        ids = {d: pl.read_parquet(d / "trace.parquet", columns=[KEY])[KEY][0] for d in dirs}
        yield next(d for d, i in ids.items() if i == trace_id)
        return
    with tempfile.TemporaryDirectory(prefix="tracepipe-pick-") as tmp:
        copy_trace(path, trace_id, Path(tmp))
        (Path(tmp) / ORIGIN).write_text(json.dumps({"dataset": str(path), "trace_id": trace_id}))
        yield Path(tmp)


def dataset_problems(path: Path) -> str | None:
    """What a batch dataset's manifest says is not whole (inputs quarantined, traces truncated),
    in one line naming the first few; None for a whole dataset (or no dataset)."""
    if not is_dataset(path) or not (path / "traces").is_dir():
        return None
    m = tables(path, ["traces"])["traces"].filter(pl.col("status") != "ok").select("path", "status").collect()
    if not m.height:
        return None
    parts = []
    for status, what in (("quarantined", "not read (quarantined)"), ("truncated", "truncated")):
        names = [str(p).rsplit("/", 1)[-1] for p in m.filter(pl.col("status") == status)["path"].to_list()]
        if names:
            more = f" and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
            parts.append(f"{len(names):,} {what}: {', '.join(names[:SHOWN])}{more}")
    return f"{path}: the dataset is not whole: {'; '.join(parts)} (tracepipe ranks lists every problem)"


FLAT = "flat"  # in a run folder's cache (`files.folder_cache`): its traces flattened, one folder each


def cached_flat(folder: Path, selector: str | None) -> Path:
    """The flattened tables of the trace file `selector` names in a run folder (its stem, else a
    part of its path), kept in the folder's cache beside what `ranks` keeps of it: the trace is
    read the first time, and again only once its size or modification time changes."""
    import os

    from pipeline.files import folder_cache
    from pipeline.flatten import flatten
    from pipeline.kineto import is_trace_name, trace_stem

    files = sorted(str(p) for p in folder.rglob("*") if p.is_file() and is_trace_name(p.name))
    found = [f for f in files if selector is None or trace_stem(f) == selector]
    if selector is not None and not found:
        found = [f for f in files if selector in f]
    if len(found) != 1:
        if not files:
            raise UsageError(f"{folder}: holds no trace")
        names = ", ".join(trace_stem(f) for f in (found or files)[:SHOWN])
        more = f" and {len(found or files) - SHOWN} more" if len(found or files) > SHOWN else ""
        what = "choose one with --trace STEM or part of its path" if selector is None or found else "none matches"
        raise UsageError(
            f"{folder} holds {len(files)} traces: {what} {selector or ''} ({names}{more})".replace("  ", " ")
        )
    trace = found[0]
    st = os.stat(trace)
    stamp = {"source": trace, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "version": __version__}
    home = folder_cache(folder) / FLAT / path_key(trace)
    done = home / "source.json"
    if done.is_file() and json.loads(done.read_text()) == stamp:
        return next(d for d in home.iterdir() if d.is_dir())
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    flatten(trace, home)
    done.write_text(json.dumps(stamp))
    return next(d for d in home.iterdir() if d.is_dir())


def copy_trace(ds: Path, trace_id: str, out: Path) -> None:
    """Write the rows of one trace of a dataset as a flattened-trace directory `out`."""
    for name, lf in tables(ds, schema.TABLES).items():
        rows = lf.filter(pl.col(KEY) == trace_id)
        rows = rows if name == "trace" else rows.drop(KEY)
        rows.sink_parquet(out / f"{name}.parquet")
