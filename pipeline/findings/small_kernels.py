"""small_kernels: launch overhead above kernel time: the launches, not the kernels, pace the device.

Premise: at least [small_kernels] min_shorter of the kernels ran shorter than the call that
launched them (the launch section), and the device waits for the host (`host_bound`'s host wait)
at least [small_kernels] min_span of the window. The part of that wait it claims is the share of
the host's critical-path time spent launching (`Facts.launch_share`); `host_bound` keeps the
rest. Saving: [low, high] of it (CUDA graphs replay kernels for ~1-2 µs each instead of a launch
call each), within the host's time on the critical path.
"""

from __future__ import annotations

import polars as pl

from pipeline.findings.facts import Facts
from pipeline.findings.finding import Evidence, Finding, ms, pct, scaled

ID = "small_kernels"


def small_kernels(t: Facts) -> Finding | None:
    lim = t.limits(ID)
    if not t.has_device or t.host_idle_us < lim["min_span"] * t.span_us or not t.launch_share:
        return None
    launching = t.host_idle_us * t.launch_share
    wall, _ = t.bounded(t.on_host(scaled(launching, lim["low"], lim["high"])))
    if not t.worth(wall):
        return None
    launch = t.section("launch").filter(pl.col("kernels").fill_null(0) > 0)
    evidence = [
        Evidence(
            "device",
            f"device {r['device']}: kernels shorter than their launch call",
            r["kernels"],
            None,
            r["shorter_than_launch_pct"],
            of="its launched kernels",
            note=f"median launch call {ms(r['launch_p50_us'] or 0)}",
        )
        for r in launch.iter_rows(named=True)
    ]
    small = t.kernels.filter((pl.col("device") >= 0) & (pl.col("mean_us") < lim["small_us"])).sort(
        "count", descending=True
    )
    evidence += t.kernel_evidence(small, 4, lambda r: f"mean {ms(r['mean_us'])}")
    evidence.append(
        Evidence("path", "launching on the critical path", None, launching, pct(launching, t.span_us), of="the window")
    )
    n = int(small["count"].sum() or 0)
    return Finding(
        ID,
        f"Launch-bound: {n:,} kernels run under {lim['small_us']:g} µs each; launching them keeps the device waiting "
        f"{ms(launching)} ({pct(launching, t.span_us):.0f}% of the window)",
        wall,
        None,
        t.worded(ID, "remedy"),
        "launch",
        tuple(evidence),
        f"{lim['low']:.0%}-{lim['high']:.0%} of the host wait times the launches' share of the host's "
        "critical-path time, at most the host's time on the critical path",
    )
