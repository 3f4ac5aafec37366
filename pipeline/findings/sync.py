"""sync: host-device synchronisation that leaves the device idle.

A synchronising call ([marks] sync: cudaStreamSynchronize, cudaDeviceSynchronize, a blocking
cudaMemcpy, ...; what `.item()`, `.cpu()`, `nonzero` do inside) waits for the device's queue to
drain; the device then sits idle until the CPU has launched the next work. Premise: the device's
idle gaps that begin while such a call runs and last past its return (the device drained into
them; the gaps between kernels it ran while the CPU waited are its queue's), outside DataLoader
fetches (`dataloader`'s), add up to at least [sync] min_span of the window. A sync after which the
CPU launches at once costs little. Saving: [low, high] of those gaps, within the host's time on the
critical path.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from pipeline.findings import spans
from pipeline.findings.facts import Facts
from pipeline.findings.finding import Evidence, Finding, ms, pct, scaled, us

ID = "sync"


def sync(t: Facts) -> Finding | None:
    if not t.has_device:
        return None
    lim = t.limits(ID)
    calls = t.marks["sync"]
    if not calls.height or not t.gaps.height:
        return None
    u = spans.union(calls["ts_ns"].to_numpy(), calls["end_ns"].to_numpy())
    g = t.gaps
    after = g.filter(pl.Series(spans.drained(u, g["start_ns"].to_numpy(), g["end_ns"].to_numpy())))
    if not after.height:
        return None
    loading = spans.covered(after["start_ns"].to_numpy(), after["end_ns"].to_numpy(), t.mark_spans("dataloader"))
    lost = us(int((after["end_ns"] - after["start_ns"]).sum()) - int(loading.sum()))
    if lost < lim["min_span"] * t.span_us:
        return None
    wall, _ = t.bounded(t.on_host(scaled(lost, lim["low"], lim["high"])))
    if not t.worth(wall):
        return None
    # which calls: those the device drained in
    starts = after["start_ns"].to_numpy()
    cs, ce = calls["ts_ns"].to_numpy(), calls["end_ns"].to_numpy()
    hit = np.zeros(len(cs), bool)
    order = np.argsort(cs, kind="stable")
    k = np.searchsorted(cs[order], starts, side="right") - 1
    ok = (k >= 0) & (ce[order][k.clip(0)] >= starts)
    hit[order[k[ok]]] = True
    by_name = (
        calls.with_columns(hit=pl.Series(hit), ns=pl.col("end_ns") - pl.col("ts_ns"))
        .group_by("name")
        .agg(n=pl.len(), draining=pl.col("hit").sum(), ns=pl.col("ns").sum())
        .sort("draining", "ns", descending=True)
    )
    evidence = [
        Evidence("call", r["name"], r["n"], us(r["ns"]), note=f"{r['draining']:,} of them left the device idle after")
        for r in by_name.head(5).iter_rows(named=True)
    ]
    causes = t.ops.filter(pl.col("name").str.contains(lim["ops"])).sort("calls", descending=True)
    evidence += [
        Evidence("op", r["name"], r["calls"], r["cpu_total_us"], note="an op that synchronises")
        for r in causes.head(4).iter_rows(named=True)
    ]
    evidence.append(
        Evidence("device", "device idle after a sync", after.height, lost, pct(lost, t.span_us), of="the window")
    )
    named = ", ".join(causes["name"].head(3).to_list())
    frees = by_name.filter(pl.col("name").str.contains("(?i)free") & (pl.col("draining") > 0))
    if frees.height:
        named += ("; " if named else "") + t.worded(ID, "frees", names=", ".join(frees["name"].to_list()))
    return Finding(
        ID,
        f"The device sat idle {ms(lost)} ({pct(lost, t.span_us):.0f}% of the window) after {after.height:,} "
        "host-device synchronisations",
        wall,
        None,
        "Remove syncs from the step: keep values on the device instead of .item() / .cpu() / print(tensor) "
        "(log every N steps, or accumulate on the device), avoid data-dependent shapes (nonzero, masked_select, "
        "boolean indexing) in the hot loop, copy to the host with non_blocking=True into pinned memory"
        + (f"; here: {named}" if named else ""),
        "critical-path",
        tuple(evidence),
        f"{lim['low']:.0%}-{lim['high']:.0%} of the idle gaps that began inside a synchronising call and lasted "
        "past its return (outside DataLoader fetches), at most the host's time on the critical path",
    )
