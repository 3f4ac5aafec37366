"""Normalisation formulas: layer/batch/group/instance/RMS norms and softmax, forward and backward.

These count approximate work (torch's counter counts none): a fixed number of FLOPs per element of
the input, from the arithmetic each op does per element (mean, variance, normalise, scale...).
"""

from __future__ import annotations

from functools import partial
from math import prod

from .inputs import OpInputs
from .registry import Formula, Work, aten, formula, register


def per_element(k: int, inp: OpInputs, like: int = 0, out_dtype: str | None = None) -> Work:
    """k FLOPs per element of input `like`; one output of its shape."""
    x = inp.tensor(like)
    return Work(k * prod(x), [x], out_dtype=out_dtype)


_NORMS = (
    # (FLOPs per element, ops, the input whose shape is the output)
    (
        5,
        aten(
            "layer_norm native_layer_norm batch_norm native_batch_norm _batch_norm_impl_index "
            "cudnn_batch_norm miopen_batch_norm _native_batch_norm_legit "
            "_native_batch_norm_legit_no_training group_norm native_group_norm instance_norm"
        ),
        "mean, variance, normalise, scale, shift",
    ),
    (4, aten("rms_norm _fused_rms_norm"), "square, mean, normalise, scale"),
    (
        8,
        aten(
            "native_layer_norm_backward native_batch_norm_backward native_group_norm_backward "
            "cudnn_batch_norm_backward miopen_batch_norm_backward"
        ),
        "two reductions and the combination (approximate)",
    ),
    (6, aten("_fused_rms_norm_backward"), "one reduction and the combination (approximate)"),
)
for _k, _names, _why in _NORMS:
    register(
        Formula(
            _names,
            "norm",
            f"{_k}·numel(input) ({_why})",
            "all tensor inputs + out (input's shape; mean/rstd/weight grads not counted)",
            partial(per_element, _k),
        )
    )


@formula(
    *aten("_softmax _log_softmax"),
    family="softmax",
    flops="5·numel (max, subtract, exp, sum, divide / log)",
    bytes="input + out (fp32 when half_to_float)",
)
def _softmax(inp: OpInputs) -> Work:
    return per_element(5, inp, out_dtype="fp32" if inp.concrete(2) is True else None)


@formula(*aten("softmax log_softmax"), family="softmax", flops="5·numel", bytes="input + out (dtype argument)")
def _softmax_public(inp: OpInputs) -> Work:
    return per_element(5, inp, out_dtype=inp.dtype_arg(2))


@formula(
    *aten("_softmax_backward_data _log_softmax_backward_data"),
    family="softmax",
    flops="4·numel (y·(g − Σg·y) / g − exp(y)·Σg)",
    bytes="grad + output + grad_input",
)
def _softmax_backward(inp: OpInputs) -> Work:
    return per_element(4, inp, out_dtype=inp.dtype_arg(3))
