"""Reduction formulas: sum, mean, amax, argmax, any, var/std, logsumexp, norm, max/min.

These count approximate work (torch's counter counts none): k FLOPs per input element. The reduced
dims come from the op's dim argument; without one (or in the overload that has none) the reduction
is full, to a scalar.
"""

from __future__ import annotations

from functools import partial
from math import prod

from .elementwise import elementwise_work
from .inputs import OpInputs, need
from .registry import Formula, Work, aten, formula, register


def _reduction(k: int, dim_index: int, out_dtype: str | None, inp: OpInputs) -> Work:
    """k FLOPs per input element; the output drops the dims named by input `dim_index`."""
    x = inp.tensor(0)
    # the dim argument exists only in the overload that also has keepdim after it
    dims = inp.concrete(dim_index) if inp.n > dim_index + 1 else None
    dims = [dims] if type(dims) is int else dims
    need(dims is None or (isinstance(dims, list) and all(type(d) is int for d in dims)))
    ndim = max(len(x), 1)
    need(all(-ndim <= d < ndim for d in dims or ()))
    axes = {d % ndim for d in dims or ()}
    out = tuple(s for a, s in enumerate(x) if axes and a not in axes)
    return Work(k * prod(x), [out], out_dtype=out_dtype)


_REDUCTIONS = (
    # (FLOPs per input element, ops, index of the dim argument, output dtype)
    (1, "sum nansum mean prod amax amin", 1, None),
    (1, "any all", 1, "bool"),
    (1, "argmax argmin", 1, "int64"),
    (3, "logsumexp", 1, None),
    (3, "var std var_mean std_mean", 1, None),
    (2, "norm linalg_vector_norm", 2, None),
)
for _k, _ops, _dim, _out in _REDUCTIONS:
    register(
        Formula(
            aten(_ops),
            "reduction",
            f"{_k}·numel(input)",
            "input + out (dims from the dim argument; when unknown, a full reduction)" + (f" ({_out})" if _out else ""),
            partial(_reduction, _k, _dim, _out),
        )
    )


@formula(
    *aten("max min"),
    family="reduction",
    flops="numel(input) (with a tensor `other`: elementwise, numel(out))",
    bytes="input + out (values only)",
)
def _max_min(inp: OpInputs) -> Work:
    """A reduction, or elementwise max/min of two tensors (the `other` overload)."""
    if inp.shape(1) is not None:
        return elementwise_work(1, None, inp)._replace(family="elementwise")
    return _reduction(1, 1, None, inp)
