"""comm_exposed (across ranks): communication no compute overlaps, beyond waiting for other ranks.

Premise: on the median rank, the steps' exposed communication (not overlapped by compute) minus the
time it waited in its collectives for the last rank (that is `straggler`'s) is at least
[comm_exposed] min_span of the step. Saving: [low, high] of it.
"""

from __future__ import annotations

from pipeline.findings.finding import Evidence, Finding, ms, pct
from pipeline.findings.run.facts import RunFacts

ID = "comm_exposed"


def comm_exposed(r: RunFacts) -> Finding | None:
    lim = r.limits(ID)
    ranks = r.device_ranks
    if not ranks:
        return None
    moving = {k: max(d["exposed_comm_us"] - d["wait_us"], 0.0) for k, d in ranks.items()}
    mid = r.median(list(moving.values()))
    if mid < lim["min_span"] * r.median_step_us:
        return None
    wall = r.bounded((mid * lim["low"], mid * lim["high"]))
    if not r.worth(wall):
        return None
    evidence = [
        Evidence(
            "rank",
            f"rank {k}",
            ranks[k]["steps"],
            moving[k],
            pct(moving[k], ranks[k]["step_us"]),
            of="its steps",
            note=f"exposed communication {ms(ranks[k]['exposed_comm_us'])}, of it waiting {ms(ranks[k]['wait_us'])}",
        )
        for k in sorted(ranks, key=lambda k: -moving[k])[:8]
    ]
    return Finding(
        ID,
        f"Communication not overlapped with compute: {ms(mid)} per rank (median) beyond waiting for other ranks",
        wall,
        None,
        lim["remedy"],
        "steps",
        tuple(evidence),
        f"{lim['low']:.0%}-{lim['high']:.0%} of the median rank's exposed communication minus its waits",
    )
