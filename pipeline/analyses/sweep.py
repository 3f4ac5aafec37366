"""sweep: read a flattened trace window by window in time, in memory bounded by a window.

The analyses never hold the GPU-op or CPU-op table: they read it in consecutive windows of start
time (`time_windows`, about `PER_WINDOW` rows each) and fold every window into small running
totals: sums per key (`fold`, `float_sum`), unions of intervals (`RunTally`), CPU slices nested per
thread (`SliceSweep`), prefix sums per thread (`ThreadPrefix`). Each carries into the next window
only what that window may still change, so the answers equal those of one pass over the table.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from pipeline.link import nesting
from pipeline.link.windows import EventReach, TimeBins, TimeCells

PER_WINDOW = 1 << 17  # rows read per window (about: cuts fall between histogram bins)

Window = tuple[int | None, int | None]  # [a, b) of time; None: open


def time_windows(path: Path, where: pl.Expr, per_window: int | None = None) -> list[Window]:
    """Consecutive windows [a, b) of `ts_ns` (the first open below, the last open above), each
    holding about `per_window` (default PER_WINDOW) of the rows `where` selects: one streaming read
    of the columns `where` uses and `ts_ns`, counted per time bin. A last window of under half
    that joins the one before (up to 1.5x): each window costs ~100 small queries, so the 209 MB
    trace's 70K GPU ops in windows of 64K and 6K took 218 (0.19-0.21 s), in one 130 (0.14-0.16 s);
    `analyze` of the 1 GB trace, every section, peaked at 395-406 MB against 393-394."""
    per_window = per_window or PER_WINDOW
    bins = TimeBins.over(EventReach.of(path).span)
    starts = (
        pl.scan_parquet(path)
        .filter(where & pl.col("ts_ns").is_not_null())
        .group_by(bin=bins.of(pl.col("ts_ns")))
        .agg(n=pl.len())
        .collect(engine="streaming")
    )
    cuts = TimeCells.of(starts, bins, per_window, whole_tail=True).cuts.to_list() if starts.height else []
    return list(zip([None, *cuts], [*cuts, None], strict=False))


def within(window: Window, column: str = "ts_ns") -> pl.Expr:
    """The time column is set and lies in the window."""
    a, b = window
    inside = pl.col(column).is_not_null()
    if a is not None:
        inside &= pl.col(column) >= a
    if b is not None:
        inside &= pl.col(column) < b
    return inside


def read(path: Path, where: pl.Expr, columns: list) -> pl.DataFrame:
    """The rows of a Parquet file that `where` selects, in file order (streaming: rows are filtered
    row group by row group and only the kept rows' other columns are decoded)."""
    return pl.scan_parquet(path).filter(where).select(columns).collect(engine="streaming")


def read_among(
    path: Path, where: pl.Expr, column: str, values: pl.Series, columns: list, wide: bool = False
) -> pl.DataFrame:
    """The rows `where` selects whose `column` is one of `values` (`columns`, which must include
    `column`). The reader gets the values' range, to skip row groups by their statistics; the rows
    are then matched in memory (a predicate on thousands of values costs more than a few narrow
    columns), unless `wide`: then the reader matches them, so that wide columns (args) are decoded
    for the matching rows only."""
    values = values.drop_nulls().unique()
    if values.is_empty():
        return read(path, pl.lit(False), columns)
    in_range = where & pl.col(column).is_between(values.min(), values.max())
    if wide:
        return read(path, in_range & pl.col(column).is_in(values.implode()), columns)
    return read(path, in_range, columns).join(values.to_frame(column), on=column, how="semi", maintain_order="left")


# ------------------------------------------------------------------ sums
def float_sum(column: str | pl.Expr) -> pl.Expr:
    """The sum of a float column (nulls as 0), the same in every run and to the last bit nearly
    exact. Polars' own sums split the rows among threads, so their last digits change from run to
    run; adding in row order instead loses digits over long groups. Here each value is cut at a
    power of two `scale` chosen so that no partial sum of the high parts (whole multiples of
    `scale`, below 2**53 of them) can round: those add exactly in any order, and only the small
    remainders, exact too, are added in row order."""
    x = (pl.col(column) if isinstance(column, str) else column).fill_null(0.0)
    top = x.abs().max() * pl.len()  # bounds every partial sum
    scale = pl.lit(2.0).pow(top.log(2).ceil() - 50)
    high = (x / scale).round() * scale
    split = high.sum() + (x - high).cum_sum().last()
    return pl.when(top == 0).then(0.0).when(top.is_finite()).then(split).otherwise(x.sum())


def fold(total: pl.DataFrame | None, part: pl.DataFrame, keys: list[str], combine: list[pl.Expr]) -> pl.DataFrame:
    """Running totals per keys: `total` (None at first) and one window's `part` combined with
    `combine` (expressions over the columns of both, one row per key each: at most two rows per
    group, total's first). Null keys are a group of their own."""
    if total is None:
        return part
    both = pl.concat([total, part.select(total.columns)], how="vertical_relaxed")
    return both.group_by(keys, maintain_order=True).agg(combine)


def first_by(value: str, position: str) -> pl.Expr:
    """In a fold: the `value` with the smallest `position` (where the value is known)."""
    return pl.col(value).sort_by(pl.col(position), nulls_last=True).first()


# ------------------------------------------------------------------ unions of intervals
def interval_union(iv: pl.LazyFrame | pl.DataFrame, by: list[str]) -> pl.LazyFrame:
    """Disjoint runs (by..., start_ns, end_ns) covering intervals (by..., ts_ns, end_ns), sorted. In
    start order per key, a run starts where an interval starts after all earlier ones have ended
    (after the running max of their ends), and ends at that running max before the next run."""
    reach = pl.col("end_ns").cum_max().over(by)
    rows = iv.lazy().sort(*by, "ts_ns").with_columns(_reach=reach)
    first_of_key = pl.struct(by).is_first_distinct()
    rows = rows.with_columns(_new=first_of_key | (pl.col("ts_ns") > pl.col("_reach").shift(1)))
    starts = rows.filter("_new").select(*by, start_ns="ts_ns")
    ends = rows.filter(pl.col("_new").shift(-1).fill_null(True)).select(end_ns="_reach")
    return pl.concat([starts, ends], how="horizontal")


class RunTally:
    """The union of intervals per key, fed in windows of start time (every interval of a window
    starts at or after those added before): `result()` gives per key the first start, the last
    end, the busy time (summed run lengths), the number of runs and the largest gap between runs.

    The state is one row per key: totals over the final runs, and the last run, carried because
    the next window's intervals may still extend it."""

    def __init__(self, by: list[str]):
        self.by = by
        # by..., first_ns, done_busy_ns, done_runs, largest_gap_ns (final runs), run_start_ns, run_end_ns (last run)
        self.state: pl.DataFrame | None = None

    def add(self, iv: pl.DataFrame):
        """Add intervals (by..., ts_ns, end_ns)."""
        if iv.is_empty():
            return
        iv = iv.select(*self.by, "ts_ns", "end_ns")
        carried = (
            iv.clear() if self.state is None else self.state.select(*self.by, ts_ns="run_start_ns", end_ns="run_end_ns")
        )
        runs = interval_union(pl.concat([carried, iv], how="vertical_relaxed"), self.by).collect()
        length = pl.col("end_ns") - pl.col("start_ns")
        window = runs.group_by(self.by, maintain_order=True).agg(
            w_first=pl.col("start_ns").first(),
            w_runs=pl.len().cast(pl.Int64),
            w_busy=length.sum(),
            w_gap=(pl.col("start_ns") - pl.col("end_ns").shift(1)).max(),
            w_last_start=pl.col("start_ns").last(),
            w_last_end=pl.col("end_ns").last(),
        )
        self.state = self._merged(window)

    def _merged(self, window: pl.DataFrame) -> pl.DataFrame:
        """The state with a window's runs (w_*; the carried run is among them) taken in: all of them
        final but the last."""
        state = (
            self.state
            if self.state is not None
            else pl.DataFrame(
                schema={
                    **window.select(self.by).schema,
                    **dict.fromkeys(
                        ["first_ns", "done_busy_ns", "done_runs", "largest_gap_ns", "run_start_ns", "run_end_ns"],
                        pl.Int64,
                    ),
                }
            )
        )
        both = state.join(window, on=self.by, how="full", coalesce=True, nulls_equal=True)
        seen = pl.col("w_runs").is_not_null()
        final_busy = pl.col("w_busy") - (pl.col("w_last_end") - pl.col("w_last_start"))
        return both.select(
            *self.by,
            first_ns=pl.min_horizontal("first_ns", "w_first"),
            done_busy_ns=pl.col("done_busy_ns").fill_null(0) + pl.when(seen).then(final_busy).otherwise(0),
            done_runs=pl.col("done_runs").fill_null(0) + pl.when(seen).then(pl.col("w_runs") - 1).otherwise(0),
            largest_gap_ns=pl.max_horizontal("largest_gap_ns", "w_gap"),
            run_start_ns=pl.when(seen).then("w_last_start").otherwise("run_start_ns"),
            run_end_ns=pl.when(seen).then("w_last_end").otherwise("run_end_ns"),
        )

    def result(self, schema: Mapping[str, pl.DataType | type[pl.DataType]]) -> pl.DataFrame:
        """(by..., start_ns, end_ns, busy_ns, runs, largest_gap_ns) per key (`schema`: the key types,
        for a tally that saw no interval)."""
        if self.state is None:
            return pl.DataFrame(
                schema={
                    **schema,
                    "start_ns": pl.Int64,
                    "end_ns": pl.Int64,
                    "busy_ns": pl.Int64,
                    "runs": pl.Int64,
                    "largest_gap_ns": pl.Int64,
                }
            )
        return self.state.select(
            *self.by,
            start_ns="first_ns",
            end_ns="run_end_ns",
            busy_ns=pl.col("done_busy_ns") + pl.col("run_end_ns") - pl.col("run_start_ns"),
            runs=pl.col("done_runs") + 1,
            largest_gap_ns="largest_gap_ns",
        )


# ------------------------------------------------------------------ quantiles
def quantiles_from_counts(counts: pl.DataFrame, by: list[str], value: str, qs: tuple[float, ...]) -> pl.DataFrame:
    """(by..., q0, q1, ...): the nearest-rank quantiles of a column given as value counts
    (by..., value, n), equal to polars' `quantile(q, "nearest")` of the values themselves: the
    value at rank (n - 1) q rounded half away from zero among the n sorted values."""
    ranked = (
        counts.filter(pl.col(value).is_not_null())
        .sort(*by, value)
        .with_columns(upto=pl.col("n").cum_sum().over(by), total=pl.col("n").sum().over(by))
    )
    out = ranked.select(by).unique(maintain_order=True)
    for i, q in enumerate(qs):
        x = (pl.col("total") - 1).cast(pl.Float64) * q
        rank = x.floor() + (x - x.floor() >= 0.5).cast(pl.Float64)
        picked = (
            ranked.filter(pl.col("upto") > rank)
            .group_by(by, maintain_order=True)
            .agg(pl.col(value).first().alias(f"q{i}"))
        )
        out = out.join(picked, on=by, how="left", nulls_equal=True, maintain_order="left")
    return out


# ------------------------------------------------------------------ prefix sums per thread
class ThreadPrefix:
    """Sums of point values per thread (`by`), window by window in time: `at` gives, for query
    times inside the current window, the sum over all points so far that lie before (or at) each
    query. The points of earlier windows are kept only as one total per thread, entered as a first
    point of the window at the earliest time."""

    EARLIEST = -(1 << 63)

    def __init__(self, by: list[str], values: list[str]):
        self.by, self.values = by, values
        self.points: pl.DataFrame | None = None  # (by..., t, values): running sums, in time order

    def enter(self, points: pl.DataFrame):
        """Start the next window with its points (by..., t, values); points without a thread never count."""
        points = points.drop_nulls([*self.by, "t"]).select(*self.by, "t", *self.values)
        if self.points is not None and self.points.height:
            totals = self.points.group_by(self.by).agg(pl.col(v).last() for v in self.values)
            earlier = totals.select(*self.by, pl.lit(self.EARLIEST, pl.Int64).alias("t"), *self.values)
            points = pl.concat([earlier, points], how="vertical_relaxed")
        points = points.sort("t", maintain_order=True)
        self.points = points.select(*self.by, "t", *(pl.col(v).cum_sum().over(self.by) for v in self.values))

    def at(self, queries: pl.DataFrame, t: str, inclusive: bool) -> pl.DataFrame:
        """The value sums over the points before each query's time `t` (at or before it if
        inclusive), one row per query (with `by` and `t`) in their order."""
        assert self.points is not None, "enter a window first"
        q = queries.select(*self.by, t).with_row_index("_q")
        found = (
            q.sort(t)
            .join_asof(
                self.points.rename({"t": "_t"}),
                left_on=t,
                right_on="_t",
                by=self.by,
                strategy="backward",
                allow_exact_matches=inclusive,
                check_sortedness=False,
            )
            .sort("_q")
        )
        return found.select(pl.col(v).fill_null(0) for v in self.values)


# ------------------------------------------------------------------ CPU slices
@dataclass(frozen=True)
class Nest:
    """Slices nested among themselves: those `member` selects (all when None) get `parent_<name>`
    (their innermost enclosing member) and `child_<name>_ns` (the summed durations of their direct children)."""

    name: str
    member: pl.Expr | None = None


SLICE_COLUMNS = ["event_idx", "cat", "name", "pid", "tid", "ts_ns", "dur_ns", "end_ns"]


class SliceSweep:
    """The CPU slices (complete events on a thread) that `where` selects, window by window in time,
    nested as `pipeline.link.nesting` nests all of them at once (each nest: the slices its `member`
    selects), with the same answers wherever slices overlap without nesting.

    For each window (`windows()`) it gives the slices starting in it (`owned`) with their parent
    in each nest, and the slices that became final in it (`final`): no slice to come can be their
    child, so their child time is complete. `extend(owned, window)` adds the caller's columns to
    the owned slices (they travel with a slice until it is final), `at_end(slices)` gives columns
    (event_idx first) for the slices that end in the window, in it; `path` = (nest, label) gives
    owned slices `path_id`, the id in `paths` of the labels of their ancestors in that nest,
    outermost first, and their own, joined by ';'.

    How a window reproduces the nesting of all slices: a slice's depth is the number of slices
    started before it minus those ended by then. Slices that ended before the window count in
    both, so nesting the window's slices together with the slices still running (`pending`) gives
    every new slice its depth. Its parent is the last slice started before it one level up: among
    the window's slices, else the last start at that depth of the windows before, which is carried
    per thread and depth (`_last`). A slice is final once it has ended before the window's end and
    is no longer such a last start."""

    def __init__(
        self,
        events: Path,
        where: pl.Expr,
        nests: tuple[Nest, ...],
        windows: list[Window],
        extend: Callable[[pl.DataFrame, Window], pl.DataFrame] = lambda owned, window: owned,
        at_end: Callable[[pl.DataFrame], pl.DataFrame] | None = None,
        path: tuple[str, pl.Expr] | None = None,
    ):
        self.events, self.where, self.nests, self.extend, self.path = events, where, nests, extend, path
        self.at_end = at_end
        self.paths = Paths()
        self._windows = windows
        self._last: dict[str, pl.DataFrame] = {}  # per nest: (pid, tid, depth, event_idx) of the last start

    def windows(self) -> Iterator[tuple[Window, pl.DataFrame, pl.DataFrame]]:
        """(window, owned, final) for every window, in time order; every slice is final once."""
        pending: pl.DataFrame | None = None
        for window in self._windows:
            owned = self.extend(self._read(window), window)
            owned = owned.with_columns(pl.lit(0, pl.Int64).alias(f"child_{n.name}_ns") for n in self.nests)
            live = owned if pending is None else pl.concat([pending, owned], how="diagonal_relaxed")
            for n in self.nests:
                live = self._nested(live, n, owned.height)
            if self.path is not None:
                live = _with_paths(live, owned.height, *self.path, self.paths)
            if self.at_end is not None:
                live = _with_values(live, self.at_end(live.filter(within(window, "end_ns"))))
            done = self._done(window)
            pending = live.filter(~done)
            yield window, live.tail(owned.height), live.filter(done)

    def _read(self, window: Window) -> pl.DataFrame:
        end = pl.col("ts_ns") + pl.col("dur_ns").fill_null(0)
        return read(
            self.events,
            self.where & within(window),
            [
                "event_idx",
                "cat",
                pl.col("name").cast(pl.String),
                "pid",
                "tid",
                "ts_ns",
                pl.col("dur_ns").fill_null(0),
                end.alias("end_ns"),
            ],
        )

    def _done(self, window: Window) -> pl.Expr:
        """The slices no later slice can be a child of: ended before the window's end, and not the
        last start at their depth (the parent a later slice one level deeper would get)."""
        if window[1] is None:
            return pl.lit(True)
        awaited = pl.concat([last["event_idx"] for last in self._last.values()])
        return (pl.col("end_ns") < window[1]) & ~pl.col("event_idx").is_in(awaited.implode())

    def _nested(self, live: pl.DataFrame, n: Nest, owned: int) -> pl.DataFrame:
        """live (pending slices first, then the `owned` newest) with parent_<n> of the owned members
        and their durations added to their parents' child_<n>_ns."""
        parent, child = f"parent_{n.name}", f"child_{n.name}_ns"
        members = live if n.member is None else live.filter(n.member)
        # per thread in start order: the depth of every member; only the owned ones' are their
        # depths among all slices, so pending rows are left out (the carried last starts stand for them)
        nested = nesting.nesting(
            members.select(iv_idx="event_idx", pid="pid", tid="tid", ts_ns="ts_ns", end_ns="end_ns"),
            nesting.LONGER_FIRST,
        )
        pending = live.head(live.height - owned)["event_idx"]
        new = (
            nested.with_row_index("pos")
            .filter(~pl.col("iv_idx").is_in(pending.implode()))
            .select(pl.col("pos").cast(pl.Int64), event_idx="iv_idx", depth="depth")
        )
        new = new.with_columns(beside(new, members.select("event_idx", "pid", "tid"), "event_idx").drop("event_idx"))
        last = self._last.get(n.name, new.clear().select("pid", "tid", "depth", "event_idx"))
        starts = pl.concat([last.with_columns(pos=pl.lit(-1, pl.Int64)), new.select(*last.columns, "pos")])
        found = new.with_columns(depth=pl.col("depth") - 1).join_asof(
            starts.rename({"event_idx": parent, "pos": "before"}).sort("before"),
            left_on="pos",
            right_on="before",
            by=["pid", "tid", "depth"],
            strategy="backward",
            allow_exact_matches=False,
            check_sortedness=False,
        )
        self._last[n.name] = starts.sort("pos").group_by("pid", "tid", "depth").agg(pl.col("event_idx").last())
        if parent not in live.columns:
            live = live.with_columns(pl.lit(None, pl.Int64).alias(parent))
        mine = beside(live.tail(owned), found.select("event_idx", parent), "event_idx")[parent]
        live = live.with_columns(pl.concat([live[parent].head(live.height - owned), mine]).alias(parent))
        children = (
            live.tail(owned).filter(pl.col(parent).is_not_null()).group_by(parent).agg(_add=pl.col("dur_ns").sum())
        )
        added = beside(live, children, "event_idx", parent)["_add"].fill_null(0)
        return live.with_columns((pl.col(child) + added).alias(child))


def _with_values(live: pl.DataFrame, values: pl.DataFrame) -> pl.DataFrame:
    """live with the columns of `values` (event_idx, ...) set on the rows they are given for."""
    given = beside(live, values, "event_idx")
    return live.with_columns(
        pl.coalesce(given[c], pl.col(c)) if c in live.columns else given[c] for c in values.columns if c != "event_idx"
    )


def beside(frame: pl.DataFrame, other: pl.DataFrame, left_on: str, right_on: str | None = None) -> pl.DataFrame:
    """The columns of `other` (at most one row per key) for each row of `frame`, in its order: a
    join in which only the key column of the frame takes part (its other columns are not copied)."""
    return frame.select(left_on).join(
        other, left_on=left_on, right_on=right_on or left_on, how="left", maintain_order="left"
    )


class Paths:
    """Stack paths, each distinct one stored once: (path_id, parent_path, label, path), a path
    being its parent path and a label. Slices carry a path id, so a window of slices holds one
    integer each rather than the labels of all its ancestors."""

    def __init__(self):
        self.table = pl.DataFrame(
            schema={"path_id": pl.Int64, "parent_path": pl.Int64, "label": pl.String, "path": pl.String}
        )

    def ids(self, parent_paths: pl.Series, labels: pl.Series) -> pl.Series:
        """The ids of the paths (parent path id or null, label), stored if new."""
        keys = ["parent_path", "label"]
        asked = pl.DataFrame({"parent_path": parent_paths.cast(pl.Int64), "label": labels.cast(pl.String)})
        new = asked.unique(maintain_order=True).join(self.table.select(keys), on=keys, how="anti", nulls_equal=True)
        if new.height:
            new = new.with_row_index("path_id", offset=self.table.height).with_columns(pl.col("path_id").cast(pl.Int64))
            outer = beside(new, self.table.select(parent_path="path_id", outer="path"), "parent_path")["outer"]
            new = new.with_columns(
                path=pl.when(outer.is_null()).then(pl.col("label")).otherwise(outer + ";" + pl.col("label"))
            )
            self.table = pl.concat([self.table, new.select(self.table.columns)])
        return asked.join(
            self.table.select(*keys, "path_id"), on=keys, how="left", nulls_equal=True, maintain_order="left"
        )["path_id"]

    def strings(self, ids: pl.Series) -> pl.Series:
        """The paths of ids (ids are row numbers of the table)."""
        return self.table["path"].gather(ids)


def _with_paths(live: pl.DataFrame, owned: int, nest: str, label: pl.Expr, paths: Paths) -> pl.DataFrame:
    """live with `path_id` (`Paths`) set for its `owned` newest slices (see `SliceSweep`): a slice's
    parent is pending (its path is known) or owned too, so one join per nesting level among the owned."""
    parent = f"parent_{nest}"
    if "path_id" not in live.columns:
        live = live.with_columns(path_id=pl.lit(None, pl.Int64))
    rest = live.tail(owned).select("event_idx", parent, label=label)
    roots = rest.filter(pl.col(parent).is_null())
    found = [roots.select("event_idx", path_id=paths.ids(roots[parent], roots["label"]))]
    level = pl.concat([live.head(live.height - owned).select("event_idx", "path_id"), found[0]])
    rest = rest.filter(pl.col(parent).is_not_null())
    while rest.height and level.height:
        inner = rest.join(level.rename({"event_idx": parent, "path_id": "outer"}), on=parent, how="inner")
        level = inner.select("event_idx", path_id=paths.ids(inner["outer"], inner["label"]))
        rest = rest.join(level, on="event_idx", how="anti")
        found.append(level)
    no_parent = pl.Series([None] * rest.height, dtype=pl.Int64)
    orphans = rest.select("event_idx", path_id=paths.ids(no_parent, rest["label"]))
    mine = beside(live.tail(owned), pl.concat([*found, orphans]), "event_idx")["path_id"]
    return live.with_columns(pl.concat([live["path_id"].head(live.height - owned), mine]).alias("path_id"))
