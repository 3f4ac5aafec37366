"""arrays: Arrow columns built from Python values with C-level loops: integers that fit int64,
ids that are ints or strings, raw JSON texts joined into one buffer."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.read.values import INT64_MAX, Problems, as_int, wide_int

NONE_TYPE = type(None)
INT_OR_NONE, STR_OR_NONE, DICT_OR_NONE = {int, NONE_TYPE}, {str, NONE_TYPE}, {dict, NONE_TYPE}
NUMBER_OR_NONE = {int, float, NONE_TYPE}


def valid_utf8(arr: pa.Array) -> bool:
    try:
        arr.validate(full=True)
        return True
    except pa.ArrowInvalid:
        return False


def plain_strings(raw: pa.Array) -> pa.Array:
    """The strings that plain raw JSON values hold (`"e"` -> `e`; null, absent -> null)."""
    return pc.if_else(pc.starts_with(raw, '"'), pc.utf8_slice_codeunits(raw, 1, -1), pa.scalar(None, pa.string()))


def raw_texts(raws: list) -> pa.Array:
    """A string column of raw JSON texts (msgspec.Raw or bytes): the texts joined into one buffer
    with their offsets, no string object made per event."""
    data = b"".join(raws)  # a chunk is far below 2 GB: int32 offsets
    offsets = pa.concat_arrays(
        [pa.array([0], pa.int32()), pc.cumulative_sum(pa.array(list(map(len, raws)), pa.int32()))]
    )
    return pa.StringArray.from_buffers(len(raws), offsets.buffers()[1], pa.py_buffer(data))


INT64_MIN = -(2**63)


def int_column(values: list, typed: bool = False) -> pa.Array | None:
    """int64 Array of ints/None, or None if any value is another type or outside ±INT64_MAX.
    `typed`: the values are known to be ints or None (from a typed decode): no type check."""
    if not typed and set(map(type, values)) - INT_OR_NONE:
        return None
    try:
        arr = pa.array(values, pa.int64())
    except OverflowError:
        return None
    return no_int64_min(arr)


def no_int64_min(arr: pa.Array) -> pa.Array | None:
    """The int64 array, or None if it holds -2**63 (outside the ±INT64_MAX the columns take)."""
    return None if pc.min(arr).as_py() == INT64_MIN else arr


def int_or_str_columns(values: list, typed: bool = False) -> tuple[pa.Array, pa.Array] | None:
    """(int64 column, string column) of values that are ints, strings or None; else None. An int
    beyond int64 is kept as its text (and as a uint64's bits: `values.wide_int`).
    `typed`: the values are known to be ints, strings or None."""
    if typed:
        try:
            ints = int_column(values, typed=True)  # raises at the first string
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            return _ints_beside_strings(values)
        return (ints, pa.nulls(len(values), pa.string())) if ints is not None else _wide_ints(values)
    types = set(map(type, values))
    if types - {int, str, NONE_TYPE}:
        return None
    if not types - INT_OR_NONE:
        ints = int_column(values)
        return (ints, pa.nulls(len(values), pa.string())) if ints is not None else _wide_ints(values)
    return _ints_beside_strings(values)


def _ints_beside_strings(values: list) -> tuple[pa.Array, pa.Array] | None:
    """`int_or_str_columns` of ints, strings and None some of which are strings, in one pass over
    them: a trace names a few processes and threads ("Spans", "PyTorch Profiler"), every other pid
    and tid is an int."""
    ints, strs = list(values), [None] * len(values)
    for i in [i for i, v in enumerate(values) if v.__class__ is str]:
        strs[i], ints[i] = ints[i], None
    column = int_column(ints, typed=True)
    return _wide_ints(values) if column is None else (column, pa.array(strs, pa.string()))


def _wide_ints(values: list) -> tuple[pa.Array, pa.Array]:
    """`int_or_str_columns` of values among which some ints lie beyond int64 (`values.wide_int`)."""
    ints: list[int | None] = list(values)
    strs: list[str | None] = [None] * len(values)
    for i, v in enumerate(values):
        if v.__class__ is str:
            strs[i], ints[i] = v, None
        elif v.__class__ is int and not -INT64_MAX <= v <= INT64_MAX:
            ints[i], strs[i] = wide_int(v)
    return pa.array(ints, pa.int64()), pa.array(strs, pa.string())


def coerced_ints(values: list, what: str, problems: Problems) -> pa.Array:
    """int64 Array of id-like values; anything but an in-range int is coerced by `as_int` (and counted)."""
    arr = int_column(values)
    if arr is None:
        arr = pa.array(
            [v if type(v) is int and -INT64_MAX <= v <= INT64_MAX else as_int(v, what, problems) for v in values],
            pa.int64(),
        )
    return arr


def plain_ints(values: list) -> pa.Array:
    """int64 Array of the values that are in-range ints; other values are null."""
    arr = int_column(values)
    if arr is None:
        arr = pa.array([v if type(v) is int and -INT64_MAX <= v <= INT64_MAX else None for v in values], pa.int64())
    return arr


def args_json_of(raws: list) -> pa.Array:
    """args_json from each event's raw args text (None for none)."""
    text = raw_texts([r if r is not None else b"null" for r in raws] if None in raws else raws)
    return pc.if_else(pc.equal(text, "null"), pa.scalar(None, pa.string()), text)
