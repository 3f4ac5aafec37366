"""names: kernel names made readable (demangled), and op and kernel names as keys that match
across vendors, libraries and builds (`diff`).

`readable` turns an Itanium-mangled C++ name (`_ZN7ck_tile6kentryILi1E...`, as ROCm and some CUDA
libraries write kernel names) into its C++ form for display and grouping; the tables keep the raw
name. It uses the `cpp_demangle` package (the `demangle` extra: the Rust crate of the gimli project,
fuzzed, with recursion limits) and falls back to the raw name when the package is absent or a name
does not demangle. A trace is untrusted, so demangling is bounded: names over MAX_MANGLED
characters are not tried, results over MAX_DEMANGLED are dropped, and once a process has spent
DEMANGLE_BUDGET_S seconds demangling, further names stay raw (a crafted 300-character name can
take a second and a hundred megabytes to expand).

Both key tables are declarative rules applied in order: `OP_ALIASES` maps vendor-specific ops to
one key, `KERNEL_NAME_RULES` strips what changes from build to build (templates, hashes, suffixes).
"""

from __future__ import annotations

import re
import time
from functools import lru_cache

import polars as pl

try:
    from cpp_demangle import demangle as _demangle
except ImportError:  # optional: raw names are shown
    _demangle = None

MANGLED_PREFIXES = ("_Z", "__Z")  # Itanium C++ ABI (`__Z` on Mach-O)
MAX_MANGLED = 32_768  # characters: longer names are not demangled
MAX_DEMANGLED = 65_536  # characters: a longer result is dropped (the raw name is kept)
DEMANGLE_BUDGET_S = 2.0  # seconds per process; then names stay raw
_spent = [0.0]


@lru_cache(maxsize=1 << 16)
def readable(name: str) -> str:
    """The C++ form of an Itanium-mangled name (`_Z3fooi` -> `foo(int)`); any other name, one that
    does not demangle, or any name when `cpp_demangle` is absent or the budget is spent: as it is."""
    if _demangle is None or not name.startswith(MANGLED_PREFIXES) or len(name) > MAX_MANGLED:
        return name
    if _spent[0] >= DEMANGLE_BUDGET_S:
        return name
    start = time.perf_counter()
    try:
        out = _demangle(name)
    except Exception:  # ValueError on a malformed name; never let a trace's name stop a report
        out = name
    finally:
        _spent[0] += time.perf_counter() - start
    return out if 0 < len(out) <= MAX_DEMANGLED else name


def readable_names(names: pl.Expr) -> pl.Expr:
    """`readable` over a string column, once per distinct name."""

    def batch(s: pl.Series) -> pl.Series:
        mangled = s.filter(s.str.starts_with("_Z") | s.str.starts_with("__Z")).unique()
        if mangled.is_empty():
            return s
        table = {m: readable(m) for m in mangled.to_list()}
        return s.replace(table)

    return names.map_batches(batch, return_dtype=pl.String)


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

# Launch wrappers: kernels whose name is a generic entry point, the kernel being its template
# argument; as (regex, replacement) giving that argument's name (mi300x_vllm_graph_replay's
# `ck_tile::kentry<1, ck_tile::Rmsnorm2dFwd<...>, ...>`, a100_nccl's
# `cutlass_cudnn_train::Kernel<cutlass_cudnn_train::conv::kernel::ImplicitGemmConvolution<...>>`).
LAUNCH_WRAPPERS: tuple[tuple[str, str], ...] = (
    (r"^(?:void\s+)?ck_tile::kentry<\d+,\s*([\w:]+).*$", "$1"),
    (r"^(?:void\s+)?cutlass\w*::Kernel2?<([\w:]+).*$", "$1"),
)

# Kernel names reduced to what survives across builds: launch wrappers, template arguments,
# parameter lists, return types, hex hashes and Inductor's numeric suffixes dropped, as (regex,
# replacement).
KERNEL_NAME_RULES: tuple[tuple[str, str], ...] = (
    *LAUNCH_WRAPPERS,
    (r"\(anonymous namespace\)::", ""),
    (r"^(?:void\s+)?std::enable_if<.*?>::type\s+", ""),  # SFINAE return type (may hold `(8)>(0)`)
    *((r"<[^<>]*>", ""),) * 8,  # template arguments, innermost first (nesting up to 8 deep)
    (r"\(.*$", ""),  # parameter list, and "(Pinned -> Device)" of copies
    (r"^(?:void|\S+::type)\s+", ""),  # return type
    (r"_[0-9a-f]{16,}", ""),  # hashes (and old triton__0d1d2d... signatures)
    (r"^(triton_\w+?)_\d+$", "$1"),  # triton_poi_fused_add_0 -> triton_poi_fused_add
    (r"\s+", " "),
)


def unwrapped(name: str) -> str:
    """The kernel a launch wrapper's name (`LAUNCH_WRAPPERS`) launches; other names as they are."""
    for pattern, repl in LAUNCH_WRAPPERS:
        out = re.sub(pattern, repl.replace("$1", r"\1"), name)
        if out != name:
            return out
    return name


def normalize_op(name: pl.Expr) -> pl.Expr:
    """An op name as a cross-vendor key: overload suffix dropped, `OP_ALIASES` applied."""
    out = name.str.replace(OVERLOAD_SUFFIX, "$1")
    for pattern, key in OP_ALIASES:
        out = out.str.replace(pattern, key)
    return out


def normalize_kernel(name: pl.Expr) -> pl.Expr:
    """A kernel name (demangled) without launch wrappers, template arguments, parameters, return
    type and hashes."""
    name = readable_names(name)
    out = name
    for pattern, repl in KERNEL_NAME_RULES:
        out = out.str.replace_all(pattern, repl)
    return pl.when(out.str.strip_chars() == "").then(name).otherwise(out.str.strip_chars())
