"""clock: how far each rank's clock reads ahead of the lowest rank's.

Ranks on different hosts have clocks that disagree by up to milliseconds. Ranks leave a blocking
collective (allreduce, allgather, reducescatter, alltoall, barrier) at almost the same instant, so
the end of one collective on rank r is its true end plus r's offset. Offsets are estimated from
such collectives that two or more ranks recorded (up to `SAMPLE` per process group, evenly
spread), robustly: the true end of a collective is the median of its ranks' ends less their
offsets, a rank's offset the median over its collectives of its end less their true ends; five
rounds of this settle (all offsets start at 0). Offsets are then taken relative to the lowest
rank (of each group of ranks that share collectives at all).

A rank that is never in a blocking collective with another cannot be aligned: its offset is null
(and taken as 0 for waits). Ranks that share a clock come out at about 0.
"""

from __future__ import annotations

import numpy as np

from pipeline.runs.calls import KIND_CODE

BLOCKING = ("allreduce", "allgather", "reducescatter", "alltoall", "barrier")
BLOCKING_CODES = np.array([KIND_CODE[k] for k in BLOCKING], np.int8)
ROUNDS = 5
SAMPLE = 2_000  # collectives per process group used (evenly spread): a median needs no more


def sample(shared: np.ndarray) -> np.ndarray:
    """The seqs to use of a group's shared collectives (sorted): every k-th, at most ~SAMPLE."""
    stride = len(shared) // SAMPLE + 1
    return shared[::stride]


def grouped_median(groups: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    """The median of `values` per group 0..n-1 (the mean of the two middle ones for an even
    count, as polars takes it); NaN for an empty group."""
    order = np.lexsort((values, groups))
    g, v = groups[order], values[order]
    counts = np.bincount(g, minlength=n)
    first = np.r_[0, np.cumsum(counts)[:-1]]
    out = np.full(n, np.nan)
    has = counts > 0
    lo = first + (counts - 1) // 2
    hi = first + counts // 2
    out[has] = (v[lo[has]] + v[hi[has]]) / 2
    return out


def offsets(coll: np.ndarray, rank: np.ndarray, pg: np.ndarray, end: np.ndarray, ranks: list[int]) -> dict:
    """rank -> offset (float ns, None when it cannot be aligned), from the ends of sampled
    collectives: per call, its collective's number (`coll`), rank, group and end (float ns)."""
    if not len(coll):
        return {r: None for r in ranks}
    seen = sorted(set(rank.tolist()))
    ridx = {r: i for i, r in enumerate(seen)}
    ri = np.array([ridx[r] for r in rank.tolist()], np.int64)
    nc = int(coll.max()) + 1
    off = np.zeros(len(seen))
    for _ in range(ROUNDS):
        true_end = grouped_median(coll, end - off[ri], nc)
        off = grouped_median(ri, end - true_end[coll], len(seen))
    anchor = _components(ri, pg, len(seen))
    rel = off - off[anchor]
    return {r: (float(rel[ridx[r]]) if r in ridx else None) for r in ranks}


def _components(ri: np.ndarray, pg: np.ndarray, n: int) -> np.ndarray:
    """For each rank (index), the lowest rank index it is connected to through groups whose
    collectives they share (union-find over the (rank, group) pairs)."""
    parent = list(range(n))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    first_of: dict[int, int] = {}
    for r, g in set(zip(ri.tolist(), pg.tolist())):
        if g in first_of:
            a, b = find(r), find(first_of[g])
            parent[max(a, b)] = min(a, b)
        else:
            first_of[g] = r
    return np.array([find(i) for i in range(n)], np.int64)
