"""verdicts: from each name's test to `regressed`, `improved` or `same`, with the false discovery
rate held over every name tested at once.

A comparison tests hundreds of names. At a 1% level per name, three of 300 unchanged names would
be flagged by chance in every comparison. Benjamini and Hochberg's procedure bounds instead the
expected share of false discoveries among the names flagged (`fdr`): the p-values are adjusted
into q-values (`bh_qvalues`), and a name is a discovery when its q-value is at most `fdr`. Under
positive dependence between the tests (a slow rank slows many kernels together) the bound still
holds (Benjamini & Yekutieli, 2001). When nothing changed at all, the chance of flagging anything
is at most `fdr`: 1% by default, so that a nightly gate cries wolf about once in 100 quiet nights.

A discovery is also a change worth a look: `regressed` when the time grew by at least
`min_effect_pct` (default 5%), `improved` when it shrank by as much, `same` otherwise (a change
too small to matter, or one the noise cannot tell apart). Names found in one run only are `new`
or `gone`, and names a test cannot be run on (fewer than two units a side) `untested`: neither
gets a verdict from a test that did not run.
"""

from __future__ import annotations

import numpy as np
import polars as pl

VERDICTS = ("regressed", "improved", "new", "gone", "untested", "same")  # the order rows are listed in
FDR = 0.01
MIN_EFFECT_PCT = 5.0


def bh_qvalues(p: np.ndarray) -> np.ndarray:
    """Benjamini-Hochberg adjusted p-values (q-values) of the finite entries of p (NaN stays NaN)."""
    p = np.asarray(p, dtype=float)
    q = np.full(p.shape, np.nan)
    ok = np.flatnonzero(np.isfinite(p))
    if not ok.size:
        return q
    order = ok[np.argsort(p[ok], kind="stable")]
    m = order.size
    ranked = p[order] * m / np.arange(1, m + 1)
    q[order] = np.minimum(np.minimum.accumulate(ranked[::-1])[::-1], 1.0)
    return q


def decide(rows: pl.DataFrame, fdr: float = FDR, min_effect_pct: float = MIN_EFFECT_PCT) -> pl.DataFrame:
    """Rows (with base_us, new_us, delta_pct, p, effect: the test's signed change) given `q` and a
    `verdict` (see the module docstring)."""
    q = bh_qvalues(rows["p"].to_numpy())
    rows = rows.with_columns(q=pl.Series(q, dtype=pl.Float64))
    found = pl.col("q").is_not_nan() & (pl.col("q") <= fdr)
    big_up = (pl.col("delta_pct") >= min_effect_pct) & (pl.col("effect") > 0)
    big_down = (pl.col("delta_pct") <= -min_effect_pct) & (pl.col("effect") < 0)
    base, new = pl.col("base_us").fill_null(0) != 0, pl.col("new_us").fill_null(0) != 0
    verdict = (
        pl.when(base & ~new)
        .then(pl.lit("gone"))
        .when(new & ~base)
        .then(pl.lit("new"))
        .when(~base & ~new)
        .then(pl.lit("same"))
        .when(pl.col("p").is_null() | pl.col("p").is_nan())
        .then(pl.lit("untested"))
        .when(found & big_up)
        .then(pl.lit("regressed"))
        .when(found & big_down)
        .then(pl.lit("improved"))
        .otherwise(pl.lit("same"))
    )
    return rows.with_columns(verdict=verdict)


def gate(rows: pl.DataFrame, fail_above_pct: float) -> pl.DataFrame:
    """The rows that fail `--fail-above PCT`: regressed by more than PCT."""
    return rows.filter((pl.col("verdict") == "regressed") & (pl.col("delta_pct") > fail_above_pct))
