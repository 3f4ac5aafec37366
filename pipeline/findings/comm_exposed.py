"""comm_exposed: communication the device's compute does not overlap.

Premise: a device's collective kernels' busy time not overlapped by its compute kernels (the
communication section's exposed time) is at least [comm_exposed] min_span of the window. In one
rank's trace part of it may be waiting for the other ranks (`tracepipe ranks` on the run tells
which: its `comm_exposed` counts only the transfer, its `straggler` the waiting). Saving:
[low, high] of the exposed time (DDP bucketing, FSDP prefetch, async collectives overlap most of
it; the step's last reduce stays), as far as device time is on the critical path.
"""

from __future__ import annotations

import polars as pl

from pipeline.findings.facts import Facts
from pipeline.findings.finding import Evidence, Finding, ms, pct, scaled

ID = "comm_exposed"


def comm_exposed(t: Facts) -> Finding | None:
    if not t.has_device:
        return None
    lim = t.limits(ID)
    comm = t.section("communication")
    if not comm.height:
        return None
    exposed = float(comm["exposed_us"].fill_null(0.0).sum() or 0.0)
    if exposed < lim["min_span"] * t.span_us:
        return None
    wall, _ = t.bounded(t.on_device(scaled(exposed, lim["low"], lim["high"])))
    if not t.worth(wall):
        return None
    evidence = [
        Evidence(
            "device",
            f"device {r['device']}: exposed communication",
            r["comm_kernels"],
            r["exposed_us"],
            pct(r["exposed_us"] or 0.0, t.span_us),
            of="the window",
            note=f"{r['overlap_pct'] or 0:.0f}% of its {ms(r['comm_busy_us'] or 0)} overlapped",
        )
        for r in comm.filter(pl.col("exposed_us") > 0).iter_rows(named=True)
    ]
    return Finding(
        ID,
        f"Communication not overlapped with compute: {ms(exposed)} ({pct(exposed, t.span_us):.0f}% of the window)",
        wall,
        None,
        lim["remedy"] + "; first check with `tracepipe ranks` on the run that the time is not waiting for a straggler",
        "communication",
        tuple(evidence),
        f"{lim['low']:.0%}-{lim['high']:.0%} of the exposed communication time, x {t.on_path_share:.2f} "
        "on the critical path",
    )
