"""Convolution formulas: every forward and backward convolution op, from a table of argument layouts.

FLOPs are exactly those of ``torch.utils.flop_counter`` (tests/test_formulas_oracle.py checks them):
bias adds are not counted; a transposed convolution counts ``2·N·prod(input spatial)·Cin·
(Cout/groups)·prod(kernel)``; ``convolution_backward`` counts grad_input like the forward and
grad_weight as torch does (``2·N·Cin·Cout·prod(kernel)·prod(spatial)``, not divided by groups),
grad_bias as 0 FLOPs. The ops differ only in where they keep stride, padding... hence the layouts.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from math import prod
from typing import NamedTuple

from .inputs import OpInputs, Shape, need
from .registry import Formula, Work, aten, register


class ConvLayout(NamedTuple):
    """Where a forward convolution op keeps its arguments (input is 0 and weight 1 in all)."""

    stride: int | None
    padding: int | None
    dilation: int | None
    transposed: int | bool  # an input index, or fixed by the op
    output_padding: int | None
    groups: int | None


_CONV_LAYOUTS = {
    ("aten::convolution", "aten::_convolution", "aten::convolution_overrideable"): ConvLayout(3, 4, 5, 6, 7, 8),
    aten("conv1d conv2d conv3d"): ConvLayout(3, 4, 5, False, None, 6),
    aten("conv_transpose1d conv_transpose2d conv_transpose3d"): ConvLayout(3, 4, 7, True, 5, 6),
    aten("cudnn_convolution"): ConvLayout(3, 2, 4, False, None, 5),
    aten("cudnn_convolution_transpose"): ConvLayout(4, 2, 5, True, 3, 6),
    aten("miopen_convolution miopen_depthwise_convolution mkldnn_convolution"): ConvLayout(4, 3, 5, False, None, 6),
    aten("miopen_convolution_transpose"): ConvLayout(5, 3, 6, True, 4, 7),
    aten("_slow_conv2d_forward thnn_conv2d"): ConvLayout(4, 5, None, False, None, None),
    aten("slow_conv_transpose2d slow_conv_transpose3d"): ConvLayout(4, 5, 7, True, 6, None),
}


def _spatial_arg(inp: OpInputs, index: int | None, nsp: int, default: int, low: int) -> tuple[int, ...]:
    """A per-spatial-dim int list argument (one value is repeated), each value >= low."""
    values = (default,) * nsp if index is None else inp.ints_arg(index)
    values = values * nsp if len(values) == 1 else values
    need(len(values) == nsp and all(v >= low for v in values))
    return values


def _transposed(inp: OpInputs, transposed: int | bool) -> bool:
    """Fixed by the op (a bool), or read from the op's `transposed` argument (an input index)."""
    return transposed if isinstance(transposed, bool) else inp.flag_arg(transposed)


def conv_output_shape(
    x: Shape,
    w: Shape,
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    transposed: bool,
    output_padding: Sequence[int],
    groups: int,
) -> Shape:
    """The output shape of a (transposed) convolution; Insufficient when the shapes disagree."""
    n, cin, size = x[0], x[1], x[2:]
    kernel = w[2:]
    if transposed:
        need(cin == w[0])
        cout = w[1] * groups
        out = [
            (i - 1) * s - 2 * p + d * (k - 1) + op + 1
            for i, s, p, d, k, op in zip(size, stride, padding, dilation, kernel, output_padding, strict=True)
        ]
    else:
        need(cin == w[1] * groups and w[0] % groups == 0)
        cout = w[0]
        out = [
            (i + 2 * p - d * (k - 1) - 1) // s + 1
            for i, s, p, d, k in zip(size, stride, padding, dilation, kernel, strict=True)
        ]
    need(all(o >= 1 for o in out))
    return (n, cout, *out)


def conv_flops(x: Shape, w: Shape, out: Shape, transposed: bool) -> int:
    """torch.utils.flop_counter.conv_flop_count: 2·N·prod(spatial)·w0·w1·prod(kernel), where the
    spatial size is the output's (regular) or the input's (transposed)."""
    spatial = (x if transposed else out)[2:]
    return 2 * x[0] * prod(spatial) * w[0] * w[1] * prod(w[2:])


def _conv_forward(layout: ConvLayout, inp: OpInputs) -> Work:
    x, w = inp.tensor(0), inp.tensor(1)
    nsp = len(w) - 2
    need(nsp >= 1 and len(x) == len(w))
    transposed = _transposed(inp, layout.transposed)
    stride = _spatial_arg(inp, layout.stride, nsp, 1, 1)
    padding = _spatial_arg(inp, layout.padding, nsp, 0, 0)
    dilation = _spatial_arg(inp, layout.dilation, nsp, 1, 1)
    output_padding = _spatial_arg(inp, layout.output_padding, nsp, 0, 0)
    groups = 1 if layout.groups is None else inp.int_arg(layout.groups)
    need(groups >= 1)
    out = conv_output_shape(x, w, stride, padding, dilation, transposed, output_padding, groups)
    return Work(conv_flops(x, w, out, transposed), [out])


for _names, _layout in _CONV_LAYOUTS.items():
    register(
        Formula(
            _names,
            "conv",
            "2·N·prod(out spatial)·Cout·(Cin/groups)·prod(kernel); transposed: "
            "2·N·prod(in spatial)·Cin·(Cout/groups)·prod(kernel) (bias not counted)",
            "input + weight + bias + out (size from stride, padding, dilation, output_padding, groups)",
            partial(_conv_forward, _layout),
        )
    )


class ConvBackwardLayout(NamedTuple):
    """Where a convolution backward op keeps its arguments."""

    grad_output: int
    input: int
    weight: int
    transposed: int | bool
    output_mask: int  # -1: the last input (legacy cudnn/miopen/mkldnn backward ops)


_CONV_BACKWARD_LAYOUTS = {
    aten("convolution_backward"): ConvBackwardLayout(0, 1, 2, 7, 10),
    # torch <= 1.10 layouts: (self, grad_output, weight, padding, ..., output_mask)
    aten(
        "cudnn_convolution_backward miopen_convolution_backward miopen_depthwise_convolution_backward "
        "mkldnn_convolution_backward"
    ): ConvBackwardLayout(1, 0, 2, False, -1),
    aten("cudnn_convolution_transpose_backward miopen_convolution_transpose_backward"): ConvBackwardLayout(
        1, 0, 2, True, -1
    ),
}


def _conv_backward(layout: ConvBackwardLayout, inp: OpInputs) -> Work:
    go, x, w = inp.tensor(layout.grad_output), inp.tensor(layout.input), inp.tensor(layout.weight)
    need(len(w) >= 3 and len(go) == len(x) == len(w) and go[0] == x[0])
    transposed = _transposed(inp, layout.transposed)
    need(x[1] == w[0] if transposed else go[1] == w[0])
    mask = inp.flags_arg(layout.output_mask % inp.n)
    need(len(mask) in (2, 3))
    grad_in, grad_w, grad_b = (mask + (False,))[:3]
    spatial = prod((x if transposed else go)[2:])
    kernel = prod(w[2:])
    flops = 0
    if grad_in:  # conv_transpose(grad_out, weight): the forward's FLOPs
        flops += 2 * go[0] * spatial * w[0] * w[1] * kernel
    if grad_w:  # conv(input, grad_out) over channels: torch does not divide by groups
        flops += 2 * go[0] * x[1] * go[1] * kernel * spatial
    grads = zip((x, w, (go[1],)), (grad_in, grad_w, grad_b), strict=True)
    return Work(flops, [shape for shape, wanted in grads if wanted])


for _names, _backward_layout in _CONV_BACKWARD_LAYOUTS.items():
    register(
        Formula(
            _names,
            "conv",
            "per output_mask: grad_input = forward FLOPs; grad_weight = "
            "2·N·Cin·Cout·prod(kernel)·prod(out spatial, or in spatial if transposed); "
            "grad_bias 0 (torch's conv_backward_flop)",
            "grad_out + input + weight + the masked grads (input, weight, [Cout] bias)",
            partial(_conv_backward, _backward_layout),
        )
    )
