"""copies: host copies from pageable memory, and copies that only change a dtype or a layout.

Two premises, either enough:
- memcpy from or to pageable host memory (Kineto names it: `Memcpy HtoD (Pageable -> Device)`)
  takes at least [copies] min_span of the window: the driver stages it through a pinned buffer at
  a fraction of the link's bandwidth, and the host waits for it. Saving: [pageable_low,
  pageable_high] of its device time, on the host and the device alike (the host waits for it).
- copy kernels ([copies] copy_kernels: dtype casts, `.contiguous()`, `.to()`) take at least
  [copies] min_kernels of the device's kernel time. Saving: [copy_low, copy_high] of their device
  time, as far as device time is on the critical path. (`fusion` leaves these kernels to this rule.)
A trace without a device: CPU ops that copy ([copies] cpu_copies: copy_, _to_copy, clone, ...),
outside the optimizer's steps and the DataLoader's fetches, at least [copies] min_span of the
window; [cpu_copy_low, cpu_copy_high] of their self time and of the allocations of their results
(the `empty*` ops inside them).
"""

from __future__ import annotations

import polars as pl

from pipeline.findings.facts import Facts
from pipeline.findings.finding import Evidence, Finding, counted, ms, pct, scaled

ID = "copies"


def copies(t: Facts) -> Finding | None:
    lim = t.limits(ID)
    if not t.has_device:
        return _on_cpu(t, lim)
    moves = t.section("transfers")
    paged = (
        moves.filter((pl.col("device") >= 0) & pl.col("name").str.contains(lim["pageable"])) if moves.height else moves
    )
    paged_us = float(paged["dur_us"].sum() or 0.0) if paged.height else 0.0
    k = t.kernels.filter((pl.col("device") >= 0) & pl.col("name").str.contains(lim["copy_kernels"]))
    copy_us = float(k["dur_us"].sum() or 0.0)
    use_paged = paged_us >= lim["min_span"] * t.span_us
    use_copy = bool(t.kernel_us) and copy_us >= lim["min_kernels"] * t.kernel_us
    if not use_paged and not use_copy:
        return None
    gpu, wall, evidence, parts = (0.0, 0.0), (0.0, 0.0), [], []
    if use_paged:
        g = scaled(paged_us, lim["pageable_low"], lim["pageable_high"])
        on_dev, on_host = t.on_device(g), t.on_host(g)
        w = (max(on_dev[0], on_host[0]), max(on_dev[1], on_host[1]))
        gpu, wall = _plus(gpu, g), _plus(wall, w)
        n = int(paged["count"].sum())
        parts.append(f"{ms(paged_us)} of copies in {counted(n, 'call')} from pageable host memory")
        evidence += [
            Evidence(
                "memcpy",
                r["name"],
                r["count"],
                r["dur_us"],
                pct(r["dur_us"], t.span_us),
                of="the window",
                note=f"{r['achieved_gbps'] or 0:.3g} GB/s",
            )
            for r in paged.sort("dur_us", descending=True).iter_rows(named=True)
        ]
    if use_copy:
        g = scaled(copy_us, lim["copy_low"], lim["copy_high"])
        gpu, wall = _plus(gpu, g), _plus(wall, t.on_device(g))
        parts.append(
            f"{ms(copy_us)} ({pct(copy_us, t.kernel_us):.0f}% of kernel time) in {int(k['count'].sum()):,} "
            "dtype/layout copy kernels"
        )
        evidence += t.kernel_evidence(k.sort("dur_us", descending=True), 4)
    wall_r, gpu_r = t.bounded(wall, gpu)
    if not t.worth(wall_r, gpu_r):
        return None
    remedy = []
    if use_paged:
        remedy.append(t.worded(ID, "remedy_pageable"))
    if use_copy:
        remedy.append(
            "avoid copies that only change a dtype or a layout: keep activations in one dtype (no .float() / "
            ".to(dtype) round trips), call .contiguous() once where a layout must change, or let torch.compile "
            "fold them into the neighbouring ops"
        )
    basis = []
    if use_paged:
        basis.append(
            f"{lim['pageable_low']:.0%}-{lim['pageable_high']:.0%} of the pageable copies' time "
            "(pinned memory runs at 2-3x its bandwidth)"
        )
    if use_copy:
        basis.append(
            f"{lim['copy_low']:.0%}-{lim['copy_high']:.0%} of the copy kernels' time, "
            f"x {t.on_path_share:.2f} on the critical path"
        )
    return Finding(
        ID,
        "Copies: " + "; ".join(parts),
        wall_r,
        gpu_r,
        _sentence("; ".join(remedy)),
        "transfers" if use_paged else "kernels",
        tuple(evidence),
        "; ".join(basis),
    )


def _on_cpu(t: Facts, lim: dict) -> Finding | None:
    """A trace without a device: the CPU ops that copy (casts, .contiguous(), clones), outside the
    optimizer's steps and the DataLoader's fetches."""
    k = t.kernels.filter(pl.col("name").str.contains(lim["cpu_copies"]))
    # the optimizer's copies are `optimizer`'s, the DataLoader's (collate, pinning) `dataloader`'s
    theirs = pl.concat([t.inside("optimizer"), t.inside("dataloader")]).filter(
        pl.col("name").str.contains(lim["cpu_copies"])
    )
    all_us = float(k["dur_us"].sum() or 0.0)
    copy_us = max(all_us - float(theirs["us"].sum() or 0.0), 0.0)
    if copy_us < lim["min_span"] * t.span_us:
        return None
    # a copy that goes takes the allocation of its result with it (empty_like / empty_strided inside
    # clone / _to_copy), in the same share as the copies counted
    n_alloc, alloc_us = t.under(lim["cpu_allocs"], lim["cpu_copies"])
    alloc_us *= copy_us / all_us if all_us else 0.0
    mass = copy_us + alloc_us
    wall, _ = t.bounded(t.on_host(scaled(mass, lim["cpu_copy_low"], lim["cpu_copy_high"])))
    if not t.worth(wall):
        return None
    by = t.callers(lim["cpu_copies"], lim["cpu_copy_family"]).sort("us", descending=True)
    evidence = [
        Evidence(
            "op",
            "called from Python (.to(), .float(), .contiguous(), .clone())"
            if r["caller"] is None
            else f"inside {r['caller']}",
            r["n"],
            r["us"],
            pct(r["us"], t.span_us),
            of="the window",
            note="copy ops' self time",
        )
        for r in by.head(5).iter_rows(named=True)
    ]
    if alloc_us:
        evidence.append(
            Evidence(
                "op",
                "allocations of the copies' results",
                n_alloc,
                alloc_us,
                pct(alloc_us, t.span_us),
                of="the window",
                note="self time of the empty* ops inside the copy ops",
            )
        )
    inner = by.filter(pl.col("caller").is_not_null() & (pl.col("us") >= 0.1 * copy_us)).head(3)["caller"].to_list()
    remedy = _sentence(CPU_REMEDY) + (
        f"; the copies inside {', '.join(inner)} are that op converting its inputs: give it the layout and dtype it "
        "works in (e.g. channels_last activations and weights for convolutions)"
        if inner
        else ""
    )
    return Finding(
        ID,
        f"Copies: {ms(copy_us)} ({pct(copy_us, t.span_us):.0f}% of the window) in {int(k['count'].sum()):,} copy, cast "
        "and contiguous ops",
        wall,
        None,
        remedy,
        "ops",
        tuple(evidence),
        f"{lim['cpu_copy_low']:.0%}-{lim['cpu_copy_high']:.0%} of their self time and their results' allocations "
        "(outside the optimizer's steps and the DataLoader's fetches), at most the critical path",
    )


CPU_REMEDY = (
    "avoid copies that only change a dtype or a layout: convert weights and constants once (at load, not in "
    "forward), keep activations in one dtype (no .float() / .to(dtype) round trips), call .contiguous() once "
    "where a layout must change, or let torch.compile fold them into the neighbouring ops"
)


def _plus(a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float]:
    return (a[0] + b[0], a[1] + b[1])


def _sentence(s: str) -> str:
    return s[:1].upper() + s[1:]
