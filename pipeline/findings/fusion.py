"""fusion: memory-bound elementwise / reduction / normalisation chains that one kernel could do.

Premise (a device): kernels of the [fusion] categories (but the copies `copies` counts), each on
average under [fusion] max_mean_us, at least [fusion] min_count of them, take at least [fusion]
min_kernels of the device's kernel time. Each reads and writes its tensors whole; a chain of them
(RMSNorm, RoPE, SwiGLU, ...) fused reads and writes once. Saving: [low, high] of their device
time; wall time as far as device time is on the critical path. The evidence names the chain the
kernel sequences repeat most (by the ops that launched its kernels) and the patterns the trace's
ops make (data: [[fusion.patterns]]).

A trace without a device: the CPU ops torch.compile takes away (elementwise and reduction ops, the
view ops around them, the autograd engine's per-node overhead; not copies, not the optimizer's own
ops), when their self time is at least [fusion] cpu_min_span of the window; [cpu_low, cpu_high]
of it.
"""

from __future__ import annotations

import re

import polars as pl

from pipeline.findings import spans
from pipeline.findings.facts import Facts
from pipeline.findings.finding import Evidence, Finding, pct, scaled, us
from pipeline.findings.limits import limits

ID = "fusion"


def fusion(t: Facts) -> Finding | None:
    lim = t.limits(ID)
    if not t.has_device:
        return _on_cpu(t, lim)
    copy = limits("copies")["copy_kernels"]
    k = t.kernels.filter(
        (pl.col("device") >= 0)
        & pl.col("category").is_in(lim["categories"])
        & ~pl.col("name").str.contains(copy)
        & (pl.col("mean_us") <= lim["max_mean_us"])
    )
    n_opt, opt_us = t.optimizer_kernels  # the optimizer's own kernels are `optimizer`'s
    mass = max(float(k["dur_us"].sum() or 0.0) - opt_us, 0.0)
    count = max(int(k["count"].sum() or 0) - n_opt, 0)
    if count < lim["min_count"] or not t.kernel_us or mass < lim["min_kernels"] * t.kernel_us:
        return None
    gpu = scaled(mass, lim["low"], lim["high"])
    wall, gpu_r = t.bounded(t.on_device(gpu), gpu)
    if not t.worth(wall, gpu_r):
        return None
    ops = _by_op(k)
    patterns = _patterns(lim.get("patterns", []), set(ops["op"].to_list()))
    # the chain: of these kernels and the casts between them (a chain fuses with its casts; their
    # time stays `copies`')
    casts = t.kernels.filter((pl.col("device") >= 0) & pl.col("name").str.contains(copy))["name"]
    chain = _chain(t, set(k["name"].to_list()) | set(casts.to_list()))
    evidence = ([chain] if chain is not None else []) + [
        Evidence(
            "op", r["op"], r["count"], r["dur_us"], pct(r["dur_us"], t.kernel_us), of="kernel time", note="its kernels"
        )
        for r in ops.head(6).iter_rows(named=True)
    ]
    named = f" ({', '.join(patterns)})" if patterns else ""
    return Finding(
        ID,
        f"{pct(mass, t.kernel_us):.0f}% of kernel time is in {count:,} small elementwise / reduction kernels{named}: "
        "fuse them",
        wall,
        gpu_r,
        t.worded(ID, "remedy"),
        "sequences" if chain else "kernels",
        tuple(evidence),
        f"{lim['low']:.0%}-{lim['high']:.0%} of their device time; wall time x {t.on_path_share:.2f}, "
        "the share of device time on the critical path",
    )


def _on_cpu(t: Facts, lim: dict) -> Finding | None:
    """A trace without a device: the CPU ops torch.compile takes away (self times)."""
    ops = t.kernels  # a CPU-only trace's kernels are its ops (device -1), dur_us their self time
    copy = limits("copies")["cpu_copies"]
    fusible = pl.col("category").is_in(lim["categories"]) & ~pl.col("name").str.contains(copy)
    k = ops.filter(
        fusible | pl.col("name").str.contains(lim["cpu_views"]) | pl.col("name").str.contains(lim["cpu_autograd"])
    )
    theirs = t.optimizer_inside.filter(pl.col("name").is_in(k["name"].implode()))  # the optimizer's own: `optimizer`'s
    ops_us = max(float(k["dur_us"].sum() or 0.0) - float(theirs["us"].sum() or 0.0), 0.0)
    count = max(int(k["count"].sum() or 0) - int(theirs["n"].sum() or 0), 0)
    if count < lim["min_count"] or ops_us < lim["cpu_min_span"] * t.span_us:
        return None
    # and the Python between the ops that a compiled graph skips: the critical path's untraced time
    # ("waiting"), but the optimizer's Python and the waits for data
    python = float(t.path["breakdown_us"].get("waiting") or 0.0) - t.optimizer_ops_us[1]
    python = max(python - us(spans.length(t.mark_spans("dataloader"))), 0.0)
    mass = ops_us + python
    wall, _ = t.bounded(t.on_host(scaled(mass, lim["cpu_low"], lim["cpu_high"])))
    if not t.worth(wall):
        return None
    mine = ops.filter(fusible)
    by_op = _by_op(mine)
    patterns = _patterns(lim.get("patterns", []), set(by_op["op"].to_list()))
    evidence = [
        Evidence("op", r["op"], r["count"], r["dur_us"], pct(r["dur_us"], t.span_us), of="the window", note="self time")
        for r in by_op.head(5).iter_rows(named=True)
    ]
    for what, rx in (("view ops", lim["cpu_views"]), ("autograd nodes", lim["cpu_autograd"])):
        part = ops.filter(pl.col("name").str.contains(rx))
        if part.height:
            v = float(part["dur_us"].sum() or 0.0)
            evidence.append(
                Evidence("op", what, int(part["count"].sum()), v, pct(v, t.span_us), of="the window", note="self time")
            )
    if python:
        evidence.append(
            Evidence(
                "path",
                "Python between the ops (untraced time on the critical path)",
                None,
                python,
                pct(python, t.span_us),
                of="the window",
                note="outside the optimizer's steps and DataLoader fetches",
            )
        )
    named = f" ({', '.join(patterns)})" if patterns else ""
    return Finding(
        ID,
        f"{pct(ops_us, t.span_us):.0f}% of the window is in {count:,} eager elementwise, view and autograd "
        f"ops{named}"
        + (f", {pct(python, t.span_us):.0f}% in the Python between them" if python >= 0.01 * t.span_us else "")
        + ": compile them",
        wall,
        None,
        t.worded(ID, "remedy"),
        "kernels",
        tuple(evidence),
        f"{lim['cpu_low']:.0%}-{lim['cpu_high']:.0%} of their self time (outside the optimizer's steps) and of "
        "the Python between them, at most the critical path",
    )


def _by_op(k: pl.DataFrame) -> pl.DataFrame:
    return (
        k.group_by(pl.col("cpu_op").fill_null(pl.col("name")).alias("op"))
        .agg(pl.col("count").sum(), pl.col("dur_us").sum())
        .sort("dur_us", descending=True)
    )


def _patterns(patterns: list[dict], ops: set[str]) -> list[str]:
    """The named patterns whose ops (each regex) the fusible kernels' ops all include."""
    return [p["name"] for p in patterns if all(any(re.search(rx, o) for o in ops) for rx in p["ops"])]


def _chain(t: Facts, fusible: set[str]) -> Evidence | None:
    """The repeated kernel sequence with most time whose kernels are all fusible, by the ops that
    launched them (the kernel's name where it has no op)."""
    seq = t.section("sequences")
    if not seq.height or not {"kernels", "count", "dur_us"} <= set(seq.columns):
        return None
    seq = seq.filter((pl.col("count") >= 2) & pl.col("kernels").list.eval(pl.element().is_in(list(fusible))).list.all())
    if not seq.height:
        return None
    best = seq.sort("dur_us", descending=True).row(0, named=True)
    op_of = dict(zip(t.kernels["name"].to_list(), t.kernels["cpu_op"].to_list()))
    names = " → ".join(op_of.get(n) or n for n in best["kernels"])
    return Evidence(
        "chain",
        names,
        best["count"],
        best["dur_us"],
        pct(best["dur_us"], t.kernel_us),
        of="kernel time",
        note=f"{len(best['kernels'])} kernels in a row, repeated; the time of every occurrence",
    )
