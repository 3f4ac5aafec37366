"""Embedding formulas: the lookup and its backward.

The lookup does no arithmetic (0 FLOPs) and reads only the gathered rows of the weight, not the
whole table: numel(indices)·D elements. The backward scatter-adds one FLOP per grad element.
"""

from __future__ import annotations

from math import prod

from .inputs import OpInputs, need
from .registry import Work, aten, formula


@formula(
    "aten::embedding",
    family="embedding",
    flops="0",
    bytes="indices + gathered rows (numel(indices)·D) read + out[..., D] written",
)
def _embedding(inp: OpInputs) -> Work:
    w, idx = inp.tensor(0, 2), inp.tensor(1)
    rows = prod(idx) * w[1]
    return Work(0, [idx + (w[1],)], read_bytes=inp.input_bytes(skip=(0,)) + rows * inp.elem_size(0))


@formula(
    *aten("embedding_dense_backward embedding_backward"),
    family="embedding",
    flops="numel(grad_output) (scatter-add)",
    bytes="grad_output + indices + out[num_weights, D]",
)
def _embedding_backward(inp: OpInputs) -> Work:
    go, num_weights = inp.tensor(0), inp.int_arg(2)
    need(len(go) >= 1 and num_weights >= 0)
    return Work(prod(go), [(num_weights, go[-1])])
