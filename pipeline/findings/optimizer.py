"""optimizer: optimizer steps that loop over the parameters where foreach / fused versions exist.

Premise: the trace's `Optimizer.step#<class>.step` slices (torch.optim wraps each step in them)
of a torch.optim class ([optimizer] foreach_classes) and, inside them, no foreach or fused ops
([marks] multi_tensor: a per-parameter loop, torch's OptimizerSingleTensorPattern); or foreach ops
but no fused ones, of a class that has fused=True (a further fix). Saving, on the host (see the
[optimizer] table): a share of the steps' self time (the Python between their ops), a dispatch
cost per op inside them, and a share of their ops' time (the passes a fused kernel merges). On a
device that host time counts only while the device waits for it (its idle time inside the steps),
plus [kernel_low, kernel_high] of the steps' kernels' device time (many small per-parameter
kernels become few multi-tensor ones) as far as device time is on the critical path. At least
[optimizer] min_span of the window.
"""

from __future__ import annotations

import re

import polars as pl

from pipeline.findings import spans
from pipeline.findings.facts import Facts
from pipeline.findings.finding import Evidence, Finding, counted, ms, pct, scaled, us

ID = "optimizer"


def optimizer(t: Facts) -> Finding | None:
    lim = t.limits(ID)
    steps = t.marks["optimizer"]
    if not steps.height:
        return None
    u = t.mark_spans("optimizer")
    multi = t.marks["multi_tensor"]
    inside = multi.filter(pl.Series(spans.holding(u, multi["ts_ns"].to_numpy()))) if multi.height else multi
    if inside["name"].str.contains("_fused_").any():
        return None  # already fused: nothing faster to switch to
    mode = "foreach" if inside.height else "loop"
    names = steps["name"].unique().sort().to_list()
    classes = {_class(n) for n in names}
    if not classes <= set(lim["foreach_classes" if mode == "loop" else "fused_classes"]):
        return None  # not torch.optim's, or no faster implementation to switch to
    total, self_us = t.optimizer_ops_us
    total = total or us(int((steps["end_ns"] - steps["ts_ns"]).sum()))
    children = max(total - self_us, 0.0)
    n_ops = t.optimizer_op_count
    loop = mode == "loop"
    low_self, high_self = (
        (lim["self_low"], lim["self_high"]) if loop else (lim["foreach_self_low"], lim["foreach_self_high"])
    )
    cap = lim["ops_cap"] * children
    host = (
        low_self * self_us + min(n_ops * lim["op_low_us"], cap),
        high_self * self_us + min(n_ops * lim["op_high_us"] + lim["pass_high"] * children, cap),
    )
    gpu = None
    evidence = [Evidence("annotation", n, int((steps["name"] == n).sum()), note="optimizer steps") for n in names]
    evidence += [
        Evidence(
            "op", "Python inside the steps (their self time)", None, self_us, pct(self_us, t.span_us), of="the window"
        ),
        Evidence(
            "op",
            "ops inside the steps",
            n_ops,
            children,
            pct(children, t.span_us),
            of="the window",
            note=f"{children / n_ops:.1f} µs each" if n_ops else None,
        ),
    ]
    if t.has_device:
        n_kernels, kernel_us = t.optimizer_kernels
        idle = t.idle_within(u)
        gpu = scaled(kernel_us, lim["kernel_low"], lim["kernel_high"])
        on_device = t.on_device(gpu)
        waited = (min(host[0], idle), min(host[1], idle))
        wall = (waited[0] + on_device[0], waited[1] + on_device[1])
        evidence += [
            Evidence(
                "kernel",
                "kernels launched inside the steps",
                n_kernels,
                kernel_us,
                pct(kernel_us, t.kernel_us),
                of="kernel time",
            ),
            Evidence("device", "device idle inside the steps", None, idle, pct(idle, t.span_us), of="the window"),
        ]
    else:
        wall = t.on_host(host)
    if max(wall[1], (gpu or (0, 0))[1]) < lim["min_span"] * t.span_us:
        return None
    wall, gpu = t.bounded(wall, gpu)
    if not t.worth(wall, gpu):
        return None
    cls = _classes(names)
    if mode == "loop":
        evidence.append(Evidence("op", "foreach / fused ops inside the steps", 0, note="none: one op per parameter"))
        title = (
            f"{cls} steps loop over the parameters one at a time: {ms(total)} in {counted(steps.height, 'step')}, "
            f"{ms(self_us)} of it Python between per-parameter ops"
        )
        fused = classes <= set(lim["fused_classes"])
        remedy = t.worded(ID, "remedy_loop_fused" if fused else "remedy_loop", cls=cls)
    else:
        ops_in = inside.group_by("name").agg(pl.len()).sort("len", descending=True)
        evidence += [
            Evidence("op", r["name"], r["len"], note="inside the steps") for r in ops_in.head(4).iter_rows(named=True)
        ]
        title = (
            f"{cls} steps run foreach ops: {ms(total)} in {counted(steps.height, 'step')}; "
            "a fused step does each parameter group in one kernel"
        )
        remedy = t.worded(ID, "remedy_foreach", cls=cls)
    basis = (
        f"{low_self:.0%}-{high_self:.0%} of the steps' self time (Python), plus "
        f"{lim['op_low_us']:g}-{lim['op_high_us']:g} µs per op inside them and up to {lim['pass_high']:.0%} "
        f"of their ops' time (merged passes), at most {lim['ops_cap']:.0%} of it"
        + (
            "; on a device, only while the device waited inside the steps, plus "
            f"{lim['kernel_low']:.0%}-{lim['kernel_high']:.0%} of their kernels' time"
            if t.has_device
            else ""
        )
    )
    return Finding(ID, title, wall, gpu, remedy, "ops", tuple(evidence), basis)


def _class(name: str) -> str:
    """The optimizer class a step's name gives ("Optimizer.step#AdamW.step": AdamW)."""
    m = re.match(r"^Optimizer\.step#(\w+)\.step$", name)
    return m.group(1) if m else name


def _classes(names: list[str]) -> str:
    """The optimizer classes the step names give ("torch.optim.AdamW")."""
    return " / ".join(f"torch.optim.{c}" for c in sorted({_class(n) for n in names})) or "optimizer"
