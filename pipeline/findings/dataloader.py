"""dataloader: the input pipeline on the step's critical path: the main thread waits for batches.

Premise: the trace's `enumerate(DataLoader)#...__next__` slices (torch wraps each batch fetch in
them) hold at least [dataloader] min_span of the window: on a device, the device's idle time
inside them (it waited with the CPU); without a device, their own time (the main thread's). An
iterator named `_SingleProcessDataLoaderIter` has no workers (num_workers=0: torch's
SynchronizedDataLoaderPattern); a `_MultiProcessingDataLoaderIter` has too few, or they start
with each epoch. Saving: [low, high] of that time, within the host's time on the critical path.
"""

from __future__ import annotations

import polars as pl

from pipeline.findings.facts import Facts
from pipeline.findings.finding import Evidence, Finding, ms, pct, scaled, us

ID = "dataloader"
SINGLE = "_SingleProcessDataLoaderIter"


def dataloader(t: Facts) -> Finding | None:
    lim = t.limits(ID)
    m = t.marks["dataloader"]
    if not m.height:
        return None
    u = t.mark_spans("dataloader")
    waited = us(int((u[1] - u[0]).sum()))
    moving = t.idle_within(u) if t.has_device else waited
    if moving < lim["min_span"] * t.span_us:
        return None
    wall, _ = t.bounded(t.on_host(scaled(moving, lim["low"], lim["high"])))
    if not t.worth(wall):
        return None
    by_name = (
        m.group_by("name")
        .agg(
            n=pl.len(),
            ns=(pl.col("end_ns") - pl.col("ts_ns")).sum(),
            longest=(pl.col("end_ns") - pl.col("ts_ns")).max(),
        )
        .sort("ns", descending=True)
    )
    single = any(SINGLE in n for n in by_name["name"].to_list())
    evidence = [
        Evidence(
            "annotation",
            r["name"],
            r["n"],
            us(r["ns"]),
            pct(us(r["ns"]), t.span_us),
            of="the window",
            note=f"longest {ms(us(r['longest']))}",
        )
        for r in by_name.iter_rows(named=True)
    ]
    if t.has_device:
        evidence.append(
            Evidence(
                "device",
                "device idle while the main thread waited for data",
                None,
                moving,
                pct(moving, t.span_us),
                of="the window",
            )
        )
    where = "the device sat idle" if t.has_device else "the main thread waited"
    title = (
        f"The input pipeline stalls the step: {where} {ms(moving)} ({pct(moving, t.span_us):.0f}% of the window) "
        f"in {int(m.height):,} DataLoader fetches" + (" without workers (num_workers=0)" if single else "")
    )
    remedy = t.worded(ID, "remedy_single" if single else "remedy_workers")
    return Finding(
        ID,
        title,
        wall,
        None,
        remedy,
        "ops",
        tuple(evidence),
        f"{lim['low']:.0%}-{lim['high']:.0%} of the "
        + ("device's idle time inside the DataLoader fetches" if t.has_device else "time in the DataLoader fetches")
        + ", at most the host's time on the critical path",
    )
