"""report: two runs compared, name by name at every level (`compare_runs`), as the rows of
`tracepipe compare`.

Per name, each run gives one sample per **unit**: a rank (its time per profiler step: the name's
time over the rank's traces / their steps), else, when each run has a single rank, a profiler
step of that rank (the name's time in that step), each change's variance then also holding the
run-to-run one, fitted over the level's names; a collective's unit is the call. A
unit where the name did not run counts 0. `base_us` / `new_us` are the name's time per rank and
step (its time over the run / the run's rank-steps), `delta_pct` their change, and the test
(`ttest`) runs on the units' logarithms (on the times themselves when some unit is 0 or below,
as an idle sum can be), the variances of a level's names moderated towards their common one.
Kernels are matched by full name; those found in one run only are then matched by their name
without template arguments, hashes and suffixes, as `diff` matches them across vendors
(`base_names` / `new_names` list what was joined).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from pipeline.analyses.names import normalize_kernel
from pipeline.compare import samples, verdicts
from pipeline.compare.runs import Run
from pipeline.compare.ttest import NO_PRIOR, between_runs, fit_prior, moderated, pooled

LEVELS = samples.LEVELS
LEVEL_ORDER = {lv: i for i, lv in enumerate(LEVELS)}


@dataclass(frozen=True)
class Comparison:
    """Two runs compared: every row, how the units were chosen, what the runs lack."""

    base: Run
    new: Run
    units: str  # "ranks" or "steps" (collectives: calls)
    rows: pl.DataFrame
    fdr: float
    min_effect_pct: float
    problems: list[str] = field(default_factory=list)
    base_units: int = 0
    new_units: int = 0

    def counts(self, level: str | None = None) -> dict[str, int]:
        """How many rows got each verdict (of one level)."""
        rows = self.rows if level is None else self.rows.filter(pl.col("level") == level)
        got = dict(rows.group_by("verdict").len().iter_rows())
        return {v: got.get(v, 0) for v in verdicts.VERDICTS}


def compare_runs(
    base: Run,
    new: Run,
    levels=LEVELS,
    fdr: float = verdicts.FDR,
    min_effect_pct: float = verdicts.MIN_EFFECT_PCT,
    problems: list[str] | None = None,
) -> Comparison:
    """Compare `new` against `base` (see the module docstring and `verdicts`)."""
    by_step = base.units == 1 and new.units == 1
    tot = {s: samples.totals(r.dataset, r.ids, levels, by_step) for s, r in (("base", base), ("new", new))}
    steps = {s: samples.step_counts(r.dataset, r.ids) for s, r in (("base", base), ("new", new))}
    tot, names = _match_kernels(tot["base"], tot["new"])
    parts = [_level_rows(tot, steps, {"base": base, "new": new}, by_step)]
    n_units = {s: _units(r, steps[s], by_step).height for s, r in (("base", base), ("new", new))}
    if "collective" in levels:
        parts.append(_collective_rows(base, new, steps))
    rows = (
        pl.concat([p for p in parts if p.height], how="diagonal_relaxed") if any(p.height for p in parts) else _empty()
    )
    rows = rows.join(names, on=["level", "name"], how="left") if names.height else rows
    both = (pl.col("base_us").fill_null(0) != 0) & (pl.col("new_us").fill_null(0) != 0)
    untested = ["p", "effect", "ci_low_pct", "ci_high_pct", "test"]  # a name in one run only: no test ran
    rows = rows.with_columns(pl.when(both).then(pl.col(c)).alias(c) for c in untested if c in rows.columns)
    delta = pl.when(pl.col("base_us") > 0).then((pl.col("new_us") / pl.col("base_us") - 1) * 100)
    rows = _finish(verdicts.decide(rows.with_columns(delta_pct=delta), fdr, min_effect_pct))
    return Comparison(
        base,
        new,
        "steps" if by_step else "ranks",
        rows,
        fdr,
        min_effect_pct,
        problems or [],
        n_units["base"],
        n_units["new"],
    )


def compare_in(
    ds_a: Path,
    ds_b: Path | None = None,
    base: str | None = None,
    new: str | None = None,
    levels=LEVELS,
    fdr: float = verdicts.FDR,
    min_effect_pct: float = verdicts.MIN_EFFECT_PCT,
    run_by: str | None = None,
    source: str | Path | None = None,
) -> tuple[Comparison, list[str], str | None]:
    """`tracepipe compare`: the run `base` of the dataset `ds_a` against the run `new` of `ds_b`
    (default: `ds_a` again; `source` names it in errors), measured and compared; with one dataset
    and a run left unnamed, `new` is its latest run and `base` the one before it. Returns the
    comparison, the runs' problems, and the line saying which runs were chosen (or None)."""
    from pipeline.compare.measured import measure_runs
    from pipeline.compare.problems import run_problems
    from pipeline.compare.runs import all_runs, last_component, load_run
    from pipeline.errors import UsageError

    said = None
    if ds_b is None and (base is None or new is None):
        runs = all_runs(ds_a, run_by)
        if len(runs) < 2:
            raise UsageError(f"{source or ds_a}: holds {len(runs)} run: give a second dataset, or --base and --new")
        names = [r.name for r in runs]
        new = new or names[-1]
        if base is None:
            newest = load_run(ds_a, new, "new", run_by).name
            earlier = names[: names.index(newest)]
            if not earlier:
                raise UsageError(f"--new {new} is the earliest run: give --base")
            base = earlier[-1]
        said = f"comparing {last_component(new)} against {last_component(base)} (the latest two runs in time order)"
    b = load_run(ds_a, base, "base", run_by)
    n = load_run(ds_b if ds_b is not None else ds_a, new, "new", run_by)
    if b.dataset == n.dataset and b.name == n.name:
        raise UsageError(f"--base and --new name the same run ({b.name})")
    measure_runs([b, n])  # both at once when they share a dataset
    problems = run_problems(b) + run_problems(n)
    return compare_runs(b, n, levels, fdr, min_effect_pct, problems), problems, said


# ------------------------------------------------------------------ kernels matched across vendors
def _match_kernels(base: pl.DataFrame, new: pl.DataFrame) -> tuple[dict[str, pl.DataFrame], pl.DataFrame]:
    """Kernel names found in one run only, renamed to their normalised name when that name is also
    among the other run's unmatched ones; (level, name, base_names, new_names) of those rows."""
    k = lambda t: set(t.filter(pl.col("level") == "kernel")["name"].unique().to_list())
    nb, nn = k(base), k(new)
    only_b, only_n = sorted(nb - nn), sorted(nn - nb)
    empty = pl.DataFrame(
        schema={
            "level": pl.String,
            "name": pl.String,
            "base_names": pl.List(pl.String),
            "new_names": pl.List(pl.String),
        }
    )
    if not only_b or not only_n:
        return {"base": base, "new": new}, empty
    key = lambda names: pl.DataFrame({"name": names}).with_columns(key=normalize_kernel(pl.col("name")))
    kb, kn = key(only_b), key(only_n)
    shared = set(kb["key"]) & set(kn["key"]) - (nb & nn)
    if not shared:
        return {"base": base, "new": new}, empty
    kb, kn = kb.filter(pl.col("key").is_in(list(shared))), kn.filter(pl.col("key").is_in(list(shared)))

    def rename(t: pl.DataFrame, keys: pl.DataFrame) -> pl.DataFrame:
        kern = pl.col("level") == "kernel"
        mapped = t.join(keys, on="name", how="left").with_columns(
            name=pl.when(kern & pl.col("key").is_not_null()).then(pl.col("key")).otherwise(pl.col("name"))
        )
        return mapped.group_by("trace_id", "step", "level", "name").agg(pl.col("time_ns", "count").sum())

    names = (
        kb.group_by("key")
        .agg(base_names=pl.col("name").sort())
        .join(kn.group_by("key").agg(new_names=pl.col("name").sort()), on="key")
        .select(level=pl.lit("kernel"), name="key", base_names="base_names", new_names="new_names")
    )
    return {"base": rename(base, kb), "new": rename(new, kn)}, names


# ------------------------------------------------------------------ units and their values
def _units(run: Run, steps: pl.DataFrame, by_step: bool) -> pl.DataFrame:
    """(unit, trace_id, step, steps) of a run: its ranks, or its profiler steps (a trace without
    steps: one unit); `steps`: the unit's profiler steps (at least 1 per trace)."""
    tr = run.traces.select("trace_id", "unit").join(steps, on="trace_id", how="left")
    if not by_step:
        return tr.select(
            unit=pl.col("unit").cast(pl.String),
            trace_id="trace_id",
            step=pl.lit(None, pl.String),
            steps=pl.max_horizontal(pl.col("steps"), 1),
        )
    iv = samples.step_intervals(run.dataset, run.ids).select("trace_id", "step")
    stepless = tr.filter(pl.col("steps") == 0).select("trace_id", step=pl.lit(None, pl.String))
    both = pl.concat([iv, stepless])
    return both.select(
        unit=pl.concat_str(pl.col("trace_id"), pl.col("step").fill_null("-"), separator="/"),
        trace_id="trace_id",
        step="step",
        steps=pl.lit(1, pl.Int64),
    )


def _level_rows(
    tot: dict[str, pl.DataFrame], steps: dict[str, pl.DataFrame], runs: dict[str, Run], by_step: bool
) -> pl.DataFrame:
    """Per (level, name) but collectives: base_us, new_us, counts and the test."""
    names = pl.concat([t.select("level", "name") for t in tot.values()]).unique()
    stats, ratio = {}, {}
    for side, t in tot.items():
        units = _units(runs[side], steps[side], by_step)
        rank_steps = steps[side].select(pl.max_horizontal(pl.col("steps"), 1).sum()).item() or 1
        ratio[side] = t.group_by("level", "name").agg(
            (pl.col("time_ns").sum() / rank_steps / 1e3).alias(f"{side}_us"),
            (pl.col("count").sum() / rank_steps).alias(f"{side}_count"),
        )
        if by_step:
            keyed = t.join(
                units.select("trace_id", "step", "unit"), on=["trace_id", "step"], how="inner", nulls_equal=True
            )
        else:
            keyed = t.join(units.select("trace_id", "unit"), on="trace_id", how="inner")
        per_unit = keyed.group_by("unit", "level", "name").agg(pl.col("time_ns").sum())
        denom = units.group_by("unit").agg(pl.col("steps").sum())
        grid = names.join(denom, how="cross").join(per_unit, on=["unit", "level", "name"], how="left")
        values = grid.with_columns(v=pl.col("time_ns").fill_null(0.0) / pl.col("steps"))
        stats[side] = _stats(values, side)
    out = names.join(ratio["base"], on=["level", "name"], how="left").join(
        ratio["new"], on=["level", "name"], how="left"
    )
    out = out.join(stats["base"], on=["level", "name"], how="left").join(stats["new"], on=["level", "name"], how="left")
    return _tested(out.with_columns(units=pl.lit("steps" if by_step else "ranks")), across_runs=by_step)


def _stats(values: pl.DataFrame, side: str) -> pl.DataFrame:
    """Per (level, name) of a side's unit values `v`: count, mean and variance, of v and of log v."""
    log = pl.when(pl.col("v") > 0).then(pl.col("v").log())
    return values.group_by("level", "name").agg(
        pl.len().cast(pl.Int64).alias(f"{side}_n"),
        pl.col("v").mean().alias(f"{side}_mean"),
        pl.col("v").var().alias(f"{side}_var"),
        (pl.col("v") > 0).all().alias(f"{side}_pos"),
        log.mean().alias(f"{side}_lmean"),
        log.var().alias(f"{side}_lvar"),
    )


def _tested(out: pl.DataFrame, across_runs: bool = False) -> pl.DataFrame:
    """Rows with the test run (`ttest.moderated`) on the units' logs where every unit of both runs
    is positive (the variances moderated by a prior fitted to the level's names so tested), else
    on the values themselves (Student's t): p, effect (the test's change: the log ratio or the
    difference), ci_low_pct / ci_high_pct (95%), test. `across_runs` (units are the steps of one
    rank): each change's variance also holds the run-to-run one (`ttest.between_runs`), fitted
    over the level's names tested on logs; names it cannot be fitted for are not tested."""
    if not out.height:
        return out
    logs = (out["base_pos"].fill_null(False) & out["new_pos"].fill_null(False)).to_numpy()
    pick = lambda a, b: np.where(logs, out[a].fill_null(np.nan).to_numpy(), out[b].fill_null(np.nan).to_numpy())
    n_a, n_b = out["base_n"].fill_null(0).to_numpy().astype(float), out["new_n"].fill_null(0).to_numpy().astype(float)
    m_a, v_a, m_b, v_b = (
        pick("base_lmean", "base_mean"),
        pick("base_lvar", "base_var"),
        pick("new_lmean", "new_mean"),
        pick("new_lvar", "new_var"),
    )
    level = out["level"].to_numpy()
    per_unit = (out["base_count"].fill_null(0) + out["new_count"].fill_null(0)).to_numpy() / 2
    instances = np.where(per_unit > 0, per_unit, np.nan)  # the trend of the variances
    cols = {k: np.full(out.height, np.nan) for k in ("p", "diff", "low", "high")}
    prior_d0 = np.zeros(out.height)
    between = np.full(out.height, np.nan)
    testable = np.zeros(out.height, dtype=bool)
    for lv in np.unique(level):
        for on_logs in (True, False):
            rows = (level == lv) & (logs == on_logs)
            if not rows.any():
                continue
            s2, d = pooled(n_a[rows], v_a[rows], n_b[rows], v_b[rows])
            prior = fit_prior(s2, d, instances[rows]) if on_logs else NO_PRIOR
            t = moderated(n_a[rows], m_a[rows], v_a[rows], n_b[rows], m_b[rows], v_b[rows], prior)
            if across_runs:
                tau2 = between_runs(t.diff, t.se) if on_logs else None
                if tau2 is None:
                    continue  # untested: the run-to-run noise is unknown
                t = moderated(n_a[rows], m_a[rows], v_a[rows], n_b[rows], m_b[rows], v_b[rows], prior, between=tau2)
                between[rows] = tau2
            for k, v in (("p", t.p), ("diff", t.diff), ("low", t.low), ("high", t.high)):
                cols[k][rows] = v
            prior_d0[rows] = prior.d0
            testable[rows] = t.testable
    base_mean = out["base_mean"].fill_null(np.nan).to_numpy()
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        low = np.where(logs, np.expm1(cols["low"]), cols["low"] / base_mean) * 100
        high = np.where(logs, np.expm1(cols["high"]), cols["high"] / base_mean) * 100
    test = [None if not ok else ("t-log" if lg else "t") for ok, lg in zip(testable, logs)]
    return out.with_columns(
        p=pl.Series(cols["p"], dtype=pl.Float64),
        effect=pl.Series(cols["diff"], dtype=pl.Float64),
        ci_low_pct=pl.Series(low, dtype=pl.Float64),
        ci_high_pct=pl.Series(high, dtype=pl.Float64),
        test=pl.Series(test, dtype=pl.String),
        prior_df=pl.Series(prior_d0, dtype=pl.Float64),
        between_runs_var=pl.Series(between, dtype=pl.Float64),
    )


# ------------------------------------------------------------------ collectives
def _collective_rows(base: Run, new: Run, steps: dict[str, pl.DataFrame]) -> pl.DataFrame:
    """Per collective kind and size: mean latency (µs) and bus bandwidth of each run, tested over calls."""
    per = {}
    for side, run in (("base", base), ("new", new)):
        calls = samples.collective_calls(run)
        v = calls.with_columns(level=pl.lit("collective"), name=pl.lit(""), v=pl.col("latency_ns"))
        st = _stats(v.with_columns(name=pl.col("kind") + "\x00" + pl.col("bytes").cast(pl.String).fill_null("")), side)
        extra = v.group_by(name=pl.col("kind") + "\x00" + pl.col("bytes").cast(pl.String).fill_null("")).agg(
            (pl.col("latency_ns").mean() / 1e3).alias(f"{side}_us"),
            pl.len().cast(pl.Float64).alias(f"{side}_count"),
            pl.col("busbw_gbps").mean().alias(f"{side}_busbw_gbps"),
            pl.col("kind").first(),
            pl.col("bytes").first(),
        )
        per[side] = st.join(extra, on="name")
    if not per["base"].height and not per["new"].height:
        return _empty()
    both = per["base"].join(per["new"], on=["level", "name"], how="full", coalesce=True, suffix="_n")
    both = both.with_columns(
        kind=pl.coalesce("kind", "kind_n"), bytes=pl.coalesce("bytes", "bytes_n"), units=pl.lit("calls")
    ).drop("kind_n", "bytes_n")
    both = both.with_columns(
        name=pl.struct("kind", "bytes").map_elements(
            lambda s: samples.collective_name(s["kind"], s["bytes"]), return_dtype=pl.String
        )
    )
    return _tested(both)


# ------------------------------------------------------------------ the rows as shown
COLUMNS = [  # by importance: the table at a narrow terminal leaves out the last ones
    "level",
    "name",
    "verdict",
    "delta_pct",
    "base_us",
    "new_us",
    "q",
    "ci_low_pct",
    "ci_high_pct",
    "base_count",
    "new_count",
    "base_n",
    "new_n",
    "units",
    "test",
    "p",
    "prior_df",
    "between_runs_var",
    "base_busbw_gbps",
    "new_busbw_gbps",
    "kind",
    "bytes",
    "base_names",
    "new_names",
    "note",
]
NOTES = {
    "new": "only in the new run",
    "gone": "only in the base run",
    "untested": "fewer than 2 units in a run: no test",
}


def _empty() -> pl.DataFrame:
    return pl.DataFrame(
        schema={
            "level": pl.String,
            "name": pl.String,
            "base_us": pl.Float64,
            "new_us": pl.Float64,
            "p": pl.Float64,
            "effect": pl.Float64,
        }
    )


def _finish(rows: pl.DataFrame) -> pl.DataFrame:
    """Every column of COLUMNS, delta_pct, sorted: by level, verdict, then the largest change in time."""
    for c in COLUMNS:
        if c not in rows.columns:
            rows = rows.with_columns(pl.lit(None).alias(c))
    note = pl.col("verdict").replace_strict(NOTES, default=None, return_dtype=pl.String)
    joined = pl.col("base_names").is_not_null() if "base_names" in rows.columns else pl.lit(False)
    rows = rows.with_columns(
        note=pl.when(joined).then(pl.lit("matched by name without templates and hashes")).otherwise(note)
    )
    order = {v: i for i, v in enumerate(verdicts.VERDICTS)}
    change = (pl.col("new_us").fill_null(0) - pl.col("base_us").fill_null(0)).abs()
    return rows.sort(
        pl.col("level").replace_strict(LEVEL_ORDER, default=len(LEVEL_ORDER)),
        pl.col("verdict").replace_strict(order, default=len(order)),
        change,
        "name",
        descending=[False, False, True, False],
    ).select(COLUMNS)
