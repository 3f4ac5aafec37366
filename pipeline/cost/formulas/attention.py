"""Attention formulas: scaled_dot_product_attention and its flash/efficient/cudnn kernels, both passes.

FLOPs are those of ``torch.utils.flop_counter`` (tests/test_formulas_oracle.py checks them). Causal
attention is NOT halved (torch's convention): FLOPs cover the full Sq×Sk score matrix whatever
``is_causal`` says, so the achieved FLOP/s of a causal kernel reads about 2× its useful rate.
Grouped-query attention (Hq a multiple of Hkv) counts Hq heads. One difference from torch's counter:
``_flash_attention_forward/backward`` and ``_efficient_attention_forward/backward`` take
[B, S, H, D] tensors, which this table reads as such (torch's counter reads them as [B, H, S, D] and
misreports dense calls).
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

from .inputs import OpInputs, Shape, need
from .registry import Formula, Work, aten, register


class AttentionLayout(NamedTuple):
    """Where an attention op keeps q, k, v (k = q + 1, v = q + 2) and its other arguments."""

    q: int
    grad_out: int | None  # backward ops
    bshd: bool  # tensors are [B, S, H, D] (flash/efficient kernels) not [B, H, S, D]
    varlen: tuple[int, int] | None = None  # nested inputs: indices of cu_seqlens_q and max_q


_ATTENTION_LAYOUTS = {
    aten(
        "scaled_dot_product_attention _scaled_dot_product_flash_attention "
        "_scaled_dot_product_efficient_attention _scaled_dot_product_cudnn_attention "
        "_scaled_dot_product_flash_attention_for_cpu _scaled_dot_product_attention_math "
        "_scaled_dot_product_fused_attention_overrideable"
    ): AttentionLayout(0, None, False),
    aten(
        "_scaled_dot_product_flash_attention_backward _scaled_dot_product_efficient_attention_backward "
        "_scaled_dot_product_cudnn_attention_backward _scaled_dot_product_flash_attention_for_cpu_backward "
        "_scaled_dot_product_fused_attention_overrideable_backward"
    ): AttentionLayout(1, 0, False),
    aten("_flash_attention_forward"): AttentionLayout(0, None, True, (3, 5)),
    aten("_efficient_attention_forward"): AttentionLayout(0, None, True, (4, 6)),
    aten("_flash_attention_backward _efficient_attention_backward"): AttentionLayout(1, 0, True, (6, 8)),
}


def _bhsd(inp: OpInputs, layout: AttentionLayout) -> tuple[Shape, Shape, Shape]:
    """q, k, v shapes as [B, H, S, D]: transposed from [B, S, H, D], or from varlen [T, H, D]."""
    q, k, v = (inp.tensor(layout.q + j, (3, 4)) for j in range(3))
    if layout.varlen is not None:
        cu_seqlens_q, max_q_index = layout.varlen
        cu = inp.shape(cu_seqlens_q)
        if cu is not None and len(cu) == 1 and cu[0] >= 2:
            # nested / varlen: torch counts every sequence at the max length (an upper bound)
            batch, max_q, max_k = cu[0] - 1, inp.int_arg(max_q_index), inp.int_arg(max_q_index + 1)
            need(max_q >= 0 and max_k >= 0)
            return ((batch, q[-2], max_q, q[-1]), (batch, k[-2], max_k, k[-1]), (batch, v[-2], max_k, v[-1]))
    need(len(q) == len(k) == len(v) == 4)
    if layout.bshd:
        return _swap_s_h(q), _swap_s_h(k), _swap_s_h(v)
    return q, k, v


def _swap_s_h(s: Shape) -> Shape:
    """[B, S, H, D] -> [B, H, S, D]."""
    return (s[0], s[2], s[1], s[3])


def attention_flops(q: Shape, k: Shape, v: Shape, backward: bool) -> int:
    """torch's sdpa_flop_count / sdpa_backward_flop_count on [B, H, S, D] shapes (GQA: Hq heads)."""
    (b, hq, sq, d), (b2, hkv, sk, d2), (b3, hv, sk2, dv) = q, k, v
    need(b == b2 == b3 and d == d2 and sk == sk2 and hkv == hv and hkv >= 1 and hq % hkv == 0)
    scores = b * hq * sq * sk
    # forward: QK^T and PV. backward: recompute QK^T, dP = dO V^T, dV = P^T dO, dQ = dS K, dK = dS^T Q
    return 2 * scores * (3 * d + 2 * dv) if backward else 2 * scores * (d + dv)


def _attention(layout: AttentionLayout, inp: OpInputs) -> Work:
    q, k, v = _bhsd(inp, layout)
    backward = layout.grad_out is not None
    flops = attention_flops(q, k, v, backward)
    outputs = [inp.tensor(layout.q + j) for j in range(3)] if backward else [q[:3] + (v[3],)]
    return Work(flops, outputs)


def _docs(layout: AttentionLayout) -> tuple[str, str]:
    """The table's FLOPs and bytes text for one layout."""
    backward = layout.grad_out is not None
    flops = (
        "2·B·Hq·Sq·Sk·(3·D + 2·Dv) (recompute QKᵀ, dP, dV, dQ, dK)"
        if backward
        else "2·B·Hq·Sq·Sk·(D + Dv) (QKᵀ and PV)"
    )
    flops += "; GQA counts Hq heads; causal not halved" + ("; tensors [B,S,H,D]" if layout.bshd else "")
    return flops, "all tensor inputs + " + ("dQ + dK + dV" if backward else "out[B,Hq,Sq,Dv]")


for _names, _layout in _ATTENTION_LAYOUTS.items():
    register(Formula(_names, "attention", *_docs(_layout), partial(_attention, _layout)))
