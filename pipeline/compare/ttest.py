"""ttest: the two-sample t-test `compare` runs on every name at once, its variances moderated
across names (empirical Bayes, as limma does for thousands of genes), with numpy only.

A comparison tests a few hundred names at once from a handful of samples each (8 ranks a side is
typical). The samples are per-unit times (a rank's time per step) that vary multiplicatively: a
rank runs a kernel a few % faster throughout, an instance 10% slower. On their logarithms such
noise is additive and close to normal, and a change is a shift, so a t-test on the logs asks
"did the geometric mean move?". With 8 ranks a side each name's variance rests on 14 degrees of
freedom: a noisy estimate, and a t-test built on it must ask for a large t before a false
discovery correction over 300 names lets a change through. But the names of one level share
their noise (the same ranks, the same machine): `moderated` estimates from all names a prior
for the variances (a scaled inverse chi-square: s0^2 with d0 degrees of freedom, fitted to the
spread of the log variances by the method of moments, Smyth 2004; its variance following A +
B / instances per unit, as the mean of a unit's instances does) and shrinks each name's variance
towards it. The moderated t has d0 + d degrees of freedom: more power at the same
false alarm rate, and a name whose own variance is odd keeps most of it when the names' variances
differ a lot (then d0 comes out small). Why not the alternatives:

* a permutation or rank test (Mann-Whitney) needs no normality, but with 8 units a side it can
  never give a p-value below 1/12,870 (permutations) or ~1e-4 (ranks), and a false-discovery
  correction over ~300 names needs smaller ones: with 4 ranks a side it could find nothing at all;
* pooling every (rank, step) sample would give more samples but pretend they are independent:
  a rank's systematic offset would be counted once per step and turn noise into "changes";
* Welch's test allows the runs different spreads, but a side of 2 ranks then has 1 degree of
  freedom for its own variance; the pooled variance (equal spreads) is the one moderation needs.

The t distribution's tail comes from the regularised incomplete beta function (a continued
fraction, Numerical Recipes' `betacf`), the prior from digamma and trigamma series: scipy is not
a dependency for a few functions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

_lgamma = np.frompyfunc(math.lgamma, 1, 1)
MAX_ITER = 400
EPS = 1e-13
TINY = 1e-300


def _lg(x: np.ndarray) -> np.ndarray:
    return _lgamma(np.asarray(x, dtype=float)).astype(float)


def _betacf(a: np.ndarray, b: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The continued fraction of the incomplete beta function (modified Lentz), elementwise."""
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c = np.ones_like(x)
    d = 1.0 - qab * x / qap
    d = 1.0 / np.where(np.abs(d) < TINY, TINY, d)
    h = d.copy()
    for m in range(1, MAX_ITER + 1):
        m2 = 2.0 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + aa * d
            d = 1.0 / np.where(np.abs(d) < TINY, TINY, d)
            c = 1.0 + aa / c
            c = np.where(np.abs(c) < TINY, TINY, c)
            step = d * c
            h = h * step
        if np.all(np.abs(step - 1.0) < EPS):
            break
    return h


def betainc(a, b, x) -> np.ndarray:
    """The regularised incomplete beta function I_x(a, b), elementwise (a, b > 0, 0 <= x <= 1)."""
    a, b, x = np.broadcast_arrays(*(np.asarray(v, dtype=float) for v in (a, b, x)))
    out = np.where(x <= 0, 0.0, 1.0)
    inside = (x > 0) & (x < 1)
    if not inside.any():
        return out
    a_, b_, x_ = a[inside], b[inside], x[inside]
    front = np.exp(_lg(a_ + b_) - _lg(a_) - _lg(b_) + a_ * np.log(x_) + b_ * np.log1p(-x_))
    direct = x_ < (a_ + 1.0) / (a_ + b_ + 2.0)  # where the fraction converges fast; else by symmetry
    value = np.empty_like(x_)
    if direct.any():
        value[direct] = front[direct] * _betacf(a_[direct], b_[direct], x_[direct]) / a_[direct]
    if (~direct).any():
        f = ~direct
        value[f] = 1.0 - front[f] * _betacf(b_[f], a_[f], 1.0 - x_[f]) / b_[f]
    out[inside] = value
    return out


def t_sf2(t, df) -> np.ndarray:
    """Two-sided tail probability of Student's t: P(|T| >= |t|) with `df` degrees of freedom."""
    t, df = np.broadcast_arrays(np.abs(np.asarray(t, dtype=float)), np.asarray(df, dtype=float))
    p = np.ones_like(t)
    ok = np.isfinite(df) & (df > 0) & ~np.isnan(t)
    inf = ok & np.isinf(t)
    p[inf] = 0.0
    fin = ok & ~inf
    if fin.any():
        with np.errstate(over="ignore"):  # t**2 beyond a float: x = 0, p = 0
            p[fin] = betainc(df[fin] / 2.0, 0.5, df[fin] / (df[fin] + t[fin] ** 2))
    return np.clip(p, 0.0, 1.0)


def _t_pdf(t: np.ndarray, df: np.ndarray) -> np.ndarray:
    norm = np.exp(_lg((df + 1) / 2) - _lg(df / 2)) / np.sqrt(df * np.pi)
    return norm * (1 + t**2 / df) ** (-(df + 1) / 2)


def t_quantile(two_sided_p, df) -> np.ndarray:
    """The t with P(|T| >= t) = p (for a confidence interval): the Cornish-Fisher expansion around
    the normal quantile (Abramowitz & Stegun 26.7.5), then Newton's method on `t_sf2`."""
    from statistics import NormalDist

    p, df = np.broadcast_arrays(np.asarray(two_sided_p, dtype=float), np.asarray(df, dtype=float))
    inv = np.frompyfunc(lambda x: NormalDist().inv_cdf(1 - x / 2), 1, 1)
    z = inv(p).astype(float)
    t = (
        z
        + (z**3 + z) / (4 * df)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3)
        + (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / (92160 * df**4)
    )
    for _ in range(8):
        t = np.maximum(t + (t_sf2(t, df) - p) / (2 * _t_pdf(t, df)), 1e-12)
    return t


# ------------------------------------------------------------------ digamma, trigamma
def digamma(x) -> np.ndarray:
    """psi(x) for x > 0: recurrence up to 6, then the asymptotic series."""
    x = np.asarray(x, dtype=float).copy()
    out = np.zeros_like(x)
    while (small := x < 6).any():
        out -= np.where(small, 1 / np.where(small, x, 1), 0)
        x = np.where(small, x + 1, x)
    inv2 = 1 / x**2
    return out + np.log(x) - 0.5 / x - inv2 * (1 / 12 - inv2 * (1 / 120 - inv2 / 252))


def trigamma(x) -> np.ndarray:
    """psi'(x) for x > 0: recurrence up to 6, then the asymptotic series."""
    x = np.asarray(x, dtype=float).copy()
    out = np.zeros_like(x)
    while (small := x < 6).any():
        out += np.where(small, 1 / np.where(small, x, 1) ** 2, 0)
        x = np.where(small, x + 1, x)
    inv, inv2 = 1 / x, 1 / x**2
    return out + inv + inv2 / 2 + inv * inv2 * (1 / 6 - inv2 * (1 / 30 - inv2 * (1 / 42 - inv2 / 30)))


def trigamma_inverse(y: float) -> float:
    """The x > 0 with trigamma(x) = y (trigamma falls monotonically): bisection on log x."""
    lo, hi = -20.0, 20.0
    for _ in range(120):
        mid = (lo + hi) / 2
        if float(trigamma(math.exp(mid))) > y:
            lo = mid
        else:
            hi = mid
    return math.exp((lo + hi) / 2)


# ------------------------------------------------------------------ the test
def between_runs(diff: np.ndarray, se: np.ndarray) -> float | None:
    """The variance of a name's change from one run to the next that its samples cannot show
    (tau^2: with one rank a run, the rank's own offsets, drawn anew each run), estimated across
    names as a random effect, robustly: the spread of the names' changes (1.4826 x their median
    absolute deviation: the few names that did change do not move it) less the typical sampling
    variance. None from fewer than MIN_NAMES names."""
    ok = np.isfinite(diff) & np.isfinite(se)
    if ok.sum() < MIN_NAMES:
        return None
    d = diff[ok]
    spread = 1.4826 * np.median(np.abs(d - np.median(d)))
    return max(0.0, float(spread**2 - np.median(se[ok] ** 2)))


@dataclass(frozen=True)
class Prior:
    """The names' common variance `s0_sq` (one per name when it follows a trend) and how much it
    is worth, `d0` degrees of freedom (0: no prior, each name on its own; inf: the prior's
    variance alone)."""

    d0: float
    s0_sq: np.ndarray | float


NO_PRIOR = Prior(0.0, 0.0)
MIN_NAMES = 10  # names with a variance needed to fit a prior


def _trend(var: np.ndarray, count: np.ndarray) -> np.ndarray:
    """Each name's expected variance from its instances per unit: A + B / count, fitted by least
    squares with A, B >= 0 (the rank's own offset, and the mean of `count` instances' noise)."""
    both = np.column_stack([np.ones(count.size), 1 / count])
    coef, *_ = np.linalg.lstsq(both, var, rcond=None)
    if coef[1] < 0:  # no noise that averages out: one variance for all
        return np.full(count.size, float(var.mean()))
    if coef[0] < 0:  # no offset of its own: all of it averages out (A held at 0)
        return both[:, 1] * max(float(both[:, 1] @ var / (both[:, 1] @ both[:, 1])), 0.0)
    return both @ coef


def fit_prior(var: np.ndarray, df: np.ndarray, count: np.ndarray | None = None) -> Prior:
    """The prior of sample variances `var` (each on `df` degrees of freedom) by the method of
    moments on their logarithms (Smyth 2004, limma's fitFDist). With `count` (instances per unit:
    a kernel run once a step varies more than one run 60 times, whose noise averages out), the
    prior's variance follows A + B / count (fitted to the variances by least squares), scaled as
    the moments say. NO_PRIOR from fewer than MIN_NAMES positive variances."""
    var, df = np.asarray(var, dtype=float), np.asarray(df, dtype=float)
    c = np.ones(var.shape) if count is None else np.asarray(count, dtype=float)
    ok = np.isfinite(var) & (var > 0) & (df > 0) & np.isfinite(c) & (c > 0)
    if ok.sum() < MIN_NAMES:
        return NO_PRIOR
    shape = np.ones(var.shape)
    if count is not None:
        fitted = _trend(var[ok], c[ok])
        if (fitted > 0).all():
            shape[ok] = fitted / np.exp(np.mean(np.log(fitted)))  # the trend's shape; its scale from the moments
    v, d = var[ok] / shape[ok], df[ok]
    e = np.log(v) - digamma(d / 2) + np.log(d / 2)
    spread = float(np.var(e, ddof=1) - np.mean(trigamma(d / 2)))
    if spread <= 0:  # no more spread than sampling alone makes: the prior's variance alone
        return Prior(math.inf, shape * float(np.exp(e.mean())))
    d0 = 2 * trigamma_inverse(spread)
    return Prior(d0, shape * float(np.exp(e.mean() + digamma(d0 / 2) - math.log(d0 / 2))))


@dataclass(frozen=True)
class TTest:
    """Per name: the difference of means (new - base), its standard error, degrees of freedom,
    the two-sided p-value and a 95% confidence interval of the difference (NaN when no `level`
    was asked for); NaN where the test cannot run (`testable` False: no degree of freedom)."""

    diff: np.ndarray
    se: np.ndarray
    df: np.ndarray
    p: np.ndarray
    low: np.ndarray
    high: np.ndarray
    testable: np.ndarray


def pooled(n_a, var_a, n_b, var_b) -> tuple[np.ndarray, np.ndarray]:
    """(pooled variance, its degrees of freedom n_a + n_b - 2) of two samples."""
    d = n_a + n_b - 2
    with np.errstate(divide="ignore", invalid="ignore"):
        v = (
            np.where(n_a > 1, (n_a - 1) * np.nan_to_num(var_a), 0)
            + np.where(n_b > 1, (n_b - 1) * np.nan_to_num(var_b), 0)
        ) / d
    return np.where(d > 0, np.maximum(v, 0), np.nan), d


def moderated(
    n_a, mean_a, var_a, n_b, mean_b, var_b, prior: Prior = NO_PRIOR, level: float | None = 0.95, between: float = 0.0
) -> TTest:
    """The two-sample t-test of mean_b - mean_a per name from each side's count, mean and (n-1)
    variance, on their pooled variance moderated by `prior` (NO_PRIOR: Student's t-test);
    `between`: a variance the difference has beyond its samples' (`between_runs`).

    Equal samples on each side (no variance at all, and no prior) give p = 1 when the means agree
    and p = 0 when they differ: the limit of the test as the noise goes to zero."""
    n_a, mean_a, var_a, n_b, mean_b, var_b = (
        np.asarray(v, dtype=float) for v in (n_a, mean_a, var_a, n_b, mean_b, var_b)
    )
    s2, d = pooled(n_a, var_a, n_b, var_b)
    testable = (n_a >= 1) & (n_b >= 1) & (d >= 1) & np.isfinite(mean_a) & np.isfinite(mean_b)
    if math.isinf(prior.d0):
        s2, df = np.broadcast_to(prior.s0_sq, s2.shape).astype(float), np.full(s2.shape, 1e6)
    else:
        with np.errstate(invalid="ignore"):
            s2 = (prior.d0 * prior.s0_sq + d * s2) / (prior.d0 + d)
        df = prior.d0 + d
    with np.errstate(divide="ignore", invalid="ignore"):
        se = np.sqrt(s2 * (1 / n_a + 1 / n_b) + between)
        diff = mean_b - mean_a
        t = np.where(se > 0, diff / se, np.where(diff == 0, 0.0, np.inf))
    p = np.where(testable, t_sf2(np.nan_to_num(t, nan=0.0), np.where(testable, df, 1.0)), np.nan)
    nan = np.full(p.shape, np.nan)
    diff = np.where(testable, diff, np.nan)
    if level is None:  # no interval asked for
        return TTest(diff, se, df, p, nan, nan, testable)
    half = t_quantile(np.full(p.shape, 1.0 - level), np.where(testable, df, 1.0)) * se
    return TTest(
        diff, se, df, p, np.where(testable, diff - half, np.nan), np.where(testable, diff + half, np.nan), testable
    )
