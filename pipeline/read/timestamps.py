"""timestamps: exact nanoseconds for float µs timestamps too long for a float64 (epoch µs with
three or more decimals), read from the chunk's own text rather than from the parsed float."""

from __future__ import annotations

import re
from decimal import Decimal

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.read.arrays import NONE_TYPE, NUMBER_OR_NONE, int_column, no_int64_min
from pipeline.read.chunks import NeedsExactParse
from pipeline.read.values import FLOAT_EXACT_US, NS_PER_US, Problems

_TS_TEXT = re.compile(rb'"ts"\s*:\s*(-?[0-9][0-9.eE+-]*|[^,}\s]+)')


_PLAIN_DECIMAL = re.compile(rb"-?[0-9]+(?:\.[0-9]+)?\Z")


class TimestampTexts:
    """Exact ns for float timestamps too large for a float64, from the chunk's own text.

    The k-th `"ts":` in the text belongs to the k-th event that has a `ts` key; that alignment
    is verified (same count, and the text parses to the same float) before a value is used.
    Anything unexpected raises NeedsExactParse (the chunk is then parsed with ijson).
    """

    def __init__(self, text: bytes | None, events: list):
        self.text, self.events = text, events
        self._texts: list[bytes] | None = None  # the `"ts":` values' texts, in text order
        self._ordinal: dict[int, int] | None = None  # event i -> k: its ts is the k-th text

    def ns(self, i: int, value: float) -> int:
        if self.text is None:
            raise NeedsExactParse("ts")
        if self._texts is None:
            self._texts = _TS_TEXT.findall(self.text)
            with_ts = [j for j, e in enumerate(self.events) if type(e) is dict and "ts" in e]
            if len(with_ts) != len(self._texts):
                raise NeedsExactParse("ts")
            self._ordinal = {j: k for k, j in enumerate(with_ts)}
        assert self._ordinal is not None  # set with _texts
        t = self._texts[self._ordinal[i]]
        if not _PLAIN_DECIMAL.match(t) or float(t) != value:
            raise NeedsExactParse("ts")
        return int((Decimal(t.decode()) * NS_PER_US).to_integral_value())  # as us_to_ns does with ijson's Decimal


def ns_column_of_strings(values: list) -> tuple[pa.Array, int] | None:
    """µs timestamps written as decimal strings (torch_npu writes `"ts": "1736405443863674.400"`,
    exact to the ns) as int64 ns, straight from their digits, never through a float; and how many
    were strings. None unless every value is such a string or None (others take the careful path,
    which coerces and counts each one as `us_to_ns` does)."""
    if set(map(type, values)) - {str, NONE_TYPE}:
        return None
    s = pa.array(values, pa.string())
    n = len(s) - s.null_count
    if not n or not pc.all(pc.match_substring_regex(s, _EXACT_TS_TEXT)).as_py():
        return None
    present = s.filter(s.is_valid())
    if pc.max(pc.abs(pc.cast(present, pa.float64()))).as_py() >= 9.2e15:
        return None  # beyond int64 ns: dropped and counted by the careful path
    ns = ns_of_decimal_texts(present)
    if ns is None:
        return None
    if s.null_count:
        ns = pc.replace_with_mask(pa.nulls(len(s), pa.int64()), s.is_valid(), ns)
    return ns, n


def ts_column(values: list, text: bytes | None, problems: Problems, typed: bool = False) -> pa.Array | None:
    """`ns_column` of the events' `ts`, or of their decimal strings (`ns_column_of_strings`, each
    counted as `coerced:ts_string_to_number`); None if any needs the event-by-event path."""
    ns = ns_column(values, text, typed)
    if ns is not None:
        return ns
    strings = ns_column_of_strings(values)
    if strings is None:
        return None
    problems.coerced["ts_string_to_number"] += strings[1]
    return strings[0]


def ns_column(values: list, text: bytes | None, typed: bool = False) -> pa.Array | None:
    """µs values (int/float/None) as int64 ns, exactly as `us_to_ns`; None if that needs coercion.

    Floats below FLOAT_EXACT_US: round(v * 1000) (Arrow rounds half to even, as Python does).
    Larger ones (epoch-based timestamps) take their exact decimal text from the chunk
    (`exact_ns_from_text`); without text they are left to the event-by-event path.
    `typed`: the values are known to be ints, floats or None: Arrow's type inference tells which
    (and its array is used as it is).
    """
    if typed:
        try:
            arr = pa.array(values)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):  # TypeError: strings beside numbers
            return None
        if arr.type == pa.null():
            arr = arr.cast(pa.int64())
        if arr.type not in (pa.int64(), pa.float64()):
            return None  # beyond int64
        ints = no_int64_min(arr) if arr.type == pa.int64() else None
        has_float = arr.type == pa.float64()
    else:
        types = set(map(type, values))
        if types - NUMBER_OR_NONE:
            return None
        has_float = float in types
        ints = None if has_float else int_column(values, typed=True)
        try:
            arr = pa.array(values, pa.float64()) if has_float else None
        except pa.ArrowInvalid:  # an int beside the floats that a float64 cannot hold exactly
            return None
    if not has_float:
        if ints is None:
            return None
        try:
            return pc.multiply_checked(ints, pa.scalar(1000, pa.int64()))
        except pa.ArrowInvalid:
            return None
    if pc.all(pc.less(pc.abs(arr), FLOAT_EXACT_US)).as_py() is not False:
        return pc.cast(pc.round(pc.multiply(arr, 1000.0)), pa.int64())
    if text is None:
        return None
    return exact_ns_from_text(arr, text)


_EXACT_TS_TEXT = r"^-?[0-9]+(?:\.[0-9]+)?$"


def exact_ns_from_text(values: pa.Array, text: bytes) -> pa.Array | None:
    """int64 ns of timestamps (float64, null where an event has none; some may have been ints)
    from their decimal text in the chunk (see TimestampTexts): the µs text times 1000, digits
    below a nanosecond rounded half to even, exactly as `us_to_ns` turns ijson's Decimals.

    The k-th `"ts":` text belongs to the k-th event that has a ts; that alignment and every value
    are verified (as many texts as timestamps, and each text parses to the same float) or None
    is returned (a `"ts"` inside args, `"ts": null`, exponents: the careful path decides).
    """
    if not pc.all(pc.less(pc.abs(values), 9.2e15)).as_py():
        return None
    texts = _TS_TEXT.findall(text)
    if len(texts) != len(values) - values.null_count:
        return None
    s = pa.array(texts, pa.binary()).cast(pa.string())
    present = values.is_valid()
    try:
        same = pc.all(pc.equal(pc.cast(s, pa.float64()), values.filter(present))).as_py()
    except pa.ArrowInvalid:  # a text that is no number: a string "ts" inside args, say
        return None
    if not same:
        return None
    ns = ns_of_decimal_texts(s)
    if ns is None:
        return None
    return ns if not values.null_count else pc.replace_with_mask(pa.nulls(len(values), pa.int64()), present, ns)


_TENS = pa.array([10**k for k in range(19)], pa.int64())  # an int64 holds 19 digits at the most


def ns_of_decimal_texts(s: pa.Array) -> pa.Array | None:
    """int64 ns of µs decimal texts (`-?digits[.digits]`, below 9.2e15 µs), digits below a ns
    rounded half to even (as a Decimal's to_integral_value); None if a text is not such a number.

    Texts whose digits fit an int64 (epoch µs with three decimals do) are read as one integer
    without the dot and scaled by their number of decimals; longer ones are split at the dot
    (`_ns_of_long_decimal_texts`)."""
    if pc.max(pc.count_substring(s, ".")).as_py() > 1:
        return None
    try:
        digits = pc.cast(pc.replace_substring(s, ".", ""), pa.int64())  # only digits and a sign cast
        magnitude = pc.abs_checked(digits)
    except pa.ArrowInvalid:  # more digits than an int64 holds, or no number
        return _ns_of_long_decimal_texts(s)
    dot = pc.find_substring(s, ".")
    decimals = pc.if_else(pc.less(dot, 0), 0, pc.subtract(pc.subtract(pc.utf8_length(s), dot), 1))
    scale_up = pc.less_equal(decimals, 3)
    ns = pc.if_else(
        scale_up, pc.multiply(magnitude, _TENS.take(pc.subtract(3, pc.min_element_wise(decimals, 3)))), magnitude
    )
    if not pc.all(scale_up).as_py():  # digits below a ns: divide, rounding half to even
        below = _TENS.take(pc.subtract(pc.max_element_wise(decimals, 3), 3))
        whole_ns = pc.divide(magnitude, below)  # integer division of non-negatives
        rest = pc.subtract(magnitude, pc.multiply(whole_ns, below))
        twice = pc.multiply(rest, 2)
        up = pc.or_(
            pc.greater(twice, below), pc.and_(pc.equal(twice, below), pc.equal(pc.bit_wise_and(whole_ns, 1), 1))
        )
        ns = pc.if_else(scale_up, ns, pc.add(whole_ns, pc.cast(up, pa.int64())))
    return pc.if_else(pc.less(digits, 0), pc.negate(ns), ns)


def _ns_of_long_decimal_texts(s: pa.Array) -> pa.Array | None:
    """`ns_of_decimal_texts` of texts with more digits than an int64 holds: whole µs and the
    first three decimals read apart, the digits after them compared as text."""
    if not pc.all(pc.match_substring_regex(s, _EXACT_TS_TEXT)).as_py():
        return None
    parts = pc.extract_regex(s, r"^(?P<sign>-?)(?P<whole>[0-9]+)(?:\.(?P<digits>[0-9]+))?$")
    whole, digits = pc.struct_field(parts, "whole"), pc.struct_field(parts, "digits")  # no fraction: ""
    ns = pc.add(
        pc.multiply(pc.cast(whole, pa.int64()), 1000),
        pc.cast(pc.utf8_slice_codeunits(pc.utf8_rpad(digits, 3, "0"), 0, 3), pa.int64()),
    )
    below = pc.utf8_rtrim(pc.utf8_slice_codeunits(digits, 3), "0")  # digits below a ns
    up = pc.or_(pc.greater(below, "5"), pc.and_(pc.equal(below, "5"), pc.equal(pc.bit_wise_and(ns, 1), 1)))
    ns = pc.add(ns, pc.cast(up, pa.int64()))
    return pc.if_else(pc.equal(pc.struct_field(parts, "sign"), "-"), pc.negate(ns), ns)
