"""facts: what the run rules read of one run of `ranks` (a `runs.analysis.RunResult`'s tables,
read by their column names): its ranks' steps, stragglers and the collectives they were last in.

Times in µs. The run's time (`window_us`, what a finding's gain_pct is a share of): the longest of
its ranks' summed steps, else the span of its collectives.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from statistics import median

import numpy as np

from pipeline.findings.finding import Range, capped, narrowed
from pipeline.findings.limits import limits
from pipeline.findings.vendor import rules


@dataclass
class RunFacts:
    run: str
    ranks: list[int]
    # rank -> its steps' sums (step_us, compute_us, comm_us, exposed_comm_us, wait_us), how many
    # steps, and whether it has a device (a step with compute): `per_rank_of`
    per_rank: dict[int, dict]
    stragglers: list[dict]  # rank, wait_caused_us, times_last (largest wait caused first)
    lags: dict[int, list[float]] = field(
        default_factory=dict
    )  # rank -> its lag behind the next-latest rank, per collective it was last in
    collectives: int = 0
    span_us: float = 0.0  # first collective's start to last one's, when there are no steps
    vendor: str = "other"  # the ranks' device vendor (`findings.vendor`): picks the remedies' wording

    @staticmethod
    def limits(rule: str) -> dict:
        return limits(rule)

    @classmethod
    def of(cls, res, run: str, top: int = 3) -> RunFacts:
        """The facts of run `run` of a RunResult (its tables' rows of that run; the waits of the
        collectives its `top` stragglers were last in)."""
        mine = lambda rows: [r for r in rows.iter_rows(named=True) if r["run"] == run]
        us = lambda v: None if v is None or v != v else float(v) / 1e3
        per_rank = per_rank_of(res.steps, run)
        strag = [
            {"rank": r["rank"], "wait_caused_us": us(r["wait_caused_ns"]) or 0.0, "times_last": r["times_last"]}
            for r in mine(res.stragglers)
        ]
        ranks = sorted({r["rank"] for r in mine(res.ranks)})
        c = res.collectives
        lags: dict[int, list[float]] = {}
        wanted = {s["rank"] for s in strag[:top]}
        first, last, n = None, None, 0
        if c.height:
            runs, last_rank = c.data["run"], c.data["last_rank"]
            stores, firsts, skews = c.data["_store"], c.data["first_ns"], c.data["start_skew_ns"]
            for i in range(c.height):
                if runs[i] != run:
                    continue
                n += 1
                f0 = float(firsts[i])
                first = f0 if first is None else min(first, f0)
                last = f0 + float(skews[i]) if last is None else max(last, f0 + float(skews[i]))
                lr = int(last_rank[i])
                if lr in wanted and float(skews[i]) >= 1e3:  # measures.LAST_BY: a straggler by at least 1 µs
                    who, waits = res.waits.get(int(stores[i]))
                    others = [w for k, w in zip(who, waits) if k != lr]
                    if others:
                        lags.setdefault(lr, []).append(min(others) / 1e3)
        span = (last - first) / 1e3 if first is not None and last is not None else 0.0
        vendor = getattr(res, "vendors", {}).get(run) or rules()["fallback"]
        return cls(run, ranks, per_rank, strag, lags, n, span, vendor)

    @cached_property
    def device_ranks(self) -> dict[int, dict]:
        """`per_rank` of the ranks with a device and steps."""
        return {k: d for k, d in self.per_rank.items() if d["device"] and d["step_us"]}

    @cached_property
    def median_step_us(self) -> float:
        """The median rank's summed steps (of the ranks with a device)."""
        return self.median([d["step_us"] for d in self.device_ranks.values()])

    @cached_property
    def window_us(self) -> float:
        """The run's time: the longest of its ranks' summed steps (else its collectives' span)."""
        totals = [d["step_us"] for d in self.per_rank.values()]
        return max(totals) if totals else self.span_us

    def median(self, values: list[float]) -> float:
        return float(median(values)) if values else 0.0

    def bounded(self, wall: Range) -> Range:
        """high at most max_ratio x low, within the run's time."""
        ratio = limits("common")["max_ratio"]
        return narrowed(capped(wall, self.window_us) if self.window_us else wall, ratio)

    def worth(self, wall: Range) -> bool:
        c = limits("common")
        return wall[1] >= max(c["min_gain_span"] * self.window_us, c["min_gain_us"])


SUMMED = ("step_us", "compute_us", "comm_us", "exposed_comm_us", "wait_us")


def per_rank_of(steps, run: str) -> dict[int, dict]:
    """rank -> the sums of its steps' times (SUMMED, in µs; a null one counts 0), their count and
    whether any has compute (a device), for the rows of run `run` of the steps table (numpy columns
    `run`, `rank` and the times in ns, as `runs.analysis` makes it), ranks in the order they come.

    From the columns, not a dict per step: a run of 1,024 ranks x 1,250 steps is 1.3 M rows, whose
    dicts took 1.6 GB. Each sum adds a rank's steps one after another in their order, as a loop
    over them would."""
    if not steps.height:
        return {}
    data = steps.data
    mine = np.asarray(data["run"], dtype=object) == run
    every = bool(mine.all())  # one run: its columns as they are, not copies
    if not every and not mine.any():
        return {}
    of_run = lambda c: np.asarray(data[c]) if every else np.asarray(data[c])[mine]
    ranks = of_run("rank")
    order = np.argsort(ranks, kind="stable")  # a rank's steps together, in their order
    cuts = np.flatnonzero(np.r_[True, ranks[order][1:] != ranks[order][:-1], True])
    segments = sorted(zip(cuts[:-1], cuts[1:]), key=lambda c: order[c[0]])  # ranks in the order they come
    out: dict[int, dict] = {int(ranks[order[a]]): {"steps": int(b - a)} for a, b in segments}
    for k in SUMMED:  # a column at a time: a run of 1,024 ranks holds 1.3 M rows of each
        v = of_run(k[:-3] + "_ns").astype(np.float64)[order] / 1e3
        v[np.isnan(v)] = 0.0
        for (a, b), d in zip(segments, out.values(), strict=True):
            d[k] = float(np.cumsum(v[a:b])[-1])
    device = ~np.isnan(of_run("compute_ns").astype(np.float64)[order])  # a step with compute
    for (a, b), d in zip(segments, out.values(), strict=True):
        d["device"] = bool(device[a:b].any())
    return out
