"""match: the same collective on every rank of a run.

The i-th collective of a process group on each rank is one collective: calls match on (run, pg,
seq). A process group is known across ranks by its global ranks (names may differ between ranks),
and, among the groups of one rank with the same ranks, by the order of their names: `pg` is
`0,1,2,3#0` (`calls.pg_keys`). Collectives with no group recorded belong to the whole world
(`all#0`).

Matched calls must agree: the same kind (unknown agrees with any) and the same message size (an
unknown size agrees with any; the ranks of an alltoall may send buffers of different sizes,
`messages.SIZE_PER_RANK`). A rank whose call differs from what most ranks did is
desynchronised there: reported (rank, pg, seq, what it did, what the others did) and the
collective left out of every measure rather than paired wrongly.

Calls come a window at a time (`Window`: numpy columns of the calls of a group's seqs [a, b) on
every rank, sorted by seq then rank); each collective is a segment of rows.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from pipeline.cost.formulas.messages import SIZE_PER_RANK
from pipeline.runs.calls import KIND_CODE, UNKNOWN

PER_RANK = np.array([KIND_CODE[k] for k in sorted(SIZE_PER_RANK)], np.int8)  # kinds whose sizes may differ


@dataclass
class Window:
    """Calls of one group and a range of seqs, sorted by (seq, rank); `starts`: where each
    collective's rows begin (and `len` rows end the last)."""

    cols: dict[str, np.ndarray]  # rank, seq, kind, bytes, dtype, pg_size, ts, dur, step (run-wide codes)
    starts: np.ndarray

    @property
    def n(self) -> int:
        return len(self.starts)

    def segment_of_rows(self) -> np.ndarray:
        out = np.zeros(len(self.cols["seq"]), np.int64)
        if self.n > 1:
            out[self.starts[1:]] = 1
        return np.cumsum(out)

    def reduce(self, ufunc, values: np.ndarray) -> np.ndarray:
        return ufunc.reduceat(values, self.starts) if self.n else values[:0]


def window(cols: dict[str, np.ndarray]) -> Window:
    """A Window of calls gathered rank by rank (each rank's already in seq order)."""
    order = np.lexsort((cols["rank"], cols["seq"]))
    cols = {c: v[order] for c, v in cols.items()}
    seq = cols["seq"]
    starts = np.flatnonzero(np.r_[True, seq[1:] != seq[:-1]]) if len(seq) else np.zeros(0, np.int64)
    return Window(cols, starts)


def agreed(w: Window, column: str, unknown: int) -> tuple[np.ndarray, np.ndarray]:
    """Per collective: the one known value of `column` its calls give (else `unknown`), and
    whether its known values disagree."""
    v = w.cols[column]
    known = v != unknown
    big = np.iinfo(v.dtype).max
    lo = w.reduce(np.minimum, np.where(known, v, big))
    hi = w.reduce(np.maximum, np.where(known, v, unknown if unknown < 0 else -1))
    some = w.reduce(np.maximum, known.astype(np.int8)) > 0
    return np.where(some, lo, unknown), some & (hi != lo)


def mode(values: list, names: list | None = None):
    """The value most calls give (ties: the smallest, by name when `names` maps codes to names)."""
    if not values:
        return None
    counts = Counter(values)
    top = max(counts.values())
    best = [v for v, c in counts.items() if c == top]
    return min(best, key=(lambda v: names[v]) if names is not None else None)


def desyncs(w: Window, kind_names: list[str]) -> tuple[np.ndarray, list[tuple]]:
    """Which collectives of the window are desynchronised (a bool per collective), and the
    (rank, seq, kind, bytes, expected_kind, expected_bytes) of each call that differs."""
    kind, kinds_differ = agreed(w, "kind", UNKNOWN)
    _, sizes_differ = agreed(w, "bytes", -1)
    bad = kinds_differ | (sizes_differ & ~np.isin(kind, PER_RANK))
    rows = []
    ends = np.r_[w.starts[1:], len(w.cols["seq"])]
    for i in np.flatnonzero(bad):
        a, b = w.starts[i], ends[i]
        kinds = w.cols["kind"][a:b].tolist()
        sizes = w.cols["bytes"][a:b].tolist()
        want_kind = mode([k for k in kinds if k != UNKNOWN], kind_names)
        want_bytes = mode([s for s in sizes if s >= 0])
        same_size = want_kind is None or want_kind not in PER_RANK
        for j, (k, s) in enumerate(zip(kinds, sizes)):
            wrong = (k != UNKNOWN and want_kind is not None and k != want_kind) or (
                same_size and k not in PER_RANK and s >= 0 and want_bytes is not None and s != want_bytes
            )
            if wrong:
                rows.append(
                    (
                        int(w.cols["rank"][a + j]),
                        int(w.cols["seq"][a + j]),
                        kind_names[k],
                        s if s >= 0 else None,
                        None if want_kind is None else kind_names[want_kind],
                        want_bytes,
                    )
                )
    return bad, rows
