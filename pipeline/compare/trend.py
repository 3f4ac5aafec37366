"""trend: one level's names followed over every run of a dataset in time order (`trend`), with
their change points (`changepoints`).

A run's value of a name is what `compare` calls its time per rank and step: the name's time over
the run's traces divided by their profiler steps (a trace without steps counts one); a
collective's is its mean latency. Runs are ordered by time (`runs.all_runs`). Names: those
matching `pattern` (a regular expression searched in the full name, case-insensitive), else the
`top` names with the most time over all runs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from pipeline.compare import samples
from pipeline.compare.changepoints import MIN_SIZE, ChangePoint, change_points
from pipeline.compare.runs import Run, iso_time
from pipeline.errors import UsageError

TOP = 5


@dataclass(frozen=True)
class Trend:
    """`rows`: (run, label, time_ns, order, name, value_us, count) in time order per name;
    `changes`: name -> its change points; `problems`: the runs' problems."""

    level: str
    rows: pl.DataFrame
    changes: dict[str, list[ChangePoint]]
    fdr: float
    min_effect_pct: float
    problems: list[str] = field(default_factory=list)


def run_values(runs: list[Run], level: str) -> pl.DataFrame:
    """(run, name, value_us, count) of every name of `level` in every run."""
    if level == "collective":
        parts = []
        for r in runs:
            calls = samples.collective_calls(r)
            per = calls.group_by("kind", "bytes").agg(
                value_us=pl.col("latency_ns").mean() / 1e3, count=pl.len().cast(pl.Float64)
            )
            names = [samples.collective_name(k, b) for k, b in per.select("kind", "bytes").iter_rows()]
            parts.append(
                per.select(
                    run=pl.lit(r.name), name=pl.Series(names, dtype=pl.String), value_us="value_us", count="count"
                )
            )
        return (
            pl.concat(parts)
            if parts
            else pl.DataFrame(schema={"run": pl.String, "name": pl.String, "value_us": pl.Float64, "count": pl.Float64})
        )
    out = []
    for ds in dict.fromkeys(r.dataset for r in runs):
        mine = [r for r in runs if r.dataset == ds]
        owner = pl.concat([r.traces.select("trace_id", run=pl.lit(r.name)) for r in mine])
        ids = owner["trace_id"].to_list()
        tot = samples.totals(ds, ids, (level,), by_step=False).join(owner, on="trace_id")
        steps = samples.step_counts(ds, ids).join(owner, on="trace_id")
        per_run = steps.group_by("run").agg(rank_steps=pl.max_horizontal(pl.col("steps"), 1).sum())
        out.append(
            tot.group_by("run", "name")
            .agg(pl.col("time_ns").sum(), pl.col("count").sum())
            .join(per_run, on="run")
            .select(
                "run",
                "name",
                value_us=pl.col("time_ns") / pl.col("rank_steps") / 1e3,
                count=pl.col("count") / pl.col("rank_steps"),
            )
        )
    return pl.concat(out)


def trend(
    runs: list[Run],
    level: str = "kernel",
    pattern: str | None = None,
    top: int = TOP,
    fdr: float = 0.01,
    min_effect_pct: float = 5.0,
    problems: list[str] | None = None,
) -> Trend:
    """The names' values over the runs (see the module docstring) and their change points."""
    if level not in samples.LEVELS:
        raise UsageError(f"--level {level}: levels are {', '.join(samples.LEVELS)}")
    values = run_values(runs, level)
    if pattern is not None:
        try:
            rx = re.compile(pattern, re.IGNORECASE)
        except re.error as e:
            raise UsageError(f"--name: not a regex ({e})") from None
        names = sorted(n for n in values["name"].unique().to_list() if rx.search(n))
        if not names:
            raise UsageError(f"--name {pattern}: no {level} name matches (try a shorter pattern)")
    else:
        sums = values.group_by("name").agg(pl.col("value_us").sum()).sort("value_us", "name", descending=[True, False])
        names = sums.head(top)["name"].to_list() if top else sums["name"].to_list()
    order = pl.DataFrame(
        {
            "run": [r.name for r in runs],
            "label": [r.label for r in runs],
            "time_ns": pl.Series([r.time_ns for r in runs], dtype=pl.Int64),
            "order": list(range(len(runs))),
        }
    )
    grid = order.join(pl.DataFrame({"name": names}, schema={"name": pl.String}), how="cross")
    rows = grid.join(values, on=["run", "name"], how="left").with_columns(pl.col("value_us", "count").fill_null(0.0))
    rows = rows.sort("name", "order")
    series = {n: rows.filter(pl.col("name") == n)["value_us"].to_numpy() for n in names}
    changes = change_points(series, fdr, min_effect_pct)
    problems = list(problems or [])
    if len(runs) < 2 * MIN_SIZE:  # else "0 found" reads as "no change" where none could be found
        held = "1 run" if len(runs) == 1 else f"{len(runs)} runs"
        problems.insert(0, f"{held}: a change point needs at least {MIN_SIZE} runs on each side, {2 * MIN_SIZE} in all")
    return Trend(level, _with_changes(rows, changes), changes, fdr, min_effect_pct, problems)


def _with_changes(rows: pl.DataFrame, changes: dict[str, list[ChangePoint]]) -> pl.DataFrame:
    """Rows with `change_pct` at the first run after each change point (null elsewhere) and
    `vs_previous_pct`, the change from the run before."""
    marks = [(n, cp.index, cp.delta_pct, cp.p) for n, cps in changes.items() for cp in cps]
    m = pl.DataFrame(
        marks,
        schema={"name": pl.String, "order": pl.Int64, "change_pct": pl.Float64, "change_p": pl.Float64},
        orient="row",
    )
    prev = pl.col("value_us").shift(1).over("name", order_by="order")
    return (
        rows.with_columns(pl.col("order").cast(pl.Int64))
        .join(m, on=["name", "order"], how="left")
        .with_columns(vs_previous_pct=pl.when(prev > 0).then((pl.col("value_us") / prev - 1) * 100))
    )


def trend_json(t: Trend) -> dict:
    """{"level", "method", "rows": [{run, label, time, name, value_us, count, vs_previous_pct,
    change_pct, change_p}], "change_points": [{name, run, label, before_us, after_us, delta_pct,
    p}], "problems"}."""
    from pipeline.render.tables import records

    runs = t.rows.select("order", "run", "label").unique("order").sort("order")
    run_of = dict(zip(runs["order"].to_list(), zip(runs["run"].to_list(), runs["label"].to_list())))
    rows = records(
        t.rows.with_columns(time=pl.col("time_ns").map_elements(iso_time, return_dtype=pl.String)).drop(
            "order", "time_ns"
        )
    )
    cps = [
        {
            "name": n,
            "run": run_of[cp.index][0],
            "label": run_of[cp.index][1],
            "before_us": cp.before,
            "after_us": cp.after,
            "delta_pct": cp.delta_pct,
            "p": cp.p,
        }
        for n, found in t.changes.items()
        for cp in found
    ]
    method = {
        "change_points": "binary segmentation, two-sample t on log values, Bonferroni over split places, "
        "Benjamini-Hochberg over the names",
        "fdr": t.fdr,
        "min_effect_pct": t.min_effect_pct,
        "min_runs_each_side": 2,
    }
    return {"level": t.level, "method": method, "rows": rows, "change_points": cps, "problems": t.problems}


def series_of(t: Trend) -> dict[str, np.ndarray]:
    return {n: t.rows.filter(pl.col("name") == n)["value_us"].to_numpy() for n in t.changes}
