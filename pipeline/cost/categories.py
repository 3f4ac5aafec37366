"""categories: the declarative table that names what a GPU op is (gemm, attention, triton_*, ...).

Rows are tried in order: the first whose `kind` (memcpy/memset) or kernel-name regex matches
wins; only when none does is the CPU op name tried. Used by `cost` (the `gpu_ops.category`
column) and `report` (time by category). The kernels of `communication` are those of the
communication libraries' table (`comm_kernels`).
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from pipeline.cost.comm_kernels import COMM_KERNEL, OWN_TASK
from pipeline.cost.memo import Memo, classified


@dataclass(frozen=True)
class Category:
    """One kernel category. A GPU op gets the first category whose `kind` equals its kind or whose
    `kernel` regex matches its name; if none, the first whose `op` regex matches its CPU op's name;
    else `other`. (The kernel name is the stronger evidence: an elementwise kernel launched by
    aten::addmm stays elementwise.)"""

    name: str
    kernel: str | None = None
    op: str | None = None
    kind: str | None = None


_ELEMENTWISE_OPS = (
    "add|add_|sub|sub_|mul|mul_|div|div_|pow|neg|exp|log|sqrt|rsqrt|reciprocal|sin|cos|"
    "tanh|sigmoid|silu|gelu|relu|relu_|threshold_backward|clamp|clamp_|where|copy_|_to_copy|"
    "to|fill_|zero_|zeros|ones|cat|stack|index|index_select|index_put_|masked_fill|eq|ne|lt|"
    "gt|le|ge|abs|arange|embedding|dropout|lerp_|addcmul_|addcdiv_|_foreach_\\w+"
)
CATEGORIES: tuple[Category, ...] = (
    Category("memcpy", kind="memcpy"),
    Category("memset", kind="memset"),
    Category("sync", kind="sync"),  # a device stream waiting for or recording an event (Ascend)
    Category(
        "communication",
        kernel=COMM_KERNEL,  # every communication library's kernels (comm_kernels.LIBRARIES)
        op=r"(?i)^(?:nccl|rccl|gloo|c10d)[:]|record_param_comms|all_?reduce|all_?gather|reduce_scatter|all_?to_?all|broadcast",
    ),
    Category("triton_persistent_reduction", kernel=r"^triton_per_"),
    Category("triton_reduction", kernel=r"^triton_red_"),
    Category("triton_pointwise", kernel=r"^triton_poi_"),
    Category("inductor_cpp", kernel=r"^cpp_fused_"),
    Category(
        "embedding",
        kernel=r"(?i)split_embedding|embedding_bag|pooled_embs|bounds_check_indices",
        op=r"(?i)^fbgemm::|SplitLookup|embedding_bag",
    ),
    Category("attention", kernel=r"(?i)flash|fmha|attn|attention|sdpa", op=r"(?i)attention|sdpa"),
    Category(
        "normalization",
        kernel=r"(?i)_norm|norm_|layernorm|rmsnorm|batchnorm|groupnorm|bn_fw|bn_bw|softmax",
        op=r"(?i)norm|softmax",
    ),
    Category(
        "conv",
        kernel=r"(?i)convol|conv[123]d|fprop|dgrad|wgrad|implicit_?gemm|winograd|^triton_tem_fused_convolution",
        op=r"(?i)convolution|conv[123]d|conv_transpose",
    ),
    Category(
        "gemm",
        kernel=r"(?i)(?:^|[^b])gemm|gemv|Cijk_|xmma|wgmma|nvjet|matmul|splitKreduce|^bmm_|^triton_tem_fused_(?:addmm|mm|bmm)",
        op=r"^aten::(?:mm|addmm|bmm|baddbmm|matmul|linear|_scaled_mm|addmv|mv|dot|_addmm_activation)$",
    ),
    Category("triton_other", kernel=r"^triton_"),  # templates (tem_) matched above; old `triton__0d1d2d...`
    Category(
        "pooling",
        kernel=r"(?i)pool(?:ing)?_?(?:forward|backward|2d|3d|1d|nchw|nhwc|kernel)|avg_pool|max_pool",
        op=r"(?i)pool[123]d|_pool",
    ),
    Category(
        "sort", kernel=r"(?i)radixsort|bitonic|sort_kernel|segmented_?sort", op=r"^aten::(?:sort|argsort|unique\w*)$"
    ),
    Category(
        "reduction",
        kernel=r"(?i)reduce|reduction|argmax|argmin|topk|cumsum|scan",
        op=r"^aten::(?:sum|mean|max|min|amax|amin|argmax|argmin|prod|std|var|all|any|cumsum|topk|norm)$",
    ),
    Category(
        "elementwise",
        kernel=r"(?i)elementwise|pointwise|unrolled|vectorized|copy|fill|cat_?array|index|gather|scatter|multi_tensor_apply|where|masked",
        op=rf"^aten::(?:{_ELEMENTWISE_OPS})$",
    ),
)
OTHER = "other"


def category_expr(name: pl.Expr, op: pl.Expr, kind: pl.Expr) -> pl.Expr:
    """The category of a GPU op (see `Category`) from its kernel name, CPU op name and kind."""
    first = []
    for c in CATEGORIES:
        if c.kind:
            first.append(pl.when(kind == c.kind).then(pl.lit(c.name)))
        elif c.kernel:
            first.append(pl.when(name.str.contains(c.kernel)).then(pl.lit(c.name)))
    fallback = [pl.when(op.str.contains(c.op)).then(pl.lit(c.name)) for c in CATEGORIES if c.op]
    return pl.coalesce(*first, *fallback, pl.lit(OTHER))


CategoryMemo = Memo  # the categories of the (name, op, kind) seen so far (`memo.classified`)


def with_category(
    frame: pl.DataFrame,
    name: str = "name",
    op: str = "cpu_op_name",
    kind: str = "kind",
    memo: Memo | None = None,
) -> pl.DataFrame:
    """`frame` with a `category` column from its `name`, `op` and `kind` columns (`category_expr`),
    computed once per distinct (name, op, kind) (`memo.classified`; a CPU-only trace uses the op
    name as kernel name)."""
    return classified(
        frame, [name, op, kind], lambda text: {"category": category_expr(text(name), text(op), text(kind))}, memo
    )


def with_library_task(frame: pl.DataFrame, memo: Memo | None = None) -> pl.DataFrame:
    """`frame` with `library_task`: whether its kernel is a task a communication library issues
    itself, without a launch of its own (`comm_kernels.OWN_TASK`), each distinct name classified once."""
    if not OWN_TASK:
        return frame.with_columns(library_task=pl.lit(False))
    task = lambda text: {"library_task": (pl.col("kind") == "kernel") & text("name").str.contains(OWN_TASK)}
    return classified(frame, ["name", "kind"], task, memo)
