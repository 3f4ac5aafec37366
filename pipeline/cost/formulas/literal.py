"""The Concrete Inputs parser: the text Kineto records for a non-tensor argument, as a value.

Kineto prints non-tensor arguments as text (``"[1, 1]"``, ``"False"``, ``"0."``, ``"15"``). Traces
are untrusted input, so this is a tiny literal parser (ints, floats, bools, None, bare words, nested
lists), bounded in length and depth: never ``eval``.
"""

from __future__ import annotations

import re
from typing import Any

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
    tokens = _tokens(text.strip())
    value, end = _parse_value(tokens, 0, 0)
    if end != len(tokens):
        raise ValueError("trailing tokens")
    return value


def _tokens(text: str) -> list[str]:
    """Brackets, parentheses and commas, and the runs of other non-space characters between them."""
    tokens: list[str] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise ValueError(f"bad text at {pos}")
        tokens.append(m.group(1) or m.group(2))
        pos = m.end()
    return tokens


def _parse_value(tokens: list[str], pos: int, depth: int) -> tuple[Any, int]:
    """The value starting at tokens[pos], and the position after it."""
    if pos >= len(tokens):
        raise ValueError("unexpected end")
    tok = tokens[pos]
    if tok not in ("[", "("):
        return _atom(tok), pos + 1
    if depth >= _MAX_DEPTH:
        raise ValueError("nested too deep")
    close, pos = ("]" if tok == "[" else ")"), pos + 1
    items: list[Any] = []
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
