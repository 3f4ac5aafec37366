"""The compiled chunk builder (native/, `pipeline.read.by_native`): the same tables as the Python
builders on every shared real trace and on mutated traces, declined (None) where it is not sure,
and tracepipe unchanged without it. Skipped where the module is not built (no C++ compiler)."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipeline.errors import BadTrace
from pipeline.flatten import flatten
from pipeline.read import by_native, decode
from pipeline.read.chunks import ChunkParseError, Salvaged, text_of
from pipeline.read.source import TraceSource
from pipeline.schema import TABLES

pytest.importorskip(
    "tracepipe_native", reason="the native chunk builder is not built (make install with a C++ compiler)"
)


def _same_chunk_tables(a, b) -> str | None:
    """What differs between two ChunkTables (None: nothing)."""
    for k in ("events", "gpu_ops", "flows"):
        ta, tb = getattr(a, k), getattr(b, k)
        if ta.schema != tb.schema or not ta.equals(tb):
            return k
    for k in ("problems", "device_ids", "task_pids", "cats", "launches"):
        if getattr(a, k) != getattr(b, k):
            return k
    ea, eb = a.open_ends, b.open_ends
    if (ea is None) != (eb is None) or (ea is not None and vars(ea) != vars(eb)):
        return "open_ends"
    return None


def _built(text: bytes, native: bool, monkeypatch):
    monkeypatch.setenv("TRACEPIPE_NATIVE", "1" if native else "0")
    try:
        return decode.build_from_text(text)
    except ChunkParseError as e:  # the chunk is merged with the next one: the same either way
        return f"ChunkParseError: {e}"


def _compare_chunks(path: Path, chunk_bytes: int, monkeypatch) -> tuple[int, int, list]:
    """(chunks, chunks the native builder took, differences) of a trace read in chunks."""
    n = took = 0
    diffs = []
    with TraceSource(str(path), chunk_bytes=chunk_bytes) as src:
        for piece in src.pieces():
            if isinstance(piece, Salvaged):
                continue
            text = text_of(piece)
            n += 1
            ref = _built(text, False, monkeypatch)
            monkeypatch.setenv("TRACEPIPE_NATIVE", "1")
            took += by_native.tables_by_native(text) is not None
            got = _built(text, True, monkeypatch)
            if isinstance(ref, str) or isinstance(got, str):
                d = None if ref == got else f"{ref!r} / {got!r}"
            else:
                d = _same_chunk_tables(ref, got)
            if d:
                diffs.append((n - 1, d))
    return n, took, diffs


VOLATILE = ("flattened_at",)  # the trace table's clock time of the flatten


def _tables(out_dir: Path) -> dict:
    """Every table flatten wrote, the volatile columns left out."""
    out = {}
    for n in TABLES:
        if (out_dir / f"{n}.parquet").exists():
            t = pq.read_table(out_dir / f"{n}.parquet")
            out[n] = t.drop_columns([c for c in VOLATILE if c in t.column_names])
    return out


# ------------------------------------------------------------------ the shared real traces
@pytest.mark.real
@pytest.mark.slow
def test_every_shared_trace_flattens_to_identical_tables(shared_traces, tmp_path, monkeypatch):
    """Every table of every shared real trace, flattened with and without the native module
    (small chunks, so that most traces span many; linking nests launches in its sweep,
    `native/nesting.cpp`, or in polars), is identical; and the native builder took the chunks of
    every trace (Ascend's decimal-string timestamps included)."""
    took = {}
    calls: list = []

    def counted(text):
        calls.append(by_native.tables_by_native(text))
        return calls[-1]

    monkeypatch.setattr(decode, "tables_by_native", counted)
    for path in sorted(shared_traces.glob("*/*.json.gz")):
        name = f"{path.parent.name}/{path.name.removesuffix('.json.gz')}"
        out = {}
        for native in (False, True):
            monkeypatch.setenv("TRACEPIPE_NATIVE", "1" if native else "0")
            calls.clear()
            r = flatten(path, tmp_path / ("on" if native else "off"), workers=1, chunk_bytes=256 << 10)
            out[native] = (_tables(r.out_dir), r.problems)
            if native:
                took[name] = (sum(c is not None for c in calls), len(calls))
        (off, p_off), (on, p_on) = out[False], out[True]
        assert p_on == p_off, name
        assert off.keys() == on.keys(), name
        for table in off:
            assert on[table].schema == off[table].schema, (name, table)
            assert on[table].equals(off[table]), (name, table)
    assert all(n == total for name, (n, total) in took.items()), took


def test_rows_categories_and_launches_picked_as_the_python_rules_pick_them(monkeypatch):
    """The native pass picks a chunk's GPU activity (a category on a device's process only below
    its pid: `hpu_op`), flow endpoints, categories and launch calls (any case of a launch
    category, the host-function launches and captures told apart) as the Python builders do; a
    category beyond ASCII leaves the launches to Python's `lower()`."""
    ev = dict(EVENT)
    events = [
        ev,
        {**ev, "cat": "hpu_op", "pid": 3},
        {**ev, "cat": "hpu_op", "pid": 300},
        {**ev, "cat": "hpu_op", "pid": "dev"},
        {**ev, "ph": "B", "cat": "Memcpy"},
        {**ev, "cat": None},
        {**ev, "cat": "CUDA_Runtime", "name": "cudaLaunchKernel"},
        {**ev, "cat": "cuda_runtime", "name": "cudaLaunchKernel"},
        {**ev, "cat": "cuda_runtime", "name": "cudaLaunchHostFunc"},
        {**ev, "cat": "cuda_runtime", "name": "cudaStreamBeginCapture"},
        {**ev, "cat": "cuda_runtime", "name": None},
        {**ev, "ph": "i", "cat": "cuda_runtime", "name": "cudaLaunchKernel"},
        {"ph": "s", "cat": "ac2g", "name": "f", "pid": 0, "tid": 7, "ts": 1, "id": 3},
        {"ph": "f", "cat": "ac2g", "name": "f", "pid": 0, "tid": 7, "ts": 2, "id": 3, "bp": "e"},
    ]
    non_ascii = [{**ev, "cat": "driveé", "name": "cuLaunchKernel"}]  # its launches are counted in Python
    for extra in ([], non_ascii):
        text = _text(*events, *extra)
        native, python = _built(text, True, monkeypatch), _built(text, False, monkeypatch)
        assert _same_chunk_tables(native, python) is None
        assert native.launches == {"launches": 2, "captures": 1}
        assert native.cats == {
            "kernel",
            "hpu_op",
            "Memcpy",
            None,
            "CUDA_Runtime",
            "cuda_runtime",
            "ac2g",
            *(e["cat"] for e in extra),
        }
        assert native.gpu_ops.column("event_idx").to_pylist() == [0, 1]
        assert native.flows.num_rows == 2
    assert "calls" in by_native._native.build(_text(*events))
    assert "calls" not in by_native._native.build(_text(*events, *non_ascii))


# ------------------------------------------------------------------ mutated traces
def test_mutated_traces_build_identical_chunks(tmp_path, monkeypatch):
    """Chunks of mutated traces (tests/fuzz.py's mutations of its seeds: wrong types, huge and deep
    values, invalid UTF-8, NaN, cuts) build the same tables, or fail the same way, with and without
    the native builder; and it declines some and takes some."""
    import fuzz

    shared = Path(__file__).resolve().parents[2] / "shared" / "traces"
    seeds = fuzz.seeds(shared if shared.is_dir() else None)
    r = random.Random(36)
    total = took = 0
    for case in range(120):
        name, text = seeds[case % len(seeds)]
        for _ in range(r.randint(1, 2)):
            text = r.choice(fuzz.MUTATIONS)(r, text)
        path = tmp_path / f"case{case}.json"
        path.write_bytes(text)
        try:
            n, t, diffs = _compare_chunks(path, 4096, monkeypatch)
        except (BadTrace, ValueError, OSError):  # no traceEvents to read: nothing reaches a builder
            continue
        assert not diffs, (case, name, diffs[:3])
        total, took = total + n, took + t
    assert 0 < took < total, (took, total)


# ------------------------------------------------------------------ what the native pass declines
EVENT = {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1.5, "dur": 2, "args": {"correlation": 3}}


def _text(*events) -> bytes:
    return b",".join(json.dumps(e).encode() for e in events)


@pytest.mark.parametrize(
    "text",
    [
        _text({**EVENT, "other": 1}),  # a key beyond the plain event's
        _text({**EVENT, "ts": "1736405443863674.400"}) + b", " + _text(EVENT),  # string and number ts mixed
        _text({**EVENT, "ts": "1.7e15"}),  # a string ts that is no plain decimal
        _text({**EVENT, "ts": "9300000000000000"}),  # a string ts beyond int64 ns
        _text(EVENT).replace(b'"ts": 1.5', b'"ts": 1.7e15'),  # an exponent on an epoch time (no exact text)
        _text({**EVENT, "pid": 2**64}),  # beyond int64
        _text({**EVENT, "pid": 1.5}),
        _text({**EVENT, "name": "\ud800"}),  # a \u escape
        _text({**EVENT, "args": [1]}),  # args that are not an object
        _text({**EVENT, "args": {"correlation": "3"}}),
        _text(
            {
                **EVENT,
                "args": {
                    "a": [
                        [
                            [
                                [
                                    [
                                        [
                                            [
                                                [
                                                    [
                                                        [
                                                            [
                                                                [
                                                                    [
                                                                        [
                                                                            [
                                                                                [
                                                                                    [
                                                                                        [
                                                                                            [
                                                                                                [
                                                                                                    [
                                                                                                        [
                                                                                                            [
                                                                                                                [
                                                                                                                    [
                                                                                                                        [
                                                                                                                            [
                                                                                                                                [
                                                                                                                                    [
                                                                                                                                        [
                                                                                                                                            [
                                                                                                                                                [
                                                                                                                                                    [
                                                                                                                                                        [
                                                                                                                                                            [
                                                                                                                                                                [
                                                                                                                                                                    [
                                                                                                                                                                        [
                                                                                                                                                                            [
                                                                                                                                                                                [
                                                                                                                                                                                    [
                                                                                                                                                                                        [
                                                                                                                                                                                            [
                                                                                                                                                                                                [
                                                                                                                                                                                                    [
                                                                                                                                                                                                        [
                                                                                                                                                                                                            [
                                                                                                                                                                                                                [
                                                                                                                                                                                                                    [
                                                                                                                                                                                                                        [
                                                                                                                                                                                                                            [
                                                                                                                                                                                                                                [
                                                                                                                                                                                                                                    [
                                                                                                                                                                                                                                        [
                                                                                                                                                                                                                                            [
                                                                                                                                                                                                                                                [
                                                                                                                                                                                                                                                    [
                                                                                                                                                                                                                                                        [
                                                                                                                                                                                                                                                            [
                                                                                                                                                                                                                                                                [
                                                                                                                                                                                                                                                                    [
                                                                                                                                                                                                                                                                        [
                                                                                                                                                                                                                                                                            [
                                                                                                                                                                                                                                                                                []
                                                                                                                                                                                                                                                                            ]
                                                                                                                                                                                                                                                                        ]
                                                                                                                                                                                                                                                                    ]
                                                                                                                                                                                                                                                                ]
                                                                                                                                                                                                                                                            ]
                                                                                                                                                                                                                                                        ]
                                                                                                                                                                                                                                                    ]
                                                                                                                                                                                                                                                ]
                                                                                                                                                                                                                                            ]
                                                                                                                                                                                                                                        ]
                                                                                                                                                                                                                                    ]
                                                                                                                                                                                                                                ]
                                                                                                                                                                                                                            ]
                                                                                                                                                                                                                        ]
                                                                                                                                                                                                                    ]
                                                                                                                                                                                                                ]
                                                                                                                                                                                                            ]
                                                                                                                                                                                                        ]
                                                                                                                                                                                                    ]
                                                                                                                                                                                                ]
                                                                                                                                                                                            ]
                                                                                                                                                                                        ]
                                                                                                                                                                                    ]
                                                                                                                                                                                ]
                                                                                                                                                                            ]
                                                                                                                                                                        ]
                                                                                                                                                                    ]
                                                                                                                                                                ]
                                                                                                                                                            ]
                                                                                                                                                        ]
                                                                                                                                                    ]
                                                                                                                                                ]
                                                                                                                                            ]
                                                                                                                                        ]
                                                                                                                                    ]
                                                                                                                                ]
                                                                                                                            ]
                                                                                                                        ]
                                                                                                                    ]
                                                                                                                ]
                                                                                                            ]
                                                                                                        ]
                                                                                                    ]
                                                                                                ]
                                                                                            ]
                                                                                        ]
                                                                                    ]
                                                                                ]
                                                                            ]
                                                                        ]
                                                                    ]
                                                                ]
                                                            ]
                                                        ]
                                                    ]
                                                ]
                                            ]
                                        ]
                                    ]
                                ]
                            ]
                        ]
                    ]
                },
            }
        ),
        _text(EVENT).replace(b'"correlation": 3', b'"correlation": 3, "x": tru'),  # invalid JSON inside args
        _text(EVENT).replace(b'"correlation": 3}', b'"correlation": 3, "x": [{"y": 1}'),  # a cut inside args
        b'{"y": 2}]}}, ' + _text(EVENT),  # the other side of that cut
        _text(EVENT) + b", 1",  # an element that is not an event
        b"",
        _text({**EVENT, "ph": "f", "bp": "e", "s": "t"}),  # both extra keys: their order is not kept
        _text({**EVENT, "ph": "f", "bp": 'e"q'}),  # an extra value that is not plain
        _text(EVENT) + b", " + _text({**EVENT, "ph": "i", "s": 1}),
    ],
)
def test_declines_what_it_does_not_cover(text):
    assert by_native.tables_by_native(text) is None


def test_unicode_escapes_build_identical_chunks_natively(monkeypatch):
    """\\u escapes (what `json.dumps` writes for any non-ASCII character: a scaled or re-written
    trace has them in every copy) in names, categories, string ids, args keys and values, a
    surrogate pair, a NUL and an escaped quote: the native pass takes the chunk and builds what the
    Python builders build."""
    events = [
        {**EVENT, "name": "gemm \u00b5s \u2192 \U0001f600", "cat": "kernel"},
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": "aten::mm \u00e9",
            "pid": 1,
            "tid": 2,
            "ts": 1,
            "dur": 9,
            "args": {"Input Dims": [[2, 3]], "\u00b5key": 'v\u00e9\u0000"q', "External id": 4},
        },
        {"ph": "f", "id": "\u00e9x", "pid": 1, "tid": 2, "ts": 3, "cat": "ac2g", "name": "ac2g", "bp": "e"},
        {"ph": "i", "s": "t", "name": "\u65e5\u672c", "pid": 1, "tid": 2, "ts": 4},
    ]
    text = b",".join(json.dumps(e).encode() for e in events)
    assert b"\\u00b5" in text and b"\\ud83d\\ude00" in text  # escaped, as json.dumps writes them
    # an escaped key that spells one of the linking keys is that key
    text += b"," + _text({**EVENT, "ts": 5}).replace(b'"correlation"', b'"\\u0063orrelation"')
    assert by_native.tables_by_native(text) is not None
    ref, got = _built(text, False, monkeypatch), _built(text, True, monkeypatch)
    assert _same_chunk_tables(ref, got) is None
    assert "gemm µs → 😀" in got.gpu_ops.column("name").to_pylist()
    assert got.gpu_ops.column("correlation").to_pylist()[-1] == 3


def test_extra_keys_become_extra_json_natively(monkeypatch):
    """`bp` and `s` (flow binding points, instant scopes) as `extra_json` (`{"bp":"e"}`), made in
    the native pass as the Python builders make it: on the events that have one, null elsewhere,
    a null value kept; the flows' `bp` read from it."""
    events = [
        {"ph": "s", "id": 5, "pid": 1, "tid": 2, "ts": 1, "cat": "ac2g", "name": "ac2g"},
        {"ph": "f", "id": 5, "pid": 1, "tid": 2, "ts": 3, "cat": "ac2g", "name": "ac2g", "bp": "e"},
        {"ph": "i", "s": "t", "name": "mark", "pid": 1, "tid": 2, "ts": 4},
        {"ph": "i", "s": None, "name": "mark", "pid": 1, "tid": 2, "ts": 5},
        {**EVENT, "ts": 6},
    ]
    text = _text(*events)
    ref, got = _built(text, False, monkeypatch), _built(text, True, monkeypatch)
    assert by_native.tables_by_native(text) is not None
    assert _same_chunk_tables(ref, got) is None
    assert got.events.column("extra_json").to_pylist() == [None, '{"bp":"e"}', '{"s":"t"}', '{"s":null}', None]
    assert got.flows.column("bp").to_pylist() == [None, "e"]


@pytest.mark.parametrize(
    "ts, expected",
    [
        (
            [b"1739425750467006.123", b"1739425750467006.1235", b"1739425750467006.1245", b"-3.0005", b"17"],
            [1739425750467006123, 1739425750467006124, 1739425750467006124, -3000, 17000],
        ),
        (  # torch_npu's decimal strings; nulls beside them stay null
            [b'"1736405443863674.400"', b'"1736405443863674.4005"', b'"1736405443863674.4015"', b'"-3.0005"', None],
            [1736405443863674400, 1736405443863674400, 1736405443863674402, -3000, None],
        ),
    ],
    ids=["numbers", "strings"],
)
def test_timestamps_exact_to_the_ns_from_the_text(ts, expected, monkeypatch):
    """Epoch µs with more decimals than a float64 holds, as numbers or as torch_npu's decimal
    strings: the ns of the text (half to even below a ns), never through the float, and the strings
    counted as `ts_string_to_number`, as the Python builders read and count them."""
    text = b",".join(
        b'{"ph": "X", "name": "a", "pid": 1, "tid": 1, "dur": 1%s}' % (b', "ts": ' + t if t else b"") for t in ts
    )
    native = by_native.tables_by_native(text)
    assert native is not None
    assert native.events.column("ts_ns").to_pylist() == expected
    assert native.problems.coerced["ts_string_to_number"] == sum(t is not None and t[:1] == b'"' for t in ts)
    monkeypatch.setenv("TRACEPIPE_NATIVE", "0")
    python = decode.build_from_text(text)
    assert python.events.equals(native.events.select(python.events.column_names))
    assert python.problems.coerced == native.problems.coerced


def test_float_times_below_a_ns_are_taken_as_the_python_builders_read_them(monkeypatch):
    """Times below FLOAT_EXACT_US with digits below a ns, as a scaled trace's shifted times have
    (`1365628131990.1238`), or an exponent: the Python builders read them through the float
    (round(v * 1000), half to even), and so does the native pass, which declined such a chunk
    before (17 of 30 chunks of a 1 GB scaled b200 trace went to the slower builders)."""
    texts = [b"1365628131990.1238", b"1365628132000.6099", b"2.0005", b"0.0125", b"1.5e3", b"17", b"1365628131990.1245"]
    text = b",".join(b'{"ph": "X", "ts": %s, "dur": %s}' % (t, t) for t in texts)
    t = by_native.tables_by_native(text)
    assert t is not None
    monkeypatch.setenv("TRACEPIPE_NATIVE", "0")
    ref = decode.build_from_text(text)
    assert _same_chunk_tables(t, ref) is None
    # through the float: 2.0005 * 1000 is 2000.5000000000002 (up), 0.0125 * 1000 is 12.5 (to even)
    assert t.events.column("ts_ns").to_pylist()[2:6] == [2001, 12, 1500000, 17000]


def test_exact_times_are_taken_only_where_every_ts_key_is_an_events(monkeypatch):
    """Exact ns come from the k-th `"ts":` of the text for the k-th event with a ts, so the native
    pass counts the text's `"ts"` keys (32 places at a time where built for AVX2) and declines a
    chunk where they are not one per event, as the Python builders do. Keys at every offset
    against the 32-byte blocks and at the text's end are counted; a `"ts"` that is a value, or
    followed by whitespace before its colon, is counted as the Python builders' regex counts it."""
    if not by_native.available():
        pytest.skip("the native module is not built")
    r = random.Random(5)
    events = [
        b'{"ph": "X", "name": "%s", "pid": 1, "tid": 1, "dur": 1, "ts": 1739425750467%03d.123}'
        % (b"k" * r.randrange(40), i)
        for i in range(300)
    ]
    spaced = events[:150] + [events[150].replace(b'"ts": ', b'"ts" \n\t: ')] + events[151:]
    valued = events + [
        b'{"ph": "X", "name": "ts", "cat": "ts", "pid": 1, "tid": 1, "dur": 1, "ts": 1739425750468000.5}'
    ]
    for text in (b",".join(events), b",".join(spaced), b",".join(valued), b",".join(events[:3])):
        got = by_native.tables_by_native(text)
        assert got is not None
        with monkeypatch.context() as m:
            m.setenv("TRACEPIPE_NATIVE", "0")
            assert _same_chunk_tables(got, decode.build_from_text(text)) is None
    for at in (0, 7, 31, 32, 33, 150, 299):  # one event more with a "ts" key in its args: declined
        nested = events[:at] + [events[at].replace(b'"dur": 1', b'"dur": 1, "args": {"ts": 3}')] + events[at + 1 :]
        assert by_native.tables_by_native(b",".join(nested)) is None, at


def test_without_the_module_the_python_builders_read(monkeypatch, tmp_path):
    """No module (not built) or TRACEPIPE_NATIVE=0: nothing goes through the native pass."""
    text = _text(EVENT, EVENT)
    assert by_native.tables_by_native(text) is not None
    monkeypatch.setenv("TRACEPIPE_NATIVE", "0")
    assert by_native.tables_by_native(text) is None
    monkeypatch.delenv("TRACEPIPE_NATIVE")
    monkeypatch.setattr(by_native, "_native", None)
    assert not by_native.available() and by_native.tables_by_native(text) is None
    assert decode.build_from_text(text).events.num_rows == 2


def test_a_gzipped_shared_shape_reads_the_same_through_workers(shared_traces, tmp_path, monkeypatch):
    """The worker processes (forked) use the native builder too: a trace flattened with 2 workers
    gives the tables it gives without it."""
    path = shared_traces / "hta" / "a100_nccl.json.gz"
    plain = tmp_path / "a100_nccl.json"
    plain.write_bytes(gzip.open(path, "rb").read())
    out = {}
    for native in ("0", "1"):
        monkeypatch.setenv("TRACEPIPE_NATIVE", native)
        r = flatten(plain, tmp_path / native, workers=2, chunk_bytes=512 << 10)
        out[native] = _tables(r.out_dir)
    for table in out["0"]:
        assert out["1"][table].equals(out["0"][table]), table


_READ_PROBE = """
import sys
from pipeline.read import head_start  # what a reading worker is forked with
from pipeline.read.by_native import tables_by_native
events = ",".join(
    '{"ph":"X","cat":"kernel","name":"k","pid":0,"tid":7,"ts":%d,"dur":2,'
    '"args":{"device":0,"stream":7,"correlation":%d}}' % (i, i)
    for i in range(50)
)
ct = tables_by_native(events.encode())  # a chunk: the text of its events
print(ct is not None and ct.gpu_ops.num_rows, "numpy.ma" in sys.modules)
"""


def test_a_worker_builds_a_chunk_without_importing_numpy_ma(tmp_path):
    """A reading worker is forked before numpy's masked arrays are imported, and `pa.array` of a
    numpy array imports them on its first call (~45 ms of each worker's CPU): the chunk's event
    indexes and flow rows are built over their buffers instead."""
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-c", _READ_PROBE], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-500:]
    assert p.stdout.split() == ["50", "False"]


def test_int64_array_is_the_numpy_values():
    import numpy as np
    import pyarrow as pa

    from pipeline.read.tables import int64_array

    values = np.array([3, -1, 2**62, 0], dtype=np.int64)
    assert int64_array(values).equals(pa.array(values))
    assert int64_array(values[::2]).to_pylist() == [3, 2**62]  # a strided view is copied first
    assert int64_array(np.empty(0, np.int64)).equals(pa.array([], pa.int64()))
