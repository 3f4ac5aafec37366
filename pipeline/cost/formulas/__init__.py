"""formulas: FLOPs and bytes of one CPU op, computed from its Kineto event args.

`op_cost(name, args)` looks the op up in `FORMULAS` (op name -> `Formula`) and evaluates it on the
event's `OpInputs`; `formulas_markdown()` renders the table for the README. `registry` holds the
table and the conventions all formulas share; each op family is one module that registers its rows
on import. They are imported below in a fixed order: the order of `FORMULAS` and of the README table.
"""

from __future__ import annotations

from pipeline.kineto import ARG_ALIASES

from .dtypes import normalize_dtype
from .inputs import OpInputs
from .literal import parse_literal
from .registry import FORMULAS, Cost, Formula, formula, formulas_markdown, has_formula, op_cost

# isort: off
from . import gemm, conv, attention, norms, embedding, elementwise, copies, reductions, collectives

# isort: on
from .collectives import collective_bandwidth, collective_kind

FAMILIES = (gemm, conv, attention, norms, embedding, elementwise, copies, reductions, collectives)
"""The family modules in registration order."""

MODELLED_OPS: tuple[str, ...] = tuple(sorted(FORMULAS))
# Every event arg a formula reads: the four input args (and older layouts' names for them:
# `kineto.ARG_ALIASES`), and the ones record_param_comms carries (without them a
# record_param_comms event has no cost).
ARGS_READ: tuple[str, ...] = (
    *ARG_ALIASES,
    "Input Dims",
    "Input type",
    "Input Strides",
    "Concrete Inputs",
    "Collective name",
    "dtype",
    "In msg nelems",
    "Out msg nelems",
    "Group size",
)

__all__ = [
    "Cost",
    "OpInputs",
    "Formula",
    "FORMULAS",
    "MODELLED_OPS",
    "ARGS_READ",
    "op_cost",
    "has_formula",
    "formula",
    "formulas_markdown",
    "collective_bandwidth",
    "collective_kind",
    "normalize_dtype",
    "parse_literal",
]
