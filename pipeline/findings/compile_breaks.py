"""compile_breaks: eager time between the graphs of a torch.compile'd model: its graph breaks.

A model compiled whole runs one compiled graph forward (CompiledFunction, Torch-Compiled Region,
`## Call CompiledFxGraph`) and one backward (CompiledFunctionBackward) per step; at each graph
break dynamo splits it into one more graph each way, and the code at the break runs eagerly in
between. Premise: inside a ProfilerStep (the whole trace without steps), the gaps between
consecutive compiled regions of the same direction (forward after forward, backward after
backward: the gap between the forward and the backward is the loss and autograd, not a break)
add up to at least [compile_breaks] min_span of the window. Saving: [low, high] of that eager time
(compiled, it runs fused and without Python overhead; some breaks stay: custom ops, by-design
splits such as vLLM's piecewise graphs around attention), within the window.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from pipeline.findings import spans
from pipeline.findings.facts import Facts
from pipeline.findings.finding import Evidence, Finding, ms, pct, scaled, us

ID = "compile_breaks"
REMEDY = (
    "Find the graph breaks: TORCH_LOGS=graph_breaks python train.py (or torch._dynamo.explain(model)(*inputs)), "
    "then remove their causes (.item(), print, data-dependent control flow, unsupported calls) or compile with "
    "fullgraph=True to make each an error (splits made on purpose, e.g. vLLM's piecewise graphs, stay)"
)


def compile_breaks(t: Facts) -> Finding | None:
    lim = t.limits(ID)
    cpu = t.f.any_cpu()
    r = cpu.regions
    if r.height < 2:
        return None
    gaps = _breaks(r, cpu.steps)
    if not gaps.height:
        return None
    # per step, robust to a step's hiccup (a recompile, the OS): the median step's eager time x steps
    per = gaps.group_by("step").agg(ns=pl.col("gap_ns").sum())
    mid = per["ns"].median()
    eager = us(float(mid) * per.height) if isinstance(mid, int | float) else 0.0
    if eager < lim["min_span"] * t.span_us:
        return None
    wall, _ = t.bounded(scaled(eager, lim["low"], lim["high"]))
    if not t.worth(wall):
        return None
    per_step = (
        gaps.group_by("step")
        .agg(n=pl.len(), ns=pl.col("gap_ns").sum(), largest=pl.col("gap_ns").max(), step_ns=pl.col("step_ns").first())
        .sort("ns", descending=True)
    )
    evidence = [
        Evidence(
            "step",
            f"ProfilerStep#{s['step']}" if s["step"] is not None else "the trace",
            s["n"],
            us(s["ns"]),
            pct(s["ns"], s["step_ns"] or 0),
            of="the step",
            note=f"graph breaks; largest {ms(us(s['largest']))}",
        )
        for s in per_step.head(4).iter_rows(named=True)
    ]
    names = r.group_by("name").agg(n=pl.len(), ns=pl.col("dur_ns").sum()).sort("ns", descending=True)
    evidence += [
        Evidence(
            "region", x["name"], x["n"], us(x["ns"]), pct(us(x["ns"]), t.span_us), of="the window", note="compiled"
        )
        for x in names.head(3).iter_rows(named=True)
    ]
    steps = max(per_step.height, 1)
    return Finding(
        ID,
        f"Graph breaks: {gaps.height / steps:.0f} per step; the eager code between compiled graphs takes "
        f"{ms(eager / steps)} a step ({pct(eager, t.span_us):.0f}% of the window)",
        wall,
        None,
        REMEDY,
        "compile",
        tuple(evidence),
        f"{lim['low']:.0%}-{lim['high']:.0%} of the time between consecutive compiled graphs of one direction "
        "inside the steps (the median step's, x the steps)",
    )


def _breaks(regions: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """(step, step_ns, gap_ns): each gap between consecutive compiled graphs of the same direction
    inside one step. The graphs are the innermost regions (a `## Call CompiledFxGraph` inside a
    CompiledFunction inside a `Torch-Compiled Region`: dynamo's frame region holds the eager code of
    a break too); backward: inside a region whose name says so."""
    r = regions.sort(["ts_ns", "end_ns"], descending=[False, True])
    s, e = r["ts_ns"].to_numpy(), r["end_ns"].to_numpy()
    leaf = np.ones(len(s), bool)
    leaf[:-1] = s[1:] >= e[:-1]  # the next region does not start inside this one
    named_back = r["name"].str.contains("(?i)backward").to_numpy()
    backward = spans.union(s[named_back], e[named_back])
    s, e = s[leaf], e[leaf]
    back = spans.holding(backward, s)
    empty = pl.DataFrame(schema={"step": pl.Int64, "step_ns": pl.Int64, "gap_ns": pl.Int64})
    if len(s) < 2:
        return empty
    if steps.height:
        st = steps.sort("ts_ns")
        a, b, n = st["ts_ns"].to_numpy(), st["end_ns"].to_numpy(), st["step"].to_list()
        k = np.searchsorted(a, s, side="right") - 1
        inside = (k >= 0) & (s <= b[k.clip(0)])
        step = np.where(inside, k, -1)
        step_ns = np.where(inside, (b - a)[k.clip(0)], 0)
        label = [n[i] if i >= 0 else None for i in step]
    else:
        step = np.zeros(len(s), np.int64)
        step_ns = np.full(len(s), int(e.max() - s.min()))
        label = [None] * len(s)
    same = (back[1:] == back[:-1]) & (step[1:] == step[:-1]) & (step[1:] >= 0)
    gap = s[1:] - e[:-1]
    keep = same & (gap > 0)
    idx = np.flatnonzero(keep) + 1
    if not len(idx):
        return empty
    return pl.DataFrame(
        {"step": [label[i] for i in idx], "step_ns": step_ns[idx], "gap_ns": gap[keep]},
        schema={"step": pl.Int64, "step_ns": pl.Int64, "gap_ns": pl.Int64},
    )
