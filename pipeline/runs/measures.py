"""measures: what a run's matched collectives say, on clocks aligned (`clock`), a window of
collectives at a time (`match.Window`).

Per collective (pg, seq), over the ranks that recorded it:
- `n_ranks`: ranks in the collective (its group's size; the ranks present when unknown);
  `ranks_present`: the ranks that recorded it (fewer when a trace is truncated or missing);
- `last_rank`: the rank that started last (ties: the lowest); `start_skew`: latest start - earliest;
- `wait` of a rank: latest start - its start (the time it spent waiting for the last one);
- `latency`: the shortest duration over the ranks (the part that is transfer, not waiting);
- `algbw` = bytes / latency and `busbw` = algbw x nccl-tests' factor (allreduce 2(n-1)/n;
  allgather, reducescatter, alltoall (n-1)/n; broadcast, reduce, send/recv 1), in GB/s (10^9).
Per rank: the wait it caused others (the sum, over collectives where it started last by at least
`LAST_BY` ns, of the other ranks' waits) and how often that was: the stragglers, ranked. A rank's
totals are over the collectives it recorded: a collective a truncated trace never reached is no
wait of 0.
"""

from __future__ import annotations

import numpy as np

from pipeline.cost.formulas.collectives import BUS_FACTOR
from pipeline.runs.calls import KIND_NAMES, UNKNOWN
from pipeline.runs.match import Window, agreed, mode

LAST_BY = 1_000  # ns: a collective whose ranks started within 1 µs of each other has no straggler
QUANTILES = (0.5, 0.99)
FACTOR = np.array([np.nan if k not in BUS_FACTOR else 0.0 for k in KIND_NAMES])


def bus_factor(kind: np.ndarray, n: np.ndarray) -> np.ndarray:
    """nccl-tests' bus-bandwidth factor of each collective (NaN for kinds without one)."""
    out = np.full(len(kind), np.nan)
    for code, name in enumerate(KIND_NAMES):
        if name in BUS_FACTOR:
            sel = kind == code
            if sel.any():
                out[sel] = [BUS_FACTOR[name](int(x)) for x in n[sel]]
    return out


class Totals:
    """Per rank and per (rank, step): what a run's windows add up to."""

    def __init__(self, ranks: list[int], n_steps: int):
        self.index = {r: i for i, r in enumerate(ranks)}
        n = len(ranks)
        self.wait = np.zeros(n)
        self.measured = np.zeros(n, np.int64)  # calls in measured (not desynchronised) collectives
        self.caused = np.zeros(n)
        self.times_last = np.zeros(n, np.int64)
        self.step_wait = np.zeros((n, max(n_steps, 1)))


def measure(w: Window, good: np.ndarray, offset: np.ndarray, base: int, totals: Totals, names: dict) -> dict:
    """The measured collectives of a window (columns), and their calls' ranks and waits (for the
    JSON document), adding to the run's totals. `offset`: per row index of totals, the clock
    offset (0 when unknown); `names`: dtype and step names by code."""
    keep_rows = good[w.segment_of_rows()]
    cols = {c: v[keep_rows] for c, v in w.cols.items()}
    if not len(cols["seq"]):
        return {}
    sub = _subwindow(cols)
    ri = np.array([totals.index[r] for r in cols["rank"].tolist()], np.int64)
    a_ts = (cols["ts"] - base).astype(np.float64) - offset[ri]
    latest = sub.reduce(np.maximum, a_ts)
    first = sub.reduce(np.minimum, a_ts)
    seg = sub.segment_of_rows()
    waits = latest[seg] - a_ts
    at_latest = np.flatnonzero(a_ts == latest[seg])
    last_row = at_latest[np.r_[True, seg[at_latest][1:] != seg[at_latest][:-1]]]  # lowest rank: rows are by rank
    present = np.diff(np.r_[sub.starts, len(seg)])
    kind, _ = agreed(sub, "kind", UNKNOWN)
    size = _modes(sub, cols["bytes"], None)  # an alltoall's ranks may send different sizes: the most common
    pg_size = sub.reduce(np.maximum, cols["pg_size"])
    n_ranks = np.where(pg_size > 0, pg_size, present)
    latency = sub.reduce(np.minimum, cols["dur"])
    algbw = np.where((latency > 0) & (size >= 0), size / np.maximum(latency, 1), np.nan)
    skew = latest - first
    np.add.at(totals.wait, ri, waits)
    np.add.at(totals.measured, ri, 1)
    steps = cols["step"]
    has_step = steps >= 0
    np.add.at(totals.step_wait, (ri[has_step], steps[has_step]), waits[has_step])
    late = np.flatnonzero(skew >= LAST_BY)
    caused = np.add.reduceat(waits, sub.starts)
    lr = ri[last_row]
    np.add.at(totals.caused, lr[late], caused[late])
    np.add.at(totals.times_last, lr[late], 1)
    return {
        "seq": cols["seq"][sub.starts],
        "kind": kind,
        "bytes": size,
        "dtype": _modes(sub, cols["dtype"], names["dtypes"]),
        "step": _modes(sub, steps, names["steps"]),
        "pg_size": pg_size,
        "n_ranks": n_ranks,
        "present": present,
        "first_ns": first,
        "last_rank": cols["rank"][last_row],
        "start_skew_ns": skew,
        "latency_ns": latency,
        "algbw_gbps": algbw,
        "busbw_gbps": algbw * bus_factor(kind, n_ranks),
        "_ranks": cols["rank"],
        "_waits": waits,
    }


def _subwindow(cols: dict) -> Window:
    seq = cols["seq"]
    return Window(cols, np.flatnonzero(np.r_[True, seq[1:] != seq[:-1]]))


def _modes(w: Window, codes: np.ndarray, names: list | None) -> np.ndarray:
    """Per collective, the code most of its calls give (null -1 ignored; ties: the smallest name)."""
    value, differ = _agreed_codes(w, codes)
    ends = np.r_[w.starts[1:], len(codes)]
    for i in np.flatnonzero(differ):
        vals = [c for c in codes[w.starts[i] : ends[i]].tolist() if c >= 0]
        value[i] = mode(vals, names)
    return value


def _agreed_codes(w: Window, codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    known = codes >= 0
    lo = w.reduce(np.minimum, np.where(known, codes, np.iinfo(codes.dtype).max))
    hi = w.reduce(np.maximum, np.where(known, codes, -1))
    some = hi >= 0
    return np.where(some, lo, -1).astype(np.int64), some & (hi != lo)


def nearest(values: np.ndarray, q: float) -> float | None:
    """polars' quantile(q, "nearest") of the non-NaN values (None when there are none)."""
    v = np.sort(values[~np.isnan(values)])
    if not len(v):
        return None
    return float(v[int(np.floor((len(v) - 1) * q + 0.5))])
