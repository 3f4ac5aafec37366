"""changepoints: where a metric's series over runs shifted for good, by binary segmentation with
a two-sample t-test, as CI systems find performance regressions in nightly
series (Daly et al., "The Use of Change Point Detection to Identify Software Performance
Regressions in a Continuous Integration System", ICPE 2020; Hunter/Otava).

A series (one value per run, in time order; logarithms when every value is positive) is split
where the two-sample t between the runs before and the runs after is largest (Student's, the
variance pooled: under no change both sides share it, and a side of two runs could not estimate
its own), at least `min_size` runs
on each side (one slow run is not a change: two after it must agree). The split's p-value is
multiplied by the number of places tried (Bonferroni: the largest of many t's is not one t). The
first split of every series shown is kept when it passes Benjamini-Hochberg at `fdr` over the
series and moved the level by at least `min_effect_pct`; each side of a kept split is then split
again the same way (at `fdr` each), until nothing passes. Assumes runs in time order are
independent around their segment's level: a slow drift shows as a step or not at all.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.compare.ttest import t_sf2
from pipeline.compare.verdicts import bh_qvalues

MIN_SIZE = 2


@dataclass(frozen=True)
class ChangePoint:
    """A shift in a series: `index` is its first run after the change; `before` / `after` the
    levels of the segments around it (geometric means for positive series), `delta_pct` the
    change, `p` the split's p-value (Bonferroni over the places tried)."""

    index: int
    before: float
    after: float
    delta_pct: float
    p: float


def best_split(values: np.ndarray, lo: int, hi: int, min_size: int = MIN_SIZE) -> ChangePoint | None:
    """The most significant split of values[lo:hi] (see the module docstring), or None when the
    segment is too short to split."""
    x = np.asarray(values[lo:hi], dtype=float)
    n = x.size
    if n < 2 * min_size:
        return None
    logs = bool(np.all(x > 0))
    y = np.log(x) if logs else x
    y0 = y - y.mean()  # centred: sums of squares without cancellation
    c1, c2 = np.cumsum(y0), np.cumsum(y0**2)
    k = np.arange(min_size, n - min_size + 1)
    n1, n2 = k.astype(float), (n - k).astype(float)
    s1, q1 = c1[k - 1], c2[k - 1]
    s2, q2 = c1[-1] - s1, c2[-1] - q1
    m1, m2 = s1 / n1, s2 / n2
    pooled = np.maximum(q1 - n1 * m1**2 + q2 - n2 * m2**2, 0) / (n - 2)
    se = np.sqrt(pooled * (1 / n1 + 1 / n2))
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(se > 0, (m2 - m1) / se, np.where(m2 == m1, 0.0, np.inf))
    p = t_sf2(t, n - 2)
    i = int(np.lexsort((-np.abs(m2 - m1), p))[0])  # the least p; ties: the largest shift
    split = int(k[i])
    mean = lambda seg: float(np.exp(np.log(seg).mean())) if logs else float(seg.mean())
    before, after = mean(x[:split]), mean(x[split:])
    delta = (after / before - 1) * 100 if before else float("nan")
    return ChangePoint(lo + split, before, after, delta, float(min(1.0, p[i] * k.size)))


def change_points(
    series: dict[str, np.ndarray], fdr: float = 0.01, min_effect_pct: float = 5.0, min_size: int = MIN_SIZE
) -> dict[str, list[ChangePoint]]:
    """The change points of each named series (see the module docstring), in index order."""
    first = {name: best_split(v, 0, len(v), min_size) for name, v in series.items()}
    named = [n for n, cp in first.items() if cp is not None]
    q = bh_qvalues(np.array([first[n].p for n in named])) if named else np.array([])  # type: ignore[union-attr]
    out: dict[str, list[ChangePoint]] = {name: [] for name in series}
    big = lambda cp: abs(cp.delta_pct) >= min_effect_pct
    for name, qv in zip(named, q):
        cp = first[name]
        assert cp is not None
        if qv > fdr or not big(cp):
            continue
        found, todo = [cp], [(0, cp.index), (cp.index, len(series[name]))]
        while todo:
            lo, hi = todo.pop()
            sub = best_split(series[name], lo, hi, min_size)
            if sub is not None and sub.p <= fdr and big(sub):
                found.append(sub)
                todo += [(lo, sub.index), (sub.index, hi)]
        out[name] = sorted(found, key=lambda c: c.index)
    return out
