"""expression: the small arithmetic language of formula files (`user`), parsed and evaluated safely.

A formula is text such as ``2 * in0[0] * in1[1] * in1[2] * topk`` or ``bytes(in0) + bytes(in1)``.
It is tokenized and parsed by the grammar below into a tree of tuples, and the tree is evaluated
by a small interpreter over the names it is given: nothing is ever passed to ``eval``, ``exec``
or ``ast``, and neither the text nor the values can make it run for long or grow without bound
(`MAX_TEXT` characters, `MAX_DEPTH` levels of nesting, `MAX_NODES` nodes; every value within
``±MAX_VALUE``; ``**`` refused before it would pass it)::

    expr    := term (("+" | "-") term)*
    term    := unary (("*" | "/" | "//" | "%") unary)*
    unary   := ("-" | "+") unary | power
    power   := postfix ("**" unary)?
    postfix := atom ("[" expr "]")*
    atom    := NUMBER | NAME | NAME "(" expr ("," expr)* ")" | "(" expr ")"

Values are numbers (int, float; a bool counts as 0 or 1), tensors (`Tensor`: a shape and the size
of its element; indexing gives a dim), and lists (a TensorList input, a list Concrete Input):
indexing gives an element; negative indexes count from the end. `FUNCTIONS` lists the functions.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Union

MAX_TEXT = 2000  # characters of one formula
MAX_DEPTH = 32  # nesting of parentheses, brackets, calls and unary signs
MAX_NODES = 400  # numbers, names, operators and calls of one formula
MAX_VALUE = 1e30  # any value further from 0 is an error (a FLOP count of 1e30 is not a real kernel)


class FormulaError(ValueError):
    """A formula that does not parse, or that cannot be evaluated on an op's inputs."""


@dataclass(frozen=True)
class Tensor:
    """A tensor input of an op: its shape and the bytes of one element (None: dtype unknown)."""

    shape: tuple[int, ...]
    elsize: float | None


Value = Union[int, float, Tensor, tuple]
Node = tuple  # ("num", v) | ("name", n) | ("neg", a) | ("bin", op, a, b) | ("index", a, i) | ("call", f, args)

_TOKEN = re.compile(
    r"\s*(?:(?P<num>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)|(?P<name>[A-Za-z_][A-Za-z0-9_]*)"
    r"|(?P<op>\*\*|//|[-+*/%()\[\],]))"
)


@dataclass(frozen=True)
class Expr:
    """A parsed formula: its text, its tree and the names it reads (functions aside)."""

    text: str
    tree: Node
    names: frozenset[str]

    def __call__(self, env: Mapping[str, Value]) -> Value:
        return _eval(self.tree, env)


def parse(text: str) -> Expr:
    """Parse one formula; FormulaError says what is wrong and at which column (1-based)."""
    if not isinstance(text, str):
        raise FormulaError(f"a formula is a string, not {type(text).__name__}")
    if len(text) > MAX_TEXT:
        raise FormulaError(f"longer than {MAX_TEXT} characters")
    p = _Parser(_tokens(text))
    tree = p.expr(0)
    if p.pos < len(p.tokens):
        kind, tok, col = p.tokens[p.pos]
        raise FormulaError(f"unexpected {tok!r} at column {col}")
    _check_constants(tree)
    return Expr(text, tree, frozenset(_names(tree)))


def _check_constants(node: Node) -> None:
    """Evaluate each largest part of the tree that reads no name: a division by zero or a value
    beyond the bounds there is an error of the formula itself, found before any op is costed."""
    if node[0] in ("num", "name"):
        return
    if not _names(node):
        _eval(node, {})
        return
    children = node[2] if node[0] == "call" else node[1:]
    for child in children:
        if isinstance(child, tuple):
            _check_constants(child)


def _tokens(text: str) -> list[tuple[str, str, int]]:
    """(kind, text, column) of each token: num, name or op."""
    out, pos = [], 0
    while pos < len(text):
        if text[pos:].isspace():
            break
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            col = pos + len(text[pos:]) - len(text[pos:].lstrip()) + 1
            raise FormulaError(f"unexpected character {text[col - 1]!r} at column {col}")
        kind = m.lastgroup or "op"
        out.append((kind, m.group(kind), m.start(kind) + 1))
        pos = m.end()
    if not out:
        raise FormulaError("empty formula")
    if len(out) > MAX_NODES:
        raise FormulaError(f"more than {MAX_NODES} tokens")
    return out


class _Parser:
    """Recursive descent over the tokens, one method per rule of the grammar."""

    def __init__(self, tokens: list[tuple[str, str, int]]):
        self.tokens, self.pos = tokens, 0

    def peek(self) -> str | None:
        return self.tokens[self.pos][1] if self.pos < len(self.tokens) else None

    def take(self, want: str) -> None:
        if self.peek() != want:
            raise FormulaError(f"expected {want!r} {self.where()}")
        self.pos += 1

    def where(self) -> str:
        if self.pos >= len(self.tokens):
            return "at the end"
        _, tok, col = self.tokens[self.pos]
        return f"at column {col} (found {tok!r})"

    def deeper(self, depth: int) -> int:
        if depth >= MAX_DEPTH:
            raise FormulaError(f"nested deeper than {MAX_DEPTH} levels {self.where()}")
        return depth + 1

    def expr(self, depth: int) -> Node:
        node = self.term(depth)
        while self.peek() in ("+", "-"):
            op = self.tokens[self.pos][1]
            self.pos += 1
            node = ("bin", op, node, self.term(depth))
        return node

    def term(self, depth: int) -> Node:
        node = self.unary(depth)
        while self.peek() in ("*", "/", "//", "%"):
            op = self.tokens[self.pos][1]
            self.pos += 1
            node = ("bin", op, node, self.unary(depth))
        return node

    def unary(self, depth: int) -> Node:
        if self.peek() in ("-", "+"):
            op = self.tokens[self.pos][1]
            self.pos += 1
            inner = self.unary(self.deeper(depth))
            return ("neg", inner) if op == "-" else inner
        return self.power(depth)

    def power(self, depth: int) -> Node:
        node = self.postfix(depth)
        if self.peek() == "**":
            self.pos += 1
            node = ("bin", "**", node, self.unary(self.deeper(depth)))
        return node

    def postfix(self, depth: int) -> Node:
        node = self.atom(depth)
        while self.peek() == "[":
            self.pos += 1
            index = self.expr(self.deeper(depth))
            self.take("]")
            node = ("index", node, index)
        return node

    def atom(self, depth: int) -> Node:
        if self.pos >= len(self.tokens):
            raise FormulaError("unexpected end of the formula")
        kind, tok, col = self.tokens[self.pos]
        self.pos += 1
        if kind == "num":
            value = float(tok) if any(c in tok for c in ".eE") else int(tok)
            return ("num", _bounded(value))
        if kind == "name" and self.peek() == "(":
            if tok not in FUNCTIONS:
                raise FormulaError(f"unknown function {tok!r} at column {col} (functions: {', '.join(FUNCTIONS)})")
            self.pos += 1
            args = [self.expr(self.deeper(depth))]
            while self.peek() == ",":
                self.pos += 1
                args.append(self.expr(self.deeper(depth)))
            self.take(")")
            return ("call", tok, tuple(args))
        if kind == "name":
            return ("name", tok)
        if tok == "(":
            node = self.expr(self.deeper(depth))
            self.take(")")
            return node
        raise FormulaError(f"unexpected {tok!r} at column {col}")


def _names(node: Node) -> list[str]:
    """The names a tree reads (functions aside)."""
    kind = node[0]
    if kind == "name":
        return [node[1]]
    if kind == "num":
        return []
    if kind == "call":
        return [n for a in node[2] for n in _names(a)]
    return [n for child in node[1:] if isinstance(child, tuple) for n in _names(child)]


# ------------------------------------------------------------------------------ evaluation


def _bounded(v: Value) -> Value:
    """v, unless it is a number beyond ±MAX_VALUE or not finite."""
    if isinstance(v, float) and math.isnan(v):
        raise FormulaError("not a number")
    if isinstance(v, (int, float)) and not (-MAX_VALUE <= v <= MAX_VALUE):
        raise FormulaError("a value beyond 1e30")
    return v


def _number(v: Value, what: str) -> int | float:
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, (int, float)):
        return v
    raise FormulaError(f"{what} is {_kind(v)}, not a number")


def _kind(v: Value) -> str:
    if isinstance(v, Tensor):
        return f"a tensor of shape {list(v.shape)} (index it, or numel(), bytes())"
    if isinstance(v, tuple):
        return "a list (index it)"
    return type(v).__name__


def _power(a: int | float, b: int | float) -> int | float:
    if a == 0 and b < 0:
        raise FormulaError("division by zero (0 to a negative power)")
    if abs(a) > 1 and b > 0 and b * math.log10(abs(a)) > math.log10(MAX_VALUE):
        raise FormulaError("a value beyond 1e30")
    if a < 0 and not float(b).is_integer():
        raise FormulaError("a negative number to a fractional power")
    return a**b if isinstance(a, int) and isinstance(b, int) and b >= 0 else float(a) ** float(b)


def _divide(op: str, a: int | float, b: int | float) -> int | float:
    if b == 0:
        raise FormulaError("division by zero")
    if op == "/":
        return a / b
    return a // b if op == "//" else a % b


_BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "**": _power,
}


def _eval(node: Node, env: Mapping[str, Value]) -> Value:
    kind = node[0]
    if kind == "num":
        return node[1]
    if kind == "name":
        try:
            return env[node[1]]
        except KeyError:
            raise FormulaError(f"{node[1]!r} is not defined for this op") from None
    if kind == "neg":
        return _bounded(-_number(_eval(node[1], env), "the operand of -"))
    if kind == "bin":
        op = node[1]
        a = _number(_eval(node[2], env), f"the left side of {op}")
        b = _number(_eval(node[3], env), f"the right side of {op}")
        return _bounded(_divide(op, a, b) if op in ("/", "//", "%") else _BINARY[op](a, b))
    if kind == "index":
        return _index(_eval(node[1], env), _eval(node[2], env))
    if kind == "call":
        return _bounded(FUNCTIONS[node[1]](*(_eval(a, env) for a in node[2])))
    raise FormulaError(f"bad node {kind!r}")  # not reachable from `parse`


def _index(seq: Value, i: Value) -> Value:
    items = seq.shape if isinstance(seq, Tensor) else seq
    if not isinstance(items, tuple):
        raise FormulaError(f"cannot index {_kind(seq)}")
    if isinstance(i, bool) or not isinstance(i, int) and not (isinstance(i, float) and i.is_integer()):
        raise FormulaError(f"an index must be a whole number, not {i!r}")
    k = int(i)
    if not -len(items) <= k < len(items):
        raise FormulaError(f"index {k} out of range for {len(items)} entries")
    return items[k]


def _tensors(v: Value, fn: str) -> list[Tensor]:
    """The tensors of a tensor or a TensorList."""
    if isinstance(v, Tensor):
        return [v]
    if isinstance(v, tuple) and v and all(isinstance(t, Tensor) for t in v):
        return list(v)
    raise FormulaError(f"{fn}() takes a tensor input (in0, in1, ...), not {_kind(v)}")


def _numel(v: Value) -> int:
    return sum(math.prod(t.shape) for t in _tensors(v, "numel"))


def _elsize(v: Value) -> float:
    sizes = {t.elsize for t in _tensors(v, "elsize")}
    if None in sizes or len(sizes) != 1:
        raise FormulaError("the element size of this input is not known (no Input type; see --dtype)")
    return float(sizes.pop())  # type: ignore[arg-type]


def _bytes(v: Value) -> float:
    total = 0.0
    for t in _tensors(v, "bytes"):
        if t.elsize is None:
            raise FormulaError("the element size of this input is not known (no Input type; see --dtype)")
        total += math.prod(t.shape) * t.elsize
    return total


def _ndim(v: Value) -> int:
    if not isinstance(v, Tensor):
        raise FormulaError(f"ndim() takes one tensor input, not {_kind(v)}")
    return len(v.shape)


def _extreme(pick: Callable, name: str) -> Callable[..., int | float]:
    def fn(*args: Value) -> int | float:
        return pick(_number(a, f"an argument of {name}()") for a in args)

    return fn


def _one(fn: Callable[[Any], Any], name: str) -> Callable[..., Any]:
    def call(*args: Value) -> Any:
        if len(args) != 1:
            raise FormulaError(f"{name}() takes 1 argument, not {len(args)}")
        return fn(args[0])

    return call


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "numel": _one(_numel, "numel"),  # elements of a tensor (a TensorList: of all its tensors)
    "bytes": _one(_bytes, "bytes"),  # numel × element size
    "elsize": _one(_elsize, "elsize"),  # bytes of one element (from Input type)
    "ndim": _one(_ndim, "ndim"),  # dims of a tensor
    "min": _extreme(min, "min"),
    "max": _extreme(max, "max"),
    "ceil": _one(lambda v: math.ceil(_number(v, "the argument of ceil()")), "ceil"),
    "floor": _one(lambda v: math.floor(_number(v, "the argument of floor()")), "floor"),
}
