"""GEMM formulas: mm, addmm, bmm, baddbmm, addbmm, matmul, mv/dot, addmv, linear, _scaled_mm.

FLOPs are exactly those of ``torch.utils.flop_counter`` (tests/test_formulas_oracle.py checks them):
2·M·N·K per matrix product, bias adds not counted. One difference: ``aten::dot``, ``aten::mv`` (and
matmul with a 1-D right operand, which runs as mv/dot) count 2·M·K, where torch has no formula (0).
"""

from __future__ import annotations

from math import prod

from .inputs import OpInputs, Shape, broadcast, need
from .registry import Work, formula


def matmul_work(a: Shape, b: Shape) -> Work:
    """torch.matmul semantics: 1-D operands, broadcast batch dims; 2·batch·M·N·K FLOPs."""
    need(len(a) >= 1 and len(b) >= 1)
    a2 = (1,) + a if len(a) == 1 else a
    b2 = b + (1,) if len(b) == 1 else b
    (m, k), (k2, n) = a2[-2:], b2[-2:]
    need(k == k2)
    batch = broadcast(a2[:-2], b2[:-2])
    out = batch + ((m,) if len(a) > 1 else ()) + ((n,) if len(b) > 1 else ())
    return Work(2 * prod(batch) * m * n * k, [out])


def _batched_matmul(inp: OpInputs, first: int) -> Work:
    """[B,M,K] x [B,K,N] from inputs `first` and `first + 1`."""
    a, b = inp.tensor(first, 3), inp.tensor(first + 1, 3)
    need(a[0] == b[0])
    return matmul_work(a, b)


@formula("aten::mm", family="gemm", flops="2·M·N·K", bytes="A + B + out[M,N]")
def _mm(inp: OpInputs) -> Work:
    return matmul_work(inp.tensor(0, 2), inp.tensor(1, 2))


@formula("aten::addmm", family="gemm", flops="2·M·N·K (bias add not counted)", bytes="bias + A + B + out[M,N]")
def _addmm(inp: OpInputs) -> Work:
    work = matmul_work(inp.tensor(1, 2), inp.tensor(2, 2))
    need(broadcast(inp.tensor(0), work.outputs[0]) == work.outputs[0])
    return work


@formula("aten::bmm", family="gemm", flops="2·B·M·N·K", bytes="A + B + out[B,M,N]")
def _bmm(inp: OpInputs) -> Work:
    return _batched_matmul(inp, 0)


@formula("aten::baddbmm", family="gemm", flops="2·B·M·N·K (bias add not counted)", bytes="bias + A + B + out[B,M,N]")
def _baddbmm(inp: OpInputs) -> Work:
    return _batched_matmul(inp, 1)


@formula("aten::addbmm", family="gemm", flops="2·B·M·N·K", bytes="bias + A + B + out[M,N]")
def _addbmm(inp: OpInputs) -> Work:
    work = _batched_matmul(inp, 1)
    (_, m, _), (_, _, n) = inp.tensor(1, 3), inp.tensor(2, 3)
    return Work(work.flops, [(m, n)])


@formula(
    "aten::matmul",
    family="gemm",
    flops="2·batch·M·N·K, batch dims broadcast; a 1-D operand counts M=1 or N=1",
    bytes="A + B + out",
)
def _matmul(inp: OpInputs) -> Work:
    return matmul_work(inp.tensor(0), inp.tensor(1))


@formula("aten::mv", "aten::dot", "aten::vdot", family="gemm", flops="2·M·K (dot: 2·K)", bytes="A + x + out")
def _mv(inp: OpInputs) -> Work:
    return matmul_work(inp.tensor(0, (1, 2)), inp.tensor(1, 1))


@formula("aten::addmv", family="gemm", flops="2·M·K", bytes="bias + A + x + out[M]")
def _addmv(inp: OpInputs) -> Work:
    return matmul_work(inp.tensor(1, 2), inp.tensor(2, 1))


@formula(
    "aten::linear",
    family="gemm",
    flops="2·prod(input[:-1])·N·K (weight [N,K])",
    bytes="input + weight + bias + out[...,N]",
)
def _linear(inp: OpInputs) -> Work:
    x, w = inp.tensor(0), inp.tensor(1, 2)
    need(len(x) >= 1 and x[-1] == w[1])
    return Work(2 * prod(x[:-1]) * w[0] * w[1], [x[:-1] + (w[0],)])


@formula(
    "aten::_scaled_mm",
    family="gemm",
    flops="2·M·N·K (fp8 inputs)",
    bytes="A + B + scales + bias + out[M,N] (out_dtype)",
)
def _scaled_mm(inp: OpInputs) -> Work:
    work = matmul_work(inp.tensor(0, 2), inp.tensor(1, 2))
    return work._replace(out_dtype=inp.dtype_arg(6) or inp.dtype(0))
