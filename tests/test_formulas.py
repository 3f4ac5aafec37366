"""pipeline.cost.formulas: hand-computed costs per family, robustness, the old trace layout."""

from __future__ import annotations

import builtins
import gzip
import math
import os

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.cost.formulas import (
    ARGS_READ,
    FORMULAS,
    MODELLED_OPS,
    Cost,
    OpInputs,
    collective_bandwidth,
    collective_kind,
    formulas_markdown,
    normalize_dtype,
    op_cost,
    parse_literal,
)


def args(dims, types, concrete=None, strides=None, **extra):
    """A Kineto args dict; strides default to contiguous (omitted with strides=False)."""
    a = {"Input Dims": dims, "Input type": types, **extra}
    if concrete is not None:
        a["Concrete Inputs"] = concrete
    if strides is None:
        strides = [contiguous(d) if d and all(isinstance(x, int) for x in d) else [] for d in dims]
    if strides is not False:
        a["Input Strides"] = strides
    return a


def contiguous(shape):
    out, acc = [], 1
    for size in reversed(shape):
        out.insert(0, acc)
        acc *= size
    return out


def cost(name, a, fallback=None) -> Cost:
    c = op_cost(name, a, fallback)
    assert c is not None, f"{name}: no cost"
    return c


# ------------------------------------------------------------------------------------------ GEMM


def test_mm():
    c = cost("aten::mm", args([[64, 128], [128, 32]], ["float", "float"], ["", ""]))
    assert c == Cost(2 * 64 * 128 * 32, (64 * 128 + 128 * 32 + 64 * 32) * 4, "fp32", "gemm")
    assert isinstance(c.flops, float) and isinstance(c.bytes, float)


def test_addmm_counts_bias_bytes_not_bias_flops():
    c = cost(
        "aten::addmm",
        args(
            [[32], [64, 128], [128, 32], [], []], ["c10::BFloat16"] * 3 + ["Scalar", "Scalar"], ["", "", "", "1", "1"]
        ),
    )
    assert c.flops == 2 * 64 * 128 * 32
    assert c.bytes == (32 + 64 * 128 + 128 * 32 + 64 * 32) * 2
    assert c.dtype == "bf16"


def test_bmm_baddbmm_addbmm():
    assert cost("aten::bmm", args([[4, 8, 16], [4, 16, 2]], ["c10::Half"] * 2)).flops == 2 * 4 * 8 * 16 * 2
    c = cost("aten::baddbmm", args([[4, 8, 2], [4, 8, 16], [4, 16, 2], [], []], ["c10::Half"] * 3 + ["Scalar"] * 2))
    assert c.flops == 2 * 4 * 8 * 16 * 2 and c.bytes == (64 + 512 + 128 + 64) * 2
    c = cost("aten::addbmm", args([[8, 2], [4, 8, 16], [4, 16, 2], [], []], ["float"] * 3 + ["Scalar"] * 2))
    assert c.flops == 2 * 4 * 8 * 16 * 2 and c.bytes == (16 + 512 + 128 + 16) * 4
    assert op_cost("aten::bmm", args([[4, 8, 16], [5, 16, 2]], ["float"] * 2)) is None  # batch mismatch
    assert op_cost("aten::mm", args([[4, 8], [9, 2]], ["float"] * 2)) is None  # K mismatch


@pytest.mark.parametrize(
    "a, b, flops, out_numel",
    [
        ([2, 1, 8, 16], [3, 16, 4], 2 * 6 * 8 * 4 * 16, 2 * 3 * 8 * 4),  # broadcast batch [2,1] x [3] -> [2,3]
        ([8, 16], [5, 16, 4], 2 * 5 * 8 * 4 * 16, 5 * 8 * 4),  # 2-D x 3-D
        ([16], [16], 2 * 16, 1),  # dot
        ([3, 8, 16], [16], 2 * 3 * 8 * 16, 3 * 8),  # N-D x 1-D (mv)
        ([16], [2, 16, 4], 2 * 2 * 16 * 4, 2 * 4),  # 1-D x N-D
    ],
)
def test_matmul_broadcast_and_1d(a, b, flops, out_numel):
    c = cost("aten::matmul", args([a, b], ["float", "float"], ["", ""]))
    assert c.flops == flops
    numel = lambda s: math.prod(s)
    assert c.bytes == (numel(a) + numel(b) + out_numel) * 4


def test_matmul_rejects_mismatched_shapes():
    assert op_cost("aten::matmul", args([[2, 8, 16], [3, 16, 4]], ["float"] * 2)) is None
    assert op_cost("aten::matmul", args([[8, 16], [15, 4]], ["float"] * 2)) is None


def test_mv_dot_addmv():
    assert cost("aten::mv", args([[8, 16], [16]], ["float"] * 2)).flops == 2 * 8 * 16
    assert cost("aten::dot", args([[16], [16]], ["float"] * 2)).flops == 2 * 16
    assert cost("aten::addmv", args([[8], [8, 16], [16], [], []], ["float"] * 3 + ["Scalar"] * 2)).flops == 256


def test_linear():
    c = cost("aten::linear", args([[2, 5, 16], [8, 16], [8]], ["c10::BFloat16"] * 3, ["", "", ""]))
    assert c.flops == 2 * 10 * 8 * 16
    assert c.bytes == (160 + 128 + 8 + 2 * 5 * 8) * 2
    assert cost("aten::linear", args([[16], [8, 16], []], ["float", "float", ""])).flops == 2 * 8 * 16
    assert op_cost("aten::linear", args([[2, 15], [8, 16], []], ["float", "float", ""])) is None


def test_scaled_mm_fp8_with_out_dtype():
    c = cost(
        "aten::_scaled_mm",
        args(
            [[16, 32], [32, 64], [], [], [], [], [], []],
            ["c10::Float8_e4m3fn", "c10::Float8_e4m3fn", "float", "float", "", "", "Scalar", "Scalar"],
            ["", "", "", "", "", "", "15", "False"],
        ),
    )
    assert c.flops == 2 * 16 * 32 * 64 and c.dtype == "fp8"
    assert c.bytes == 16 * 32 + 32 * 64 + 4 + 4 + 16 * 64 * 2  # fp8 inputs, fp32 scales, bf16 out


# ----------------------------------------------------------------------------------- convolution

CONV_TYPES = ["float", "float", "", "ScalarList", "ScalarList", "ScalarList", "Scalar", "ScalarList", "Scalar"]


def conv_args(x, w, stride, padding, dilation, transposed, output_padding, groups, bias=None):
    return args(
        [x, w, bias or [], [], [], [], [], [], []],
        CONV_TYPES[:2] + ["float" if bias else ""] + CONV_TYPES[3:],
        ["", "", "", str(stride), str(padding), str(dilation), str(transposed), str(output_padding), str(groups)],
    )


def test_conv2d_stride_padding_dilation_groups():
    # out = (10 + 2·1 - 2·(3-1) - 1) // 2 + 1 = 4  ->  [1, 8, 4, 4]
    a = conv_args([1, 4, 10, 10], [8, 2, 3, 3], [2, 2], [1, 1], [2, 2], False, [0, 0], 2, bias=[8])
    c = cost("aten::convolution", a)
    assert c.flops == 2 * 1 * (4 * 4) * 8 * 2 * 9  # 2·N·out spatial·Cout·(Cin/groups)·k
    assert c.bytes == (400 + 144 + 8 + 128) * 4
    assert c.family == "conv"
    # the same call through aten::conv2d (input, weight, bias, stride, padding, dilation, groups)
    c2 = cost(
        "aten::conv2d",
        args(
            [[1, 4, 10, 10], [8, 2, 3, 3], [8], [], [], [], []],
            ["float"] * 3 + ["ScalarList"] * 3 + ["Scalar"],
            ["", "", "", "[2, 2]", "[1, 1]", "[2, 2]", "2"],
        ),
    )
    assert c2 == c


def test_conv1d_asymmetric_and_conv3d():
    # conv1d: out = (20 + 0 - 1·(5-1) - 1)//3 + 1 = 6
    c = cost(
        "aten::conv1d",
        args(
            [[2, 3, 20], [6, 3, 5], [], [], [], [], []],
            ["float", "float", "", "ScalarList", "ScalarList", "ScalarList", "Scalar"],
            ["", "", "", "[3]", "[0]", "[1]", "1"],
        ),
    )
    assert c.flops == 2 * 2 * 6 * 6 * 3 * 5
    # conv3d with per-dim parameters: out = [(4+2-1-1)//1+1, (6+0-2-1)//2+1, (5+0-1)//1+1] = [5, 2, 5]
    a = conv_args([1, 2, 4, 6, 5], [4, 2, 2, 3, 1], [1, 2, 1], [1, 0, 0], [1, 1, 1], False, [0, 0, 0], 1)
    assert cost("aten::convolution", a).flops == 2 * 1 * (5 * 2 * 5) * 4 * 2 * (2 * 3 * 1)


def test_conv_transpose_uses_input_spatial():
    # weight [Cin=4, Cout/groups=3, 3]; out = (5-1)·2 - 2·1 + 1·(3-1) + 1 + 1 = 10
    a = conv_args([1, 4, 5], [4, 3, 3], [2], [1], [1], True, [1], 1)
    c = cost("aten::convolution", a)
    assert c.flops == 2 * 1 * 5 * 4 * 3 * 3  # torch: input spatial for transposed
    assert c.bytes == (20 + 36 + 1 * 3 * 10) * 4
    ct = cost(
        "aten::conv_transpose1d",
        args(
            [[1, 4, 5], [4, 3, 3], [], [], [], [], [], []],
            ["float", "float", "", "ScalarList", "ScalarList", "ScalarList", "Scalar", "ScalarList"],
            ["", "", "", "[2]", "[1]", "[1]", "1", "[1]"],
        ),
    )
    assert ct == c
    # groups = 2: Cout = 3·2
    g = cost("aten::convolution", conv_args([1, 4, 5], [4, 3, 3], [2], [1], [1], True, [1], 2))
    assert g.bytes == (20 + 36 + 1 * 6 * 10) * 4


def test_cudnn_and_mkldnn_layouts():
    cud = cost(
        "aten::cudnn_convolution",
        args(
            [[1, 4, 10, 10], [8, 2, 3, 3], [], [], [], [], [], [], []],
            ["float", "float", "ScalarList", "ScalarList", "ScalarList", "Scalar", "Scalar", "Scalar", "Scalar"],
            ["", "", "[1, 1]", "[2, 2]", "[2, 2]", "2", "False", "False", "True"],
        ),
    )  # padding, stride, dilation, groups
    ref = cost("aten::convolution", conv_args([1, 4, 10, 10], [8, 2, 3, 3], [2, 2], [1, 1], [2, 2], False, [0, 0], 2))
    assert cud == ref
    mk = cost(
        "aten::mkldnn_convolution",
        args(
            [[1, 4, 10, 10], [8, 2, 3, 3], [], [], [], [], []],
            ["float", "float", "", "ScalarList", "ScalarList", "ScalarList", "Scalar"],
            ["", "", "", "[1, 1]", "[2, 2]", "[2, 2]", "2"],
        ),
    )
    assert mk == ref


def test_conv_rejects_inconsistent_channels_and_empty_output():
    assert (
        op_cost("aten::convolution", conv_args([1, 5, 10, 10], [8, 2, 3, 3], [1, 1], [0, 0], [1, 1], False, [0, 0], 2))
        is None
    )
    assert (
        op_cost("aten::convolution", conv_args([1, 4, 2, 2], [8, 4, 5, 5], [1, 1], [0, 0], [1, 1], False, [0, 0], 1))
        is None
    )


CONV_BWD_TYPES = [
    "float",
    "float",
    "float",
    "ScalarList",
    "ScalarList",
    "ScalarList",
    "ScalarList",
    "Scalar",
    "ScalarList",
    "Scalar",
    "ScalarList",
]


def conv_backward_args(go, x, w, transposed, groups, mask, bias_sizes="[8]"):
    return args(
        [go, x, w] + [[]] * 8,
        CONV_BWD_TYPES,
        ["", "", "", bias_sizes, "[2, 2]", "[1, 1]", "[2, 2]", str(transposed), "[0, 0]", str(groups), str(mask)],
    )


@pytest.mark.parametrize(
    "mask, flops, out_elems",
    [
        ([True, False, True], 4608, 400 + 8),  # grad_input = the forward's FLOPs, grad_bias 0 FLOPs
        ([False, True, False], 9216, 144),  # grad_weight: 2·N·Cin·Cout·k·spatial (= groups × fwd)
        ([True, True, True], 4608 + 9216, 400 + 144 + 8),
        ([False, False, False], 0, 0),
    ],
)
def test_convolution_backward_output_mask(mask, flops, out_elems):
    a = conv_backward_args([1, 8, 4, 4], [1, 4, 10, 10], [8, 2, 3, 3], False, 2, mask)
    c = cost("aten::convolution_backward", a)
    assert c.flops == flops
    assert c.bytes == (128 + 400 + 144 + out_elems) * 4


def test_convolution_backward_transposed():
    # transposed forward: x [1,4,5] -> out [1,3,10], weight [4,3,3]; grad_out has the out's shape
    a = args(
        [[1, 3, 10], [1, 4, 5], [4, 3, 3]] + [[]] * 8,
        CONV_BWD_TYPES,
        ["", "", "", "", "[2]", "[1]", "[1]", "True", "[1]", "1", "[True, True, False]"],
    )
    c = cost("aten::convolution_backward", a)
    assert c.flops == 2 * 5 * 4 * 3 * 3 + 2 * 1 * 4 * 3 * 3 * 5  # grad_input (fwd) + grad_weight


def test_legacy_cudnn_convolution_backward_layout():
    # torch <= 1.10: (self, grad_output, weight, padding, stride, dilation, groups, benchmark,
    # deterministic, allow_tf32, output_mask[2])
    a = args(
        [[1, 4, 10, 10], [1, 8, 4, 4], [8, 2, 3, 3]] + [[]] * 8,
        ["float"] * 3 + ["ScalarList"] * 3 + ["Scalar"] * 4 + ["ScalarList"],
        ["", "", "", "[1, 1]", "[2, 2]", "[2, 2]", "2", "False", "False", "True", "[True, True]"],
    )
    assert cost("aten::cudnn_convolution_backward", a).flops == 4608 + 9216


def test_conv_padding_string_overload_is_unknown():
    # conv2d(..., padding="same"): the profiler records a string argument as "" -> padding unknown
    a = args(
        [[2, 4, 10, 12], [6, 2, 3, 3], [], [], [], [], []],
        ["float", "float", "", "ScalarList", "", "ScalarList", "Scalar"],
        ["", "", "", "[1, 1]", "", "[2, 2]", "2"],
    )
    assert op_cost("aten::conv2d", a) is None


# ------------------------------------------------------------------------------------- attention

SDPA_TYPES = ["c10::BFloat16"] * 3 + ["", "Scalar", "Scalar", "", "Scalar"]


def sdpa_args(q, k, v, causal=False, dtype="c10::BFloat16"):
    return args(
        [q, k, v, [], [], [], [], []],
        [dtype] * 3 + SDPA_TYPES[3:],
        ["", "", "", "", "0.", str(causal), "", str(q[1] != k[1])],
    )


def test_attention_gqa():
    c = cost("aten::scaled_dot_product_attention", sdpa_args([2, 8, 16, 64], [2, 2, 32, 64], [2, 2, 32, 64]))
    assert c.flops == 2 * (2 * 8 * 16 * 32) * (64 + 64)  # Hq heads: QKᵀ + PV
    assert c.bytes == (2 * 8 * 16 * 64 + 2 * (2 * 2 * 32 * 64) + 2 * 8 * 16 * 64) * 2
    assert c.family == "attention" and c.dtype == "bf16"


def test_attention_causal_not_halved_and_dtype_sizes():
    plain = cost("aten::scaled_dot_product_attention", sdpa_args([1, 4, 32, 16], [1, 4, 32, 16], [1, 4, 32, 16]))
    causal = cost(
        "aten::scaled_dot_product_attention", sdpa_args([1, 4, 32, 16], [1, 4, 32, 16], [1, 4, 32, 16], causal=True)
    )
    assert causal.flops == plain.flops
    fp32 = cost(
        "aten::scaled_dot_product_attention", sdpa_args([1, 4, 32, 16], [1, 4, 32, 16], [1, 4, 32, 16], dtype="float")
    )
    assert fp32.bytes == 2 * plain.bytes and fp32.dtype == "fp32"


def test_attention_value_head_dim_and_backward():
    fwd = cost(
        "aten::_scaled_dot_product_efficient_attention",
        args(
            [[1, 2, 8, 16], [1, 2, 12, 16], [1, 2, 12, 32], [], [], [], [], []],
            ["float"] * 3 + ["", "Scalar", "Scalar", "Scalar", ""],
            ["", "", "", "", "True", "0.", "False", ""],
        ),
    )
    assert fwd.flops == 2 * (2 * 8 * 12) * (16 + 32)
    bwd = cost(
        "aten::_scaled_dot_product_flash_attention_backward",
        args(
            [[1, 2, 8, 16], [1, 2, 8, 16], [1, 2, 12, 16], [1, 2, 12, 16], [1, 2, 8, 16], [1, 2, 8]] + [[]] * 9,
            ["float"] * 6 + [""] * 9,
        ),
    )
    assert bwd.flops == 2 * (2 * 8 * 12) * (3 * 16 + 2 * 16)
    assert bwd.bytes == (256 * 3 + 384 * 2 + 16 + 256 + 384 * 2) * 4  # go, q, k, v, out, lse + dQ, dK, dV


def test_flash_attention_forward_reads_bshd_like_the_real_trace():
    # from tracelens/h100_qwen1.5_0.5b: _flash_attention_forward under _scaled_dot_product_flash_attention
    q = [16, 559, 16, 64]
    a = args(
        [q, q, q] + [[]] * 12,
        ["c10::BFloat16"] * 3 + ["", "", "Scalar", "Scalar", "Scalar", "Scalar", "Scalar", "Scalar", "", "", "", ""],
        ["", "", "", "", "", "559", "559", "0.", "True", "False", "0.125", "", "", "", ""],
        strides=[[572416, 64, 35776, 1]] * 3 + [[]] * 12,
    )
    outer = sdpa_args([16, 16, 559, 64], [16, 16, 559, 64], [16, 16, 559, 64], causal=True)
    assert cost("aten::_flash_attention_forward", a).flops == cost("aten::scaled_dot_product_attention", outer).flops
    assert cost("aten::_flash_attention_forward", a).flops == 2 * 16 * 16 * 559 * 559 * 128


def test_flash_attention_varlen_counts_max_lengths():
    a = args(
        [[20, 4, 16], [30, 2, 16], [30, 2, 16], [3], [3]] + [[]] * 5,
        ["float"] * 3 + ["int", "int", "Scalar", "Scalar", "Scalar", "Scalar", "Scalar"],
        ["", "", "", "", "", "8", "12", "0.", "True", "False"],
    )
    assert cost("aten::_flash_attention_forward", a).flops == 2 * (2 * 4 * 8 * 12) * (16 + 16)


def test_attention_rejects_bad_heads():
    assert op_cost("aten::scaled_dot_product_attention", sdpa_args([1, 6, 8, 16], [1, 4, 8, 16], [1, 4, 8, 16])) is None
    assert op_cost("aten::scaled_dot_product_attention", sdpa_args([1, 4, 8, 16], [1, 4, 8, 32], [1, 4, 8, 16])) is None


# ---------------------------------------------------------------------- norm, softmax, embedding


def test_layer_norm_and_rms_norm():
    c = cost(
        "aten::native_layer_norm",
        args(
            [[4, 8, 16], [], [16], [16], []],
            ["float", "ScalarList", "float", "float", "Scalar"],
            ["", "[16]", "", "", "1e-05"],
        ),
    )
    assert c == Cost(5 * 512, (512 + 16 + 16 + 512) * 4, "fp32", "norm")
    r = cost("aten::rms_norm", args([[4, 16], [], [16], []], ["c10::BFloat16", "ScalarList", "c10::BFloat16", ""]))
    assert r.flops == 4 * 64 and r.bytes == (64 + 16 + 64) * 2


def test_batch_and_group_norm():
    bn = cost(
        "aten::batch_norm",
        args(
            [[2, 3, 4, 4]] + [[3]] * 4 + [[], [], [], []],
            ["c10::Half"] * 5 + ["Scalar"] * 4,
            ["", "", "", "", "", "True", "0.1", "1e-05", "True"],
        ),
    )
    assert bn.flops == 5 * 96 and bn.bytes == (96 + 4 * 3 + 96) * 2
    gn = cost(
        "aten::group_norm",
        args([[2, 4, 8], [], [4], [4], [], []], ["float", "Scalar", "float", "float", "Scalar", "Scalar"]),
    )
    assert gn.flops == 5 * 64


def test_softmax_half_to_float_and_backward():
    c = cost("aten::_softmax", args([[4, 10], [], []], ["c10::BFloat16", "Scalar", "Scalar"], ["", "-1", "True"]))
    assert c.flops == 5 * 40 and c.bytes == 40 * 2 + 40 * 4 and c.family == "softmax"
    b = cost(
        "aten::_softmax_backward_data",
        args([[4, 10], [4, 10], [], []], ["float", "float", "Scalar", "Scalar"], ["", "", "-1", "6"]),
    )
    assert b.flops == 4 * 40 and b.bytes == 3 * 40 * 4


def test_embedding_reads_only_gathered_rows():
    c = cost(
        "aten::embedding",
        args(
            [[1000, 64], [4, 8], [], [], []],
            ["c10::BFloat16", "long int", "Scalar", "Scalar", "Scalar"],
            ["", "", "-1", "False", "False"],
        ),
    )
    assert c.flops == 0 and c.family == "embedding" and c.dtype == "bf16"
    assert c.bytes == 32 * 8 + 32 * 64 * 2 + 32 * 64 * 2  # indices + rows read + out written
    b = cost(
        "aten::embedding_dense_backward",
        args(
            [[4, 8, 64], [4, 8], [], [], []],
            ["float", "long int", "Scalar", "Scalar", "Scalar"],
            ["", "", "1000", "-1", "False"],
        ),
    )
    assert b.flops == 4 * 8 * 64 and b.bytes == (2048 + 32 * 2 + 1000 * 64) * 4


# ------------------------------------------------------------------- elementwise, copy, reduction


def test_elementwise_broadcast_inplace_and_stride0():
    c = cost("aten::add", args([[4, 1, 8], [3, 8], []], ["float", "float", "Scalar"], ["", "", "1"]))
    assert c == Cost(96, (32 + 24 + 96) * 4, "fp32", "elementwise")
    inplace = cost("aten::mul_", args([[64, 32], [64, 32]], ["float", "float"], strides=[[32, 1], [0, 1]]))
    assert inplace.flops == 2048 and inplace.bytes == (2048 + 32 + 2048) * 4  # expanded input read once
    assert cost("aten::gelu", args([[10], []], ["c10::BFloat16", ""], ["", "none"])).flops == 50
    where = cost("aten::where", args([[4, 8], [4, 8], []], ["bool", "c10::Half", "Scalar"], ["", "", "0"]))
    assert where.dtype == "fp16" and where.bytes == 32 + 64 + 64
    eq = cost("aten::eq", args([[4, 8], []], ["long int", "Scalar"], ["", "1"]))
    assert eq.bytes == 32 * 8 + 32 * 1  # bool output
    assert cost("aten::threshold_backward", args([[5], [5], []], ["float", "float", "Scalar"])).flops == 5


def test_elementwise_out_tensor_before_resize():
    # abs(self, out=...) with the out tensor recorded at [0] (old trace): the output is self's shape
    assert cost("aten::abs", args([[4096], [0]], ["float", "float"])).flops == 4096


def test_copy_family():
    c = cost("aten::copy_", args([[10], [10], []], ["c10::BFloat16", "float", "Scalar"], ["", "", "False"]))
    assert c == Cost(0, 10 * 4 + 10 * 2, "bf16", "copy")  # destination written, not read
    assert cost("aten::fill_", args([[10], []], ["float", "Scalar"], ["", "0."])).bytes == 40
    assert (
        cost(
            "aten::_to_copy",
            args(
                [[10], [], [], [], [], [], []], ["float"] + ["Scalar"] + [""] * 5, ["", "15", "", "", "", "False", ""]
            ),
        ).bytes
        == 40 + 20
    )
    assert cost("aten::clone", args([[10], []], ["float", "Scalar"], ["", "0"])).bytes == 80


def test_reductions():
    s = cost("aten::sum", args([[4, 8], [], [], []], ["float", "ScalarList", "Scalar", ""], ["", "[1]", "False", ""]))
    assert s == Cost(32, (32 + 4) * 4, "fp32", "reduction")
    full = cost("aten::sum", args([[4, 8], []], ["float", ""], ["", ""]))  # sum(self, dtype=None)
    assert full.bytes == (32 + 1) * 4
    old = cost("aten::mean", args([[4, 8], [], [], []], ["float", "ScalarList", "Scalar", ""]))  # no Concrete
    assert old.flops == 32 and old.bytes == (32 + 1) * 4  # dims unknown: a lower bound
    mx = cost("aten::max", args([[4, 8], [], []], ["float", "Scalar", "Scalar"], ["", "-1", "True"]))
    assert mx.flops == 32 and mx.bytes == (32 + 4) * 4
    pair = cost("aten::max", args([[4, 8], [8]], ["float", "float"]))  # max(self, other)
    assert pair.family == "elementwise" and pair.bytes == (32 + 8 + 32) * 4
    am = cost("aten::argmax", args([[4, 8], [], []], ["float", "Scalar", "Scalar"], ["", "0", "False"]))
    assert am.bytes == 32 * 4 + 8 * 8  # int64 output
    nm = cost(
        "aten::linalg_vector_norm",
        args(
            [[4, 8], [], [], [], []], ["float", "Scalar", "ScalarList", "Scalar", ""], ["", "2", "[0, 1]", "False", ""]
        ),
    )
    assert nm.flops == 64 and nm.bytes == (32 + 1) * 4
    assert (
        op_cost(
            "aten::sum", args([[4, 8], [], [], []], ["float", "ScalarList", "Scalar", ""], ["", "[2]", "False", ""])
        )
        is None
    )  # dim out of range


# ------------------------------------------------------------------------------------- TensorList


def test_tensorlist_inputs():
    a = args([[[2, 3], [4, 3]], []], ["TensorList", "Scalar"], ["", "0"], strides=[[[3, 1], [3, 1]], []])
    c = cost("aten::cat", a, "bf16")
    assert c == Cost(0, (6 + 12) * 2 * 2, "bf16", "copy")
    unknown = cost("aten::cat", a)  # element dtype not recorded
    assert math.isnan(unknown.bytes) and unknown.dtype == "unknown"
    f = cost("aten::_foreach_add_", args([[[4], [6]], [[4], [6]], []], ["TensorList", "TensorList", "Scalar"]), "fp32")
    assert f.flops == 10 and f.bytes == (10 + 10 + 10) * 4
    inp = OpInputs.from_args(a, "bf16")
    assert inp.shape(0) is None and inp.shapes(0) == [(2, 3), (4, 3)] and inp.numel(0) == 18
    assert inp.dtype(0) == "bf16" and inp.bytes_per_elem(0) == 2 and inp.concrete(1) == 0


# ------------------------------------------------------------------------------------ collectives


def test_record_param_comms_message_size():
    a = {
        "Collective name": "allreduce",
        "dtype": "Float",
        "In msg nelems": 2049000,
        "Out msg nelems": 2049000,
        "Group size": 2,
    }
    assert cost("record_param_comms", a) == Cost(0, 2049000 * 4, "fp32", "collective")
    g = {
        "Collective name": "_allgather_base",
        "dtype": "BFloat16",
        "In msg nelems": 25136,
        "Out msg nelems": 201088,
        "Group size": 8,
        "Input Dims": [[1, 25136]],
        "Input type": ["c10::BFloat16"],
    }
    assert cost("record_param_comms", g).bytes == 201088 * 2  # nccl-tests size: the gathered output
    assert cost("record_param_comms", {k: v for k, v in g.items() if k in ARGS_READ}) == cost("record_param_comms", g)
    assert op_cost("record_param_comms", {"Collective name": "barrier"}) is None
    assert op_cost("record_param_comms", {"Input Dims": [[], []], "Input type": ["Scalar", "Scalar"]}) is None


def test_c10d_and_nccl_collectives():
    assert (
        cost("c10d::_allgather_base_", args([[65536, 64], [8192, 64], []], ["float", "float", ""])).bytes
        == 65536 * 64 * 4
    )
    assert (
        cost(
            "c10d::_reduce_scatter_base_",
            args([[8192, 384], [65536, 384], [], [], []], ["float", "float", "", "", "Scalar"]),
        ).bytes
        == 65536 * 384 * 4
    )
    assert cost("nccl:all_reduce", args([[366336]], ["float"])).bytes == 366336 * 4
    assert cost("nccl:send 0->1", args([[1024]], ["c10::BFloat16"])).bytes == 2048
    shard = args([[1, 25136]], ["c10::BFloat16"], [""])
    assert op_cost("nccl:_all_gather_base", shard) is None  # only the shard, no group size
    assert cost("nccl:_all_gather_base", {**shard, "Group size": 8}).bytes == 8 * 25136 * 2
    fn = cost(
        "_c10d_functional::all_gather_into_tensor",
        args([[4, 8], [], []], ["c10::BFloat16", "Scalar", ""], ["", "4", ""]),
    )
    assert fn.bytes == 4 * 8 * 2 * 4
    nested = args([[[1024, 4]], [], [], [], [], []], ["TensorList", "", "", "", "Scalar", "Scalar"])
    assert cost("c10d::allreduce_", nested, "bf16").bytes == 1024 * 4 * 2
    old = args([[], [], [], []], ["TensorList", "", "", "Scalar"])  # old traces: TensorList dims not recorded
    assert op_cost("c10d::allreduce_", old, "bf16") is None


def test_collective_kind():
    assert collective_kind("nccl:all_reduce") == "allreduce"
    assert collective_kind("c10d::_allgather_base_") == "allgather"
    assert collective_kind("_c10d_functional::reduce_scatter_tensor_coalesced") == "reducescatter"
    assert collective_kind("c10d::alltoall_base_") == "alltoall"
    assert collective_kind("nccl:recv 1<-0") == "sendrecv"
    assert collective_kind("record_param_comms", {"Collective name": "all_to_allv"}) == "alltoall"
    assert collective_kind("nccl:barrier") is None


@pytest.mark.parametrize(
    "kind, n, bus",
    [
        ("allreduce", 8, 2 * 7 / 8),
        ("allgather", 4, 3 / 4),
        ("reducescatter", 4, 3 / 4),
        ("alltoall", 2, 1 / 2),
        ("broadcast", 8, 1.0),
        ("reduce", 8, 1.0),
        ("nccl:all_reduce", 2, 1.0),
    ],
)
def test_collective_bandwidth_factors(kind, n, bus):
    algbw, busbw = collective_bandwidth(kind, 4e9, 2.0, n)
    assert algbw == pytest.approx(2.0) and busbw == pytest.approx(2.0 * bus)


def test_collective_bandwidth_bad_input():
    with pytest.raises(ValueError):
        collective_bandwidth("gossip", 1e9, 1.0, 8)
    assert all(math.isnan(v) for v in collective_bandwidth("allreduce", 1e9, 0.0, 8))
    assert all(math.isnan(v) for v in collective_bandwidth("allreduce", 1e9, 1.0, 0))


# ------------------------------------------------------------------------------------- robustness


def test_parse_literal():
    assert parse_literal("0.") == 0.0 and parse_literal("1.0000000000000001e-05") == 1e-05
    assert parse_literal("[1, 1]") == [1, 1] and parse_literal("[True, False, True]") == [True, False, True]
    assert parse_literal("None") is None and parse_literal("-2") == -2 and parse_literal("same") == "same"
    assert parse_literal("[[1, 2], [3]]") == [[1, 2], [3]] and parse_literal("(1, 2)") == [1, 2]
    for bad in ["[1, 1", "[1,]", "1 2", "'same'", "[" * 100 + "]" * 100, "1" * 20_000, "{}", "__import__('os')"]:
        with pytest.raises(ValueError):
            parse_literal(bad)


def test_concrete_inputs_are_never_evaluated(monkeypatch, tmp_path):
    def boom(*a, **k):
        raise AssertionError("evaluated!")

    monkeypatch.setattr(builtins, "eval", boom)
    monkeypatch.setattr(builtins, "exec", boom)
    monkeypatch.setattr(os, "system", boom)
    marker = tmp_path / "pwned"
    evil = f"__import__('os').system('touch {marker}')"
    a = conv_args([1, 4, 10, 10], [8, 2, 3, 3], [2, 2], [1, 1], [2, 2], False, [0, 0], 2)
    for i in range(3, 9):
        bad = dict(a, **{"Concrete Inputs": [evil if j == i else v for j, v in enumerate(a["Concrete Inputs"])]})
        assert op_cost("aten::convolution", bad) is None
    assert (
        op_cost(
            "aten::sum", args([[4, 8], [], [], []], ["float", "ScalarList", "Scalar", ""], ["", evil, "False", ""])
        ).flops
        == 32
    )  # unparseable dim: full reduction
    assert not marker.exists()


@pytest.mark.parametrize(
    "bad",
    [
        None,
        [],
        "aten::mm",
        42,
        {},
        {"Input Dims": None},
        {"Input Dims": "[[64, 128], [128, 32]]"},
        {"Input Dims": [["64", "128"], [128, 32]], "Input type": ["float", "float"]},
        {"Input Dims": [[64, -128], [-128, 32]], "Input type": ["float", "float"]},
        {"Input Dims": [[64, 128.0], [128, 32]], "Input type": ["float", "float"]},
        {"Input Dims": [[64, True], [True, 32]], "Input type": ["float", "float"]},
        {"Input Dims": [[64, 128]], "Input type": ["float"]},
        {"Input Dims": [[[64, 128]], [128, 32]], "Input type": ["float", "float"]},
        {"Input Dims": [[10**200, 10**200], [10**200, 10**200]], "Input type": ["float", "float"]},
    ],
)
def test_garbage_args_give_none(bad):
    assert op_cost("aten::mm", bad) is None


def test_huge_dims_are_finite():
    c = op_cost("aten::mm", args([[2**40, 2**40], [2**40, 2**40]], ["float", "float"]))
    assert c is None or (math.isfinite(c.flops) and math.isfinite(c.bytes))


def test_wrong_lengths_are_ignored():
    # Input type shorter than Input Dims: types ignored, fallback dtype used (FLOPs still computed)
    a = {"Input Dims": [[64, 128], [128, 32]], "Input type": ["float"], "Concrete Inputs": [""]}
    c = op_cost("aten::mm", a)
    assert c.flops == 2 * 64 * 128 * 32 and math.isnan(c.bytes) and c.dtype == "unknown"
    assert op_cost("aten::mm", a, "bf16").bytes == (64 * 128 + 128 * 32 + 64 * 32) * 2
    # too few Concrete Inputs for a convolution: no parameters, no cost
    conv = conv_args([1, 4, 10, 10], [8, 2, 3, 3], [2, 2], [1, 1], [2, 2], False, [0, 0], 2)
    assert op_cost("aten::convolution", {**conv, "Concrete Inputs": ["", ""]}) is None


def test_unknown_op_and_non_string_name():
    assert op_cost("aten::frobnicate", args([[1]], ["float"])) is None
    assert op_cost(None, {}) is None


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 2**70) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=5),
    max_leaves=20,
)


@settings(max_examples=200, derandomize=True, deadline=None)
@given(
    name=st.sampled_from(MODELLED_OPS),
    dims=st.lists(st.lists(st.integers(-2, 40), max_size=5) | JSONISH, max_size=12),
    types=JSONISH
    | st.lists(
        st.sampled_from(["float", "c10::BFloat16", "Scalar", "", "TensorList", "long int", "bool", "ScalarList"]),
        max_size=12,
    ),
    concrete=JSONISH
    | st.lists(
        st.sampled_from(["", "[1, 1]", "False", "True", "0.", "2", "[True, False, True]", "None", "[", "-1", "15"]),
        max_size=12,
    ),
    strides=JSONISH,
)
def test_never_raises_on_random_args(name, dims, types, concrete, strides):
    a = {"Input Dims": dims, "Input type": types, "Concrete Inputs": concrete, "Input Strides": strides}
    c = op_cost(name, a)
    assert c is None or (math.isfinite(c.flops) and c.flops >= 0 and not c.bytes < 0)


# ---------------------------------------------------------------------------- old trace layout

OLD = {  # only Input Dims + Input type, as in hta/a100_old_format_rank0
    "aten::mm": ({"Input Dims": [[4096, 64], [64, 2798]], "Input type": ["float", "float"]}, 2 * 4096 * 64 * 2798),
    "aten::addmm": (
        {
            "Input Dims": [[64], [4096, 100], [100, 64], [], []],
            "Input type": ["float", "float", "float", "Scalar", "Scalar"],
        },
        2 * 4096 * 100 * 64,
    ),
    "aten::bmm": (
        {"Input Dims": [[8, 16, 32], [8, 32, 4]], "Input type": ["c10::Half", "c10::Half"]},
        2 * 8 * 16 * 32 * 4,
    ),
}


@pytest.mark.parametrize("name", sorted(OLD))
def test_old_layout_gemm(name):
    a, flops = OLD[name]
    assert cost(name, a).flops == flops


def test_old_layout_conv_does_not_crash():
    a = {
        "Input Dims": [[32, 64, 56, 56], [64, 64, 3, 3], [], [], [], [], [], [], []],
        "Input type": [
            "float",
            "float",
            "",
            "ScalarList",
            "ScalarList",
            "ScalarList",
            "Scalar",
            "ScalarList",
            "Scalar",
        ],
    }
    for name in (
        "aten::convolution",
        "aten::_convolution",
        "aten::cudnn_convolution",
        "aten::conv2d",
        "aten::convolution_backward",
    ):
        assert op_cost(name, a) is None


REAL_TRACES = (
    "hta/a100_old_format_rank0.json.gz",
    "hta/a100_nccl.json.gz",
    "hta/sampled_no_device_props.json.gz",
    "tracelens/h100_qwen1.5_0.5b.json.gz",
    "tracelens/b200_eager.json.gz",
)


def test_real_traces_never_raise(shared_traces):
    """Every modelled op of real traces (old and new layouts, odd sampled dims): a cost or None."""
    families, flops = set(), {}
    for rel in REAL_TRACES:
        doc = orjson.loads(gzip.decompress((shared_traces / rel).read_bytes()))
        for e in doc["traceEvents"] if isinstance(doc, dict) else doc:
            name = e.get("name")
            if isinstance(name, str) and (name in FORMULAS or name.split(" ")[0] in FORMULAS):
                c = op_cost(name, e.get("args"))
                if c is not None:
                    assert math.isfinite(c.flops) and not c.bytes < 0
                    families.add(c.family)
                    flops.setdefault(name, c.flops)
    assert {"gemm", "attention", "collective", "elementwise", "reduction", "copy", "embedding"} <= families
    # h100: the three attention levels of one call agree
    assert (
        flops["aten::_flash_attention_forward"]
        == flops["aten::scaled_dot_product_attention"]
        == flops["aten::_scaled_dot_product_flash_attention"]
        == 2 * 16 * 16 * 559 * 559 * 128
    )


# -------------------------------------------------------------------------------------- the table


def test_table_lists_the_requested_ops():
    required = [
        "aten::mm",
        "aten::addmm",
        "aten::bmm",
        "aten::baddbmm",
        "aten::matmul",
        "aten::linear",
        "aten::_scaled_mm",
        "aten::convolution",
        "aten::_convolution",
        "aten::cudnn_convolution",
        "aten::miopen_convolution",
        "aten::mkldnn_convolution",
        "aten::conv1d",
        "aten::conv2d",
        "aten::conv3d",
        "aten::cudnn_convolution_transpose",
        "aten::miopen_convolution_transpose",
        "aten::conv_transpose1d",
        "aten::conv_transpose2d",
        "aten::conv_transpose3d",
        "aten::convolution_backward",
        "aten::scaled_dot_product_attention",
        "aten::_scaled_dot_product_flash_attention",
        "aten::_scaled_dot_product_efficient_attention",
        "aten::_scaled_dot_product_cudnn_attention",
        "aten::_flash_attention_forward",
        "aten::_efficient_attention_forward",
        "aten::_flash_attention_backward",
        "aten::_efficient_attention_backward",
        "aten::_scaled_dot_product_flash_attention_backward",
        "aten::layer_norm",
        "aten::native_layer_norm",
        "aten::batch_norm",
        "aten::native_batch_norm",
        "aten::_batch_norm_impl_index",
        "aten::cudnn_batch_norm",
        "aten::group_norm",
        "aten::native_group_norm",
        "aten::rms_norm",
        "aten::_fused_rms_norm",
        "aten::_softmax",
        "aten::softmax",
        "aten::_log_softmax",
        "aten::embedding",
        "aten::embedding_dense_backward",
        "aten::add",
        "aten::add_",
        "aten::sub",
        "aten::mul",
        "aten::div",
        "aten::relu",
        "aten::gelu",
        "aten::silu",
        "aten::sigmoid",
        "aten::tanh",
        "aten::exp",
        "aten::pow",
        "aten::copy_",
        "aten::fill_",
        "aten::clamp",
        "aten::where",
        "aten::sum",
        "aten::mean",
        "aten::amax",
        "aten::max",
        "aten::norm",
        "record_param_comms",
        "nccl:all_reduce",
        "c10d::allreduce_",
        "nccl:all_gather",
        "nccl:reduce_scatter",
        "nccl:broadcast",
        "nccl:all_to_all",
    ]
    assert not [op for op in required if op not in MODELLED_OPS]
    assert list(MODELLED_OPS) == sorted(FORMULAS)


def test_formulas_markdown():
    md = formulas_markdown()
    assert md.startswith("| ops | family | FLOPs | bytes |")
    for op in MODELLED_OPS:
        assert f"`{op}`" in md or f"`{op}(_)`" in md or f"`{op[:-1]}(_)`" in md
    assert all(line.count("|") - line.count("\\|") == 5 for line in md.strip().splitlines())


def test_normalize_dtype():
    for raw, want in [
        ("c10::BFloat16", "bf16"),
        ("float", "fp32"),
        ("c10::Half", "fp16"),
        ("double", "fp64"),
        ("c10::Float8_e4m3fn", "fp8"),
        ("long int", "int64"),
        ("long", "int64"),
        ("int", "int32"),
        ("bool", "bool"),
        ("signed char", "int8"),
        ("BFloat16", "bf16"),
        ("torch.float16", "fp16"),
        ("bf16", "bf16"),
        ("c10::complex<float>", "complex64"),
        ("Scalar", None),
        ("", None),
        (None, None),
    ]:
        assert normalize_dtype(raw) == want, raw
