"""The statistics of `compare` and `trend`, on generated samples with known changes: the t
distribution, Welch's test, Benjamini-Hochberg, and the whole procedure's false alarms and power
on runs that look like real ones (per-rank systematic noise, per-instance noise, heavy tails)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipeline.compare.changepoints import change_points
from pipeline.compare.ttest import (
    NO_PRIOR,
    Prior,
    betainc,
    digamma,
    fit_prior,
    moderated,
    pooled,
    t_quantile,
    t_sf2,
    trigamma,
)
from pipeline.compare.verdicts import bh_qvalues


def test_t_tail_matches_tables():
    # two-sided critical values from any t table
    assert t_sf2([12.706, 2.228, 3.169, 2.086], [1, 10, 10, 20]) == pytest.approx([0.05, 0.05, 0.01, 0.05], abs=2e-4)
    assert t_sf2(1.95996, 1e9) == pytest.approx(0.05, abs=1e-5)  # the normal limit
    assert t_sf2(0.0, 5) == 1.0 and t_sf2(math.inf, 5) == 0.0
    assert t_quantile([0.05, 0.01], [10, 30]) == pytest.approx([2.228, 2.750], abs=1e-3)
    assert float(betainc(2, 3, 0.4)) == pytest.approx(0.5248)  # 1 - sum of binomial terms, by hand


def test_tiny_p_values_keep_their_digits():
    # the direct branch of the continued fraction: p far below the 1e-4 a permutation test can give
    p = t_sf2(20.0, 14)
    assert 0 < p < 1e-10
    assert t_sf2(30.0, 14) < p


def test_student_t_by_hand():
    a, b = np.array([1.0, 2.0, 3.0, 4.0]), np.array([3.0, 5.0, 7.0])
    t = moderated([4], [a.mean()], [a.var(ddof=1)], [3], [b.mean()], [b.var(ddof=1)])
    s2 = (3 * a.var(ddof=1) + 2 * b.var(ddof=1)) / 5
    se = math.sqrt(s2 * (1 / 4 + 1 / 3))
    assert t.diff[0] == pytest.approx(2.5) and t.se[0] == pytest.approx(se) and t.df[0] == 5
    assert t.p[0] == pytest.approx(float(t_sf2(2.5 / se, 5)))
    assert t.low[0] < 2.5 < t.high[0]


def test_moderation_by_hand():
    """The moderated variance is the prior's and the name's, weighted by their degrees of freedom."""
    prior = Prior(d0=6.0, s0_sq=0.01)
    t = moderated([8], [0.0], [0.002], [8], [0.1], [0.004], prior)
    s2 = (6 * 0.01 + 14 * 0.003) / 20
    assert t.df[0] == 20 and t.se[0] == pytest.approx(math.sqrt(s2 / 4))


def test_prior_fitted_from_many_variances():
    rng = np.random.default_rng(0)
    common = rng.chisquare(14, 4000) * 0.002 / 14  # one true variance: d0 very large
    p = fit_prior(common, np.full(4000, 14.0))
    assert p.d0 > 200 and p.s0_sq == pytest.approx(0.002, rel=0.03)
    spread = 0.002 * np.exp(rng.normal(0, 0.6, 4000)) * rng.chisquare(14, 4000) / 14  # they differ: d0 small
    assert 2 < fit_prior(spread, np.full(4000, 14.0)).d0 < 15
    assert fit_prior(common[:5], np.full(5, 14.0)) == NO_PRIOR  # too few names
    assert digamma([1.0])[0] == pytest.approx(-0.5772157) and trigamma([1.0])[0] == pytest.approx(math.pi**2 / 6)


def test_test_edges():
    t = moderated(
        [1, 8, 8, 8, 1],
        [0.0, 1.0, 1.0, 1.0, 0.0],
        [0.0, 0.0, 0.0, 0.01, 0.0],
        [1, 8, 8, 8, 3],
        [1.0, 1.0, 2.0, 1.0, 1.0],
        [0.0, 0.0, 0.0, 0.01, 0.01],
    )
    assert not t.testable[0] and math.isnan(t.p[0])  # one sample a side: no test
    assert t.p[1] == 1.0  # equal, and no noise at all
    assert t.p[2] == 0.0  # different, and no noise at all
    assert t.p[3] == pytest.approx(1.0)
    assert t.testable[4] and t.df[4] == 2  # one rank against three: the variance of the three


def test_bh_by_hand():
    p = np.array([0.01, 0.04, 0.03, 0.005, np.nan])
    # sorted 0.005, 0.01, 0.03, 0.04 (m=4): 0.02, 0.02, 0.04, 0.04 after the running minimum
    assert bh_qvalues(p)[:4] == pytest.approx([0.02, 0.04, 0.04, 0.02])
    assert math.isnan(bh_qvalues(p)[4])


def _runs(rng, names: int, ranks: int, instances: np.ndarray, change: np.ndarray, heavy: bool = False):
    """Per rank time per step of each name: mean x per-rank factor x the mean of its instances'
    noise (log-normal, or Student-t with 3 df on the log scale: heavy tails)."""
    system = np.exp(rng.normal(0, 0.04, (ranks, names)))
    shape = (ranks, names, int(instances.max()))
    noise = np.exp(rng.standard_t(3, shape) * 0.05 if heavy else rng.normal(0, 0.08, shape))
    used = np.arange(shape[2]) < instances[:, None]  # (names, most instances)
    mean = (noise * used).sum(axis=2) / instances
    return 100.0 * system * mean * change


def _verdicts(base, new, instances, fdr=0.01, min_effect=5.0):
    """What `compare` decides per name (`report._tested`, `verdicts.decide`) on logs of unit values."""
    lb, ln = np.log(base), np.log(new)
    n_b, n_n = np.full(base.shape[1], base.shape[0]), np.full(new.shape[1], new.shape[0])
    vb, vn = lb.var(0, ddof=1), ln.var(0, ddof=1)
    prior = fit_prior(*pooled(n_b, vb, n_n, vn), instances)
    t = moderated(n_b, lb.mean(0), vb, n_n, ln.mean(0), vn, prior, level=None)
    q = bh_qvalues(t.p)
    delta = (new.mean(0) / base.mean(0) - 1) * 100
    return np.where((q <= fdr) & (delta >= min_effect), 1, np.where((q <= fdr) & (delta <= -min_effect), -1, 0))


@pytest.mark.slow
@pytest.mark.parametrize("heavy", [False, True])
def test_no_false_alarms_between_unchanged_runs(heavy):
    """200 A/A comparisons of 170 names over 8 ranks: at most a few flag anything (bound: fdr 1%)."""
    rng = np.random.default_rng(7)
    names = 170
    instances = rng.integers(1, 60, names)
    alarms = 0
    for _ in range(200):
        same = np.ones(names)
        alarms += bool(
            _verdicts(
                _runs(rng, names, 8, instances, same, heavy), _runs(rng, names, 8, instances, same, heavy), instances
            ).any()
        )
    assert alarms <= 6  # 2 expected at 1%; 6 is p < 0.02 under Binomial(200, 0.01)


def test_changes_found_through_the_noise():
    """Four kernels changed (+15%, +30%, +60%, -30%) among 170, as make_regression.py changes them:
    found in every one of 50 comparisons, and (nearly) nothing else flagged."""
    rng = np.random.default_rng(11)
    names = 170
    instances = rng.integers(20, 60, names)
    change = np.ones(names)
    change[[1, 4, 8, 2]] = [1.15, 1.30, 1.60, 0.70]
    want = np.where(change > 1, 1, np.where(change < 1, -1, 0))
    exact = missed = false = 0
    for _ in range(50):
        got = _verdicts(
            _runs(rng, names, 8, instances, np.ones(names)), _runs(rng, names, 8, instances, change), instances
        )
        exact += bool((got == want).all())
        missed += int((got[want != 0] != want[want != 0]).sum())
        false += int((got[want == 0] != 0).sum())
    assert missed == 0 and false <= 3  # false discoveries: 1% of ~200 at most, in expectation
    assert exact >= 47


def test_fewer_ranks_find_large_changes_only():
    rng = np.random.default_rng(3)
    names = 50
    instances = rng.integers(20, 60, names)
    change = np.ones(names)
    change[0], change[1] = 1.6, 1.05
    got = _verdicts(_runs(rng, names, 3, instances, np.ones(names)), _runs(rng, names, 3, instances, change), instances)
    assert got[0] == 1 and got[1] == 0 and not got[2:].any()


def test_change_points_found_where_they_are():
    rng = np.random.default_rng(0)
    a = np.exp(rng.normal(0, 0.04, 60))
    a[30:] *= 1.15
    a[45:] *= 0.8
    flat = np.exp(rng.normal(0, 0.04, 60))
    got = change_points({"a": 100 * a, "flat": 100 * flat})
    assert [c.index for c in got["a"]] == [30, 45] and got["flat"] == []
    assert got["a"][0].delta_pct > 5 and got["a"][1].delta_pct < -5


def test_change_points_rarely_false():
    alarms = 0
    for s in range(300):
        series = np.exp(np.random.default_rng(s).normal(0, 0.05, 50))
        alarms += bool(change_points({"x": series}, min_effect_pct=0.0)["x"])
    assert alarms <= 9  # 3 expected at 1%


def test_one_slow_run_is_no_change_point():
    x = np.full(12, 100.0) * np.exp(np.random.default_rng(1).normal(0, 0.02, 12))
    x[6] *= 3
    assert change_points({"x": x})["x"] == []
    x[-1] *= 3  # the newest run alone: not yet a change (two runs after it must agree)
    assert change_points({"x": x})["x"] == []
