"""The Trace Event Format's JSON Array Format at the top level (torch_npu's trace_view.json is one):
streamed in bounded chunks, the closing `]` optional as the format allows, `ts` written as decimal
strings read exactly to the ns (never through a float) by the fast builders too."""

from __future__ import annotations

import json
from decimal import Decimal

import pyarrow.parquet as pq
import pytest

from pipeline.flatten import flatten
from pipeline.read.by_dicts import events_by_event
from pipeline.read.by_struct import tables_by_struct
from pipeline.read.chunks import parse_chunk_exact
from pipeline.read.decode import build_from_text
from pipeline.read.source import ARRAY_NOT_CLOSED, TraceSource
from pipeline.read.values import Problems


def _events(n: int) -> list:
    # torch_npu writes ts as a string with 3 decimals (ns); some writers give more digits
    return [
        {
            "ph": "X",
            "name": f"op{i}",
            "pid": 7,
            "tid": 1,
            "ts": f"1736405443{863674 + 13 * i}.{(i * 137) % 1000:03d}" + ("5" if i % 5 == 0 else ""),
            "dur": 1.25 + i % 3,
            "args": {"i": i, "text": '}, {"ph": "X"' * (i % 2)},
        }
        for i in range(n)
    ]


def _exact_ns(ts: str) -> int:
    return int((Decimal(ts) * 1000).to_integral_value())  # half to even below the ns, as us_to_ns


def _flat(path, tmp, **kw):
    r = flatten(path, tmp / "out", link=False, **kw)
    return r, pq.read_table(r.out_dir / "events.parquet").to_pylist(), pq.read_table(r.out_dir / "trace.parquet")


@pytest.mark.parametrize("ending", ["]", "", ",", ",\n  ", "\n"])
@pytest.mark.parametrize("workers", [1, 2])
def test_array_with_or_without_its_closing_bracket(tmp_path, ending, workers):
    evs = _events(3000)
    text = json.dumps(evs, indent=1)
    assert text.endswith("]")
    p = tmp_path / "trace_view.json"
    p.write_text(text[:-1].rstrip() + ending)
    r, rows, tr = _flat(p, tmp_path, workers=workers, chunk_bytes=16 << 10)
    assert not r.truncated, r.truncation_reason
    assert [x["name"] for x in rows] == [e["name"] for e in evs]
    assert [x["ts_ns"] for x in rows] == [_exact_ns(e["ts"]) for e in evs]
    problems = json.loads(tr.column("problems_json")[0].as_py())
    assert problems.get(f"coerced:{ARRAY_NOT_CLOSED}", 0) == (0 if ending == "]" else 1)
    assert problems["coerced:ts_string_to_number"] == len(evs)
    assert tr.column("metadata_json")[0].as_py() == "{}"


@pytest.mark.parametrize("cut", [3, 40, 200])
def test_array_cut_inside_an_event_is_truncated(tmp_path, cut):
    text = json.dumps(_events(500))
    p = tmp_path / "cut.json"
    p.write_text(text[:-cut])
    r, rows, _ = _flat(p, tmp_path, workers=1, chunk_bytes=4096)
    assert r.truncated
    assert 0 < len(rows) < 500 and rows[-1]["name"] == f"op{len(rows) - 1}"


def test_array_is_streamed_in_bounded_chunks(tmp_path):
    """A JSON array is cut into chunks like traceEvents is: no chunk much above chunk_bytes."""
    p = tmp_path / "big.json"
    p.write_text(json.dumps(_events(20000)))
    size = p.stat().st_size
    for spans in (False, True):
        with TraceSource(str(p), chunk_bytes=64 << 10) as src:
            lengths = [len(x) if isinstance(x, bytes) else x.end - x.start for x in src.pieces(spans=spans)]
        assert len(lengths) > size // (128 << 10)
        assert max(lengths) < 2 * (64 << 10)
        assert not src.tail.truncated and not src.tail.unclosed


def test_string_timestamps_take_the_fast_builder_and_are_exact():
    evs = _events(400) + [
        {"ph": "C", "name": "HBM 0/Read", "pid": 9, "tid": 0, "ts": "-12.0005", "args": {"Read(MB/s)": 0.0}},
        {"ph": "M", "name": "process_name", "pid": 9, "tid": 0, "args": {"name": "HBM"}},
        {"ph": "i", "name": "whole", "pid": 9, "tid": 0, "ts": "1736405443863674"},
    ]
    text = json.dumps(evs)[1:-1].encode()
    fast = tables_by_struct(text)
    assert fast is not None  # no longer left to the event-by-event builder
    want = [None if "ts" not in e else _exact_ns(e["ts"]) for e in evs]
    assert fast.events.column("ts_ns").to_pylist() == want
    assert want[-3] == -12000 and want[5] == _exact_ns(evs[5]["ts"])  # half to even below the ns
    assert fast.problems.coerced["ts_string_to_number"] == len(evs) - 1
    # the careful builder, event by event from exact decimals, gives the same table and counts
    careful = Problems()
    slow = events_by_event(parse_chunk_exact(text), None, None, careful)
    assert slow.column("ts_ns").to_pylist() == want
    assert careful.coerced == fast.problems.coerced
    assert build_from_text(text).events.column("ts_ns").to_pylist() == want


@pytest.mark.parametrize(
    "odd",
    [
        [{"ph": "X", "name": "a", "ts": "1.5"}, {"ph": "X", "name": "b", "ts": 2.5}],  # strings beside numbers
        [{"ph": "X", "name": "a", "ts": " 1.5"}, {"ph": "X", "name": "b", "ts": "2e3"}],  # not plain decimals
        [{"ph": "X", "name": "a", "ts": "99999999999999999999.5"}],  # beyond int64 ns
        [{"ph": "X", "name": "a", "ts": "1.5"}, {"ph": "X", "name": "b", "ts": "x"}],  # no number
    ],
)
def test_odd_string_timestamps_are_coerced_or_dropped_as_before(odd):
    """Anything but plain decimal strings takes the careful builder, which counts every value."""
    text = json.dumps(odd)[1:-1].encode()
    built = build_from_text(text)
    careful = Problems()
    slow = events_by_event(parse_chunk_exact(text), None, None, careful)
    assert built.events.column("ts_ns").to_pylist() == slow.column("ts_ns").to_pylist()
    assert built.problems.coerced == careful.coerced and built.problems.dropped == careful.dropped
