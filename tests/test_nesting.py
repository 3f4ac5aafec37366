"""pipeline.nesting against a direct sweep: boundaries sorted together, depth counted one by one."""

from __future__ import annotations

import os
import random
from contextlib import contextmanager

import polars as pl
import pytest

from pipeline.link import nesting

END, START, POINT, ZERO_END = 0, 1, 2, 3  # order of boundaries at one instant


def _sweep(intervals, points, start_key):
    """Per thread, walk the boundaries in order: returns depth and parent of every interval, and
    for each point the (innermost, outermost) interval open at it whose end is not before it."""
    depth, parent, found = {}, {}, {}
    for thread in {(p, t) for _, p, t, _, _ in intervals}:
        iv = [r for r in intervals if (r[1], r[2]) == thread]
        end_of = {i: e for i, _, _, _, e in iv}
        rows = [(s, START, start_key(i, s, e), i) for i, _, _, s, e in iv]
        rows += [(e, ZERO_END if e == s else END, 0, i) for i, _, _, s, e in iv]
        rows += [(t, POINT, 0, pid) for pid, p, tt, t in points if (p, tt) == thread]
        d, last_start_at = 0, {}  # depth -> interval that started last at that depth
        for t, kind, _, i in sorted(rows):
            if kind == START:
                d += 1
                depth[i], parent[i] = d, last_start_at.get(d - 1)
                last_start_at[d] = i
            elif kind == POINT and d > 0:
                found[i] = tuple(c if end_of[c] >= t else None for c in (last_start_at[d], last_start_at[1]))
            elif kind in (END, ZERO_END):
                d -= 1
    return depth, parent, found


def _case(rng: random.Random):
    intervals, points = [], []
    for i in range(rng.randint(0, 25)):
        a = rng.randint(0, 40)
        r = rng.random()
        if r < 0.15:
            b = a  # zero length
        elif r < 0.3 and intervals:
            a, b = intervals[-1][3], intervals[-1][4]  # identical to the previous one
        else:
            b = a + rng.randint(0, 20)
        intervals.append((i * 2 + rng.randint(0, 1), 1, rng.randint(1, 2), a, b))
    for j in range(rng.randint(0, 15)):
        points.append((100 + j, 1, rng.randint(1, 2), rng.randint(-1, 60)))
    return intervals, points


@pytest.mark.parametrize("seed", range(20))
def test_nesting_and_enclosing_match_a_direct_sweep(seed):
    rng = random.Random(seed)
    for _ in range(20):
        check_against_sweep(*_case(rng))


def test_rows_around_on_many_threads_matches_a_direct_sweep():
    """rows_around where the compiled sweep numbers hundreds of threads (its table of them grows
    from 64 slots, several times) and some points lie on threads without intervals: the rows hold
    what a direct sweep finds, natively and in polars."""
    rng = random.Random(7)
    intervals, points = [], []
    for i in range(3000):
        thread = rng.randint(0, 299)
        a = rng.randint(0, 200)
        intervals.append((i, thread // 10, thread % 10, a, a + rng.choice((0, rng.randint(1, 60)))))
    for j in range(2000):
        thread = rng.randint(0, 319)  # threads 300-319 have no intervals
        points.append((10_000 + j, thread // 10, thread % 10, rng.randint(-5, 270)))
    _, _, found = _sweep(intervals, points, lambda i, s, e: (-e, i))
    iv = pl.DataFrame(intervals, schema=["iv_idx", "pid", "tid", "ts_ns", "end_ns"], orient="row").cast(pl.Int64)
    pts = pl.DataFrame(points, schema=["point_id", "pid", "tid", "t"], orient="row").cast(pl.Int64)
    outer = pts["point_id"] % 3 == 0
    want = [found.get(p, (None, None))[p % 3 == 0] for p in pts["point_id"]]
    assert sum(w is not None for w in want) > 500  # most points are inside some interval
    by = ("pid", "tid", "one")
    for native in ("0", "1") if nesting._native_around_keyed else ("0",):
        with _env("TRACEPIPE_NATIVE", native):
            rows = nesting.rows_around(pts.with_columns(one=1), iv.with_columns(one=1), nesting.LONGER_FIRST, outer, by)
            assert iv["iv_idx"].gather(rows).to_list() == want, native


def check_against_sweep(intervals: list, points: list):
    """nesting.nesting and nesting.enclosing of intervals (iv_idx, pid, tid, ts_ns, end_ns) and
    points (point_id, pid, tid, t) give what a direct sweep gives: longer first, then file order
    (the reports' order); file order only (linking's)."""
    iv = pl.DataFrame(intervals, schema=["iv_idx", "pid", "tid", "ts_ns", "end_ns"], orient="row").cast(pl.Int64)
    pts = pl.DataFrame(points, schema=["point_id", "pid", "tid", "t"], orient="row").cast(pl.Int64)
    # nesting: in polars and, where it is built, in the compiled sweep, in both start orders; the
    # same rows in the same order (the reports' sweep reads positions in start order)
    for order, key in ((nesting.LONGER_FIRST, lambda i, s, e: (-e, i)), (nesting.FILE_ORDER, lambda i, s, e: (i,))):
        depth, parent, _ = _sweep(intervals, points, key)
        answers = []
        for native in ("0", "1") if nesting._native_nest else ("0",):
            with _env("TRACEPIPE_NATIVE", native):
                answers.append(got := nesting.nesting(iv, order))
                assert {r[0]: (r[1], r[2]) for r in got.iter_rows()} == {i: (depth[i], parent[i]) for i in depth}
        assert all(a.equals(answers[0]) for a in answers), "native and polars nest in different orders"
    _, _, found = _sweep(intervals, points, lambda i, s, e: (i,))
    for outermost, k in ((False, 0), (True, 1)):
        got = nesting.enclosing(pts, iv, nesting.FILE_ORDER, outermost)
        assert dict(got.iter_rows()) == {p: c[k] for p, c in found.items() if c[k] is not None}
    # around_one: the outermost for even point ids, the innermost for odd ones; in polars and,
    # where it is built, in the compiled sweep (native/nesting.cpp), in both start orders
    outer = pts["point_id"] % 2 == 0
    for order, key in ((nesting.FILE_ORDER, lambda i, s, e: (i,)), (nesting.LONGER_FIRST, lambda i, s, e: (-e, i))):
        _, _, found = _sweep(intervals, points, key)
        want = [found.get(p, (None, None))[p % 2 == 0] for p in pts["point_id"]]
        for native in ("0", "1") if nesting._native_around else ("0",):
            with _env("TRACEPIPE_NATIVE", native):
                assert nesting.native_nesting() == (native == "1")
                assert nesting.around_one(pts, iv, order, outer).to_list() == want, native
                # rows_around: the same answers as rows of the intervals, the thread named by three
                # columns (the tid last, after a constant one), a point without a time on none
                by = ("pid", "one", "tid")
                rows = nesting.rows_around(
                    pts.with_columns(one=1, t=pl.when(pl.col("point_id") != 103).then("t")),
                    iv.with_columns(one=1),
                    order,
                    outer,
                    by,
                )
                timed = [None if p == 103 else w for p, w in zip(pts["point_id"], want)]
                assert iv["iv_idx"].gather(rows).to_list() == timed


@contextmanager
def _env(name: str, value: str):
    """The environment variable set to value, and put back as it was."""
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            del os.environ[name]
        else:
            os.environ[name] = before
