"""overview: the answer to "where does my time go?" at the top of an analysis page.

Tiles (each device's busy time, why it sat idle, the top category, the critical path, how much
of the kernel time is costed, the memory peak), then charts and small tables: time by category,
busy and idle per device and stream, the top kernels and ops, idle causes, the roofline, and
what is costed. Each is made from the sections the page holds (and the trace, for the roofline
and the costing): a section that was not computed or is empty leaves its part out.
"""

from __future__ import annotations

import polars as pl

import pipeline.render.html.charts as ch
from pipeline.analyses.flat import Flat
from pipeline.analyses.registry import pct_meanings
from pipeline.render.html.cells import duration, percent
from pipeline.render.html.costing import costing_parts, tone
from pipeline.render.html.model import Chart, Group, Part, Table, Tile
from pipeline.render.plots.figure import CATEGORY_COLOURS, OTHER_COLOUR
from pipeline.render.plots.roofline_data import kernel_time_by_reason, roofline_panels
from pipeline.render.tables import engineering

TOP = 10  # rows of the top kernels and ops
MAX_DEVICE_TILES = 4  # devices with a tile of their own (more: one tile for all)
MAX_STREAMS = 16  # stream rows in the busy and idle charts
MAX_ROOFLINES = 4  # devices with a roofline
CACHE_SERIES = "above the DRAM roof: data from the cache"  # the points of kernels roofline_bound = cache
CACHE_COLOUR = "#8e44ad"
BOUND_TIPS = {"compute": "compute-bound", "memory": "memory-bound", "cache": CACHE_SERIES}
IDLE_PARTS = (
    ("host_wait_us", "host wait (CPU late)"),
    ("kernel_wait_us", "kernel wait (short gaps)"),
    ("other_us", "other"),
)


def overview(f: Flat, sections: dict[str, pl.DataFrame], devices: dict[int, str]) -> list[Part]:
    """The overview's parts, in reading order (tiles first)."""
    label = lambda d: f"device {d}: {devices[d]}" if d in devices else f"device {d}"
    s = {k: v for k, v in sections.items() if v.height}
    parts: list[Part] = []
    parts += _busy_tiles(s.get("devices"), s.get("idle"))
    parts += _category_tile(s.get("categories"), f.has_gpu)
    parts += _critical_tile(s.get("critical-path"))
    reasons = kernel_time_by_reason(f) if "kernels" in s and f.has_gpu and "coverage" not in s else None
    cost_tiles, cost_parts = costing_parts(reasons, s.get("coverage"), label, len(devices) > 1)
    parts += cost_tiles
    parts += _memory_tile(s.get("memory"), label)
    if "categories" in s:
        parts.append(Chart(category_chart(s["categories"], label, f.has_gpu)))
    busy_part = busy_chart(s["devices"], s.get("streams"), label, f.has_gpu) if "devices" in s else None
    idle_parts = [Chart(busy_part)] if busy_part else []
    idle_parts += [Chart(idle_chart(s["idle"]))] if "idle" in s else []
    if idle_parts:
        parts.append(Group(tuple(idle_parts)))
    if "kernels" in s and (f.has_gpu or "ops" not in s):  # a CPU-only trace's: the ops' table says it
        parts.append(top_kernels(s["kernels"], len(devices) > 1, f.has_gpu))
    if "ops" in s and top_ops(s["ops"]).frame.height:
        parts.append(top_ops(s["ops"]))
    if "kernels" in s and f.has_gpu:
        parts += [Chart(spec) for spec in rooflines(f, s["kernels"])]
    return parts + cost_parts


# ------------------------------------------------------------------ tiles
def _busy_tiles(dev: pl.DataFrame | None, idle: pl.DataFrame | None) -> list[Tile]:
    if dev is None:
        return []
    out = []
    rows = dev.to_dicts()
    if len(rows) > MAX_DEVICE_TILES:
        busy, span = sum(r["busy_us"] or 0 for r in rows), sum(r["span_us"] or 0 for r in rows)
        pct = 100 * busy / span if span else 0.0
        least = min(rows, key=lambda r: r["busy_pct"] or 0)
        out.append(
            Tile(
                f"{len(rows)} devices busy",
                percent(pct),
                f"least busy: device {least['device']} at {percent(least['busy_pct'] or 0)}",
                tone(pct),
            )
        )
    else:
        for r in rows:
            who = "CPU ops" if r["device"] < 0 else f"device {r['device']} busy"
            note = f"{duration(r['busy_us'] or 0)} of {duration(r['span_us'] or 0)}; {r['gaps'] or 0:,} gaps"
            out.append(Tile(who, percent(r["busy_pct"] or 0), note, tone(r["busy_pct"] or 0)))
    if idle is not None and idle.height:
        total = float(idle["idle_us"].sum() or 0.0)
        parts = [(name, float(idle[c].sum() or 0.0)) for c, name in IDLE_PARTS]
        big = max(parts, key=lambda p: p[1])
        note = "; ".join(f"{n.split(' (')[0]} {duration(v)}" for n, v in parts)
        comm = float(idle["comm_wait_us"].sum() or 0.0)
        note += f"; {duration(comm)} of it while communication ran" if comm > 0 else ""
        label = "device idle" if idle.height == 1 else f"device idle, summed over {idle.height} streams"
        out.append(Tile(label, duration(total), f"mostly {big[0]}: {note}" if total > 0 else note))
    return out


def _category_tile(cats: pl.DataFrame | None, on_gpu: bool = True) -> list[Tile]:
    if cats is None:
        return []
    what = "kernel" if on_gpu else "CPU op"
    by = cats.group_by("category").agg(pl.col("dur_us").sum()).sort("dur_us", descending=True)
    total = by["dur_us"].sum() or 1.0
    top = by.row(0, named=True)
    rest = "; ".join(f"{c} {percent(100 * d / total)}" for c, d in by.slice(1, 3).iter_rows())
    share = percent(100 * top["dur_us"] / total)
    return [
        Tile(f"top {what} category", str(top["category"]), f"{share} of {what} time" + (f"; {rest}" if rest else ""))
    ]


def _critical_tile(cp: pl.DataFrame | None) -> list[Tile]:
    if cp is None or not cp["length_us"][0]:
        return []
    d = cp.row(0, named=True)
    length = d["length_us"] or 0.0
    parts = sorted((d["breakdown_us"] or {}).items(), key=lambda kv: -(kv[1] or 0))
    note = "; ".join(f"{k} {percent(100 * (v or 0) / length)}" for k, v in parts[:3] if length)
    return [Tile("critical path", duration(length), note)]


def _memory_tile(mem: pl.DataFrame | None, label) -> list[Tile]:
    if mem is None:
        return []
    gpu = mem.filter(pl.col("device") >= 0)
    rows = (gpu if gpu.height else mem).sort("peak_allocated_bytes", descending=True, nulls_last=True)
    r = rows.row(0, named=True)
    if not r["peak_allocated_bytes"]:
        return []
    where = "CPU" if r["device"] < 0 else f"device {r['device']}"
    note = f"on {where} at {duration(r['peak_at_us'] or 0)}" + (f" in {r['peak_op']}" if r["peak_op"] else "")
    return [Tile("memory peak (allocated)", engineering(float(r["peak_allocated_bytes"]), "B"), note)]


# ------------------------------------------------------------------ charts
def category_chart(cats: pl.DataFrame, label, on_gpu: bool = True) -> dict:
    """One device: a bar per category (its time, its share); several: a bar per device, stacked.
    A CPU-only trace's (not `on_gpu`): its ops' self time."""
    devices = cats["device"].unique().sort().to_list()
    title = "Where the time goes: " + ("kernel time" if on_gpu else "CPU ops' self time") + " by category"
    if len(devices) == 1:
        rows = [
            ch.bar(c, [d], f"{duration(d)} · {percent(p)}", color=CATEGORY_COLOURS.get(c, OTHER_COLOUR))
            for c, d, p in cats.sort("dur_us", descending=True).select("category", "dur_us", "pct").iter_rows()
        ]
        return ch.bars(title + f" ({label(devices[0])})", rows, "us")
    order = cats.group_by("category").agg(pl.col("dur_us").sum()).sort("dur_us", descending=True)["category"].to_list()
    wide = cats.pivot(on="category", index="device", values="pct").fill_null(0).sort("device")
    totals = dict(cats.group_by("device").agg(pl.col("dur_us").sum()).iter_rows())
    rows = [
        ch.bar(label(r["device"]), [r.get(c, 0) for c in order], f"{duration(totals[r['device']])} of kernels")
        for r in wide.to_dicts()
    ]
    segs = ch.series(order, {c: CATEGORY_COLOURS.get(c, OTHER_COLOUR) for c in order})
    return ch.bars(title + ", % of each device's kernel time", rows, "pct", segs, max_value=100)


def busy_chart(dev: pl.DataFrame, streams: pl.DataFrame | None, label, on_gpu: bool = True) -> dict:
    """A bar per device (and per stream under it): kernels, memcpy/memset only, idle; % of its span.
    A CPU-only trace's (not `on_gpu`): its ops and idle, per thread."""
    work, lane = ("kernels", "stream") if on_gpu else ("CPU ops", "thread")
    kinds = [work, "memcpy / memset", "idle"] if on_gpu else [work, "idle"]
    segs = ch.series(kinds, {work: ch.BUSY, "memcpy / memset": ch.TRANSFER, "idle": ch.IDLE})
    split = lambda busy, kern: [kern, busy - kern, 100 - busy] if on_gpu else [busy, 100 - busy]
    rows = []
    for r in dev.to_dicts():
        busy, kern = r["busy_pct"] or 0.0, r.get("kernel_busy_pct")
        kern = busy if kern is None else kern
        rows.append(ch.bar(label(r["device"]), split(busy, kern), f"{percent(busy)} busy"))
        if streams is not None and streams.height > 1:
            mine = streams.filter(pl.col("device") == r["device"]).sort("busy_us", descending=True).head(MAX_STREAMS)
            for s in mine.to_dicts():
                b = s["busy_pct"] or 0.0
                rows.append(ch.bar(f"  {lane} {s['stream']}", split(b, b), f"{percent(b)} busy"))
    if not on_gpu:
        note = (
            "Busy: the union of its CPU ops over its span (first start to last end); no device activity in the trace."
        )
        return ch.bars("CPU busy and idle, % of its span", rows, "pct", segs, note, max_value=100)
    note = "Busy: the union of its kernels, memcpy and memset over its span (first start to last end)."
    return ch.bars("Device busy and idle, % of its span", rows, "pct", segs, note, max_value=100)


def top_kernels(kernels: pl.DataFrame, several: bool, on_gpu: bool = True) -> Table:
    cols = [
        c
        for c in ("name", "device", "dur_us", "pct", "count", "mean_us", "achieved_flops_pct", "cpu_op")
        if c in kernels.columns
    ]
    if not several:
        cols.remove("device")
    top = kernels.sort("dur_us", descending=True).head(TOP).select(cols)
    if not on_gpu:
        title = f"Top {top.height} CPU ops by self time (of {kernels.height:,}; all in CPU ops by name below)"
        return Table(top, title, compact=True, meanings=pct_meanings("kernels", cols, cpu_only=True))
    title = f"Top {top.height} kernels by time (of {kernels.height:,}; all in Kernels below)"
    return Table(top, title, compact=True, meanings=pct_meanings("kernels", cols))


def top_ops(ops: pl.DataFrame) -> Table:
    on_device = ops["self_device_us"].sum() > 0 if "self_device_us" in ops.columns else False
    metric = "self_device_us" if on_device else "self_cpu_us"
    cols = [
        c
        for c in (
            "name",
            "calls",
            metric,
            metric.replace("_us", "_pct"),
            "self_cpu_us" if on_device else "cpu_total_us",
        )
        if c in ops.columns
    ]
    top = ops.filter(pl.col(metric) > 0).sort(metric, descending=True).head(TOP).select(cols)
    what = "self device time" if on_device else "self CPU time"
    return Table(top, f"Top {top.height} CPU ops by {what} (of {ops.height:,}; all in CPU ops below)", compact=True)


def idle_chart(idle: pl.DataFrame) -> dict:
    segs = ch.series(
        [n for _, n in IDLE_PARTS], dict(zip([n for _, n in IDLE_PARTS], ("#dd8452", "#8172b3", "#8c8c8c")))
    )

    def row(r: dict) -> dict:
        label = f"device {r['device']} stream {r['stream']}"
        comm = f"{duration(r['comm_wait_us'])} of its idle time while communication ran"
        return ch.bar(
            label,
            [max(r[c] or 0.0, 0.0) for c, _ in IDLE_PARTS],
            f"{duration(r['idle_us'] or 0)} in {r['gaps']:,} gaps",
            tip=[label, comm] if r["comm_wait_us"] else None,
        )

    rows = [row(r) for r in idle.sort("idle_us", descending=True).head(MAX_STREAMS).to_dicts()]
    note = (
        "Host wait: the next kernel was launched after the previous one ended (the CPU was late: "
        "launch overhead, Python, synchronisation). Kernel wait: a shorter gap between back-to-back "
        "kernels. Other: longer gaps whose kernel was launched in time. Hover a bar to see how much of the "
        "stream's idle time fell while a communication kernel ran on the device (comm_wait_us in the idle table)."
    )
    return ch.bars("Why the device sat idle, per stream", rows, "us", segs, note)


def rooflines(f: Flat, kernels: pl.DataFrame) -> list[dict]:
    """A roofline per device (up to MAX_ROOFLINES): each kernel with FLOPs and bytes a point
    (arithmetic intensity, achieved TFLOP/s) sized by its share of the device's kernel time,
    coloured by category; the memory roof and a compute roof per dtype peak."""
    out = []
    for p in roofline_panels(f, kernels)[:MAX_ROOFLINES]:
        pts = p.points.sort("dur_us", descending=True)
        if not pts.height:
            continue
        cache = (pl.col("roofline_bound") == "cache").fill_null(False)
        cats = pts.filter(~cache)["category"].unique(maintain_order=True).to_list()
        cats += [CACHE_SERIES] if pts.filter(cache).height else []
        groups = ch.series(
            cats, {c: CATEGORY_COLOURS.get(c, OTHER_COLOUR) for c in cats} | {CACHE_SERIES: CACHE_COLOUR}
        )
        points = []
        for r in pts.to_dicts():
            size = max(3.0, min(22.0, 3.0 + 4.4 * (r["share"] or 0.0) ** 0.5))
            x, y = ch.num(r["arithmetic_intensity"]), ch.num(r["achieved_tflops"])
            group = cats.index(CACHE_SERIES if r["roofline_bound"] == "cache" else r["category"])
            points.append({"x": x, "y": y, "r": round(size, 1), "s": group, "tip": _kernel_tip(r)})
        xs = [q["x"] for q in points if q["x"]]
        lo, hi = min(xs) / 4, max(xs) * 4
        roofs = []
        for i, (dtypes, peak) in enumerate(p.roofs):
            if p.bw_gbps:
                ridge = peak * 1e3 / p.bw_gbps  # FLOP/byte where the memory roof meets this peak
                a, b = min(lo, ridge / 4), max(hi, ridge * 4)
                pts_ = [[a, p.bw_gbps * a / 1e3], [ridge, peak], [b, peak]] if a < ridge else [[a, peak], [b, peak]]
            else:
                pts_ = [[lo, peak], [hi, peak]]
            roofs.append(
                {
                    "name": f"{dtypes} peak {peak:,.4g} TFLOP/s",
                    "color": "#333" if i == 0 else "#999",
                    "points": pts_,
                    "dash": i > 0,
                }
            )
        if p.bw_gbps and not p.roofs:
            roofs.append(
                {
                    "name": f"memory {p.bw_gbps:,.4g} GB/s",
                    "color": "#333",
                    "points": [[lo, p.bw_gbps * lo / 1e3], [hi, p.bw_gbps * hi / 1e3]],
                    "dash": False,
                }
            )
        drawn = dict(p.reasons).get("drawn", 0.0)
        note = (
            f"{pts.height} kernels with FLOPs and bytes, {percent(drawn)} of the device's kernel time; "
            "a point's area is its share of that time. Hover a point for its kernel."
            + (
                " Points above the DRAM roof moved their bytes faster than DRAM can: from the cache."
                if CACHE_SERIES in cats
                else ""
            )
        )
        out.append(
            ch.scatter(
                f"Roofline: {p.label}",
                ch.axis("arithmetic intensity (FLOP/byte)", "plain", log=True),
                ch.axis("achieved TFLOP/s", "plain", log=True),
                points,
                groups,
                roofs,
                note,
            )
        )
    return out


def _kernel_tip(r: dict) -> list[str]:
    """The tooltip of a kernel's point: its whole name, time, intensity, rates, bound, op."""
    of_peak = lambda k, what: f" ({percent(r[k])} of {what})" if r.get(k) is not None else ""
    bound = f" · {BOUND_TIPS.get(r['roofline_bound'], r['roofline_bound'])}" if r.get("roofline_bound") else ""
    mode = f" {r['math_mode']}" if r.get("math_mode") else ""
    tip = [
        r["name"],
        f"{r['category']} · {duration(r['dur_us'] or 0)} ({percent(r['pct'] or 0)} of the device), "
        f"{r['count']:,} launches",
        f"{ch.num(r['arithmetic_intensity']) or 0:.3g} FLOP/byte · "
        f"{r['achieved_tflops'] or 0:.4g}{mode} TFLOP/s{of_peak('achieved_flops_pct', f'the{mode} peak')}",
        f"{r['achieved_gbps'] or 0:.4g} GB/s{of_peak('achieved_bw_pct', 'DRAM bandwidth')}{bound}",
    ]
    return tip + ([f"launched by {r['cpu_op']}"] if r.get("cpu_op") else [])
