"""series: time series for figures, folded window by window into a bounded number of points with
their peaks kept exactly (the memory timeline, the launch queue's depth)."""

from __future__ import annotations

import polars as pl

from pipeline.analyses.sweep import fold


class Extremes:
    """Time series per key folded window by window into at most `max_points` rows per key, the
    peaks kept exactly. A key with at most `max_points` rows keeps them all; past that, the span
    [t0, t1] is cut into equal buckets (`max_points // (2 * len(values))` of them) and each bucket
    keeps only the rows holding its smallest and its largest value of each `values` column (the
    earliest of equals, by `order`), so every bucket's max and min, and so the series' max, are the
    exact ones. State: at most `max_points` rows per key, plus one window."""

    def __init__(self, keys: list[str], order: list[str], values: list[str], span: tuple[int, int], max_points: int):
        if max_points < 2 * len(values):
            raise ValueError(f"max_points must be at least {2 * len(values)}")
        self.keys, self.order, self.values = keys, order, values
        self.max_points = max_points
        self.buckets = max_points // (2 * len(values))
        self.t0, self.width = span[0], (span[1] - span[0] + 1) / self.buckets
        self.counts: pl.DataFrame | None = None
        self.all: pl.DataFrame | None = None  # every row of the keys with at most max_points
        self.kept: pl.DataFrame | None = None  # each bucket's extremes, every key

    def add(self, rows: pl.DataFrame):
        """Add rows (keys..., order..., values...) of one window; keys null are left out."""
        rows = rows.select(*self.keys, *self.order, *self.values).drop_nulls(self.keys)
        if not rows.height:
            return
        n = rows.group_by(self.keys).agg(n=pl.len())
        self.counts = fold(self.counts, n, self.keys, [pl.col("n").sum()])
        few = self.counts.filter(pl.col("n") <= self.max_points).select(self.keys)
        self.all = pl.concat([x for x in (self.all, rows) if x is not None]).join(few, on=self.keys, how="semi")
        bucket = ((pl.col(self.order[0]) - self.t0) / self.width).floor().cast(pl.Int64).clip(0, self.buckets - 1)
        both = pl.concat([x for x in (self.kept, rows.with_columns(bucket=bucket)) if x is not None])
        self.kept = self._extremes(both.with_row_index("_row"))

    def _extremes(self, rows: pl.DataFrame) -> pl.DataFrame:
        late = [False] * len(self.order)
        picks = [
            pl.col("_row").sort_by([v, *self.order], descending=[high, *late], nulls_last=True).first().alias(f"{v}{i}")
            for v in self.values
            for i, high in enumerate((True, False))
        ]
        chosen = rows.group_by(*self.keys, "bucket").agg(picks).drop(*self.keys, "bucket")
        ids = pl.concat([chosen[c] for c in chosen.columns]).unique()
        return rows.filter(pl.col("_row").is_in(ids.implode())).drop("_row")

    def result(self) -> pl.DataFrame:
        """(keys..., order..., values...) sorted by keys and order: all rows of the keys with at most
        max_points, the buckets' extremes of the others."""
        if self.counts is None or self.all is None or self.kept is None:
            return pl.DataFrame()
        many = self.counts.filter(pl.col("n") > self.max_points).select(self.keys)
        out = pl.concat([self.all, self.kept.join(many, on=self.keys, how="semi").drop("bucket")])
        return out.sort(*self.keys, *self.order)
