"""Elementwise formulas: pointwise arithmetic, activations, comparisons and their _foreach_ forms.

These count approximate work (torch's counter counts none): k FLOPs per output element, with a
per-op k: 1 for one arithmetic or transcendental function, more for composite ones (silu, gelu,
the activation backwards). The output is the broadcast of the tensor inputs.
"""

from __future__ import annotations

from functools import partial
from math import prod

from .inputs import Insufficient, OpInputs, broadcast, need
from .registry import Formula, Work, aten, register


def elementwise_work(k: int, out_dtype: str | None, inp: OpInputs) -> Work:
    """k FLOPs per element of the broadcast of all tensor inputs, which is also the output."""
    shapes = [s for s in (inp.shape(i) for i in range(inp.n)) if s is not None]
    need(shapes)
    try:
        out = broadcast(*shapes)
    except Insufficient:  # an `out=` tensor recorded before its resize ([0]) does not broadcast
        out = broadcast(*[s for s in shapes if prod(s)])
    return Work(k * prod(out), [out], out_dtype=out_dtype)


_ELEMENTWISE = (
    # (FLOPs per output element, ops with an in-place `_` form, ops without, output dtype)
    (
        1,
        "add sub mul div true_divide floor_divide rsub neg abs sign sgn reciprocal sqrt rsqrt exp exp2 "
        "expm1 log log2 log10 log1p sin cos tan asin acos atan sinh cosh sigmoid tanh erf erfc erfinv "
        "relu relu6 leaky_relu hardtanh threshold clamp clamp_min clamp_max floor ceil round trunc frac "
        "pow square fmod remainder atan2 hypot masked_fill nan_to_num bitwise_not bitwise_and "
        "bitwise_or bitwise_xor xlogy",
        "maximum minimum where fmax fmin threshold_backward hardtanh_backward",
        None,
    ),
    (
        2,
        "silu elu selu celu hardswish hardsigmoid softplus",
        "native_dropout native_dropout_backward leaky_relu_backward",
        None,
    ),
    (
        3,
        "addcmul addcdiv lerp mish",
        "sigmoid_backward tanh_backward elu_backward hardswish_backward hardsigmoid_backward softplus_backward",
        None,
    ),
    (5, "gelu", "silu_backward mish_backward", None),
    (8, "", "gelu_backward", None),
    (
        1,
        "",
        "eq ne lt le gt ge logical_not logical_and logical_or logical_xor isnan isinf isfinite isneginf isposinf",
        "bool",
    ),
)
for _k, _inplace, _plain, _out in _ELEMENTWISE:
    register(
        Formula(
            aten(_inplace, inplace=True) + aten(_plain),
            "elementwise",
            f"{_k}·numel(out), out = broadcast of tensor inputs",
            "tensor inputs + out" + (f" ({_out})" if _out else ""),
            partial(elementwise_work, _k, _out),
        )
    )


def _foreach(k: int, inp: OpInputs) -> Work:
    """k FLOPs per element of the first TensorList, whose shapes are also the outputs."""
    shapes = inp.shapes(0)
    need(shapes)
    return Work(k * sum(prod(s) for s in shapes), shapes)


_FOREACH = (
    # (FLOPs per element, ops: each registered as aten::_foreach_<op> and its in-place form)
    (1, "add sub mul div neg abs sqrt rsqrt exp log reciprocal sigmoid maximum minimum clamp_min clamp_max sign"),
    (3, "addcmul addcdiv lerp"),
)
for _k, _ops in _FOREACH:
    register(
        Formula(
            aten(" ".join(f"_foreach_{n}" for n in _ops.split()), inplace=True),
            "elementwise",
            f"{_k}·total numel of the first TensorList",
            "all tensors + the first list's shapes written",
            partial(_foreach, _k),
        )
    )
