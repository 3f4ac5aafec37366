"""names: op and kernel names as keys that match across vendors, libraries and builds (`diff`).

Both are declarative rule tables applied in order: `OP_ALIASES` maps vendor-specific ops to one
key, `KERNEL_NAME_RULES` strips what changes from build to build (templates, hashes, suffixes).
"""

from __future__ import annotations

import polars as pl

# Op names that mean the same operation across vendors and libraries, applied in order to the
# name (after an optional overload suffix `.Tensor`, `.out`, ... is dropped) as (regex, key).
OP_ALIASES: tuple[tuple[str, str], ...] = (
    (
        r"^aten::(?:cudnn|miopen|mkldnn|thnn|_nnpack|slow|_slow)_conv(?:olution|_dilated[23]d|2d|3d)?$",
        "aten::convolution",
    ),
    (r"^aten::(?:cudnn|miopen)_depthwise_convolution$|^aten::_conv_depthwise2d$", "aten::convolution"),
    (
        r"^aten::(?:cudnn|miopen|mkldnn)_convolution_transpose$|^aten::slow_conv_transpose[23]d$",
        "aten::convolution_transpose",
    ),
    (r"^aten::(?:cudnn|miopen|mkldnn)_convolution_backward(?:_input|_weight|_bias)?$", "aten::convolution_backward"),
    (r"^aten::(?:cudnn|miopen|native|_native)_batch_norm(?:_legit)?(?:_no_training)?$", "aten::batch_norm"),
    (r"^aten::(?:cudnn|miopen|native)_batch_norm_backward$", "aten::batch_norm_backward"),
    (r"^aten::_(?:cudnn|miopen)_rnn$", "aten::rnn"),
    (r"^aten::_(?:cudnn|miopen)_rnn_backward$", "aten::rnn_backward"),
    (
        r"^aten::_(?:scaled_dot_product_)?(?:flash|efficient|cudnn|fused)_attention(?:_for_cpu)?(?:_forward)?$",
        "aten::scaled_dot_product_attention",
    ),
    (
        r"^aten::_(?:scaled_dot_product_)?(?:flash|efficient|cudnn|fused)_attention(?:_for_cpu)?_backward$",
        "aten::scaled_dot_product_attention_backward",
    ),
    (r"^(?:nccl|rccl):(.+)$", "collective:$1"),
)
OVERLOAD_SUFFIX = r"^(\w[\w.]*::\w+)\.\w+$"

# Kernel names reduced to what survives across builds: template arguments, parameter lists,
# return types, hex hashes and Inductor's numeric suffixes dropped, as (regex, replacement).
KERNEL_NAME_RULES: tuple[tuple[str, str], ...] = (
    (r"\(anonymous namespace\)::", ""),
    (r"^(?:void\s+)?std::enable_if<.*?>::type\s+", ""),  # SFINAE return type (may hold `(8)>(0)`)
    *((r"<[^<>]*>", ""),) * 8,  # template arguments, innermost first (nesting up to 8 deep)
    (r"\(.*$", ""),  # parameter list, and "(Pinned -> Device)" of copies
    (r"^(?:void|\S+::type)\s+", ""),  # return type
    (r"_[0-9a-f]{16,}", ""),  # hashes (and old triton__0d1d2d... signatures)
    (r"^(triton_\w+?)_\d+$", "$1"),  # triton_poi_fused_add_0 -> triton_poi_fused_add
    (r"\s+", " "),
)


def normalize_op(name: pl.Expr) -> pl.Expr:
    """An op name as a cross-vendor key: overload suffix dropped, `OP_ALIASES` applied."""
    out = name.str.replace(OVERLOAD_SUFFIX, "$1")
    for pattern, key in OP_ALIASES:
        out = out.str.replace(pattern, key)
    return out


def normalize_kernel(name: pl.Expr) -> pl.Expr:
    """A kernel name without template arguments, parameters, return type and hashes."""
    out = name
    for pattern, repl in KERNEL_NAME_RULES:
        out = out.str.replace_all(pattern, repl)
    return pl.when(out.str.strip_chars() == "").then(name).otherwise(out.str.strip_chars())
