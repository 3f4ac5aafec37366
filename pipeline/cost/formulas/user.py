"""user: formula files (`--formulas FILE.toml`), the FLOPs and bytes of ops the built-in table lacks,
declared by the people who know what their ops compute.

A file holds one ``[[op]]`` table per op (or family of ops)::

    [[op]]
    name = "vllm::outplace_fused_experts"   # an op name, or a pattern: * any text, ? one character
    let = { tokens = "in0[0]", topk = "in3[1]" }   # optional: named values, each may use those before
    flops = "2 * tokens * topk * (in1[1] * in1[2] + in2[1] * in2[2])"
    bytes = "bytes(in0) + bytes(in1) + bytes(in2)"
    dtype = "bf16"        # optional: the dtype whose peak it is held to (default: its inputs')
    family = "moe"        # optional (default "user")

Formulas are `expression`s over these names: ``in0``, ``in1``, ... the op's inputs in ``Input Dims``
order (a tensor: index it for a dim, ``numel()``, ``bytes()``, ``elsize()``, ``ndim()``; a TensorList:
a list of tensors), ``c0``, ``c1``, ... their ``Concrete Inputs`` (a number, a bool, a list),
``n`` (how many inputs), ``input_bytes`` (the bytes of every tensor input, expanded dims once) and
the ``let`` names. Everything is checked when the file is loaded: a bad file is one `UsageError`
naming the file, the line and the entry. An entry that fails on one op's inputs (an index out of
range, a division by zero) leaves that op without a cost (`user_formula_error`).

Which wins: a file's entry over the built-in formula of the same op; an exact name over a pattern;
among patterns, the first in the file.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.errors import UsageError

from .dtypes import DTYPE_SIZE, normalize_dtype
from .expression import FUNCTIONS, Expr, FormulaError, Tensor, Value, parse
from .inputs import OpInputs
from .registry import Cost

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

MAX_FILE = 1 << 20  # bytes of a formula file
MAX_ENTRIES = 1000
MAX_NAME = 300  # characters of an op name or pattern
MAX_NESTING = 64  # of TOML arrays and tables (and brackets in formulas)
KEYS = ("name", "flops", "bytes", "let", "dtype", "family")
_INPUT = re.compile(r"(in|c)(\d{1,3})\Z")  # in0, c12: an input's tensor, its concrete value
_LET_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}\Z")
BUILTIN_NAMES = ("n", "input_bytes")


@dataclass(frozen=True)
class UserFormula:
    """One entry of a formula file."""

    pattern: str  # the name as written
    regex: str | None  # for a pattern: the regex of the names it matches; None for an exact name
    lets: tuple[tuple[str, Expr], ...]
    flops: Expr
    bytes: Expr
    dtype: str | None
    family: str
    label: str  # "formulas.toml:12 op #2 'vllm::moe_forward'" for messages

    def cost(self, inp: OpInputs) -> Cost:
        """FLOPs and bytes of one op call; FormulaError when the entry cannot be evaluated on it."""
        env = _Env(inp)
        for name, expr in self.lets:
            env[name] = expr(env)
        flops, nbytes = _amount(self.flops(env), "flops"), _amount(self.bytes(env), "bytes")
        return Cost(flops, nbytes, self.dtype or inp.compute_dtype() or "unknown", self.family)


@dataclass(frozen=True)
class UserFormulas:
    """A formula file: its entries by exact name, and its patterns in file order."""

    path: str
    exact: Mapping[str, UserFormula]
    patterns: tuple[UserFormula, ...]

    def find(self, name: str) -> UserFormula | None:
        """The entry for an op name (``nccl:send 0->1`` is also looked up as ``nccl:send``)."""
        for key in dict.fromkeys((name, name.split(" ", 1)[0])):
            if key in self.exact:
                return self.exact[key]
        for f in self.patterns:
            if f.regex is not None and re.fullmatch(f.regex, name):
                return f
        return None

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.exact)

    @property
    def pattern_regex(self) -> str | None:
        """One regex matching every op name a pattern of the file matches (None: no patterns)."""
        if not self.patterns:
            return None
        return "^(?:" + "|".join(f.regex or "" for f in self.patterns) + ")$"


class _Env(dict):
    """The names a formula reads for one op call, made when first read."""

    def __init__(self, inp: OpInputs):
        super().__init__()
        self.inp = inp

    def __missing__(self, key: str) -> Value:
        value = _input_value(self.inp, key)
        self[key] = value
        return value


def _input_value(inp: OpInputs, key: str) -> Value:
    if key == "n":
        return inp.n
    if key == "input_bytes":
        v = inp.input_bytes()
        if not math.isfinite(v):
            raise FormulaError("input_bytes: an input's element size is not known (no Input type; see --dtype)")
        return v
    m = _INPUT.match(key)
    if m is None:
        raise KeyError(key)
    i = int(m.group(2))
    if i >= inp.n:
        raise FormulaError(f"{key}: the op has {inp.n} inputs")
    if m.group(1) == "in":
        shapes = inp.shapes(i)
        if not shapes:
            raise FormulaError(f"{key}: input {i} is not a tensor (Input Dims {_dims_text(inp, i)})")
        size = inp.bytes_per_elem(i)
        tensors = tuple(Tensor(s, None if size is None else float(size)) for s in shapes)
        return tensors[0] if inp.shape(i) is not None else tensors
    value = inp.concrete(i)
    if value is None:
        raise FormulaError(f"{key}: input {i} has no Concrete Inputs value")
    return _concrete(value, key)


def _dims_text(inp: OpInputs, i: int) -> str:
    d = inp.dims[i]
    return "unreadable" if d is None else str(list(d))


def _concrete(v: Any, key: str) -> Value:
    if isinstance(v, (bool, int, float)):
        return v
    if isinstance(v, list):
        return tuple(_concrete(x, key) for x in v)
    raise FormulaError(f"{key}: its Concrete Inputs value is {v!r}, not a number")


def _amount(v: Value, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise FormulaError(f"{what} is not a number")
    if v < 0:
        raise FormulaError(f"{what} is negative ({v:g})")
    return float(v)


# ------------------------------------------------------------------------------ loading


def as_formulas(formulas: UserFormulas | str | os.PathLike | None) -> UserFormulas | None:
    """A loaded formula file as it is; a path loaded (`load`); None as it is."""
    return formulas if formulas is None or isinstance(formulas, UserFormulas) else load(formulas)


def load(path: str | os.PathLike) -> UserFormulas:
    """Read and check a formula file; UsageError (one line: the file, line, entry, what) if bad."""
    p = Path(path)
    try:
        if not p.is_file():
            raise UsageError(f"{p}: no such formula file" if not p.exists() else f"{p}: not a regular file")
        with open(p, "rb") as fh:
            raw = fh.read(MAX_FILE + 1)
    except OSError as e:
        raise UsageError(f"{p}: cannot read: {e.strerror or e}") from None
    if len(raw) > MAX_FILE:
        raise UsageError(f"{p}: larger than {MAX_FILE >> 20} MiB; a formula file is a few entries")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"{p}: not UTF-8 text") from None
    if _nesting(text) > MAX_NESTING:  # tomllib recurses per level: refused before it would overflow
        raise UsageError(f"{p}: arrays or tables nested deeper than {MAX_NESTING} levels")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"{p}: not valid TOML: {e}") from None
    extra = sorted(set(data) - {"op"})
    if extra:
        raise UsageError(f"{p}: unknown top-level key {extra[0]!r}: a formula file holds [[op]] tables")
    entries = data.get("op")
    if not isinstance(entries, list) or not entries or not all(isinstance(e, dict) for e in entries):
        raise UsageError(f"{p}: holds no [[op]] tables")
    if len(entries) > MAX_ENTRIES:
        raise UsageError(f"{p}: {len(entries)} [[op]] tables; at most {MAX_ENTRIES}")
    lines = _Lines(text)
    exact: dict[str, UserFormula] = {}
    first: dict[str, int] = {}  # name -> the entry that has it
    patterns: list[UserFormula] = []
    for k, entry in enumerate(entries, 1):
        f = _entry(p, k, entry, lines)
        if f.regex is not None:
            patterns.append(f)
        elif f.pattern in exact:
            raise UsageError(f"{p}:{lines.of(k, 'name')}: [[op]] #{k}: the same name as [[op]] #{first[f.pattern]}")
        else:
            exact[f.pattern], first[f.pattern] = f, k
    return UserFormulas(str(p), exact, tuple(patterns))


def _nesting(text: str) -> int:
    """The deepest nesting of [ and { in the text outside comments (brackets in strings counted
    too, balanced in any valid formula: at worst this overcounts a broken one)."""
    deepest = depth = 0
    for line in text.splitlines():
        for ch in line.split("#", 1)[0]:
            if ch in "[{":
                depth += 1
                deepest = max(deepest, depth)
            elif ch in "]}":
                depth -= 1
    return deepest


class _Lines:
    """Where each [[op]] table and its keys start in the file's text (for messages)."""

    _HEADER = re.compile(r"^\s*\[\[\s*op\s*\]\]")

    def __init__(self, text: str):
        self.lines = text.splitlines()
        self.headers = [i for i, line in enumerate(self.lines) if self._HEADER.match(line)]

    def of(self, k: int, key: str | None = None) -> int | None:
        """The 1-based line of entry k's `key` (or of its header); None when it cannot be told."""
        if k > len(self.headers):
            return None
        start = self.headers[k - 1]
        end = self.headers[k] if k < len(self.headers) else len(self.lines)
        if key is not None:
            key_line = re.compile(rf"^\s*{re.escape(key)}\s*[=.]")
            for i in range(start + 1, end):
                if key_line.match(self.lines[i]):
                    return i + 1
        return start + 1


def _entry(p: Path, k: int, entry: dict, lines: _Lines) -> UserFormula:
    name = entry.get("name")
    shown = f" {name!r}" if isinstance(name, str) and len(name) <= MAX_NAME else ""

    def bad(key: str | None, why: str) -> UsageError:
        line = lines.of(k, key)
        where = f"{p}:{line}" if line else str(p)
        return UsageError(f"{where}: [[op]] #{k}{shown}: {key + ': ' if key else ''}{why}")

    unknown = [key for key in entry if key not in KEYS]
    if unknown:
        raise bad(None, f"unknown key {unknown[0]!r} (keys: {', '.join(KEYS)})")
    for key in ("name", "flops", "bytes"):
        if key not in entry:
            raise bad(None, f"no {key!r}")
    if not isinstance(name, str) or not name.strip() or len(name) > MAX_NAME:
        raise bad("name", f"an op name or pattern of 1 to {MAX_NAME} characters")
    known = set(BUILTIN_NAMES)
    lets: list[tuple[str, Expr]] = []
    raw_lets = entry.get("let", {})
    if not isinstance(raw_lets, dict):
        raise bad("let", 'a table of names and formulas: let = { tokens = "in0[0]" }')
    for let_name, text in raw_lets.items():
        if not _LET_NAME.match(let_name) or let_name in known or _INPUT.match(let_name) or let_name in FUNCTIONS:
            raise bad("let", f"{let_name!r} cannot be a name (a reserved name, or not a plain identifier)")
        lets.append((let_name, _formula(text, known, lambda why, named=let_name: bad("let", f"{named}: {why}"))))
        known.add(let_name)
    flops = _formula(entry["flops"], known, lambda why: bad("flops", why))
    nbytes = _formula(entry["bytes"], known, lambda why: bad("bytes", why))
    dtype = entry.get("dtype")
    if dtype is not None and (not isinstance(dtype, str) or normalize_dtype(dtype) is None):
        raise bad("dtype", f"{dtype!r} is not a dtype ({', '.join(sorted(DTYPE_SIZE))})")
    family = entry.get("family", "user")
    if not isinstance(family, str) or not 0 < len(family) <= 40:
        raise bad("family", "a short name")
    label = f"{p.name}:{lines.of(k) or '?'} [[op]] #{k}{shown}"
    return UserFormula(name, _glob(name), tuple(lets), flops, nbytes, normalize_dtype(dtype), family, label)


def _formula(text: Any, known: set[str], bad) -> Expr:
    if not isinstance(text, str):
        raise bad(f"a formula is a string in quotes, not {type(text).__name__}")
    try:
        expr = parse(text)
    except FormulaError as e:
        raise bad(str(e)) from None
    for name in sorted(expr.names):
        if name not in known and not _INPUT.match(name):
            raise bad(f"unknown name {name!r} (names: in0.., c0.., {', '.join(sorted(known))})")
    return expr


def _glob(name: str) -> str | None:
    """The regex of a pattern (* any text, ? one character); None for an exact name. Every other
    character but a letter, digit or _ is written as its code (\\xHH, \\UHHHHHHHH), which Python's
    `re` and polars' (Rust) regex read alike."""
    if "*" not in name and "?" not in name:
        return None
    return "".join(_GLOB.get(ch) or _literal(ch) for ch in name)


_GLOB = {"*": ".*", "?": "."}


def _literal(ch: str) -> str:
    if ch.isascii() and (ch.isalnum() or ch == "_"):
        return ch
    return f"\\x{ord(ch):02x}" if ord(ch) < 0x80 else f"\\U{ord(ch):08x}"
