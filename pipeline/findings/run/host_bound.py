"""host_bound (across ranks): every rank's device waits for its host.

Premise: the ranks' steps (`ranks`' per-step table) leave their devices idle (a step's time
neither compute nor communication kernels cover) at least [host_bound] min_span of the step on
the median rank, and busy less than [host_bound] max_busy. Waiting for another rank is inside a
communication kernel (busy), so this idle time is the host's: launches, Python, data. Saving:
[low, high] of the median rank's idle time (the job moves at the pace of its ranks' hosts).
"""

from __future__ import annotations

from pipeline.findings.finding import Evidence, Finding, ms, pct
from pipeline.findings.run.facts import RunFacts
from pipeline.findings.vendor import worded

ID = "host_bound"


def host_bound(r: RunFacts) -> Finding | None:
    lim = r.limits(ID)
    ranks = r.device_ranks
    if not ranks:
        return None
    busy = {k: (d["compute_us"] + d["exposed_comm_us"]) / d["step_us"] for k, d in ranks.items()}
    idle = {k: max(d["step_us"] - d["compute_us"] - d["exposed_comm_us"], 0.0) for k, d in ranks.items()}
    mid_busy = r.median(list(busy.values()))
    mid_idle = r.median(list(idle.values()))
    if mid_busy >= lim["max_busy"] or mid_idle < lim["min_span"] * r.median_step_us:
        return None
    wall = r.bounded((mid_idle * lim["low"], mid_idle * lim["high"]))
    if not r.worth(wall):
        return None
    compute = {k: d["compute_us"] / d["step_us"] for k, d in ranks.items()}
    evidence = [
        Evidence(
            "rank",
            f"rank {k}",
            ranks[k]["steps"],
            idle[k],
            pct(idle[k], ranks[k]["step_us"]),
            of="its steps",
            note=f"device idle; busy {100 * busy[k]:.0f}% (compute {100 * compute[k]:.0f}%)",
        )
        for k in sorted(ranks, key=lambda k: -idle[k] / ranks[k]["step_us"])
    ]
    n = sum(b < lim["max_busy"] for b in busy.values())  # the ranks host-bound by themselves
    where = "its one rank" if len(busy) == 1 else "every rank" if n == len(busy) else f"{n} of {len(busy)} ranks"
    return Finding(
        ID,
        f"Host-bound on {where}: the median rank's device is busy {100 * mid_busy:.0f}% of its steps "
        f"(compute {100 * r.median(list(compute.values())):.0f}%) and idle {ms(mid_idle)} waiting for its host",
        wall,
        None,
        worded(ID, "remedy", r.vendor),
        "steps",
        tuple(evidence),
        f"{lim['low']:.0%}-{lim['high']:.0%} of the median rank's device idle time in its steps",
    )
