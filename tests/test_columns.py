"""The three chunk builders of `pipeline.read` give the same tables.

`tables_by_struct` (msgspec, the fast path) must either decline a chunk or build exactly what
the dict builders build from orjson's parse of the same text (`build_chunk` with the raw args),
and `build_from_text` must always equal the dict builders' result.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.kineto import DEVICE_FROM_PID, GPU_KINDS
from pipeline.read.by_struct import raw_args_of, tables_by_struct
from pipeline.read.chunks import NeedsExactParse, parse_chunk, parse_chunk_exact
from pipeline.read.decode import build_chunk, build_from_text
from pipeline.read.durations import pair_chunk
from pipeline.read.source import TraceSource
from pipeline.read.tables import ChunkTables
from pipeline.read.timestamps import exact_ns_from_text, ns_of_decimal_texts


def by_dicts(text: bytes) -> ChunkTables:
    """The tables of the dict builders (orjson parse), args as raw text like the struct builder."""
    return build_chunk(parse_chunk(text), text, raw_args_of(text))


def assert_same(a: ChunkTables, b: ChunkTables):
    for name in ("events", "gpu_ops", "flows"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.schema == y.schema, name
        assert x.to_pylist() == y.to_pylist(), name
    assert a.problems == b.problems
    assert a.device_ids == b.device_ids
    assert a.open_ends == b.open_ends


def chunk(events: list, indent: int | None = None) -> bytes:
    """traceEvents text of `events` as a chunk (elements separated by commas, no brackets)."""
    return json.dumps(events, indent=indent).encode()[1:-1]


PLAIN = [
    {
        "ph": "X",
        "cat": "cpu_op",
        "name": "aten::mm",
        "pid": 7,
        "tid": 8,
        "ts": 1.5,
        "dur": 2.25,
        "args": {"External id": 3, "Input Dims": [[2, 3], [3, 4]], "Input type": ["float", "float"]},
    },
    {
        "ph": "X",
        "cat": "cuda_runtime",
        "name": "cudaLaunchKernel",
        "pid": 7,
        "tid": 8,
        "ts": 2,
        "dur": 1,
        "args": {"External id": 3, "correlation": 11},
    },
    {"ph": "s", "cat": "ac2g", "name": "ac2g", "id": 11, "pid": 7, "tid": 8, "ts": 2},
    {"ph": "f", "cat": "ac2g", "name": "ac2g", "id": 11, "pid": 0, "tid": 7, "ts": 5, "bp": "e"},
    {
        "ph": "X",
        "cat": "kernel",
        "name": "sgemm",
        "pid": 0,
        "tid": 7,
        "ts": 5,
        "dur": 3.5,
        "args": {
            "device": 0,
            "stream": 7,
            "correlation": 11,
            "External id": 3,
            "grid": [4, 1, 1],
            "block": [128, 1, 1],
            "registers per thread": 32,
            "shared memory": 0,
            "warps per SM": 1.5,
            "est. achieved occupancy %": 12,
        },
    },
    {
        "ph": "X",
        "cat": "gpu_memcpy",
        "name": "Memcpy HtoD",
        "pid": 0,
        "tid": 7,
        "ts": 9,
        "dur": 1,
        "args": {"device": 0, "stream": 7, "correlation": 12, "bytes": 4096, "memory bandwidth (GB/s)": 4.1},
    },
    {"ph": "i", "cat": "cpu_instant_event", "name": "mark", "pid": 7, "tid": 8, "ts": 3, "s": "t"},
    {"ph": "M", "name": "process_name", "pid": "Spans", "args": {"name": "python"}},
    {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 7, "tid": 8, "ts": 4, "dur": 1, "args": None},
    {
        "ph": "X",
        "cat": "Kernel",
        "name": "old",
        "pid": 0,
        "tid": 7,
        "ts": 6,
        "dur": 1,
        "args": {"device": 0, "external id": 5, "correlation": 13},
    },
]


@pytest.mark.parametrize("indent", [None, 2])
def test_plain_events_take_the_struct_path_and_match_the_dict_path(indent):
    text = chunk(PLAIN, indent)
    fast = tables_by_struct(text)
    assert fast is not None
    assert_same(fast, by_dicts(text))
    assert fast.events.num_rows == len(PLAIN) and fast.gpu_ops.num_rows == 3 and fast.flows.num_rows == 2
    rows = fast.events.to_pylist()
    assert [json.loads(r["args_json"]) if r["args_json"] else None for r in rows] == [e.get("args") for e in PLAIN]
    assert rows[3]["extra_json"] == '{"bp":"e"}' and rows[6]["extra_json"] == '{"s":"t"}'
    assert rows[9]["external_id"] == 5  # the oldest layout's lower-case key


ODD = {  # chunks the struct path must decline (the dict path coerces or keeps them)
    "unknown key": {"ph": "X", "name": "a", "tts": 5},
    "numeric bp": {"ph": "f", "id": 1, "bp": 3},
    "escaped bp": {"ph": "f", "id": 1, "bp": 'a"b'},
    "two extra keys": {"ph": "i", "bp": "e", "s": "t"},
    "string correlation": {"ph": "X", "args": {"correlation": "12"}},
    "float pid": {"ph": "X", "pid": 1.0},
    "bool tid": {"ph": "X", "tid": True},
    "list name": {"ph": "X", "name": ["a"]},
    "args list": {"ph": "X", "args": [1, 2]},
    "not an object": 5,
    "string grid": {"ph": "X", "cat": "kernel", "args": {"grid": "4,1,1"}},
    "short grid": {"ph": "X", "cat": "kernel", "args": {"grid": [4]}},
    "ts as a string": {"ph": "X", "ts": "12.5"},
}


@pytest.mark.parametrize("case", sorted(ODD))
def test_odd_values_take_the_dict_path(case):
    text = chunk([PLAIN[0], ODD[case], PLAIN[3]])
    assert tables_by_struct(text) is None
    assert_same(build_from_text(text), by_dicts(text))


@pytest.mark.parametrize(
    "wide",
    [
        {"ph": "s", "id": 2**70},  # beyond uint64: text only
        {"ph": "B", "pid": 1, "tid": 2**64 - 1, "ts": 3},  # a uint64 thread id (IBM's AIU runtime)
        {"ph": "X", "pid": 2**63, "tid": -(2**63), "ts": 3, "id": 15514734831341844875},
    ],
)
def test_ids_beyond_int64_take_the_struct_path_and_are_kept_as_text(wide):
    """Every builder keeps an id beyond int64 as its decimal text, and a uint64's bits as int64."""
    text = chunk([PLAIN[0], wide, PLAIN[3]])
    fast = tables_by_struct(text)
    assert fast is not None
    exact = build_chunk(parse_chunk_exact(text), None, raw_args_of(text))
    assert_same(build_from_text(text), exact)
    fast.events, fast.open_ends = pair_chunk(fast.events)  # as build_from_text pairs every builder's
    assert_same(fast, exact)
    row = exact.events.to_pylist()[1]
    for key in ("pid", "tid", "id"):
        if key in wide:
            v = wide[key]
            beyond = not -(2**63) < v < 2**63
            assert row[f"{key}_str"] == (str(v) if beyond else None)
            assert row[key] == (v - 2**64 if 2**63 < v < 2**64 else None if beyond else v)
    assert not exact.problems.dropped


def test_null_extra_key_is_kept_by_the_struct_path():
    text = chunk([PLAIN[0], {"ph": "f", "id": 1, "bp": None}, PLAIN[3]])
    fast = tables_by_struct(text)
    assert fast is not None
    assert_same(fast, by_dicts(text))
    assert fast.events.column("extra_json").to_pylist()[1] == '{"bp":null}'
    assert fast.flows.column("bp").to_pylist() == [None, "e"]


def test_invalid_utf8_is_never_kept_undecoded():
    text = chunk([PLAIN[0]]).replace(b"aten::mm", b"aten::\xff")
    assert tables_by_struct(text) is None
    text = chunk([PLAIN[0]]).replace(b'"float"', b'"\xfe\xff"', 1)
    assert tables_by_struct(text) is None


def test_real_traces_take_the_struct_path(shared_traces):
    """Every chunk of every real trace is built by the struct path, identically to the dict path."""
    for path in sorted(shared_traces.glob("*/*.json.gz")):
        pieces = [p for p in TraceSource(str(path), chunk_bytes=256 << 10).pieces() if isinstance(p, bytes)][:8]
        for text in pieces:
            fast = tables_by_struct(text)
            assert fast is not None, path.name
            assert_same(fast, by_dicts(text))


# ------------------------------------------------------------------ random events
_ids = st.one_of(st.none(), st.integers(-(2**63), 2**64), st.text(max_size=3), st.floats(allow_nan=False))
_times = st.one_of(st.none(), st.integers(-(10**16), 10**16), st.floats(-1e13, 1e13), st.text(max_size=3))
_strings = st.one_of(
    st.none(), st.sampled_from(["X", "B", "E", "s", "f", "i", "kernel", "cpu_op", "ac2g", 'é"\\']), st.integers(0, 3)
)
_arg_values = st.one_of(
    st.none(),
    st.integers(-(2**63), 2**63),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=4),
    st.lists(st.integers(0, 9), max_size=4),
)
_args = st.one_of(
    st.none(),
    st.dictionaries(
        st.sampled_from(
            [
                "correlation",
                "External id",
                "external id",
                "device",
                "stream",
                "grid",
                "block",
                "bytes",
                "graph id",
                "warps per SM",
                "Input Dims",
                "sycl queue",
                "x",
            ]
        ),
        _arg_values,
        max_size=5,
    ),
    st.lists(st.integers(), max_size=2),
)
_event = st.fixed_dictionaries(
    {},
    optional={
        "ph": _strings,
        "cat": st.one_of(_strings, st.sampled_from(sorted(GPU_KINDS))),
        "name": _strings,
        "pid": _ids,
        "tid": _ids,
        "ts": _times,
        "dur": _times,
        "id": _ids,
        "args": _args,
        "bp": st.one_of(st.none(), st.sampled_from(["e", "s", 'q"'])),
        "s": st.sampled_from(["t", "p"]),
        "tts": st.integers(0, 5),
    },
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(_event, st.integers(), st.just(None)), min_size=1, max_size=12), st.sampled_from([None, 1]))
def test_build_from_text_equals_the_dict_builders(events, indent):
    text = chunk(events, indent)
    try:
        expected = by_dicts(text)
    except NeedsExactParse:
        return  # floats too long for a float64: parsed again with Decimals (tests/test_reader.py)
    assert_same(build_from_text(text), expected)


_plain_event = st.fixed_dictionaries(
    {"ph": st.sampled_from(["X", "s", "f", "i", "M"])},
    optional={
        "cat": st.sampled_from(["cpu_op", "kernel", "gpu_memcpy", "ac2g", "cuda_runtime", "Kernel"]),
        "name": st.text(max_size=6),
        "pid": st.one_of(st.integers(0, 2**31), st.text(max_size=3)),
        "tid": st.integers(-(2**31), 2**31),
        "ts": st.one_of(st.integers(0, 4 * 10**12), st.floats(0, 4e12)),
        "dur": st.floats(0, 1e6),
        "id": st.integers(0, 2**40),
        "args": st.fixed_dictionaries(
            {},
            optional={
                "correlation": st.integers(0, 2**40),
                "External id": st.integers(0, 2**40),
                "device": st.integers(0, 8),
                "stream": st.integers(0, 99),
                "grid": st.lists(st.integers(1, 2**20), min_size=3, max_size=3),
                "block": st.lists(st.integers(1, 1024), min_size=3, max_size=3),
                "bytes": st.integers(0, 2**40),
                "warps per SM": st.floats(0, 64),
                "Input Dims": st.lists(st.lists(st.integers(0, 9), max_size=3)),
                "Concrete Inputs": st.lists(st.text(max_size=4), max_size=3),
            },
        ),
        "bp": st.sampled_from(["e", "s"]),
    },
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_plain_event, min_size=1, max_size=12), st.sampled_from([None, 2]))
def test_plain_events_always_take_the_struct_path(events, indent):
    text = chunk(events, indent)
    fast = tables_by_struct(text)
    assert fast is not None
    assert_same(fast, by_dicts(text))


# ------------------------------------------------------------------ timestamps beyond a float's ns
def by_exact_parse(text: bytes) -> ChunkTables:
    """The tables of the careful path: ijson's exact Decimals, converted by `us_to_ns`."""
    from pipeline.read.chunks import parse_chunk_exact

    return build_chunk(parse_chunk_exact(text), None, raw_args_of(text))


_big_ts = st.one_of(
    st.builds(
        lambda whole, digits: f"{whole}.{digits}" if digits else str(whole),
        st.integers(4_390_000_000_000, 2**53),  # an int beyond 2**53 beside floats: see below
        st.one_of(st.just(""), st.from_regex(r"[0-9]{1,6}", fullmatch=True)),
    ),
    st.none(),
)  # no ts key


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_big_ts, min_size=1, max_size=12), st.booleans())
def test_long_timestamps_take_the_struct_path_exactly(stamps, negative):
    """Epoch-scale µs timestamps with any number of decimals (more than a float64 holds, as a
    scaled or re-written trace has), ints among them, some events without one: the struct path
    builds them, to the nanosecond the Decimal path gives (digits below a ns rounded half to even)."""
    events = []
    for i, t in enumerate(stamps):
        ts = "" if t is None else f'"ts": {"-" if negative else ""}{t}, '
        events.append(f'{{"ph": "X", "cat": "cpu_op", "name": "op{i}", "pid": 1, "tid": 2, {ts}"dur": 1.5}}')
    text = ",".join(events).encode()
    fast = tables_by_struct(text)
    if all(t is None for t in stamps):
        return
    assert fast is not None
    assert_same(fast, by_exact_parse(text))
    assert_same(build_chunk(parse_chunk(text), text, raw_args_of(text)), by_exact_parse(text))  # the dict path too


def test_epoch_timestamps_beside_ints_and_huge_ints():
    """Epoch µs with ns digits beside plain ints (PLAIN's) take the struct path; an int beyond 2**53
    beside floats has no exact float64 column: the careful path builds it, exactly."""
    text = chunk([PLAIN[0], {"ph": "X", "ts": 1712195495519695.8}, PLAIN[3]])
    text = text.replace(b"1712195495519695.8", b"1712195495519695.812")
    fast = tables_by_struct(text)
    assert fast is not None and fast.events.column("ts_ns").to_pylist()[1] == 1712195495519695812
    assert_same(fast, by_exact_parse(text))
    huge = b'{"ph": "X", "ts": 4390000000000.5},{"ph": "X", "ts": 9007199254740993}'
    assert tables_by_struct(huge) is None
    assert build_from_text(huge).events.column("ts_ns").to_pylist() == [4390000000000500, 9007199254740993000]


def test_sub_nanosecond_digits_round_half_to_even():
    text = b",".join(
        b'{"ph": "X", "ts": %s}' % t
        for t in (
            b"4458693246765.2705",
            b"4458693246765.2715",
            b"4458693246765.27051",
            b"4458693246765.2704999",
            b"4458693246765",
        )
    )
    fast = tables_by_struct(text)
    assert fast is not None
    assert fast.events.column("ts_ns").to_pylist() == [
        4458693246765270,
        4458693246765272,
        4458693246765271,
        4458693246765270,
        4458693246765000,
    ]


def test_timestamp_texts_that_are_no_plain_numbers_decline():
    """A text that is no number where a timestamp was expected, or one with an exponent: the
    struct path declines (the careful path decides), never raises."""
    big = pa.array([4458693246765.5])
    assert exact_ns_from_text(big, b'{"ts": "abc"}') is None
    assert exact_ns_from_text(pa.array([4.4586932467655e12]), b'{"ts": 4.4586932467655e12}') is None
    assert exact_ns_from_text(big, b'{"ts": 4458693246765.5}').to_pylist() == [4458693246765500]


def test_epoch_timestamps_with_three_decimals_and_int64_edges():
    """Epoch µs with three decimals (Kineto's form: 19 digits) are read as one integer; digits
    beyond an int64, or exactly -2**63, are read whole and decimals apart; all as Decimal rounds."""
    from decimal import Decimal

    texts = ["1712195495519695.812", "-1712195495519695.8125", "999999999999.99999995", "-0.9223372036854775808", "7"]
    got = ns_of_decimal_texts(pa.array(texts)).to_pylist()
    assert got == [int((Decimal(t) * 1000).to_integral_value()) for t in texts]


def _gpu_case(cats: list, devices: list, pids: list | None = None):
    """An events table of GPU rows (cats, devices) and the typed arg columns the native pass gives."""
    from pipeline.read.by_native import _ARG_COLUMN_ORDER

    n = len(cats)
    pids = pids if pids is not None else [7] * n
    ev = pa.table(
        {
            "event_idx": pa.array(range(n), pa.int64()),
            "cat": pa.array(cats, pa.string()),
            "name": pa.array([f"k{i % 3}" for i in range(n)], pa.string()),
            "pid": pa.array(pids, pa.int64()),
            "tid": pa.array([i % 2 for i in range(n)], pa.int64()),
            "correlation": pa.array([100 + i for i in range(n)], pa.int64()),
            "external_id": pa.array([None] * n, pa.int64()),
            "ts_ns": pa.array([1000 * i for i in range(n)], pa.int64()),
            "dur_ns": pa.array([500] * n, pa.int64()),
        }
    )
    floats = {"warps_per_sm", "occupancy_pct", "copy_bw_gbps"}
    args = {
        k: pa.array([float(i) if k in floats else i for i in range(n)], pa.float64() if k in floats else pa.int64())
        for k in _ARG_COLUMN_ORDER
    }
    args["device"] = pa.array(devices, pa.int64())
    args["stream"] = pa.array([7, None, 20, 7, 7][:n], pa.int64())
    return ev, args


def test_gpu_ops_made_by_column_are_those_made_row_by_row():
    """`typed_gpu_ops` (the native pass's ids, typed already) gives `gpu_ops_of`'s table, device
    ids and task pids; a chunk with a row needing a per-row rule is left to `gpu_ops_of`."""
    from pipeline.read.tables import gpu_ops_of, typed_gpu_ops
    from pipeline.read.values import Problems

    cats = ["kernel", "gpu_memcpy", "Kernel", "gpu_memset", "kernel"]
    ev, args = _gpu_case(cats, [0, 1, None, 0, 3])
    rows = pa.array(range(len(cats)), pa.int64())
    typed = typed_gpu_ops(rows, args, ev)
    lists = args | {k: args[k].to_pylist() for k in ("device", "stream")}
    by_row = gpu_ops_of(list(range(len(cats))), cats, [7] * len(cats), lists, ev, Problems())
    assert typed is not None
    assert typed[0].equals(by_row[0]) and typed[1:] == by_row[1:] == ({0, 1, 3}, set())
    assert typed[0].column("kind").to_pylist() == ["kernel", "memcpy", "kernel", "memset", "kernel"]
    ev2, args2 = _gpu_case(["kernel", sorted(DEVICE_FROM_PID)[0]], [0, None])  # a device read from the pid
    assert typed_gpu_ops(pa.array([0, 1], pa.int64()), args2, ev2) is None
    ev3, args3 = _gpu_case(["kernel", None], [0, 1])  # a device task without a cat
    assert typed_gpu_ops(pa.array([0, 1], pa.int64()), args3, ev3) is None
    ev4, args4 = _gpu_case(["kernel", "kernel"], [0, -(2**63)])  # an id gpu_ops_of coerces and counts
    assert typed_gpu_ops(pa.array([0, 1], pa.int64()), args4, ev4) is None
