"""fusion: memory-bound elementwise / reduction / normalisation chains that one kernel could do.

Premise (a device): kernels of the [fusion] categories (but the copies `copies` counts), each on
average under [fusion] max_mean_us, at least [fusion] min_count of them, take at least [fusion]
min_kernels of the device's kernel time. Each reads and writes its tensors whole; a chain of them
(RMSNorm, RoPE, SwiGLU, ...) fused reads and writes once. Saving: [low, high] of their device
time; wall time as far as device time is on the critical path. The evidence names the chain the
kernel sequences repeat most (by the ops that launched its kernels) and the patterns the trace's
ops make (data: [[fusion.patterns]]).

A trace without a device: the elementwise CPU ops (a dispatch and a pass over memory each) that
inductor's C++ backend fuses, when their self time is at least [fusion] cpu_min_span of the
window; [cpu_low, cpu_high] of it.
"""

from __future__ import annotations

import re

import polars as pl

from pipeline.findings.facts import Facts
from pipeline.findings.finding import Evidence, Finding, pct, scaled
from pipeline.findings.limits import limits

ID = "fusion"
REMEDY = (
    "Fuse the chains: torch.compile(model) (inductor fuses elementwise chains into one Triton kernel "
    "each), or fused kernels for the patterns named (e.g. a fused RMSNorm, fused rotary embedding, "
    "fused SwiGLU / GELU-MLP from Liger-Kernel, Apex or Transformer Engine)"
)
CPU_REMEDY = (
    "Fuse the elementwise ops: torch.compile(model) (inductor's C++ backend turns chains of aten ops "
    "into one vectorised loop each), or write them as fewer, larger tensor ops"
)


def fusion(t: Facts) -> Finding | None:
    lim = t.limits(ID)
    copy = limits("copies")["copy_kernels"]
    k = t.kernels.filter(
        pl.col("category").is_in(lim["categories"])
        & ~pl.col("name").str.contains(copy)
        & (pl.col("mean_us") <= lim["max_mean_us"])
    )
    if t.has_device:
        k = k.filter(pl.col("device") >= 0)
    # the optimizer's own elementwise work is `optimizer`'s: its kernels (device), its ops' time (CPU)
    theirs = t.optimizer_kernels if t.has_device else (0, t.optimizer_ops_us[0] - t.optimizer_ops_us[1])
    mass = max(float(k["dur_us"].sum() or 0.0) - theirs[1], 0.0)
    count = max(int(k["count"].sum() or 0) - theirs[0], 0)
    if count < lim["min_count"] or not t.kernel_us:
        return None
    if t.has_device:
        if mass < lim["min_kernels"] * t.kernel_us:
            return None
        gpu = scaled(mass, lim["low"], lim["high"])
        wall, gpu_r = t.bounded(t.on_device(gpu), gpu)
    else:
        if mass < lim["cpu_min_span"] * t.span_us:
            return None
        wall, gpu_r = t.bounded(t.on_host(scaled(mass, lim["cpu_low"], lim["cpu_high"])))
    if not t.worth(wall, gpu_r):
        return None
    ops = (
        k.group_by(pl.col("cpu_op").fill_null(pl.col("name")).alias("op"))
        .agg(pl.col("count").sum(), pl.col("dur_us").sum())
        .sort("dur_us", descending=True)
    )
    patterns = _patterns(lim.get("patterns", []), set(ops["op"].to_list()))
    evidence = []
    chain = _chain(t, set(k["name"].to_list())) if t.has_device else None
    if chain is not None:
        evidence.append(chain)
    evidence += [
        Evidence(
            "op",
            r["op"],
            r["count"],
            r["dur_us"],
            pct(r["dur_us"], t.kernel_us),
            of="kernel time" if t.has_device else "CPU op self time",
            note="its kernels" if t.has_device else "self time",
        )
        for r in ops.head(6).iter_rows(named=True)
    ]
    what = "elementwise / reduction kernels" if t.has_device else "elementwise CPU ops"
    named = f" ({', '.join(patterns)})" if patterns else ""
    title = (
        f"{pct(mass, t.kernel_us):.0f}% of {'kernel' if t.has_device else 'CPU op'} time is in {count:,} small "
        f"{what}{named}: fuse them"
    )
    if t.has_device:
        basis = (
            f"{lim['low']:.0%}-{lim['high']:.0%} of their device time; wall time x {t.on_path_share:.2f}, "
            "the share of device time on the critical path"
        )
    else:
        basis = f"{lim['cpu_low']:.0%}-{lim['cpu_high']:.0%} of their self time, at most the critical path"
    return Finding(
        ID,
        title,
        wall,
        gpu_r,
        REMEDY if t.has_device else CPU_REMEDY,
        "sequences" if chain else "kernels",
        tuple(evidence),
        basis,
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
