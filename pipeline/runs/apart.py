"""apart: the traces of a run that were not recorded at the time its other ranks were.

The ranks of one job record together: the spans of their collectives overlap, as their hosts'
clocks disagree by milliseconds (seconds at worst). A folder of traces of several jobs, read as one
run, had its collectives matched by order across jobs: rank 0 of a 2024 A100 trace was "the
straggler" against a 2023 V100 rank 1, 250 days behind on the clock. Here the ranks' spans (first
collective's start to last's end) are split where more than APART_NS separate them; the part with
the most ranks (ties: the one with the lowest rank) is the run, and each rank of the others is
left out, a problem `another time` saying how far apart it is. A rank with no collective has no
span: it stays.
"""

from __future__ import annotations

import numpy as np

APART_NS = 10 * 60 * 10**9  # ten minutes: far beyond the clock skew of one job's hosts


def span(ex) -> tuple[int, int] | None:
    """(first start, last end) of a trace's collectives, ns since the epoch; None without any.
    Kineto writes `ts` relative to `baseTimeNanoseconds` (the wall clock floored to three
    months: ranks started across such a boundary have bases three months apart), and before
    it had one, since the epoch."""
    ts, dur = ex.column("ts"), ex.column("dur")
    if not len(ts):
        return None
    base = ex.info.get("base_time_ns") or 0
    return base + int(ts.min()), base + int((ts + np.maximum(dur, 0)).max())


def far(ns: int) -> str:
    """A gap in the largest whole unit that says it: 250 days, 3 hours, 12 minutes."""
    for unit, size in (("day", 86_400), ("hour", 3_600), ("minute", 60)):
        n = ns // (size * 10**9)
        if n:
            return f"{n:,} {unit}" + ("s" if n != 1 else "")
    return f"{ns / 1e9:.0f} s"


def split_in_time(run, extracts: list) -> None:
    """Leave out of `run` (a `group.Run`) the ranks recorded apart from the most of its ranks:
    each moves from `run.ranks` to `run.apart` as (trace index, detail), and the world size and
    missing ranks are settled again without them."""
    spans = {r: span(extracts[i]) for r, i in run.ranks.items()}
    timed = sorted((s, r) for r, s in spans.items() if s is not None)
    if len(timed) < 2:
        return
    parts: list[list] = []  # [start, end, ranks]
    for (a, b), r in timed:
        if parts and a - APART_NS <= parts[-1][1]:
            parts[-1][1] = max(parts[-1][1], b)
            parts[-1][2].append(r)
        else:
            parts.append([a, b, [r]])
    if len(parts) == 1:
        return
    start, end, kept = max(parts, key=lambda p: (len(p[2]), -min(p[2])))
    for r, (a, b) in sorted((r, s) for r, s in spans.items() if s is not None and r not in kept):
        gap, when = (start - b, "before") if b < start else (a - end, "after")
        detail = (
            f"rank {r}'s collectives ran {far(gap)} {when} those of ranks {_ranks(kept)}: "
            "a trace of another job? left out"
        )
        run.apart.append((run.ranks.pop(r), detail))
    gone = {i for i, _ in run.apart} | set(run.quarantined)  # their world sizes are another job's
    run.settle([extracts[i].info.get("world_size") for i in run.traces if i not in gone])


def _ranks(ranks: list[int]) -> str:
    ranks = sorted(ranks)
    return ", ".join(map(str, ranks)) if len(ranks) <= 4 else f"{ranks[0]} to {ranks[-1]} ({len(ranks)})"
