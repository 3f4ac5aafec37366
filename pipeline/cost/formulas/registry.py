"""The formula table: `FORMULAS`, the `@formula` decorator, `op_cost` and the README rendering.

`FORMULAS` maps an op name as the profiler writes it (``aten::mm``, ``c10d::allreduce_``,
``nccl:all_reduce``) to a `Formula`: a family, a one-line FLOPs and bytes formula (the README table,
`formulas_markdown`) and a small function of `OpInputs` returning `Work`. Calling a `Formula` gives
a `Cost` or None. Single formulas register with ``@formula(...)``; families of look-alike ops
(convolution layouts, elementwise, reductions, collectives) register from small data tables. Each
family module states its own conventions; these hold for all:

* FLOPs: a multiply-add is 2 FLOPs. Integer and boolean arithmetic is no floating-point work: an
  op whose compute dtype is an integer or bool does 0 FLOPs (`NO_FLOPS`), except int8, whose
  multiply-adds are counted against the INT8 tensor peak (TOP/s).
* Bytes = the minimum traffic: the sum over tensor inputs of numel × element size (a dim with
  stride 0 in ``Input Strides``, i.e. an expanded tensor, is read once), plus the outputs the
  formula computes × the output element size. Auxiliary outputs (logsumexp, saved mean/rstd,
  indices, norm weight grads) are not counted. Exceptions are in the table.
* Element sizes come from the real dtypes (``Input type``; ``dtype_fallback`` when it is missing or
  the input is a TensorList, whose element dtype Kineto does not record). When no dtype is known the
  bytes are NaN (FLOPs still count). ``Cost.dtype`` is the compute dtype: the first floating-point
  tensor input's dtype (fp8 for ``_scaled_mm``), else the first tensor's, else the fallback, else
  ``"unknown"``.
* Composite ops and the ops they call both have formulas (``aten::linear`` → ``aten::addmm``,
  ``aten::conv2d`` → ``aten::convolution`` → ``aten::cudnn_convolution``): a consumer summing costs
  must count one level of each call stack.
* A formula that lacks what it needs (or sees shapes that cannot come from a real call) gives
  None; `op_cost` never raises.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from math import prod
from typing import Any, NamedTuple

from .dtypes import DTYPE_SIZE, FLOATING
from .inputs import OpInputs, Shape


class Cost(NamedTuple):
    """What one op costs: FLOPs, bytes moved (minimum traffic), compute dtype, family."""

    flops: float
    bytes: float
    dtype: str
    family: str


class Work(NamedTuple):
    """What a formula function returns; `Formula` turns it into a `Cost`."""

    flops: float
    outputs: Sequence[Shape] = ()  # output shapes (their numel × out dtype size is written)
    out_dtype: str | None = None  # default: the compute dtype
    read_bytes: float | None = None  # default: OpInputs.input_bytes()
    dtype: str | None = None  # compute dtype override (default: OpInputs.compute_dtype())
    family: str | None = None  # family override (default: the Formula's)


FormulaFn = Callable[[OpInputs], Work | None]
# What a formula may raise on odd inputs (Insufficient is a ValueError): the op gets no cost.
_ERRORS = (ArithmeticError, LookupError, TypeError, ValueError, RecursionError)


@dataclass(frozen=True)
class Formula:
    """One row of the table: op names, family, documented formulas, and the function."""

    names: tuple[str, ...]
    family: str
    flops: str
    bytes: str
    fn: FormulaFn

    def __call__(self, inp: OpInputs) -> Cost | None:
        try:
            work = self.fn(inp)
            return None if work is None else _to_cost(work, inp, work.family or self.family)
        except _ERRORS:
            return None


def _to_cost(work: Work, inp: OpInputs, family: str) -> Cost | None:
    dtype = work.dtype or inp.compute_dtype()
    out_dtype = work.out_dtype or dtype
    out_numel = sum(prod(s) for s in work.outputs)
    written = out_numel * DTYPE_SIZE.get(out_dtype or "", math.nan) if out_numel else 0.0
    read = inp.input_bytes() if work.read_bytes is None else work.read_bytes
    flops, nbytes = float(work.flops), float(read) + float(written)
    flops = 0.0 if dtype in NO_FLOPS else flops
    if not math.isfinite(flops) or flops < 0 or math.isinf(nbytes) or nbytes < 0:
        return None
    return Cost(flops, nbytes, dtype or "unknown", family)


# compute dtypes whose arithmetic is not counted as FLOPs (int8's is: INT8 tensor-core TOP/s)
NO_FLOPS = frozenset(d for d in DTYPE_SIZE if d not in FLOATING and d not in ("int8", "qint8", "quint8", "qint32"))
FORMULAS: dict[str, Formula] = {}


def register(f: Formula) -> Formula:
    """Add `f` under each of its names; a name registered twice is a bug (RuntimeError)."""
    for name in f.names:
        if name in FORMULAS:
            raise RuntimeError(f"duplicate formula for {name}")
        FORMULAS[name] = f
    return f


def formula(*names: str, family: str, flops: str, bytes: str = "inputs + output") -> Callable[[FormulaFn], FormulaFn]:
    """Decorator: register `fn(inp) -> Work | None` under `names`."""

    def deco(fn: FormulaFn) -> FormulaFn:
        register(Formula(tuple(names), family, flops, bytes, fn))
        return fn

    return deco


def aten(names: str, inplace: bool = False) -> tuple[str, ...]:
    """aten("mm bmm") == ("aten::mm", "aten::bmm"); inplace=True adds "aten::mm_", "aten::bmm_"."""
    base = [f"aten::{n}" for n in names.split()]
    return tuple(base + [n + "_" for n in base] if inplace else base)


def has_formula(name: str) -> bool:
    """Whether the table has a formula for an op name (``nccl:send 0->1`` as ``nccl:send``)."""
    return name in FORMULAS or name.split(" ", 1)[0] in FORMULAS


def op_cost(name: str, args: Mapping[str, Any] | None, dtype_fallback: str | None = None) -> Cost | None:
    """FLOPs and bytes of one op from its event args; None when not modelled or not computable.

    `name` is the event name (``aten::mm``; ``nccl:send 0->1`` is looked up as ``nccl:send``);
    `args` the event's args dict; `dtype_fallback` the dtype to assume when ``Input type`` is
    missing (and for TensorList elements). Never raises.
    """
    if not isinstance(name, str):
        return None
    f = FORMULAS.get(name) or FORMULAS.get(name.split(" ", 1)[0])
    if f is None:
        return None
    try:
        inp = OpInputs.from_args(args, dtype_fallback)
    except _ERRORS:
        return None
    return f(inp)


def formulas_markdown() -> str:
    """The table as Markdown (ops, family, FLOPs, bytes); rows with the same formulas merged.

    Rows come in registration order, so the family modules' import order fixes the README's.
    """
    rows: dict[tuple[str, str, str], list[str]] = {}
    for f in dict.fromkeys(FORMULAS.values()):
        rows.setdefault((f.family, f.flops, f.bytes), []).extend(f.names)
    lines = ["| ops | family | FLOPs | bytes |", "| --- | --- | --- | --- |"]
    for (family, flops, nbytes), names in rows.items():
        lines.append(f"| {_op_list(names)} | {family} | {_cell(flops)} | {_cell(nbytes)} |")
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _op_list(names: list[str]) -> str:
    """`aten::add(_)` stands for aten::add and aten::add_."""
    present = set(names)
    return ", ".join(
        f"`{n}(_)`" if n + "_" in present else f"`{n}`" for n in names if not (n.endswith("_") and n[:-1] in present)
    )
