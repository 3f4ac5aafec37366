"""coverage: where a kernel's cost came from (`SOURCES`), and why a kernel has none (`CAUSES`).

Both are data: a new source or cause is one entry. A kernel's `unmodelled_reason` is the first
cause in `CAUSES` whose condition holds for it (`unmodelled_reason`), over the columns costing
has at hand (`CAUSE_INPUTS`): its launch, its op, why the op got no cost (`op_reason`, set per op
in `pipeline.cost.enrich.op_costs`), whether a communication library issues it itself
(`library_task`: `comm_kernels.OWN_TASK`) and whether the trace recorded shapes and launches at all
(`trace_shapes`, `trace_launches`). Each cause
says what it means, what would give those kernels a cost (`remedy`; None where nothing can from
what the trace holds) and the real trace that taught it. `analyze --section coverage`, the
roofline's coverage note and the documentation's table are made from these entries.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

GRAPH_LAUNCH = r"(?i)GraphLaunch"  # cudaGraphLaunch, hipGraphLaunch, cuGraphLaunch


@dataclass(frozen=True)
class Source:
    """Where the FLOPs and bytes of costed kernels came from (gpu_ops.cost_source)."""

    name: str
    summary: str


SOURCES = (
    Source("formula", "the built-in formula of the op that launched it (`pipeline/cost/formulas/`)"),
    Source("user_formula", "the op's entry in the formula file given with --formulas"),
    Source("inductor", "Inductor's own estimate (`kernel_flop`, `kernel_num_gb`) on the launch it records"),
    Source("transfer", "a memcpy / memset: its own byte count, 0 FLOPs"),
)


@dataclass(frozen=True)
class Cause:
    """Why some kernels have no cost: the gpu_ops.unmodelled_reason value `name`, when it holds
    (default: the op's own reason is `name`), what it means, the remedy (short enough for a table
    at 80 columns; the README says more; None: none exists for this trace) and the real trace
    that taught it."""

    name: str
    summary: str
    remedy: str | None
    taught_by: str
    when: pl.Expr | None = None

    def condition(self) -> pl.Expr:
        return self.when if self.when is not None else pl.col("op_reason") == self.name


_NO_OP = pl.col("cpu_op_event_idx").is_null()

CAUSES = (
    Cause(
        "library_task",
        "a task a communication library (HCCL) puts on the device itself inside a collective, with no "
        "launch of its own: the collective's size is in the collectives table",
        None,
        "ascend/npu_level0_rank0: HCCL's Notify Wait, SDMA and Write Value tasks, 94% of NPU time",
        pl.col("launch_event_idx").is_null() & pl.col("library_task").fill_null(False),
    ),
    Cause(
        "no_cpu_activity",
        "no kernel of the trace links to a CPU launch: profiled without ProfilerActivity.CPU (or unlinked)",
        "ProfilerActivity.CPU",
        "tests/test_coverage.py: a trace of GPU activity alone",
        pl.col("launch_event_idx").is_null() & ~pl.col("trace_launches").fill_null(True),
    ),
    Cause(
        "no_launch",
        "its launch is not in the trace: queued before profiling began",
        "sync before profiling",
        "tracelens/h100_qwen1.5_0.5b: 30% of GPU time, kernels queued before the profiler started",
        pl.col("launch_event_idx").is_null(),
    ),
    Cause(
        "graph_replay_ambiguous",
        "replayed by a graph launch whose kernels match captured graphs of different ops (never guessed)",
        "only its capture",
        "tests/test_graphs.py: graphs with the same kernels and other shapes, replayed out of capture order",
    ),
    Cause(
        "graph_replay_unmatched",
        "replayed by a graph launch whose kernels match no graph of the capture traces given",
        "its capture trace",
        "tests/test_graphs.py: a replay of a graph the capture trace does not hold",
    ),
    Cause(
        "graph_replay",
        "replayed by a CUDA/HIP graph launch: the op that captured it is in the capture trace",
        "--graph-capture FILE",
        "tracelens/mi300x_vllm_graph_replay: 96% of GPU time under 25 hipGraphLaunch",
        _NO_OP & pl.col("launch_name").cast(pl.String).str.contains(GRAPH_LAUNCH),
    ),
    Cause(
        "no_cpu_op",
        "launched outside any CPU op (no op or record_function around the launch)",
        None,
        "hta/a100_old_format_rank0: optimizer and NCCL kernels launched outside ops, 8% of GPU time",
        _NO_OP,
    ),
    Cause(
        "compiled_region",
        "launched by torch.compile'd code that records no op of its own per kernel",
        None,
        "hta/diff_test_v100: cuBLAS and Triton kernels under CompiledFunction(Backward), 33% of GPU time",
    ),
    Cause(
        "inductor_no_estimate",
        "an Inductor (Triton) kernel whose launch record carries no estimate",
        "benchmark_kernel=True",
        "hta/triton_example, tracelens/b200_eager: triton_poi_* launches with kernel_backend, no kernel_flop",
    ),
    Cause(
        "no_formula",
        "the op that launched it has no formula (a custom or unlisted op)",
        "--formulas FILE.toml",
        "tracelens/b200_eager: vllm::moe_forward and other custom ops, 88% of GPU time",
    ),
    Cause(
        "user_formula_error",
        "the op's entry in the --formulas file failed on its inputs (the warning says why)",
        "fix --formulas entry",
        "tests/test_user_formulas.py",
    ),
    Cause(
        "record_shapes_off",
        "the trace records no input shapes at all (profiled with record_shapes=False)",
        "record_shapes=True",
        "hta/a100_nccl, param/rtx2080_resnet: no op has Input Dims",
        (pl.col("op_reason") == "no_shapes") & ~pl.col("trace_shapes").fill_null(False),
    ),
    Cause(
        "no_shapes",
        "the op records no input shapes, though the trace's other ops do",
        None,
        "hta/diff_control_a100: record_param_comms without Input Dims, 37% of GPU time",
    ),
    Cause(
        "shapes_not_modelled",
        "the op's recorded inputs do not determine its cost (a TensorList recorded as [], no strides)",
        None,
        "hta/a100_old_format_rank0: aten::cat of TensorLists without shapes; kineto/v100_tbplugin_resnet50: "
        "convolutions without Concrete Inputs",
    ),
)
BY_NAME = {c.name: c for c in CAUSES}
# what `unmodelled_reason` reads (besides `kind`): the link columns and, per op, its cost's reason
CAUSE_INPUTS = (
    "launch_event_idx",
    "launch_name",
    "cpu_op_event_idx",
    "op_reason",
    "trace_shapes",
    "trace_launches",
    "library_task",
)
OP_REASONS = tuple(c.name for c in CAUSES if c.when is None)  # the reasons `op_costs` gives an op


def unmodelled_reason(costed: pl.Expr) -> pl.Expr:
    """Why a kernel has no cost: the first cause that holds (null for a costed kernel or a transfer;
    an op reason no cause names is kept as it is)."""
    out = pl.when(pl.col("kind") != "kernel").then(None).when(costed).then(None)
    for c in CAUSES:
        out = out.when(c.condition()).then(pl.lit(c.name))
    return out.otherwise(pl.col("op_reason")).cast(pl.String)


def remedy(cause: str | None) -> str | None:
    c = BY_NAME.get(cause or "")
    return c.remedy if c else None


def summary(cause: str | None) -> str | None:
    c = BY_NAME.get(cause or "")
    return c.summary if c else None


def causes_markdown() -> str:
    """The causes as a Markdown table (the documentation)."""
    lines = ["| cause | what it means | remedy | taught by |", "| --- | --- | --- | --- |"]
    for c in CAUSES:
        lines.append(f"| `{c.name}` | {c.summary} | {c.remedy or '(none)'} | {c.taught_by} |")
    return "\n".join(lines) + "\n"
