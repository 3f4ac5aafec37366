"""OpInputs: the inputs of one op call as a ``cpu_op`` event records them, and shape math.

`OpInputs.from_args` reads four args of the event, one entry per op input: ``Input Dims`` (a
shape; ``[]`` for a scalar or an absent tensor; a list of shapes for a TensorList), ``Input type``
(``c10::BFloat16``, ``float``, ``Scalar``, ``TensorList``, ``""``...), ``Input Strides`` and
``Concrete Inputs`` (the text of non-tensor values, read by `parse_literal`). Any of the four may be
missing (old traces have only dims and types); a list whose length differs from ``Input Dims`` is
ignored. Formulas read inputs through the strict accessors (`OpInputs.tensor`, `int_arg`...), which
raise `Insufficient` when a value is missing or impossible: the op then gets no cost.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from math import prod
from typing import Any, TypeVar

from .dtypes import DTYPE_SIZE, FLOATING, SCALAR_TYPE_CODES, normalize_dtype
from .literal import parse_literal

Shape = tuple[int, ...]
T = TypeVar("T")

# "Input type" values of inputs that are not tensors (compared lower case).
_NON_TENSOR_TYPES = frozenset(
    {
        "",
        "scalar",
        "scalarlist",
        "tensorlist",
        "genericlist",
        "none",
        "string",
        "device",
        "layout",
        "memoryformat",
        "scalartype",
    }
)
_LIST_TYPES = frozenset({"tensorlist", "genericlist"})


class Insufficient(ValueError):
    """A formula's inputs are missing or inconsistent: the op gets no cost (None)."""


def need(condition: Any) -> None:
    """Give up on this op (None) unless `condition` holds."""
    if not condition:
        raise Insufficient


def present(value: T | None) -> T:
    """`value`, or give up on this op (None) when it is None; narrows the type for the checker."""
    if value is None:
        raise Insufficient
    return value


def broadcast(*shapes: Shape) -> Shape:
    """numpy/torch broadcasting of shapes; Insufficient if they do not broadcast."""
    ndim = max((len(s) for s in shapes), default=0)
    out = []
    for axis in range(ndim):
        sizes = {s[len(s) - ndim + axis] for s in shapes if len(s) - ndim + axis >= 0} - {1}
        need(len(sizes) <= 1)
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


# ------------------------------------------------------------------------------ Input Dims entries


class _Nested(tuple[Any, ...]):
    """The dims of a TensorList input: a tuple of shapes (or of further _Nested)."""


Dims = Shape | _Nested | None


def _parse_dims(v: Any, depth: int = 0) -> Dims:
    """One ``Input Dims`` entry -> a shape, a _Nested list of shapes, or None when unusable."""
    if not isinstance(v, (list, tuple)) or depth > 3:
        return None
    if all(type(x) is int for x in v):
        return tuple(v) if all(x >= 0 for x in v) else None
    items = [_parse_dims(x, depth + 1) for x in v]
    return None if any(i is None for i in items) else _Nested(items)


def _flat_shapes(entry: Any) -> list[Shape]:
    if isinstance(entry, _Nested):
        return [s for item in entry for s in _flat_shapes(item)]
    return [entry] if isinstance(entry, tuple) else []


def _stored_numel(shape: Shape, strides: Any) -> int:
    """Elements a read touches: numel, except that a stride-0 (expanded) dim is read once."""
    if 0 in shape:
        return 0
    if isinstance(strides, (list, tuple)) and len(strides) == len(shape) and all(type(s) is int for s in strides):
        return prod(d for d, s in zip(shape, strides, strict=True) if s != 0)
    return prod(shape)


def _as_list(v: Any) -> list[Any] | None:
    return list(v) if isinstance(v, (list, tuple)) else None


# ------------------------------------------------------------------------------------- OpInputs


@dataclass(frozen=True)
class OpInputs:
    """The inputs of one op call, as Kineto recorded them (index i = the op's i-th argument)."""

    dims: tuple[Dims, ...] = ()  # per input: a shape tuple, a _Nested (TensorList) or None
    types: tuple[str, ...] = ()  # per input: the "Input type" string; () when not recorded
    strides: tuple[Any, ...] = ()  # per input, nested like dims; () when not recorded
    concretes: tuple[Any, ...] = ()  # per input: the "Concrete Inputs" text; () when not recorded
    dtype_fallback: str | None = None
    attrs: Mapping[str, Any] = field(default_factory=dict)  # the event's other args (collectives)

    @classmethod
    def from_args(cls, args: Any, dtype_fallback: str | None = None) -> OpInputs:
        args = args if isinstance(args, Mapping) else {}
        raw_dims = _as_list(args.get("Input Dims")) or []
        n = len(raw_dims)

        def aligned(key: str) -> tuple[Any, ...]:
            v = _as_list(args.get(key))
            return tuple(v) if v is not None and len(v) == n else ()

        types = tuple(t if isinstance(t, str) else "" for t in aligned("Input type"))
        return cls(
            dims=tuple(_parse_dims(d) for d in raw_dims),
            types=types,
            strides=aligned("Input Strides"),
            concretes=aligned("Concrete Inputs"),
            dtype_fallback=normalize_dtype(dtype_fallback),
            attrs=args,
        )

    @property
    def n(self) -> int:
        return len(self.dims)

    def _type(self, i: int) -> str | None:
        return self.types[i].strip().lower() if self.types else None

    # --- shapes
    def shape(self, i: int) -> Shape | None:
        """The shape of tensor input i; None if input i is not a (recorded) tensor."""
        d = self.dims[i] if 0 <= i < self.n else None
        if not isinstance(d, tuple) or isinstance(d, _Nested):
            return None
        t = self._type(i)
        return d if (bool(d) if t is None else t not in _NON_TENSOR_TYPES) else None

    def is_tensor(self, i: int) -> bool:
        return self.shape(i) is not None

    def shapes(self, i: int) -> list[Shape]:
        """The shapes input i holds: [shape] for a tensor, all shapes of a TensorList, else []."""
        s = self.shape(i)
        if s is not None:
            return [s]
        if 0 <= i < self.n and isinstance(self.dims[i], _Nested) and self._type(i) in _LIST_TYPES | {None}:
            return _flat_shapes(self.dims[i])
        return []

    def numel(self, i: int) -> int | None:
        shapes = self.shapes(i)
        return sum(prod(s) for s in shapes) if shapes else None

    # --- dtypes
    def dtype(self, i: int) -> str | None:
        """Normalised dtype of input i (bf16, fp32, ...); the fallback when not recorded."""
        if not self.shapes(i):
            return None
        own = normalize_dtype(self.types[i]) if self.types else None
        return own or self.dtype_fallback

    def compute_dtype(self) -> str | None:
        """First floating-point tensor dtype, else the first tensor's, else the fallback."""
        known = [d for d in (normalize_dtype(t) for t in self.types) if d]
        floating = [d for d in known if d in FLOATING]
        if floating or known:
            return (floating or known)[0]
        return self.dtype_fallback

    def bytes_per_elem(self, i: int) -> int | None:
        return DTYPE_SIZE.get(self.dtype(i) or self.compute_dtype() or "")

    def elem_size(self, i: int) -> float:
        """bytes_per_elem(i), NaN when unknown (so byte sums become NaN, not errors)."""
        size = self.bytes_per_elem(i)
        return math.nan if size is None else float(size)

    def input_bytes(self, skip: Sequence[int] = ()) -> float:
        """Bytes read from all tensor inputs (TensorLists included), stride-0 dims read once."""
        total = 0.0
        for i in range(self.n):
            shapes = [] if i in skip else self.shapes(i)
            if not shapes:
                continue
            strides = self.strides[i] if self.strides else None
            stride_list = _flat_shapes(_parse_dims(strides)) if isinstance(self.dims[i], _Nested) else [strides]
            if len(stride_list) != len(shapes):
                stride_list = [None] * len(shapes)
            total += sum(_stored_numel(s, st) for s, st in zip(shapes, stride_list, strict=True)) * self.elem_size(i)
        return total

    # --- concrete values
    def concrete(self, i: int) -> Any:
        """The parsed Concrete Inputs value of input i; None when absent, empty or unparseable."""
        if not 0 <= i < len(self.concretes):
            return None
        v = self.concretes[i]
        if isinstance(v, (bool, int, float)):
            return v
        if not isinstance(v, str) or not v.strip():
            return None
        try:
            return parse_literal(v)
        except (ValueError, RecursionError):
            return None

    # --- strict accessors for formulas: raise Insufficient (-> None) instead of returning None
    def tensor(self, i: int, ndim: int | tuple[int, ...] | None = None) -> Shape:
        s = present(self.shape(i))
        need(ndim is None or len(s) in ((ndim,) if isinstance(ndim, int) else ndim))
        return s

    def int_arg(self, i: int) -> int:
        v = self.concrete(i)
        if type(v) is not int:
            raise Insufficient
        return v

    def ints_arg(self, i: int) -> tuple[int, ...]:
        v = self.concrete(i)
        v = [v] if type(v) is int else v
        need(isinstance(v, list) and all(type(x) is int for x in v))
        return tuple(v)

    def flag_arg(self, i: int) -> bool:
        v = self.concrete(i)
        need(isinstance(v, bool) or v in (0, 1))
        return bool(v)

    def flags_arg(self, i: int) -> tuple[bool, ...]:
        v = self.concrete(i)
        need(isinstance(v, list) and all(isinstance(x, bool) for x in v))
        return tuple(v)

    def dtype_arg(self, i: int) -> str | None:
        """A ScalarType argument (Concrete Inputs print its code, e.g. "15" -> bf16); None if absent."""
        v = self.concrete(i)
        return SCALAR_TYPE_CODES.get(v) if type(v) is int else normalize_dtype(v)
