"""values: one JSON value as a table wants it: a µs time as int64 ns, an integer id, a string;
each coercion or drop counted by reason in `Problems`, and values written back exactly (`dumps`)."""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation

import orjson

from pipeline.read.chunks import NeedsExactParse
from pipeline.read.tame import MAX_DEPTH, scrub

KNOWN_KEYS = frozenset(("ph", "cat", "name", "pid", "tid", "ts", "dur", "args", "id"))


INT64_MAX = 2**63 - 1
UINT64_SPAN = 2**64


def wide_int(v: int) -> tuple[int | None, str]:
    """An integer id outside ±INT64_MAX as the id columns keep it (`pid`, `tid`, `id` and their
    `_str` columns): its decimal text, and the int64 with the same 64 bits when it is a uint64
    above INT64_MAX (runtimes that write 64-bit thread and flow ids unsigned, e.g. IBM's AIU), so
    that it still groups and joins as a number; else no number."""
    return (v - UINT64_SPAN if INT64_MAX + 1 < v < UINT64_SPAN else None), str(v)


# |µs| below this: round(x * 1000) of a float is the exact nanosecond count of its
# (≤ 3-decimal) text. Larger floats are re-parsed from the decimal text (NeedsExactParse).
FLOAT_EXACT_US = 4.39e12


NS_PER_US = Decimal(1000)


def json_default(v):
    if isinstance(v, Decimal):
        if v.is_finite():
            return orjson.Fragment(str(v).encode())
        return None
    raise TypeError


def dumps(v) -> bytes:
    """JSON text of a parsed value, exact: Decimals as their text, integers beyond 64 bits too;
    a part nested deeper than orjson writes (255 levels) as the JSON string of its text."""
    try:
        return orjson.dumps(v, default=json_default)
    except TypeError:  # orjson writes no integer beyond 64 bits, nothing nested past 255 levels,
        try:  # no lone surrogate
            return orjson.dumps(_writable(v, 0), default=json_default)
        except TypeError:
            return orjson.dumps(_writable(scrub(v)[0], 0), default=json_default)


def _writable(v, depth: int):
    if type(v) is int and not -(2**63) <= v < 2**64:
        return orjson.Fragment(str(v).encode())
    if type(v) in (dict, list) and depth >= MAX_DEPTH:
        try:
            return json.dumps(v, default=str)
        except (RecursionError, ValueError):
            return "<nested too deep>"
    if type(v) is dict:
        return {k: _writable(x, depth + 1) for k, x in v.items()}
    if type(v) is list:
        return [_writable(x, depth + 1) for x in v]
    return v


@dataclass
class Problems:
    """Counts of coerced and dropped values, and of B/E events left without a duration
    (`read.durations`), by reason."""

    coerced: Counter = field(default_factory=Counter)
    dropped: Counter = field(default_factory=Counter)
    unmatched: Counter = field(default_factory=Counter)

    def merge(self, other: Problems):
        self.coerced.update(other.coerced)
        self.dropped.update(other.dropped)
        self.unmatched.update(other.unmatched)


def us_to_ns(v, what: str, problems: Problems):
    """A µs time value (int, float, Decimal or numeric string) as int64 ns, else None."""
    t = type(v)
    if t is int:
        ns = v * 1000
    elif t is float:
        if -FLOAT_EXACT_US < v < FLOAT_EXACT_US:
            return round(v * 1000)
        if math.isnan(v) or math.isinf(v):
            problems.dropped[f"{what}_not_finite"] += 1
            return None
        raise NeedsExactParse(what)
    elif v is None:
        return None
    else:
        if t is not Decimal:
            if t is bool or not isinstance(v, str):
                problems.dropped[f"{what}_wrong_type"] += 1
                return None
            try:
                v = Decimal(v.strip())
            except InvalidOperation:
                problems.dropped[f"{what}_not_a_number"] += 1
                return None
            problems.coerced[f"{what}_string_to_number"] += 1
        if not v.is_finite():
            problems.dropped[f"{what}_not_finite"] += 1
            return None
        ns = int((v * NS_PER_US).to_integral_value())
    if -INT64_MAX <= ns <= INT64_MAX:
        return ns
    problems.dropped[f"{what}_out_of_range"] += 1
    return None


def as_int(v, what: str, problems: Problems):
    """An id-like value as int64: ints as they are, integral floats and numeric/hex strings coerced."""
    t = type(v)
    if t is int:
        if -INT64_MAX <= v <= INT64_MAX:
            return v
        problems.dropped[f"{what}_out_of_range"] += 1
        return None
    if v is None:
        return None
    try:
        if t is str:
            s = v.strip()
            n = int(s, 16) if s[:2].lower() == "0x" else int(s)
        elif t is float or t is Decimal:
            if v != v or v in (math.inf, -math.inf) or v != int(v):
                problems.dropped[f"{what}_not_integer"] += 1
                return None
            n = int(v)
        else:
            problems.dropped[f"{what}_wrong_type"] += 1
            return None
    except (ValueError, OverflowError, InvalidOperation):
        problems.dropped[f"{what}_not_integer"] += 1
        return None
    if -INT64_MAX <= n <= INT64_MAX:
        problems.coerced[f"{what}_to_int"] += 1
        return n
    problems.dropped[f"{what}_out_of_range"] += 1
    return None


def as_float(v):
    t = type(v)
    if t is float or t is int:
        return float(v)
    if t is Decimal:
        return float(v)
    return None


def as_text(v, what, problems):
    if v is None or type(v) is str:
        return v
    problems.coerced[f"{what}_not_string"] += 1
    return dumps(v).decode()


def dim_at(v, i):
    if type(v) is list and len(v) > i and type(v[i]) is int:
        return v[i]
    return None
