"""Copy formulas: copy_/fill_/zero_, clone, _to_copy, cat/stack: 0 FLOPs, bytes only.

In-place overwrites (``copy_``, ``fill_``, ``zero_``) do not read their destination, so its bytes
count once, as written.
"""

from __future__ import annotations

from math import prod

from .inputs import OpInputs, need
from .registry import Work, aten, formula


@formula(
    *aten("copy_ fill_ zero_"),
    family="copy",
    flops="0",
    bytes="source (if any) read + destination written (the destination is not read)",
)
def _overwrite(inp: OpInputs) -> Work:
    dst = inp.tensor(0)
    return Work(0, [dst], out_dtype=inp.dtype(0), read_bytes=inp.input_bytes(skip=(0,)))


@formula("aten::clone", family="copy", flops="0", bytes="input + out")
def _clone(inp: OpInputs) -> Work:
    return Work(0, [inp.tensor(0)], out_dtype=inp.dtype(0))


@formula("aten::_to_copy", family="copy", flops="0", bytes="input + out (in the dtype argument's dtype)")
def _to_copy(inp: OpInputs) -> Work:
    return Work(0, [inp.tensor(0)], out_dtype=inp.dtype_arg(1) or inp.dtype(0))


@formula(*aten("cat stack"), family="copy", flops="0", bytes="the TensorList + out of the same numel")
def _cat(inp: OpInputs) -> Work:
    shapes = inp.shapes(0)
    need(shapes)
    return Work(0, [(sum(prod(s) for s in shapes),)])
