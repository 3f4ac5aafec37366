"""formulas: FLOPs and bytes of one CPU op, computed from its Kineto event args.

The table
---------
`FORMULAS` maps an op name as the profiler writes it (``aten::mm``, ``c10d::allreduce_``,
``nccl:all_reduce``) to a `Formula`: a family, a one-line FLOPs and bytes formula (the README table,
`formulas_markdown`) and a small function of `OpInputs`. Calling a `Formula` with an `OpInputs` gives
a `Cost` or None. Single formulas are registered with ``@formula(...)``; families of look-alike ops
(convolution layouts, elementwise, reductions, collectives) are registered from small data tables.
The public entry point is `op_cost(name, args)`.

Inputs
------
`OpInputs.from_args` reads four args of a ``cpu_op`` event, one entry per op input:
``Input Dims`` (a shape; ``[]`` for a scalar or an absent tensor; a list of shapes for a TensorList),
``Input type`` (``c10::BFloat16``, ``float``, ``Scalar``, ``TensorList``, ``""``...), ``Input Strides``
and ``Concrete Inputs`` (the text of non-tensor values: ``"[1, 1]"``, ``"False"``, ``"0."``, ``"15"``
for a ScalarType). Concrete Inputs are parsed by a tiny literal parser (ints, floats, bools, None,
bare words, nested lists): never ``eval``. Any of the four may be missing (old traces have only dims
and types); a list whose length differs from ``Input Dims`` is ignored. A formula that lacks what it
needs (or sees shapes that cannot come from a real call) gives None; `op_cost` never raises.

Conventions
-----------
* FLOPs: a multiply-add is 2 FLOPs. GEMM, convolution and attention FLOPs are exactly those of
  ``torch.utils.flop_counter`` (tests/test_formulas_oracle.py checks them against it):
  bias adds are not counted; a transposed convolution counts ``2·N·prod(input spatial)·Cin·
  (Cout/groups)·prod(kernel)``; ``convolution_backward`` counts grad_input like the forward and
  grad_weight as torch does (``2·N·Cin·Cout·prod(kernel)·prod(spatial)``, not divided by groups),
  grad_bias as 0 FLOPs.
* Causal attention is NOT halved (torch's flop counter convention): FLOPs cover the full Sq×Sk
  score matrix whatever ``is_causal`` says, so the achieved FLOP/s of a causal kernel reads about
  2× its useful rate. Grouped-query attention (Hq a multiple of Hkv) counts Hq heads.
  Differences from torch's counter: ``_flash_attention_forward/backward`` and
  ``_efficient_attention_forward/backward`` take [B, S, H, D] tensors, which this table reads as
  such (torch's counter reads them as [B, H, S, D] and misreports dense calls); ``aten::dot``,
  ``aten::mv`` (and matmul with a 1-D right operand, which runs as mv/dot) count 2·M·K, where torch
  has no formula (0).
* Other families count approximate work (torch's counter counts none): elementwise ``k·numel(out)``
  with a per-op k (1 for one arithmetic or transcendental function, more for composite ones: see
  `formulas_markdown`), reductions ``k·numel(input)``, norms and softmax a fixed number per element,
  embedding and copies 0, collectives 0 (the reduction arithmetic of allreduce is ignored).
* Bytes = the minimum traffic: the sum over tensor inputs of numel × element size (a dim with
  stride 0 in ``Input Strides``, i.e. an expanded tensor, is read once), plus the outputs the
  formula computes × the output element size. Exceptions, each in the table: in-place overwrites
  (``copy_``, ``fill_``, ``zero_``) do not read the destination; ``embedding`` reads only the
  gathered rows of the weight; collectives report the message size (nccl-tests' "size": the full
  buffer of allreduce/broadcast/reduce, the gathered output of allgather, the scattered input of
  reducescatter, the send buffer of alltoall). Auxiliary outputs (logsumexp, saved mean/rstd,
  indices, norm weight grads) are not counted.
* Element sizes come from the real dtypes (``Input type``; ``dtype_fallback`` when it is missing or
  the input is a TensorList, whose element dtype Kineto does not record). When no dtype is known the
  bytes are NaN (FLOPs still count). ``Cost.dtype`` is the compute dtype: the first floating-point
  tensor input's dtype (fp8 for ``_scaled_mm``), else the first tensor's, else the fallback, else
  ``"unknown"``.
* Composite ops and the ops they call both have formulas (``aten::linear`` → ``aten::addmm``,
  ``aten::conv2d`` → ``aten::convolution`` → ``aten::cudnn_convolution``): a consumer summing costs
  must count one level of each call stack.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from functools import partial
from math import prod
from typing import Any, Callable, Mapping, NamedTuple, Sequence

__all__ = ["Cost", "OpInputs", "Formula", "FORMULAS", "MODELLED_OPS", "ARGS_READ", "op_cost", "formula",
           "formulas_markdown", "collective_bandwidth", "collective_kind", "normalize_dtype",
           "parse_literal"]

Shape = tuple  # tuple[int, ...]


class Cost(NamedTuple):
    """What one op costs: FLOPs, bytes moved (minimum traffic), compute dtype, family."""
    flops: float
    bytes: float
    dtype: str
    family: str


# ----------------------------------------------------------------------------------------- dtypes

DTYPE_SIZE = {
    "bf16": 2, "fp16": 2, "fp32": 4, "fp64": 8, "fp8": 1, "fp4x2": 1,
    "complex32": 4, "complex64": 8, "complex128": 16, "bool": 1,
    "int8": 1, "uint8": 1, "int16": 2, "uint16": 2, "int32": 4, "uint32": 4, "int64": 8, "uint64": 8,
    "qint8": 1, "quint8": 1, "qint32": 4,
}
_FLOATING = frozenset({"bf16", "fp16", "fp32", "fp64", "fp8", "fp4x2", "complex32", "complex64",
                       "complex128"})
# Kineto "Input type" strings (C++ type names), c10::ScalarType names (record_param_comms "dtype"),
# torch dtype names; all lower case, "c10::" / "torch." prefixes removed before lookup.
_DTYPE_ALIASES = {
    "float": "fp32", "float32": "fp32", "double": "fp64", "float64": "fp64",
    "half": "fp16", "float16": "fp16", "bfloat16": "bf16",
    "float8_e4m3fn": "fp8", "float8_e5m2": "fp8", "float8_e4m3fnuz": "fp8", "float8_e5m2fnuz": "fp8",
    "float8_e8m0fnu": "fp8", "float4_e2m1fn_x2": "fp4x2",
    "complex<half>": "complex32", "complexhalf": "complex32",
    "complex<float>": "complex64", "complexfloat": "complex64",
    "complex<double>": "complex128", "complexdouble": "complex128",
    "bool": "bool", "signed char": "int8", "char": "int8", "unsigned char": "uint8", "byte": "uint8",
    "short int": "int16", "short": "int16", "short unsigned int": "uint16", "unsigned short": "uint16",
    "int": "int32", "unsigned int": "uint32", "long int": "int64", "long": "int64", "int64_t": "int64",
    "long long": "int64", "long unsigned int": "uint64", "unsigned long": "uint64",
    "uint16": "uint16", "uint32": "uint32", "uint64": "uint64",
}
# c10::ScalarType codes, as Concrete Inputs print a dtype argument (`dtype=torch.bfloat16` -> "15").
_SCALAR_TYPE_CODES = {
    0: "uint8", 1: "int8", 2: "int16", 3: "int32", 4: "int64", 5: "fp16", 6: "fp32", 7: "fp64",
    8: "complex32", 9: "complex64", 10: "complex128", 11: "bool", 12: "qint8", 13: "quint8",
    14: "qint32", 15: "bf16", 23: "fp8", 24: "fp8", 25: "fp8", 26: "fp8", 27: "uint16",
    28: "uint32", 29: "uint64", 44: "fp8", 45: "fp4x2",
}
# "Input type" values of inputs that are not tensors (compared lower case).
_NON_TENSOR_TYPES = frozenset({"", "scalar", "scalarlist", "tensorlist", "genericlist", "none",
                               "string", "device", "layout", "memoryformat", "scalartype"})
_LIST_TYPES = frozenset({"tensorlist", "genericlist"})


def normalize_dtype(name: Any) -> str | None:
    """``c10::BFloat16`` / ``BFloat16`` / ``torch.bfloat16`` / ``bf16`` -> ``bf16``; unknown -> None."""
    if not isinstance(name, str):
        return None
    key = name.strip().lower().replace("c10::", "").removeprefix("torch.")  # c10::complex<c10::Half>
    if key in DTYPE_SIZE:
        return key
    return _DTYPE_ALIASES.get(key)


# ------------------------------------------------------------------------- Concrete Inputs parser

_TOKEN = re.compile(r"\s*(?:([\[\](),])|([^\s\[\](),]+))")
_INT = re.compile(r"[+-]?\d{1,30}\Z")
_FLOAT = re.compile(r"[+-]?(?:\d+\.?\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?|inf|nan)\Z", re.I)
_WORD = re.compile(r"[A-Za-z_][\w.:-]*\Z")
_WORDS = {"true": True, "false": False, "none": None}
_MAX_TEXT, _MAX_DEPTH = 10_000, 8


def parse_literal(text: str) -> Any:
    """Parse one Concrete Inputs string: int, float, bool, None, a bare word, or (nested) lists.

    Raises ValueError on anything else. Never evaluates code.
    """
    if not isinstance(text, str) or len(text) > _MAX_TEXT:
        raise ValueError("not a short string")
    tokens, pos, text = [], 0, text.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise ValueError(f"bad text at {pos}")
        tokens.append(m.group(1) or m.group(2))
        pos = m.end()
    value, end = _parse_value(tokens, 0, 0)
    if end != len(tokens):
        raise ValueError("trailing tokens")
    return value


def _parse_value(tokens: list[str], pos: int, depth: int) -> tuple[Any, int]:
    if pos >= len(tokens):
        raise ValueError("unexpected end")
    tok = tokens[pos]
    if tok not in ("[", "("):
        return _atom(tok), pos + 1
    if depth >= _MAX_DEPTH:
        raise ValueError("nested too deep")
    close, items, pos = ("]" if tok == "[" else ")"), [], pos + 1
    if pos < len(tokens) and tokens[pos] == close:
        return items, pos + 1
    while True:
        item, pos = _parse_value(tokens, pos, depth + 1)
        items.append(item)
        if pos >= len(tokens):
            raise ValueError("unclosed list")
        if tokens[pos] == close:
            return items, pos + 1
        if tokens[pos] != ",":
            raise ValueError("expected ','")
        pos += 1


def _atom(tok: str) -> Any:
    if tok.lower() in _WORDS:
        return _WORDS[tok.lower()]
    if _INT.match(tok):
        return int(tok)
    if _FLOAT.match(tok):
        return float(tok)
    if _WORD.match(tok):
        return tok
    raise ValueError(f"not a literal: {tok[:40]!r}")


# ------------------------------------------------------------------------------------- OpInputs

class Insufficient(ValueError):
    """A formula's inputs are missing or inconsistent: the op gets no cost (None)."""


def need(condition: Any) -> None:
    """Give up on this op (None) unless `condition` holds."""
    if not condition:
        raise Insufficient


class _Nested(tuple):
    """The dims of a TensorList input: a tuple of shapes (or of further _Nested)."""


def _parse_dims(v: Any, depth: int = 0) -> Shape | _Nested | None:
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
    if (isinstance(strides, (list, tuple)) and len(strides) == len(shape)
            and all(type(s) is int for s in strides)):
        return prod(d for d, s in zip(shape, strides) if s != 0)
    return prod(shape)


def _as_list(v: Any) -> list | None:
    return list(v) if isinstance(v, (list, tuple)) else None


@dataclass(frozen=True)
class OpInputs:
    """The inputs of one op call, as Kineto recorded them (index i = the op's i-th argument)."""
    dims: tuple = ()          # per input: a shape tuple, a _Nested (TensorList) or None
    types: tuple = ()         # per input: the "Input type" string; () when not recorded
    strides: tuple = ()       # per input, nested like dims; () when not recorded
    concretes: tuple = ()     # per input: the "Concrete Inputs" text; () when not recorded
    dtype_fallback: str | None = None
    attrs: Mapping = field(default_factory=dict)  # the event's other args (collectives read them)

    @classmethod
    def from_args(cls, args: Any, dtype_fallback: str | None = None) -> "OpInputs":
        args = args if isinstance(args, Mapping) else {}
        raw_dims = _as_list(args.get("Input Dims")) or []
        n = len(raw_dims)

        def aligned(key: str) -> tuple:
            v = _as_list(args.get(key))
            return tuple(v) if v is not None and len(v) == n else ()

        types = tuple(t if isinstance(t, str) else "" for t in aligned("Input type"))
        return cls(dims=tuple(_parse_dims(d) for d in raw_dims), types=types,
                   strides=aligned("Input Strides"), concretes=aligned("Concrete Inputs"),
                   dtype_fallback=normalize_dtype(dtype_fallback), attrs=args)

    @property
    def n(self) -> int:
        return len(self.dims)

    def _type(self, i: int) -> str | None:
        return self.types[i].strip().lower() if self.types else None

    # --- shapes
    def is_tensor(self, i: int) -> bool:
        if not 0 <= i < self.n or not isinstance(self.dims[i], tuple) or isinstance(self.dims[i], _Nested):
            return False
        t = self._type(i)
        return bool(self.dims[i]) if t is None else t not in _NON_TENSOR_TYPES

    def shape(self, i: int) -> Shape | None:
        """The shape of tensor input i; None if input i is not a (recorded) tensor."""
        return self.dims[i] if self.is_tensor(i) else None

    def shapes(self, i: int) -> list[Shape]:
        """The shapes input i holds: [shape] for a tensor, all shapes of a TensorList, else []."""
        if self.is_tensor(i):
            return [self.dims[i]]
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
        floating = [d for d in known if d in _FLOATING]
        return (floating or known or [self.dtype_fallback])[0]

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
            total += sum(_stored_numel(s, st) for s, st in zip(shapes, stride_list)) * self.elem_size(i)
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
        s = self.shape(i)
        need(s is not None)
        need(ndim is None or len(s) in ((ndim,) if isinstance(ndim, int) else ndim))
        return s

    def int_arg(self, i: int) -> int:
        v = self.concrete(i)
        need(type(v) is int)
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
        return _SCALAR_TYPE_CODES.get(v) if type(v) is int else normalize_dtype(v)


# -------------------------------------------------------------------------------- the registry

class Work(NamedTuple):
    """What a formula function returns; `Formula` turns it into a `Cost`."""
    flops: float
    outputs: Sequence[Shape] = ()     # output shapes (their numel × out dtype size is written)
    out_dtype: str | None = None      # default: the compute dtype
    read_bytes: float | None = None   # default: OpInputs.input_bytes()
    dtype: str | None = None          # compute dtype override (default: OpInputs.compute_dtype())
    family: str | None = None         # family override (default: the Formula's)


_ERRORS = (ArithmeticError, LookupError, TypeError, ValueError, RecursionError)


@dataclass(frozen=True)
class Formula:
    """One row of the table: op names, family, documented formulas, and the function."""
    names: tuple[str, ...]
    family: str
    flops: str
    bytes: str
    fn: Callable[[OpInputs], Work | None]

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
    if not math.isfinite(flops) or flops < 0 or math.isinf(nbytes) or nbytes < 0:
        return None
    return Cost(flops, nbytes, dtype or "unknown", family)


FORMULAS: dict[str, Formula] = {}


def register(f: Formula) -> Formula:
    for name in f.names:
        if name in FORMULAS:
            raise RuntimeError(f"duplicate formula for {name}")
        FORMULAS[name] = f
    return f


def formula(*names: str, family: str, flops: str, bytes: str = "inputs + output"):
    """Decorator: register `fn(inp) -> Work | None` under `names`."""
    def deco(fn: Callable[[OpInputs], Work | None]):
        register(Formula(tuple(names), family, flops, bytes, fn))
        return fn
    return deco


def aten(names: str, inplace: bool = False) -> tuple[str, ...]:
    """aten("mm bmm") == ("aten::mm", "aten::bmm"); inplace=True adds "aten::mm_", "aten::bmm_"."""
    base = [f"aten::{n}" for n in names.split()]
    return tuple(base + [n + "_" for n in base] if inplace else base)


# ------------------------------------------------------------------------------------ shape math

def broadcast(*shapes: Shape) -> Shape:
    """numpy/torch broadcasting of shapes; Insufficient if they do not broadcast."""
    ndim = max((len(s) for s in shapes), default=0)
    out = []
    for axis in range(ndim):
        sizes = {s[len(s) - ndim + axis] for s in shapes if len(s) - ndim + axis >= 0} - {1}
        need(len(sizes) <= 1)
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def _matmul_work(a: Shape, b: Shape) -> Work:
    """torch.matmul semantics: 1-D operands, broadcast batch dims; 2·batch·M·N·K FLOPs."""
    need(len(a) >= 1 and len(b) >= 1)
    a2 = (1,) + a if len(a) == 1 else a
    b2 = b + (1,) if len(b) == 1 else b
    (m, k), (k2, n) = a2[-2:], b2[-2:]
    need(k == k2)
    batch = broadcast(a2[:-2], b2[:-2])
    out = batch + ((m,) if len(a) > 1 else ()) + ((n,) if len(b) > 1 else ())
    return Work(2 * prod(batch) * m * n * k, [out])


# ------------------------------------------------------------------------------------------ GEMM

@formula("aten::mm", family="gemm", flops="2·M·N·K", bytes="A + B + out[M,N]")
def _mm(inp):
    return _matmul_work(inp.tensor(0, 2), inp.tensor(1, 2))


@formula("aten::addmm", family="gemm", flops="2·M·N·K (bias add not counted)",
         bytes="bias + A + B + out[M,N]")
def _addmm(inp):
    work = _matmul_work(inp.tensor(1, 2), inp.tensor(2, 2))
    need(broadcast(inp.tensor(0), work.outputs[0]) == work.outputs[0])
    return work


def _batched_matmul(inp, first: int) -> Work:
    """[B,M,K] x [B,K,N] from inputs `first` and `first + 1`."""
    a, b = inp.tensor(first, 3), inp.tensor(first + 1, 3)
    need(a[0] == b[0])
    return _matmul_work(a, b)


@formula("aten::bmm", family="gemm", flops="2·B·M·N·K", bytes="A + B + out[B,M,N]")
def _bmm(inp):
    return _batched_matmul(inp, 0)


@formula("aten::baddbmm", family="gemm", flops="2·B·M·N·K (bias add not counted)",
         bytes="bias + A + B + out[B,M,N]")
def _baddbmm(inp):
    return _batched_matmul(inp, 1)


@formula("aten::addbmm", family="gemm", flops="2·B·M·N·K", bytes="bias + A + B + out[M,N]")
def _addbmm(inp):
    work = _batched_matmul(inp, 1)
    (_, m, _), (_, _, n) = inp.tensor(1, 3), inp.tensor(2, 3)
    return Work(work.flops, [(m, n)])


@formula("aten::matmul", family="gemm",
         flops="2·batch·M·N·K, batch dims broadcast; a 1-D operand counts M=1 or N=1",
         bytes="A + B + out")
def _matmul(inp):
    return _matmul_work(inp.tensor(0), inp.tensor(1))


@formula("aten::mv", "aten::dot", "aten::vdot", family="gemm", flops="2·M·K (dot: 2·K)",
         bytes="A + x + out")
def _mv(inp):
    return _matmul_work(inp.tensor(0, (1, 2)), inp.tensor(1, 1))


@formula("aten::addmv", family="gemm", flops="2·M·K", bytes="bias + A + x + out[M]")
def _addmv(inp):
    return _matmul_work(inp.tensor(1, 2), inp.tensor(2, 1))


@formula("aten::linear", family="gemm", flops="2·prod(input[:-1])·N·K (weight [N,K])",
         bytes="input + weight + bias + out[...,N]")
def _linear(inp):
    x, w = inp.tensor(0), inp.tensor(1, 2)
    need(len(x) >= 1 and x[-1] == w[1])
    return Work(2 * prod(x[:-1]) * w[0] * w[1], [x[:-1] + (w[0],)])


@formula("aten::_scaled_mm", family="gemm", flops="2·M·N·K (fp8 inputs)",
         bytes="A + B + scales + bias + out[M,N] (out_dtype)")
def _scaled_mm(inp):
    work = _matmul_work(inp.tensor(0, 2), inp.tensor(1, 2))
    return work._replace(out_dtype=inp.dtype_arg(6) or inp.dtype(0))


# ------------------------------------------------------------------------------------ convolution

class ConvLayout(NamedTuple):
    """Where a forward convolution op keeps its arguments (input is 0 and weight 1 in all)."""
    stride: int | None
    padding: int | None
    dilation: int | None
    transposed: int | bool        # an input index, or fixed by the op
    output_padding: int | None
    groups: int | None


_CONV_LAYOUTS = {
    ("aten::convolution", "aten::_convolution", "aten::convolution_overrideable"):
        ConvLayout(3, 4, 5, 6, 7, 8),
    aten("conv1d conv2d conv3d"): ConvLayout(3, 4, 5, False, None, 6),
    aten("conv_transpose1d conv_transpose2d conv_transpose3d"): ConvLayout(3, 4, 7, True, 5, 6),
    aten("cudnn_convolution"): ConvLayout(3, 2, 4, False, None, 5),
    aten("cudnn_convolution_transpose"): ConvLayout(4, 2, 5, True, 3, 6),
    aten("miopen_convolution miopen_depthwise_convolution mkldnn_convolution"):
        ConvLayout(4, 3, 5, False, None, 6),
    aten("miopen_convolution_transpose"): ConvLayout(5, 3, 6, True, 4, 7),
    aten("_slow_conv2d_forward thnn_conv2d"): ConvLayout(4, 5, None, False, None, None),
    aten("slow_conv_transpose2d slow_conv_transpose3d"): ConvLayout(4, 5, 7, True, 6, None),
}


def _spatial_arg(inp: OpInputs, index: int | None, nsp: int, default: int, low: int) -> tuple[int, ...]:
    """A per-spatial-dim int list argument (one value is repeated), each value >= low."""
    values = (default,) * nsp if index is None else inp.ints_arg(index)
    values = values * nsp if len(values) == 1 else values
    need(len(values) == nsp and all(v >= low for v in values))
    return values


def conv_output_shape(x: Shape, w: Shape, stride, padding, dilation, transposed: bool,
                      output_padding, groups: int) -> Shape:
    """The output shape of a (transposed) convolution; Insufficient when the shapes disagree."""
    n, cin, size = x[0], x[1], x[2:]
    kernel = w[2:]
    if transposed:
        need(cin == w[0])
        cout = w[1] * groups
        out = [(i - 1) * s - 2 * p + d * (k - 1) + op + 1
               for i, s, p, d, k, op in zip(size, stride, padding, dilation, kernel, output_padding)]
    else:
        need(cin == w[1] * groups and w[0] % groups == 0)
        cout = w[0]
        out = [(i + 2 * p - d * (k - 1) - 1) // s + 1
               for i, s, p, d, k in zip(size, stride, padding, dilation, kernel)]
    need(all(o >= 1 for o in out))
    return (n, cout, *out)


def conv_flops(x: Shape, w: Shape, out: Shape, transposed: bool) -> int:
    """torch.utils.flop_counter.conv_flop_count: 2·N·prod(spatial)·w0·w1·prod(kernel), where the
    spatial size is the output's (regular) or the input's (transposed)."""
    spatial = (x if transposed else out)[2:]
    return 2 * x[0] * prod(spatial) * w[0] * w[1] * prod(w[2:])


def _conv_forward(layout: ConvLayout, inp: OpInputs) -> Work:
    x, w = inp.tensor(0), inp.tensor(1)
    nsp = len(w) - 2
    need(nsp >= 1 and len(x) == len(w))
    transposed = layout.transposed if isinstance(layout.transposed, bool) else inp.flag_arg(layout.transposed)
    stride = _spatial_arg(inp, layout.stride, nsp, 1, 1)
    padding = _spatial_arg(inp, layout.padding, nsp, 0, 0)
    dilation = _spatial_arg(inp, layout.dilation, nsp, 1, 1)
    output_padding = _spatial_arg(inp, layout.output_padding, nsp, 0, 0)
    groups = 1 if layout.groups is None else inp.int_arg(layout.groups)
    need(groups >= 1)
    out = conv_output_shape(x, w, stride, padding, dilation, transposed, output_padding, groups)
    return Work(conv_flops(x, w, out, transposed), [out])


for _names, _layout in _CONV_LAYOUTS.items():
    register(Formula(_names, "conv",
                     "2·N·prod(out spatial)·Cout·(Cin/groups)·prod(kernel); transposed: "
                     "2·N·prod(in spatial)·Cin·(Cout/groups)·prod(kernel) (bias not counted)",
                     "input + weight + bias + out (size from stride, padding, dilation, "
                     "output_padding, groups)", partial(_conv_forward, _layout)))


class ConvBackwardLayout(NamedTuple):
    grad_output: int
    input: int
    weight: int
    transposed: int | bool
    output_mask: int              # -1: the last input (legacy cudnn/miopen/mkldnn backward ops)


_CONV_BACKWARD_LAYOUTS = {
    aten("convolution_backward"): ConvBackwardLayout(0, 1, 2, 7, 10),
    # torch <= 1.10 layouts: (self, grad_output, weight, padding, ..., output_mask)
    aten("cudnn_convolution_backward miopen_convolution_backward miopen_depthwise_convolution_backward "
         "mkldnn_convolution_backward"): ConvBackwardLayout(1, 0, 2, False, -1),
    aten("cudnn_convolution_transpose_backward miopen_convolution_transpose_backward"):
        ConvBackwardLayout(1, 0, 2, True, -1),
}


def _conv_backward(layout: ConvBackwardLayout, inp: OpInputs) -> Work:
    go, x, w = inp.tensor(layout.grad_output), inp.tensor(layout.input), inp.tensor(layout.weight)
    need(len(w) >= 3 and len(go) == len(x) == len(w) and go[0] == x[0])
    transposed = layout.transposed if isinstance(layout.transposed, bool) else inp.flag_arg(layout.transposed)
    need(x[1] == w[0] if transposed else go[1] == w[0])
    mask = inp.flags_arg(layout.output_mask % inp.n)
    need(len(mask) in (2, 3))
    grad_in, grad_w, grad_b = (mask + (False,))[:3]
    spatial = prod((x if transposed else go)[2:])
    kernel = prod(w[2:])
    flops = 0
    if grad_in:   # conv_transpose(grad_out, weight): the forward's FLOPs
        flops += 2 * go[0] * spatial * w[0] * w[1] * kernel
    if grad_w:    # conv(input, grad_out) over channels: torch does not divide by groups
        flops += 2 * go[0] * x[1] * go[1] * kernel * spatial
    outputs = [shape for shape, wanted in zip((x, w, (go[1],)), (grad_in, grad_w, grad_b)) if wanted]
    return Work(flops, outputs)


for _names, _layout in _CONV_BACKWARD_LAYOUTS.items():
    register(Formula(_names, "conv",
                     "per output_mask: grad_input = forward FLOPs; grad_weight = "
                     "2·N·Cin·Cout·prod(kernel)·prod(out spatial, or in spatial if transposed); "
                     "grad_bias 0 (torch's conv_backward_flop)",
                     "grad_out + input + weight + the masked grads (input, weight, [Cout] bias)",
                     partial(_conv_backward, _layout)))


# -------------------------------------------------------------------------------------- attention

class AttentionLayout(NamedTuple):
    q: int                        # k = q + 1, v = q + 2
    grad_out: int | None          # backward ops
    bshd: bool                    # tensors are [B, S, H, D] (flash/efficient kernels) not [B, H, S, D]
    cu_seqlens_q: int | None = None   # varlen (nested) inputs: cumulative lengths, max lengths
    max_q: int | None = None


_ATTENTION_LAYOUTS = {
    aten("scaled_dot_product_attention _scaled_dot_product_flash_attention "
         "_scaled_dot_product_efficient_attention _scaled_dot_product_cudnn_attention "
         "_scaled_dot_product_flash_attention_for_cpu _scaled_dot_product_attention_math "
         "_scaled_dot_product_fused_attention_overrideable"): AttentionLayout(0, None, False),
    aten("_scaled_dot_product_flash_attention_backward _scaled_dot_product_efficient_attention_backward "
         "_scaled_dot_product_cudnn_attention_backward _scaled_dot_product_flash_attention_for_cpu_backward "
         "_scaled_dot_product_fused_attention_overrideable_backward"): AttentionLayout(1, 0, False),
    aten("_flash_attention_forward"): AttentionLayout(0, None, True, 3, 5),
    aten("_efficient_attention_forward"): AttentionLayout(0, None, True, 4, 6),
    aten("_flash_attention_backward _efficient_attention_backward"): AttentionLayout(1, 0, True, 6, 8),
}


def _bhsd(inp: OpInputs, layout: AttentionLayout) -> tuple[Shape, Shape, Shape]:
    """q, k, v shapes as [B, H, S, D]: transposed from [B, S, H, D], or from varlen [T, H, D]."""
    q, k, v = (inp.tensor(layout.q + j, (3, 4)) for j in range(3))
    cu = inp.shape(layout.cu_seqlens_q) if layout.cu_seqlens_q is not None else None
    if cu is not None and len(cu) == 1 and cu[0] >= 2:
        # nested / varlen: torch counts every sequence at the max length (an upper bound)
        batch, max_q, max_k = cu[0] - 1, inp.int_arg(layout.max_q), inp.int_arg(layout.max_q + 1)
        need(max_q >= 0 and max_k >= 0)
        return ((batch, q[-2], max_q, q[-1]), (batch, k[-2], max_k, k[-1]), (batch, v[-2], max_k, v[-1]))
    need(len(q) == len(k) == len(v) == 4)
    if layout.bshd:
        return tuple((s[0], s[2], s[1], s[3]) for s in (q, k, v))
    return q, k, v


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


for _names, _layout in _ATTENTION_LAYOUTS.items():
    _backward = _layout.grad_out is not None
    register(Formula(
        _names, "attention",
        ("2·B·Hq·Sq·Sk·(3·D + 2·Dv) (recompute QKᵀ, dP, dV, dQ, dK)" if _backward
         else "2·B·Hq·Sq·Sk·(D + Dv) (QKᵀ and PV)")
        + "; GQA counts Hq heads; causal not halved" + ("; tensors [B,S,H,D]" if _layout.bshd else ""),
        "all tensor inputs + " + ("dQ + dK + dV" if _backward else "out[B,Hq,Sq,Dv]"),
        partial(_attention, _layout)))


# ---------------------------------------------------------------------- norm, softmax, embedding

def _per_element(k: int, inp: OpInputs, like: int = 0, out_dtype: str | None = None) -> Work:
    """k FLOPs per element of input `like`; one output of its shape."""
    x = inp.tensor(like)
    return Work(k * prod(x), [x], out_dtype=out_dtype)


_NORMS = (
    # (FLOPs per element, ops, the input whose shape is the output)
    (5, aten("layer_norm native_layer_norm batch_norm native_batch_norm _batch_norm_impl_index "
             "cudnn_batch_norm miopen_batch_norm _native_batch_norm_legit "
             "_native_batch_norm_legit_no_training group_norm native_group_norm instance_norm"),
     "mean, variance, normalise, scale, shift"),
    (4, aten("rms_norm _fused_rms_norm"), "square, mean, normalise, scale"),
    (8, aten("native_layer_norm_backward native_batch_norm_backward native_group_norm_backward "
             "cudnn_batch_norm_backward miopen_batch_norm_backward"),
     "two reductions and the combination (approximate)"),
    (6, aten("_fused_rms_norm_backward"), "one reduction and the combination (approximate)"),
)
for _k, _names, _why in _NORMS:
    register(Formula(_names, "norm", f"{_k}·numel(input) ({_why})",
                     "all tensor inputs + out (input's shape; mean/rstd/weight grads not counted)",
                     partial(_per_element, _k)))


@formula(*aten("_softmax _log_softmax"), family="softmax",
         flops="5·numel (max, subtract, exp, sum, divide / log)",
         bytes="input + out (fp32 when half_to_float)")
def _softmax(inp):
    return _per_element(5, inp, out_dtype="fp32" if inp.concrete(2) is True else None)


@formula(*aten("softmax log_softmax"), family="softmax", flops="5·numel",
         bytes="input + out (dtype argument)")
def _softmax_public(inp):
    return _per_element(5, inp, out_dtype=inp.dtype_arg(2))


@formula(*aten("_softmax_backward_data _log_softmax_backward_data"), family="softmax",
         flops="4·numel (y·(g − Σg·y) / g − exp(y)·Σg)", bytes="grad + output + grad_input")
def _softmax_backward(inp):
    return _per_element(4, inp, out_dtype=inp.dtype_arg(3))


@formula("aten::embedding", family="embedding", flops="0",
         bytes="indices + gathered rows (numel(indices)·D) read + out[..., D] written")
def _embedding(inp):
    w, idx = inp.tensor(0, 2), inp.tensor(1)
    rows = prod(idx) * w[1]
    return Work(0, [idx + (w[1],)], read_bytes=inp.input_bytes(skip=(0,)) + rows * inp.elem_size(0))


@formula(*aten("embedding_dense_backward embedding_backward"), family="embedding",
         flops="numel(grad_output) (scatter-add)", bytes="grad_output + indices + out[num_weights, D]")
def _embedding_backward(inp):
    go, num_weights = inp.tensor(0), inp.int_arg(2)
    need(len(go) >= 1 and num_weights >= 0)
    return Work(prod(go), [(num_weights, go[-1])])


# ------------------------------------------------------------------------------------ elementwise

def _elementwise(k: int, out_dtype: str | None, inp: OpInputs) -> Work:
    shapes = [inp.shape(i) for i in range(inp.n) if inp.shape(i) is not None]
    need(shapes)
    try:
        out = broadcast(*shapes)
    except Insufficient:  # an `out=` tensor recorded before its resize ([0]) does not broadcast
        out = broadcast(*[s for s in shapes if prod(s)])
    return Work(k * prod(out), [out], out_dtype=out_dtype)


_ELEMENTWISE = (
    # (FLOPs per output element, ops with an in-place `_` form, ops without, output dtype)
    (1, "add sub mul div true_divide floor_divide rsub neg abs sign sgn reciprocal sqrt rsqrt exp exp2 "
        "expm1 log log2 log10 log1p sin cos tan asin acos atan sinh cosh sigmoid tanh erf erfc erfinv "
        "relu relu6 leaky_relu hardtanh threshold clamp clamp_min clamp_max floor ceil round trunc frac "
        "pow square fmod remainder atan2 hypot masked_fill nan_to_num bitwise_not bitwise_and "
        "bitwise_or bitwise_xor xlogy",
     "maximum minimum where fmax fmin threshold_backward hardtanh_backward", None),
    (2, "silu elu selu celu hardswish hardsigmoid softplus",
     "native_dropout native_dropout_backward leaky_relu_backward", None),
    (3, "addcmul addcdiv lerp mish",
     "sigmoid_backward tanh_backward elu_backward hardswish_backward hardsigmoid_backward "
     "softplus_backward", None),
    (5, "gelu", "silu_backward mish_backward", None),
    (8, "", "gelu_backward", None),
    (1, "", "eq ne lt le gt ge logical_not logical_and logical_or logical_xor isnan isinf isfinite "
            "isneginf isposinf", "bool"),
)
for _k, _inplace, _plain, _out in _ELEMENTWISE:
    register(Formula(aten(_inplace, inplace=True) + aten(_plain), "elementwise",
                     f"{_k}·numel(out), out = broadcast of tensor inputs",
                     "tensor inputs + out" + (f" ({_out})" if _out else ""),
                     partial(_elementwise, _k, _out)))


def _foreach(k: int, inp: OpInputs) -> Work:
    shapes = inp.shapes(0)
    need(shapes)
    return Work(k * sum(prod(s) for s in shapes), shapes)


for _k, _names in ((1, "add sub mul div neg abs sqrt rsqrt exp log reciprocal sigmoid maximum minimum "
                       "clamp_min clamp_max sign"),
                   (3, "addcmul addcdiv lerp")):
    register(Formula(aten(" ".join(f"_foreach_{n}" for n in _names.split()), inplace=True),
                     "elementwise", f"{_k}·total numel of the first TensorList",
                     "all tensors + the first list's shapes written", partial(_foreach, _k)))


# ------------------------------------------------------------------------------------------ copy

@formula(*aten("copy_ fill_ zero_"), family="copy", flops="0",
         bytes="source (if any) read + destination written (the destination is not read)")
def _overwrite(inp):
    dst = inp.tensor(0)
    return Work(0, [dst], out_dtype=inp.dtype(0), read_bytes=inp.input_bytes(skip=(0,)))


@formula("aten::clone", family="copy", flops="0", bytes="input + out")
def _clone(inp):
    return Work(0, [inp.tensor(0)], out_dtype=inp.dtype(0))


@formula("aten::_to_copy", family="copy", flops="0", bytes="input + out (in the dtype argument's dtype)")
def _to_copy(inp):
    return Work(0, [inp.tensor(0)], out_dtype=inp.dtype_arg(1) or inp.dtype(0))


@formula(*aten("cat stack"), family="copy", flops="0", bytes="the TensorList + out of the same numel")
def _cat(inp):
    shapes = inp.shapes(0)
    need(shapes)
    return Work(0, [(sum(prod(s) for s in shapes),)])


# ------------------------------------------------------------------------------------- reductions

def _reduction(k: int, dim_index: int, out_dtype: str | None, inp: OpInputs) -> Work:
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
for _k, _names, _dim, _out in _REDUCTIONS:
    register(Formula(aten(_names), "reduction", f"{_k}·numel(input)",
                     "input + out (dims from the dim argument; when unknown, a full reduction)"
                     + (f" ({_out})" if _out else ""), partial(_reduction, _k, _dim, _out)))


@formula(*aten("max min"), family="reduction",
         flops="numel(input) (with a tensor `other`: elementwise, numel(out))",
         bytes="input + out (values only)")
def _max_min(inp):
    if inp.shape(1) is not None:
        return _elementwise(1, None, inp)._replace(family="elementwise")
    return _reduction(1, 1, None, inp)


# ------------------------------------------------------------------------------------ collectives

# nccl-tests bus-bandwidth factors, n = world size
_BUS_FACTOR: dict[str, Callable[[int], float]] = {
    "allreduce": lambda n: 2 * (n - 1) / n,
    "allgather": lambda n: (n - 1) / n,
    "reducescatter": lambda n: (n - 1) / n,
    "alltoall": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "sendrecv": lambda n: 1.0,
}
_KIND_ALIASES = {"alltoallv": "alltoall", "send": "sendrecv", "recv": "sendrecv",
                 "recvanysource": "sendrecv"}


def _normalize_kind(raw: Any) -> str | None:
    if not isinstance(raw, str) or not raw.strip():
        return None
    key = re.split(r"::|:", raw.strip())[-1].split(" ")[0].strip("_").lower()
    for suffix in ("_coalesced", "_base", "_into_tensor", "_tensor", "_single"):
        key = key.replace(suffix, "")
    key = key.replace("_", "")
    key = _KIND_ALIASES.get(key, key)
    return key if key in _BUS_FACTOR else None


def collective_kind(name: str, args: Mapping | None = None) -> str | None:
    """allreduce / allgather / reducescatter / alltoall / broadcast / reduce / sendrecv, or None.

    ``record_param_comms`` events name their collective in the "Collective name" arg.
    """
    if name == "record_param_comms":
        return _normalize_kind((args or {}).get("Collective name")) if isinstance(args, Mapping) else None
    return _normalize_kind(name)


def collective_bandwidth(kind: str, message_bytes: float, seconds: float,
                         world_size: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (1e9 bytes/s) as nccl-tests reports them.

    algbw = message bytes / time; busbw = algbw × factor: allreduce 2(n-1)/n, allgather,
    reducescatter and alltoall (n-1)/n, broadcast, reduce and send/recv 1. `message_bytes` is
    nccl-tests' size (`Cost.bytes` of a collective). Unknown kind: ValueError; a non-positive
    time, a negative size or a world size below 1: (nan, nan).
    """
    key = _normalize_kind(kind)
    if key is None:
        raise ValueError(f"unknown collective kind: {kind!r}")
    try:
        ok = seconds > 0 and message_bytes >= 0 and world_size >= 1 and math.isfinite(seconds)
    except TypeError:
        ok = False
    if not ok:
        return math.nan, math.nan
    algbw = message_bytes / seconds / 1e9
    return algbw, algbw * _BUS_FACTOR[key](int(world_size))


_GROUP_FROM_ATTRS = "attrs"


def _collective(kind: str | None, group_size_from: int | str | None, inp: OpInputs) -> Work:
    """Message size (nccl-tests "size") of one collective; FLOPs 0.

    The largest tensor argument (a TensorList summed) is the message: it is the full buffer of
    allreduce/broadcast, the gathered output of allgather (c10d ops list their outputs), the
    scattered input of reducescatter. Ops that show only an allgather's input shard multiply it by
    the group size (a Concrete Input or the "Group size" arg), or give None without one.
    """
    attrs = inp.attrs
    kind = kind or collective_kind("record_param_comms", attrs)
    need(kind is not None)
    dtype = normalize_dtype(attrs.get("dtype")) or inp.compute_dtype()
    nelems = [attrs.get(key) for key in ("In msg nelems", "Out msg nelems")]
    nelems = [v for v in nelems if type(v) is int and v >= 0]
    if nelems:   # record_param_comms: element counts of both buffers
        return Work(0, (), read_bytes=max(nelems) * DTYPE_SIZE.get(dtype or "", math.nan), dtype=dtype)
    sizes = [(inp.numel(i) or 0) * inp.elem_size(i) for i in range(inp.n) if inp.shapes(i)]
    need(sizes)
    message = max(sizes)
    if kind == "allgather" and group_size_from is not None:
        group = attrs.get("Group size") if group_size_from == _GROUP_FROM_ATTRS else inp.concrete(group_size_from)
        need(type(group) is int and group >= 1)
        message *= group
    return Work(0, (), read_bytes=message, dtype=dtype)


_COLLECTIVES = (
    # (ops, kind (None: from the "Collective name" arg), where an allgather's group size is)
    (("record_param_comms",), None, _GROUP_FROM_ATTRS),
    (("c10d::allreduce_", "c10d::allreduce_coalesced_"), "allreduce", None),
    (("c10d::allgather_", "c10d::_allgather_base_", "c10d::allgather_coalesced_",
      "c10d::allgather_into_tensor_coalesced_"), "allgather", None),
    (("c10d::reduce_scatter_", "c10d::_reduce_scatter_base_", "c10d::reduce_scatter_tensor_coalesced_"),
     "reducescatter", None),
    (("c10d::broadcast_",), "broadcast", None),
    (("c10d::reduce_",), "reduce", None),
    (("c10d::alltoall_", "c10d::alltoall_base_"), "alltoall", None),
    (("c10d::send", "c10d::recv_", "c10d::recv_any_source_"), "sendrecv", None),
    (("_c10d_functional::all_reduce", "_c10d_functional::all_reduce_",
      "_c10d_functional::all_reduce_coalesced", "_c10d_functional::all_reduce_coalesced_"),
     "allreduce", None),
    (("_c10d_functional::all_gather_into_tensor", "_c10d_functional::all_gather_into_tensor_coalesced"),
     "allgather", 1),
    (("_c10d_functional::reduce_scatter_tensor", "_c10d_functional::reduce_scatter_tensor_coalesced"),
     "reducescatter", None),
    (("_c10d_functional::all_to_all_single",), "alltoall", None),
    (("_c10d_functional::broadcast", "_c10d_functional::broadcast_"), "broadcast", None),
) + tuple(
    # record_function ranges of ProcessGroupNCCL / ProcessGroupGloo: they record the input tensors
    (tuple(f"{backend}:{op}" for backend in ("nccl", "gloo") for op in ops), kind, _GROUP_FROM_ATTRS)
    for ops, kind in (
        (("all_reduce", "all_reduce_coalesced", "allreduce_coalesced"), "allreduce"),
        (("all_gather", "_all_gather_base", "all_gather_into_tensor_coalesced", "allgather_coalesced"),
         "allgather"),
        (("reduce_scatter", "_reduce_scatter_base", "reduce_scatter_tensor_coalesced"), "reducescatter"),
        (("broadcast",), "broadcast"),
        (("reduce",), "reduce"),
        (("all_to_all", "alltoall_base", "alltoall"), "alltoall"),
        (("send", "recv"), "sendrecv"),
    ))
for _names, _kind, _group in _COLLECTIVES:
    register(Formula(_names, "collective", "0",
                     "message size = nccl-tests size: max tensor argument × dtype size ("
                     "record_param_comms: max(In, Out msg nelems)); an allgather shard × group size",
                     partial(_collective, _kind, _group)))


# ------------------------------------------------------------------------------------ public API

MODELLED_OPS: tuple[str, ...] = tuple(sorted(FORMULAS))
# Every event arg a formula reads: the four input args, and the ones record_param_comms carries
# (without them a record_param_comms event has no cost).
ARGS_READ: tuple[str, ...] = ("Input Dims", "Input type", "Input Strides", "Concrete Inputs",
                              "Collective name", "dtype", "In msg nelems", "Out msg nelems", "Group size")


def op_cost(name: str, args: Mapping | None, dtype_fallback: str | None = None) -> Cost | None:
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
    """The table as Markdown (ops, family, FLOPs, bytes); rows with the same formulas merged."""
    rows: dict[tuple[str, str, str], list[str]] = {}
    for f in dict.fromkeys(FORMULAS.values()):
        rows.setdefault((f.family, f.flops, f.bytes), []).extend(f.names)

    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    def op_list(names: list[str]) -> str:  # `aten::add(_)` stands for aten::add and aten::add_
        present = set(names)
        return ", ".join(f"`{n}(_)`" if n + "_" in present else f"`{n}`" for n in names
                         if not (n.endswith("_") and n[:-1] in present))

    lines = ["| ops | family | FLOPs | bytes |", "| --- | --- | --- | --- |"]
    for (family, flops, nbytes), names in rows.items():
        ops = op_list(names)
        lines.append(f"| {ops} | {family} | {cell(flops)} | {cell(nbytes)} |")
    return "\n".join(lines) + "\n"
