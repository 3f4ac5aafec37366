"""warmup: one-off work inside the profiled window: torch.compile compiling.

torch.compile times each phase of a compilation (tracing, AOT autograd, lowering, code
generation, Triton or C++ compilation, autotuning) with `dynamo_timed`, which wraps it in
record_function("<phase> (dynamo_timed)") ([marks] compile). A compilation runs once per graph
and process, or again at a recompile, so a window that holds one shows a start-up, not the
steady state, and every share the other findings give is of that window.

Premise: the union of those slices holds at least [warmup] min_span of the window. Saving: none
at run time (gain 0): the finding changes what the window measures, so it comes first whatever
the others save (`finding.ranked`). Steps (ProfilerStep#N) that hold compilation are counted: in
more than one, it is recompiling (a cost every such step pays).
"""

from __future__ import annotations

import numpy as np
import polars as pl

from pipeline.findings.facts import Facts
from pipeline.findings.finding import Evidence, Finding, ms, pct, us

ID = "warmup"
EVIDENCE_ROWS = 8  # phases listed (the largest; every format but the terminal shows them all)


def warmup(t: Facts) -> Finding | None:
    lim = t.limits(ID)
    m = t.marks["compile"]
    if not m.height or not t.span_us:
        return None
    u = t.mark_spans("compile")
    compiling = us(int((u[1] - u[0]).sum()))
    if compiling < lim["min_span"] * t.span_us:
        return None
    share = pct(compiling, t.span_us)
    # the phases by self time, from the ops section (names as the marks read them)
    ops, rows = t.ops, []
    if {"calls", "self_cpu_us"} <= set(ops.columns):
        phases = ops.filter(pl.col("name").is_in(m["name"].unique().implode()))
        top = phases.sort(["self_cpu_us", "name"], descending=[True, False]).head(EVIDENCE_ROWS)
        rows = top.select("name", "calls", "self_cpu_us").rows()
    evidence = [Evidence("phase", name, n, s, pct(s, t.span_us), "the window", "self time") for name, n, s in rows]
    evidence.append(
        Evidence("measure", "torch.compile compiling (union of its phases)", None, compiling, share, of="the window")
    )
    if t.has_device:
        idle = t.idle_within(u)
        evidence.append(
            Evidence("device", "device idle while it compiled", None, idle, pct(idle, t.span_us), of="the window")
        )
    steps = _steps_compiling(t, m)
    if steps is not None:
        with_compile, total = steps
        evidence.append(
            Evidence(
                "steps", "ProfilerSteps that compile", with_compile, None, pct(with_compile, total), of="the steps"
            )
        )
    if steps is not None and with_compile > 1:  # compiling again in later steps: a guard fails
        title = (
            f"torch.compile recompiles: {with_compile:,} of {total:,} steps compile, {ms(compiling)} "
            f"({share:.0f}% of the window); the window shows no steady state"
        )
    else:
        title = (
            f"One-off work in the window: torch.compile compiled for {ms(compiling)} ({share:.0f}% of the "
            "window); the window shows a start-up, not the steady state"
        )
    return Finding(
        ID,
        title,
        (0.0, 0.0),
        None,
        t.worded(ID, "remedy"),
        "ops",
        tuple(evidence),
        basis="no run-time saving claimed: a compilation runs once per graph and process (again at each "
        "recompile); the other findings' shares are of a window that includes it",
    )


def _steps_compiling(t: Facts, m: pl.DataFrame) -> tuple[int, int] | None:
    """(steps holding a compilation phase, steps) of the trace's ProfilerSteps; None without steps."""
    steps = t.f.any_cpu().steps
    if not steps.height:
        return None
    starts = np.sort(m["ts_ns"].to_numpy())
    inside = np.searchsorted(starts, steps["end_ns"].to_numpy()) - np.searchsorted(starts, steps["ts_ns"].to_numpy())
    return int((inside > 0).sum()), steps.height
