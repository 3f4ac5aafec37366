"""runs: which traces make the runs a comparison or a trend reads, named as `tracepipe ranks`
names them, and when each run happened.

A run is the directory holding its traces (`pipeline.runs.group`; `--run-by` as in `ranks`); on
the command line its last path component is enough (`--base base` for `.../nightly/base`), the
whole name settles a clash. Every trace of a run counts, several traces of one rank included
(captures of different steps: their steps are pooled); a trace without a rank is a unit of its
own. A run's time is the earliest `baseTimeNanoseconds` of its traces, else the earliest event
start when the trace's clock is wall-clock time (after 2000), else unknown.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from pipeline.dataset.tables import tables
from pipeline.errors import UsageError
from pipeline.runs.group import TRACE_FIELDS, check_run_by, run_of

WALL_CLOCK_NS = 946_684_800 * 10**9  # 2000-01-01: an earlier "time" is a trace-relative clock
TRACE_COLUMNS = ("trace_id", "source_path", "stem", "rank", "world_size", "base_time_ns", "truncated")
SHOWN = 8  # runs named in an error


@dataclass(frozen=True)
class Run:
    """One run: its dataset, name, traces (trace_id, stem, rank, unit) and time (ns, or None), and
    the `--run-by` rule that named it."""

    dataset: Path
    name: str
    traces: pl.DataFrame
    time_ns: int | None
    run_by: str | None = None

    @property
    def ids(self) -> list[str]:
        return self.traces["trace_id"].to_list()

    @property
    def units(self) -> int:
        """Ranks (and rank-less traces) of the run."""
        return self.traces["unit"].n_unique()

    @property
    def label(self) -> str:
        return last_component(self.name)


def iso_time(ns: int | None) -> str | None:
    """A time in ns since the epoch as ISO 8601 UTC text (to the second)."""
    from datetime import datetime, timezone

    return None if ns is None else datetime.fromtimestamp(ns / 1e9, tz=timezone.utc).isoformat(timespec="seconds")


def last_component(run: str) -> str:
    parts = [p for p in re.split(r"[/\\!]", str(run)) if p]
    return parts[-1] if parts else str(run)


def trace_runs(ds: Path, run_by: str | None = None) -> pl.DataFrame:
    """Every trace of a dataset with its run (as `tracepipe ranks` names it: `runs.group.run_of`)
    and unit (its rank; a rank-less trace its own)."""
    t = tables(ds, ["trace"])["trace"]
    have = t.collect_schema().names()
    pattern = check_run_by(run_by, have)
    named = [run_by[4:]] if run_by and run_by.startswith("col:") else []  # the column --run-by names
    fields = list(dict.fromkeys([*(c for c in TRACE_FIELDS if c in have), *named]))
    rows = t.select(*dict.fromkeys([*(c for c in TRACE_COLUMNS if c in have), *fields])).collect()
    runs = [
        run_of({TRACE_FIELDS.get(c, c): r[c] for c in fields}, run_by, pattern)
        for r in rows.select(fields).iter_rows(named=True)
    ]
    rows = (
        rows.select(*(c for c in TRACE_COLUMNS if c in have))
        .with_columns(run=pl.Series(runs, dtype=pl.String))
        .sort("run", "rank", "source_path", nulls_last=True)
    )
    no_rank = -1 - pl.int_range(pl.len()).over("run")  # rank-less traces: a unit each, below every rank
    return rows.with_columns(unit=pl.when(pl.col("rank").is_null()).then(no_rank).otherwise(pl.col("rank")))


def run_times(rows: pl.DataFrame, ds: Path) -> pl.DataFrame:
    """(run, time_ns) of every run: see the module docstring."""
    start = _trace_starts(ds)
    r = rows.join(start, on="trace_id", how="left") if start is not None else rows.with_columns(start_ns=None)
    wall = pl.when(pl.col("start_ns") >= WALL_CLOCK_NS).then(pl.col("start_ns"))
    return r.group_by("run").agg(time_ns=pl.coalesce(pl.col("base_time_ns").min(), wall.min()))


def _trace_starts(ds: Path) -> pl.DataFrame | None:
    """(trace_id, start_ns): the manifest's earliest event start of each trace (a dataset's)."""
    m = tables(ds, ["traces"]).get("traces")
    if m is None:
        return None
    return m.select("trace_id", start_ns="trace_start_ns").collect()


def pick(rows: pl.DataFrame, name: str | None, what: str, ds: Path) -> str:
    """The run `name` names (whole or by its last path component); the only run when None."""
    runs = rows["run"].unique(maintain_order=True).to_list()
    if not runs:
        raise UsageError(f"{ds}: holds no trace")
    if name is None:
        if len(runs) == 1:
            return runs[0]
        raise UsageError(f"{ds} holds {len(runs)} runs: choose one with --{what} ({_listing(runs)})")
    if name in runs:
        return name
    found = [r for r in runs if last_component(r) == name.strip("/\\")]
    if len(found) == 1:
        return found[0]
    if found:
        raise UsageError(f"--{what} {name}: {len(found)} runs end so: give the whole name ({_listing(found)})")
    raise UsageError(f"--{what} {name}: no such run in {ds} ({_listing(runs)})")


def _listing(runs: list[str]) -> str:
    named = ", ".join(last_component(r) if _unique_tail(r, runs) else r for r in runs[:SHOWN])
    return "runs: " + named + (f" and {len(runs) - SHOWN} more" if len(runs) > SHOWN else "")


def _unique_tail(run: str, runs: list[str]) -> bool:
    return sum(last_component(r) == last_component(run) for r in runs) == 1


def load_run(ds: Path, name: str | None, what: str, run_by: str | None = None) -> Run:
    """The run `name` names in the dataset `ds` (see `pick`)."""
    rows = trace_runs(ds, run_by)
    run = pick(rows, name, what, ds)
    mine = rows.filter(pl.col("run") == run)
    times = run_times(mine, ds)
    return Run(ds, run, mine, times["time_ns"][0] if times.height else None, run_by)


def all_runs(ds: Path, run_by: str | None = None) -> list[Run]:
    """Every run of a dataset, in time order (runs of unknown time last, by name)."""
    rows = trace_runs(ds, run_by)
    times = run_times(rows, ds).sort("time_ns", "run", nulls_last=True)
    return [
        Run(ds, run, rows.filter(pl.col("run") == run), t, run_by)
        for run, t in times.select("run", "time_ns").iter_rows()
    ]
