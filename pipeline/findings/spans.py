"""spans: interval algebra in numpy for the findings (ns, int64): unions, and how much of each
interval a union covers. Sets of intervals are (starts, ends) arrays; a union is sorted and
disjoint."""

from __future__ import annotations

import numpy as np

Spans = tuple[np.ndarray, np.ndarray]


def empty() -> Spans:
    return np.zeros(0, np.int64), np.zeros(0, np.int64)


def union(starts, ends) -> Spans:
    """The disjoint, sorted runs covering the intervals (an interval touching the next joins it)."""
    s, e = np.asarray(starts, np.int64), np.asarray(ends, np.int64)
    if not len(s):
        return empty()
    order = np.argsort(s, kind="stable")
    s, e = s[order], np.maximum(e[order], s[order])
    reach = np.maximum.accumulate(e)
    new = np.ones(len(s), bool)
    new[1:] = s[1:] > reach[:-1]
    first = np.flatnonzero(new)
    last = np.append(first[1:], len(s)) - 1
    return s[first], reach[last]


def length(u: Spans) -> int:
    return int((u[1] - u[0]).sum()) if len(u[0]) else 0


def _covered_until(u: Spans, t: np.ndarray) -> np.ndarray:
    """The length of union u inside (-inf, t], for each t."""
    s, e = u
    if not len(s):
        return np.zeros(len(t), np.int64)
    before = np.concatenate([[0], np.cumsum(e - s)])  # covered before run k
    k = np.searchsorted(s, t, side="right") - 1  # the last run starting at or before t
    inside = np.where(k >= 0, np.clip(t - s[k.clip(0)], 0, (e - s)[k.clip(0)]), 0)
    return np.where(k >= 0, before[k.clip(0)] + inside, 0)


def covered(starts, ends, u: Spans) -> np.ndarray:
    """How much of each interval [start, end] the union u covers (ns)."""
    s, e = np.asarray(starts, np.int64), np.asarray(ends, np.int64)
    return _covered_until(u, e) - _covered_until(u, s)


def overlap(a: Spans, b: Spans) -> int:
    """The length of the intersection of two unions."""
    return int(covered(a[0], a[1], b).sum()) if len(a[0]) else 0


def holding(u: Spans, t) -> np.ndarray:
    """Whether each point t lies inside a run of u (start <= t <= end)."""
    t = np.asarray(t, np.int64)
    s, e = u
    if not len(s):
        return np.zeros(len(t), bool)
    k = np.searchsorted(s, t, side="right") - 1
    return (k >= 0) & (t <= e[k.clip(0)])


def drained(u: Spans, starts, ends) -> np.ndarray:
    """Which intervals begin inside a run of u and end after that run ends (a device gap that began
    during a synchronising call and lasted past its return)."""
    a, b = np.asarray(starts, np.int64), np.asarray(ends, np.int64)
    if not len(u[0]) or not len(a):
        return np.zeros(len(a), bool)
    k = np.searchsorted(u[0], a, side="right") - 1
    end = u[1][k.clip(0)]
    return (k >= 0) & (a <= end) & (b > end)
