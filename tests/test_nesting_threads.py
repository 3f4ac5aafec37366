"""pipeline.nesting answers all threads at once by composite int64 keys: the same answers as a
direct sweep when the keys are ranks (huge time spans over many threads), with times far apart,
and with threads whose key columns hold nulls."""

from __future__ import annotations

import random

import polars as pl
import pytest
from test_nesting import _case
from test_nesting import check_against_sweep as _check

from pipeline.link import nesting


@pytest.mark.parametrize("seed", range(10))
def test_keys_as_ranks_give_the_same_answers(seed, monkeypatch):
    """With no room for value offsets, every key is a rank among the known values."""
    monkeypatch.setattr(nesting, "_INT64_ROOM", 1)
    rng = random.Random(seed)
    for _ in range(20):
        _check(*_case(rng))


def test_times_far_apart_on_many_threads():
    """Epoch-nanosecond times next to times near zero: thread x time span does not fit in int64,
    so times are ranked; the answers do not change."""
    rng = random.Random(5)
    intervals, points = [], []
    for i in range(300):
        base = rng.choice([0, 1_700_000_000_000_000_000])
        a = base + rng.randint(0, 50)
        intervals.append((i, 1, rng.randint(1, 40), a, a + rng.choice([0, rng.randint(0, 30)])))
    for j in range(200):
        points.append(
            (1000 + j, 1, rng.randint(1, 40), rng.choice([0, 1_700_000_000_000_000_000]) + rng.randint(-5, 90))
        )
    _check(intervals, points)


def test_threads_with_a_null_key():
    iv = pl.DataFrame(
        {"iv_idx": [1, 2, 3], "pid": [None, None, 1], "tid": [1, 1, 1], "ts_ns": [0, 2, 0], "end_ns": [10, 5, 10]}
    )
    pts = pl.DataFrame({"point_id": [7, 8], "pid": [None, 1], "tid": [1, 1], "t": [3, 3]})
    found = nesting.around(pts, iv, nesting.LONGER_FIRST)
    assert sorted(found.select("point_id", "innermost", "outermost").rows()) == [(7, 2, 1), (8, 3, 3)]
