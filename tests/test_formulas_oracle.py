"""Oracle: pipeline.cost.formulas FLOPs == torch.utils.flop_counter.FlopCounterMode, case by case.

Every case is a real call on meta tensors (CPU tensors for the CPU-only mkldnn kernel). All cases
run once under torch.profiler with record_shapes, so the args handed to `op_cost` are exactly what
Kineto writes (Input Dims / Input type / Input Strides / Concrete Inputs); ops without a meta or
CPU kernel (cudnn, miopen) are recorded before they fail, which is all the trace needs. The
reference is FlopCounterMode's total for the same call, or for an equivalent call where torch's
counter has no (or a wrong-layout) formula for the op itself:

* ``_flash_attention_*`` / ``_efficient_attention_*`` take [B, S, H, D]; torch's counter reads
  them as [B, H, S, D] (it asserts or misreports), so their reference is the
  ``_scaled_dot_product_*`` call on the same tensors in [B, H, S, D];
* ``mkldnn_convolution``, ``cudnn_*`` / ``miopen_*`` convolutions and
  ``_scaled_dot_product_flash_attention_for_cpu[_backward]`` are not in torch's registry (0), so
  their reference is ``aten.convolution`` / the flash-attention op with the same arguments.

Cases come from a fixed-seed generator (the same cases every run).
"""

from __future__ import annotations

import contextlib
import json
import random
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import pytest

torch = pytest.importorskip("torch")

from torch.profiler import ProfilerActivity, profile, record_function  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from pipeline.cost.formulas import op_cost  # noqa: E402

aten = torch.ops.aten
F = torch.nn.functional
SEED = 20240611
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def T(*shape, dtype=torch.float32, device="meta"):
    return torch.empty(*shape, dtype=dtype, device=device)


@dataclass
class Case:
    id: str
    ops: tuple[str, ...]  # Kineto op names recorded by `run` whose FLOPs must match
    run: Callable[[], object]  # the profiled call
    ref: Callable[[], object] | None = None  # what FlopCounterMode counts (default: run)


# ------------------------------------------------------------------------------------------ GEMM


def gemm_cases(rng: random.Random):
    def d(hi=64):
        return rng.randint(1, hi)

    for i in range(8):
        dt = rng.choice(DTYPES)
        m, k, n, b = d(), d(), d(), d(6)
        a, w = T(m, k, dtype=dt), T(k, n, dtype=dt)
        bias = T(*rng.choice([(n,), (m, n), (1, n)]), dtype=dt)
        ba, bb = T(b, m, k, dtype=dt), T(b, k, n, dtype=dt)
        bbias = T(*rng.choice([(b, m, n), (n,), (1, m, n)]), dtype=dt)
        yield Case(f"mm{i}", ("aten::mm",), lambda a=a, w=w: torch.mm(a, w))
        yield Case(f"addmm{i}", ("aten::addmm",), lambda a=a, w=w, c=bias: torch.addmm(c, a, w))
        yield Case(f"bmm{i}", ("aten::bmm",), lambda a=ba, w=bb: torch.bmm(a, w))
        yield Case(f"baddbmm{i}", ("aten::baddbmm",), lambda a=ba, w=bb, c=bbias: torch.baddbmm(c, a, w))

    # matmul: broadcast batch dims, 2-D x N-D, N-D x 2-D, 1-D x N-D (1-D right operands run as
    # mv/dot, which torch's counter does not count: see test_formulas.py for those)
    batch_pairs = [
        ((), ()),
        ((3,), ()),
        ((), (3,)),
        ((2, 3), (2, 3)),
        ((2, 1), (1, 5)),
        ((4,), (2, 1, 4)),
        ((1,), (3,)),
    ]
    for i, (ba, bb) in enumerate(batch_pairs):
        dt = rng.choice(DTYPES)
        m, k, n = d(), d(), d()
        a, w = T(*ba, m, k, dtype=dt), T(*bb, k, n, dtype=dt)
        yield Case(f"matmul{i}", ("aten::matmul",), lambda a=a, w=w: torch.matmul(a, w))
    for i, bb in enumerate([(), (3,), (2, 3)]):
        k, n = d(), d()
        yield Case(f"matmul_1d{i}", ("aten::matmul",), lambda a=T(k), w=T(*bb, k, n): torch.matmul(a, w))

    for i in range(8):
        dt = rng.choice(DTYPES)
        lead = tuple(d(8) for _ in range(rng.randint(0, 3)))
        k, n = d(), d()
        x, w = T(*lead, k, dtype=dt), T(n, k, dtype=dt)
        bias = T(n, dtype=dt) if rng.random() < 0.5 else None
        yield Case(f"linear{i}", ("aten::linear",), lambda x=x, w=w, b=bias: F.linear(x, w, b))

    for i in range(2):
        m, k, n = 16 * rng.randint(1, 4), 16 * rng.randint(1, 4), 16 * rng.randint(1, 4)
        a, w = T(m, k, dtype=torch.float8_e4m3fn), T(n, k, dtype=torch.float8_e4m3fn).t()
        yield Case(
            f"scaled_mm{i}",
            ("aten::_scaled_mm",),
            lambda a=a, w=w: aten._scaled_mm(a, w, T(()), T(()), out_dtype=torch.bfloat16),
        )


# ----------------------------------------------------------------------------------- convolution


@dataclass
class ConvConfig:
    nd: int
    n: int
    cin: int
    cout: int
    groups: int
    size: list
    kernel: list
    stride: list
    padding: list
    dilation: list
    output_padding: list
    transposed: bool
    bias: bool
    dtype: torch.dtype

    @property
    def weight_shape(self):
        if self.transposed:
            return (self.cin, self.cout // self.groups, *self.kernel)
        return (self.cout, self.cin // self.groups, *self.kernel)

    def tensors(self, device="meta"):
        x = T(self.n, self.cin, *self.size, dtype=self.dtype, device=device)
        w = T(*self.weight_shape, dtype=self.dtype, device=device)
        b = T(self.cout, dtype=self.dtype, device=device) if self.bias else None
        return x, w, b

    def convolution(self, device="meta"):
        """aten.convolution with these arguments (the reference for every layout)."""
        x, w, b = self.tensors(device)
        return lambda: aten.convolution(
            x, w, b, self.stride, self.padding, self.dilation, self.transposed, self.output_padding, self.groups
        )


def random_conv(rng: random.Random, transposed: bool, nd: int | None = None) -> ConvConfig:
    nd = nd or rng.choice([1, 2, 3])
    groups = rng.choice([1, 1, 2, 3])
    kernel = [rng.randint(1, 3) for _ in range(nd)]
    stride = [rng.randint(1, 3) for _ in range(nd)]
    padding = [rng.randint(0, 2) for _ in range(nd)]
    dilation = [rng.randint(1, 2) for _ in range(nd)]
    output_padding = [rng.randint(0, max(s, dl) - 1) for s, dl in zip(stride, dilation)] if transposed else [0] * nd
    if transposed:  # output (i-1)·s - 2p + d(k-1) + op + 1 must be >= 1
        low = [
            1 + -(-max(0, 2 * p - dl * (k - 1) - op) // s)
            for k, p, dl, s, op in zip(kernel, padding, dilation, stride, output_padding)
        ]
    else:  # output (i + 2p - d(k-1) - 1) // s + 1 must be >= 1
        low = [max(1, dl * (k - 1) + 1 - 2 * p) for k, p, dl in zip(kernel, padding, dilation)]
    size = [rng.randint(lo, lo + (9 if nd < 3 else 4)) for lo in low]
    return ConvConfig(
        nd,
        rng.randint(1, 3),
        groups * rng.randint(1, 3),
        groups * rng.randint(1, 3),
        groups,
        size,
        kernel,
        stride,
        padding,
        dilation,
        output_padding,
        transposed,
        rng.random() < 0.5,
        rng.choice(DTYPES),
    )


def conv_cases(rng: random.Random):
    for i in range(24):
        c = random_conv(rng, transposed=False)
        x, w, b = c.tensors()
        conv = (F.conv1d, F.conv2d, F.conv3d)[c.nd - 1]
        yield Case(
            f"conv{c.nd}d_{i}",
            (f"aten::conv{c.nd}d", "aten::convolution"),
            lambda x=x, w=w, b=b, c=c, conv=conv: conv(x, w, b, c.stride, c.padding, c.dilation, c.groups),
        )
    for i in range(16):
        c = random_conv(rng, transposed=True)
        x, w, b = c.tensors()
        conv = (F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d)[c.nd - 1]
        yield Case(
            f"conv_transpose{c.nd}d_{i}",
            (f"aten::conv_transpose{c.nd}d", "aten::convolution"),
            lambda x=x, w=w, b=b, c=c, conv=conv: conv(
                x, w, b, c.stride, c.padding, c.output_padding, c.groups, c.dilation
            ),
        )
    for i in range(6):
        c = random_conv(rng, transposed=rng.random() < 0.5)
        x, w, b = c.tensors()
        yield Case(
            f"_convolution{i}",
            ("aten::_convolution",),
            lambda x=x, w=w, b=b, c=c: aten._convolution(
                x,
                w,
                b,
                c.stride,
                c.padding,
                c.dilation,
                c.transposed,
                c.output_padding,
                c.groups,
                False,
                False,
                True,
                True,
            ),
        )
    for i in range(4):  # CPU-only kernel: real (tiny) CPU tensors; reference: aten.convolution on meta
        c = random_conv(rng, transposed=False, nd=rng.choice([2, 3]))
        c.dtype = torch.float32
        x, w, b = c.tensors(device="cpu")
        yield Case(
            f"mkldnn{i}",
            ("aten::mkldnn_convolution",),
            lambda x=x, w=w, b=b, c=c: aten.mkldnn_convolution(x, w, b, c.padding, c.stride, c.dilation, c.groups),
            ref=c.convolution(),
        )
    for i in range(4):  # GPU kernels: recorded by the profiler before they fail on meta
        c = random_conv(rng, transposed=False)
        x, w, b = c.tensors()
        yield Case(
            f"cudnn{i}",
            ("aten::cudnn_convolution",),
            lambda x=x, w=w, c=c: aten.cudnn_convolution(
                x, w, c.padding, c.stride, c.dilation, c.groups, False, False, False
            ),
            ref=c.convolution(),
        )
        yield Case(
            f"miopen{i}",
            ("aten::miopen_convolution",),
            lambda x=x, w=w, b=b, c=c: aten.miopen_convolution(
                x, w, b, c.padding, c.stride, c.dilation, c.groups, False, False
            ),
            ref=c.convolution(),
        )
        c = random_conv(rng, transposed=True)
        x, w, b = c.tensors()
        yield Case(
            f"cudnn_transpose{i}",
            ("aten::cudnn_convolution_transpose",),
            lambda x=x, w=w, c=c: aten.cudnn_convolution_transpose(
                x, w, c.padding, c.output_padding, c.stride, c.dilation, c.groups, False, False, False
            ),
            ref=c.convolution(),
        )
        yield Case(
            f"miopen_transpose{i}",
            ("aten::miopen_convolution_transpose",),
            lambda x=x, w=w, b=b, c=c: aten.miopen_convolution_transpose(
                x, w, b, c.padding, c.output_padding, c.stride, c.dilation, c.groups, False, False
            ),
            ref=c.convolution(),
        )


def conv_backward_cases(rng: random.Random):
    masks = [[a, b, c] for a in (False, True) for b in (False, True) for c in (False, True)]
    for i in range(32):  # every mask, for regular and transposed convolutions alike
        c = random_conv(rng, transposed=(i // len(masks)) % 2 == 1)
        mask = masks[i % len(masks)]
        x, w, _ = c.tensors()
        go = torch.empty_like(
            aten.convolution(x, w, None, c.stride, c.padding, c.dilation, c.transposed, c.output_padding, c.groups)
        )
        bias_sizes = [c.cout] if c.bias or mask[2] else None
        yield Case(
            f"conv_backward{i}_{''.join('1' if m else '0' for m in mask)}",
            ("aten::convolution_backward",),
            lambda go=go, x=x, w=w, c=c, mask=mask, bs=bias_sizes: aten.convolution_backward(
                go, x, w, bs, c.stride, c.padding, c.dilation, c.transposed, c.output_padding, c.groups, mask
            ),
        )


# ------------------------------------------------------------------------------------- attention


def attention_cases(rng: random.Random):
    for i in range(10):
        dt = rng.choice(DTYPES)
        b, hkv, group = rng.randint(1, 3), rng.randint(1, 3), rng.choice([1, 1, 2, 4])
        hq, sq, sk = hkv * group, rng.randint(1, 40), rng.randint(1, 40)
        d, dv = 8 * rng.randint(1, 8), 8 * rng.randint(1, 8)
        causal = rng.random() < 0.5
        q, k, v = T(b, hq, sq, d, dtype=dt), T(b, hkv, sk, d, dtype=dt), T(b, hkv, sk, d, dtype=dt)
        v2 = T(b, hkv, sk, dv, dtype=dt)  # Dv != D where the kernel allows it
        go, out, lse = T(b, hq, sq, d, dtype=dt), T(b, hq, sq, d, dtype=dt), T(b, hq, sq)
        go2 = T(b, hq, sq, dv, dtype=dt)
        seed, empty = T((), dtype=torch.int64), T(0)

        def bshd(t):
            return t.transpose(1, 2)

        flash = lambda q=q, k=k, v=v, c=causal: aten._scaled_dot_product_flash_attention(q, k, v, 0.0, c)
        flash_bwd = lambda go=go, q=q, k=k, v=v, out=out, lse=lse, c=causal, sq=sq, sk=sk, s=seed, e=empty: (
            aten._scaled_dot_product_flash_attention_backward(go, q, k, v, out, lse, e, e, sq, sk, 0.0, c, s, s)
        )
        yield Case(
            f"sdpa{i}",
            ("aten::scaled_dot_product_attention", "aten::_scaled_dot_product_attention_math"),
            lambda q=q, k=k, v=v2, c=causal, g=group > 1: F.scaled_dot_product_attention(
                q, k, v, is_causal=c, enable_gqa=g
            ),
        )
        yield Case(f"flash{i}", ("aten::_scaled_dot_product_flash_attention",), flash)
        yield Case(
            f"efficient{i}",
            ("aten::_scaled_dot_product_efficient_attention",),
            lambda q=q, k=k, v=v2, c=causal: aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0, c),
        )
        yield Case(
            f"cudnn_attention{i}",
            ("aten::_scaled_dot_product_cudnn_attention",),
            lambda q=q, k=k, v=v2, c=causal: aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, c),
        )
        yield Case(f"flash_backward{i}", ("aten::_scaled_dot_product_flash_attention_backward",), flash_bwd)
        yield Case(
            f"efficient_backward{i}",
            ("aten::_scaled_dot_product_efficient_attention_backward",),
            lambda go=go2, q=q, k=k, v=v2, out=go2, lse=lse, c=causal, s=seed, e=empty: (
                aten._scaled_dot_product_efficient_attention_backward(
                    go, q, k, v, e, out, lse, s, s, 0.0, [True, True, True, False], c
                )
            ),
        )
        yield Case(
            f"cudnn_attention_backward{i}",
            ("aten::_scaled_dot_product_cudnn_attention_backward",),
            lambda go=go2, q=q, k=k, v=v2, out=go2, lse=lse, c=causal, sq=sq, sk=sk, s=seed, e=empty: (
                aten._scaled_dot_product_cudnn_attention_backward(go, q, k, v, out, lse, s, s, e, e, e, sq, sk, 0.0, c)
            ),
        )
        # [B, S, H, D] kernels: reference = the [B, H, S, D] op on the same tensors
        yield Case(
            f"flash_forward{i}",
            ("aten::_flash_attention_forward",),
            lambda q=q, k=k, v=v, c=causal, sq=sq, sk=sk: aten._flash_attention_forward(
                bshd(q), bshd(k), bshd(v), None, None, sq, sk, 0.0, c, False
            ),
            ref=flash,
        )
        yield Case(
            f"efficient_forward{i}",
            ("aten::_efficient_attention_forward",),
            lambda q=q, k=k, v=v, c=causal, sq=sq, sk=sk: aten._efficient_attention_forward(
                bshd(q), bshd(k), bshd(v), None, None, None, sq, sk, 0.0, int(c), True
            ),
            ref=flash,
        )
        yield Case(
            f"flash_attention_backward{i}",
            ("aten::_flash_attention_backward",),
            lambda go=go, q=q, k=k, v=v, out=out, lse=lse, c=causal, sq=sq, sk=sk, s=seed: (
                aten._flash_attention_backward(
                    bshd(go), bshd(q), bshd(k), bshd(v), bshd(out), lse, None, None, sq, sk, 0.0, c, s, s
                )
            ),
            ref=flash_bwd,
        )
        yield Case(
            f"efficient_attention_backward{i}",
            ("aten::_efficient_attention_backward",),
            lambda go=go, q=q, k=k, v=v, out=out, lse=lse, c=causal, sq=sq, sk=sk, s=seed: (
                aten._efficient_attention_backward(
                    bshd(go),
                    bshd(q),
                    bshd(k),
                    bshd(v),
                    None,
                    bshd(out),
                    None,
                    None,
                    sq,
                    sk,
                    lse,
                    0.0,
                    s,
                    s,
                    int(c),
                    False,
                )
            ),
            ref=flash_bwd,
        )
        if group == 1:  # the CPU flash kernel: not in torch's registry; reference = the flash op
            yield Case(
                f"flash_cpu{i}",
                ("aten::_scaled_dot_product_flash_attention_for_cpu",),
                lambda q=q, k=k, v=v, c=causal: aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, c),
                ref=flash,
            )
            yield Case(
                f"flash_cpu_backward{i}",
                ("aten::_scaled_dot_product_flash_attention_for_cpu_backward",),
                lambda go=go, q=q, k=k, v=v, out=out, lse=lse, c=causal: (
                    aten._scaled_dot_product_flash_attention_for_cpu_backward(go, q, k, v, out, lse, 0.0, c)
                ),
                ref=flash_bwd,
            )
    for i in range(3):  # varlen (nested) flash: torch counts every sequence at max length on meta
        b, h, d, max_q, max_k = (
            rng.randint(1, 4),
            rng.randint(1, 4),
            8 * rng.randint(1, 4),
            rng.randint(1, 30),
            rng.randint(1, 30),
        )
        q, k = T(b * max_q, h, d, dtype=torch.bfloat16), T(b * max_k, h, d, dtype=torch.bfloat16)
        cu = T(b + 1, dtype=torch.int32)
        yield Case(
            f"flash_varlen{i}",
            ("aten::_flash_attention_forward",),
            lambda q=q, k=k, cu=cu, mq=max_q, mk=max_k: aten._flash_attention_forward(
                q, k, k, cu, cu, mq, mk, 0.0, False, False
            ),
        )


def all_cases() -> list[Case]:
    rng = random.Random(SEED)
    cases = [c for gen in (gemm_cases, conv_cases, conv_backward_cases, attention_cases) for c in gen(rng)]
    assert len({c.id for c in cases}) == len(cases)
    return cases


with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    CASES = all_cases()


# --------------------------------------------------------------------------------------- harness


def flop_counter_total(fn: Callable[[], object]) -> int:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with FlopCounterMode(display=False) as counter:
            fn()
    return counter.get_total_flops()


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> dict[str, dict[str, dict]]:
    """case id -> op name -> the args Kineto wrote for the outermost call of that op in the case."""
    path = tmp_path_factory.mktemp("oracle") / "trace.json"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            for case in CASES:
                with record_function(f"oracle:{case.id}"):
                    # no kernel for this device: the op was recorded before it failed
                    with contextlib.suppress(NotImplementedError, RuntimeError):
                        case.run()
        prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    spans = {
        e["name"][len("oracle:") :]: (e["ts"], e["ts"] + e["dur"])
        for e in events
        if e.get("cat") == "user_annotation" and e.get("name", "").startswith("oracle:")
    }
    ops = sorted((e for e in events if e.get("cat") == "cpu_op"), key=lambda e: (e["ts"], -e.get("dur", 0)))
    found: dict[str, dict[str, dict]] = {}
    for case in CASES:
        start, end = spans[case.id]
        for e in ops:
            if start <= e["ts"] <= end and e["name"] in case.ops:
                found.setdefault(case.id, {}).setdefault(e["name"], e["args"])
    return found


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_flops_equal_torch_flop_counter(case: Case, recorded):
    expected = flop_counter_total(case.ref or case.run)
    for op in case.ops:
        args = recorded.get(case.id, {}).get(op)
        assert args is not None, f"{op} not recorded for {case.id}"
        assert {"Input Dims", "Input type", "Concrete Inputs"} <= set(args)
        cost = op_cost(op, args)
        assert cost is not None, f"{op}: no cost for {json.dumps(args)}"
        assert cost.flops == expected, f"{op}: {cost.flops} != torch {expected} for {json.dumps(args)}"
        assert cost.bytes > 0 and cost.dtype != "unknown"


def test_cases_cover_every_requested_family():
    ops = {op for c in CASES for op in c.ops}
    for op in (
        "aten::mm",
        "aten::addmm",
        "aten::bmm",
        "aten::baddbmm",
        "aten::matmul",
        "aten::linear",
        "aten::convolution",
        "aten::conv1d",
        "aten::conv2d",
        "aten::conv3d",
        "aten::conv_transpose2d",
        "aten::convolution_backward",
        "aten::scaled_dot_product_attention",
        "aten::_scaled_dot_product_flash_attention",
        "aten::_scaled_dot_product_efficient_attention",
        "aten::_scaled_dot_product_flash_attention_backward",
        "aten::_flash_attention_forward",
    ):
        assert op in ops
    masks = {c.id.rsplit("_", 1)[1] for c in CASES if c.id.startswith("conv_backward")}
    assert len(masks) == 8  # every output_mask


def test_cases_include_gqa_causal_and_transposed(recorded):
    sdpa = [recorded[c.id]["aten::scaled_dot_product_attention"] for c in CASES if c.id.startswith("sdpa")]
    assert any(a["Input Dims"][0][1] != a["Input Dims"][1][1] for a in sdpa)  # Hq != Hkv
    assert any(a["Concrete Inputs"][5] == "True" for a in sdpa)  # is_causal
    assert any(a["Concrete Inputs"][7] == "True" for a in sdpa)  # enable_gqa
    conv = [recorded[c.id]["aten::convolution"] for c in CASES if c.id.startswith("conv_transpose")]
    assert conv and all(a["Concrete Inputs"][6] == "True" for a in conv)
    grouped = [
        a
        for c in CASES
        if c.id.startswith("conv") and "aten::convolution" in recorded[c.id]
        for a in [recorded[c.id]["aten::convolution"]]
        if a["Concrete Inputs"][8] != "1"
    ]
    assert grouped
