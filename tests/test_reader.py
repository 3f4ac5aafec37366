"""reader: header/tail metadata, exact chunk splitting, compression, exact timestamps, truncation."""

from __future__ import annotations

import gzip
import json
import os
import random
import re
import tempfile
from decimal import Decimal
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline import synthetic as synth
from pipeline.errors import BadTrace
from pipeline.flatten import flatten
from pipeline.read import source
from pipeline.read import stream as reader
from pipeline.read.chunks import ChunkParseError, FileSpan, Salvaged, ordered_results, parse_chunk
from pipeline.read.source import TraceSource


def norm(v):
    """Parsed JSON with Decimals (ijson's non-integers) as floats, for comparison with json.load."""
    if isinstance(v, dict):
        return {k: norm(x) for k, x in v.items()}
    if isinstance(v, list):
        return [norm(x) for x in v]
    if isinstance(v, Decimal):
        return float(v)
    return v


def read_all(path, chunk_bytes=None, spans=False):
    """(events, metadata, tail, number of pieces) through TraceSource + ordered_results; `spans`:
    as the parallel flatten reads (file positions where the file is uncompressed)."""
    kw = {"chunk_bytes": chunk_bytes} if chunk_bytes else {}
    with TraceSource(str(path), **kw) as src:
        n_pieces = 0

        def counted():
            nonlocal n_pieces
            for p in src.pieces(spans=spans):
                n_pieces += 1
                yield p

        events, corrupt = [], []
        for part in ordered_results(counted(), parse_chunk, lambda evs: evs, on_corrupt=corrupt.append):
            events.extend(part)
        tail = src.tail
        if corrupt and not tail.truncated:  # as flatten does
            tail.truncated, tail.reason = True, corrupt[0]
        return norm(events), src.metadata, tail, n_pieces


def load(path) -> dict | list:
    op = gzip.open if str(path).endswith(".gz") else open
    with op(path, "rb") as f:
        return json.load(f)


# ------------------------------------------------------------------ header / tail metadata
def test_a_file_span_read_in_short_pieces_is_whole_and_a_shrunk_file_says_so(tmp_path, monkeypatch):
    """A chunk's bytes read by position come whole however few bytes each read gives (into a
    buffer too, as the workers' tables are), and a file cut shorter meanwhile is an error."""
    data = random.Random(0).randbytes(100_000)
    path = tmp_path / "span.bin"
    path.write_bytes(data)
    real = os.pread
    monkeypatch.setattr(os, "pread", lambda fd, n, at: real(fd, min(n, 777), at))
    assert FileSpan(str(path), 10, 90_000).read() == data[10:90_000]
    buf = bytearray(80_000)
    FileSpan(str(path), 5, 80_005).read_into(buf)
    assert bytes(buf) == data[5:80_005]
    path.write_bytes(data[:50_000])
    with pytest.raises(ChunkParseError, match="shrank"):
        FileSpan(str(path), 10, 90_000).read()
    with pytest.raises(ChunkParseError, match="shrank"):
        FileSpan(str(path), 0, 80_000).read_into(bytearray(80_000))


def test_header_before_trace_events(tmp_path):
    t = synth.make_trace()
    p = synth.write_trace(t, tmp_path / "t.json")
    events, meta, tail, _ = read_all(p)
    want = load(p)
    assert list(want)[-1] == "traceEvents"  # the header really is before the events
    assert events == want["traceEvents"]
    assert meta == {k: v for k, v in want.items() if k != "traceEvents"}
    assert meta["deviceProperties"][0]["numSms"] == 108
    assert not tail.truncated


@pytest.mark.parametrize("indent", [None, 2])
def test_metadata_after_trace_events_recovered(tmp_path, indent):
    t = synth.make_trace(metadata_after=True)
    p = synth.write_trace(t, tmp_path / "t.json", indent=indent)
    want = load(p)
    keys = list(want)
    assert keys.index("traceEvents") < keys.index("deviceProperties")
    events, meta, tail, _ = read_all(p, chunk_bytes=1024)
    assert events == want["traceEvents"]
    assert meta == {k: v for k, v in want.items() if k != "traceEvents"}
    assert not tail.truncated


@pytest.mark.parametrize("chunk_bytes", [1024, 3000, None])
def test_large_trailing_metadata(tmp_path, chunk_bytes):
    """Trailing metadata far longer than a chunk, full of `}, {"` (lists of objects), is metadata."""
    big = [{"id": i, "name": '}, {"ph": "X"', "sub": [{"a": i}, {"b": [i, {"c": "x"}]}]} for i in range(800)]
    info = [f'INFO:2024-05-22 17:15:23 CuptiActivityProfiler.cpp:{i}] }}, {{"x": {i}' for i in range(500)]
    t = synth.make_trace(metadata_after=True, gpu_devices=(0, 1), extra_metadata={"INFO": info, "big": big})
    p = synth.write_trace(t, tmp_path / "t.json", indent=2)
    want = load(p)
    assert len(p.read_bytes()) - p.read_bytes().rindex(b"]") < 100  # the metadata is after the events
    events, meta, tail, _ = read_all(p, chunk_bytes=chunk_bytes)
    assert not tail.truncated, tail.reason
    assert events == want["traceEvents"]
    assert meta["big"] == big and meta["INFO"] == info
    assert meta == {k: v for k, v in want.items() if k != "traceEvents"}


def test_bare_json_list(tmp_path):
    t = synth.make_trace(tricky=True)
    p = synth.write_trace(t["traceEvents"], tmp_path / "bare.json", indent=1)
    for cb in (1024, None):
        events, meta, tail, _ = read_all(p, chunk_bytes=cb)
        assert events == load(p)
        assert meta == {}
        assert not tail.truncated
    # and a truncated bare list keeps its complete events
    raw = p.read_bytes()
    cut = tmp_path / "bare_cut.json"
    cut.write_bytes(raw[: len(raw) // 2])
    events, _, tail, _ = read_all(cut, chunk_bytes=1024)
    assert tail.truncated
    assert events == synth.complete_events(raw[: len(raw) // 2].decode())


# ------------------------------------------------------------------ chunk splitting
@pytest.mark.parametrize("indent", [None, 2])
@pytest.mark.parametrize("chunk_bytes", [1024, 1111, 2048, 5000, None])
def test_chunk_splitting_is_exact(tmp_path, indent, chunk_bytes):
    """Tiny chunks cut inside strings holding `}, {"` and inside nested lists of objects; the
    events must still equal json.load's, character for character in every string."""
    t = synth.make_trace(n_steps=6, ops_per_step=4, tricky=True, metadata_after=True)
    p = synth.write_trace(t, tmp_path / "t.json", indent=indent)
    want = load(p)
    events, meta, tail, n_pieces = read_all(p, chunk_bytes=chunk_bytes)
    if chunk_bytes and chunk_bytes < 5000:
        assert n_pieces > 10  # many chunks really were cut
    assert not tail.truncated, tail.reason
    assert len(events) == len(want["traceEvents"])
    assert events == want["traceEvents"]
    tricky = [e for e in events if e.get("name") == synth.TRICKY_NAME]
    assert tricky and all(e["args"] == synth.TRICKY_ARGS for e in tricky)
    assert meta["traceName"] == want["traceName"]


def test_one_event_longer_than_many_chunks(tmp_path):
    """An event with a long args list of objects spans far more than a few 1 KB chunks."""
    huge = {
        "ph": "X",
        "cat": "cpu_op",
        "name": "huge",
        "pid": 1,
        "tid": 1,
        "ts": 1.5,
        "dur": 2.0,
        "args": {"list": [{"i": i, "s": '}, {"' * (i % 3)} for i in range(3000)]},
    }
    t = synth.make_trace(extra_events=[huge] + synth.make_trace(n_steps=1)["traceEvents"])
    p = synth.write_trace(t, tmp_path / "t.json")
    assert len(json.dumps(huge)) > 40 * 1024
    events, _, tail, _ = read_all(p, chunk_bytes=1024)
    assert not tail.truncated, tail.reason
    assert events == load(p)["traceEvents"]


@pytest.mark.parametrize("cut_back", [5, 60, 200])
def test_truncated_right_after_an_event_longer_than_many_chunks(tmp_path, cut_back):
    """The unparsed carry (a long event cut into many chunks) ends inside the truncated tail."""
    huge = {
        "ph": "X",
        "cat": "cpu_op",
        "name": "huge",
        "pid": 1,
        "tid": 1,
        "ts": 1.5,
        "dur": 2.0,
        "args": {"list": [{"i": i, "s": '}, {"' * (i % 3)} for i in range(600)]},
    }
    small = synth.make_trace(n_steps=1)["traceEvents"][:3]
    t = synth.make_trace(n_steps=1, extra_events=[huge] + small)
    text = synth.dumps_trace(t)
    end = text.rindex(b"]")
    p = tmp_path / "cut.json"
    p.write_bytes(text[: end - cut_back])
    want = synth.complete_events(text[: end - cut_back].decode())
    assert any(e.get("name") == "huge" for e in want)
    for cb in (1024, 2000, 4096):
        events, _, tail, _ = read_all(p, chunk_bytes=cb)
        assert tail.truncated
        assert events == want, cb


# ------------------------------------------------------------------ compression
@pytest.mark.parametrize("kind", ["gz", "zstd"])
def test_compressed_inputs(tmp_path, kind):
    pytest.importorskip("zstandard") if kind == "zstd" else None
    t = synth.make_trace(n_steps=3, tricky=True, metadata_after=True)
    plain = synth.write_trace(t, tmp_path / "t.json")
    comp = synth.write_trace(
        t, tmp_path / f"t.json.{'gz' if kind == 'gz' else 'zst'}", gz=kind == "gz", zstd=kind == "zstd"
    )
    assert comp.read_bytes()[:2] != plain.read_bytes()[:2]
    a = read_all(plain, chunk_bytes=1024)
    b = read_all(comp, chunk_bytes=1024)
    assert a[0] == b[0] == load(plain)["traceEvents"]
    assert a[1] == b[1]
    assert not b[2].truncated


def test_truncated_gzip_stream(tmp_path):
    t = synth.make_trace(n_steps=4)
    data = synth.dumps_trace(t)
    comp = gzip.compress(data)
    p = tmp_path / "t.json.gz"
    p.write_bytes(comp[: len(comp) * 2 // 3])
    events, _, tail, _ = read_all(p, chunk_bytes=1024)
    assert tail.truncated and tail.reason
    # every event decoded before the stream broke off is complete and in order
    full = load_events(data)
    assert 0 < len(events) < len(full)
    assert events == full[: len(events)]


def load_events(data: bytes) -> list:
    return json.loads(data)["traceEvents"]


# ------------------------------------------------------------------ exact timestamps
def test_ns_digit_timestamps_are_exact(tmp_path):
    ev = {
        "ph": "X",
        "cat": "cpu_op",
        "name": "exact",
        "pid": 1,
        "tid": 1,
        "ts": Decimal("1712195495519695.812"),
        "dur": Decimal("0.001"),
        "args": {},
    }
    t = synth.make_trace(ns_digits=True, extra_events=[ev])
    p = synth.write_trace(t, tmp_path / "ns.json")
    assert b'"ts": 1712195495519695.812' in p.read_bytes()
    assert float("1712195495519695.812") * 1000 != 1712195495519695812  # a float64 cannot do it
    r = flatten(p, tmp_path / "out", link=False, workers=1)
    evt = pq.read_table(r.out_dir / "events.parquet").to_pylist()
    assert evt[-1]["name"] == "exact"
    assert evt[-1]["ts_ns"] == 1712195495519695812
    assert evt[-1]["dur_ns"] == 1
    want = [synth.ns(e.get("ts")) for e in t["traceEvents"]]
    assert [row["ts_ns"] for row in evt] == want
    assert [row["dur_ns"] for row in evt] == [synth.ns(e.get("dur")) for e in t["traceEvents"]]
    g = pq.read_table(r.out_dir / "gpu_ops.parquet").to_pylist()
    assert [x["ts_ns"] for x in g] == [synth.ns(e["ts"]) for _, e in synth.gpu_events(t)]


@pytest.mark.parametrize("layout", ["new", "old", "oldest", "2021"])
def test_float_and_int_timestamps_are_exact(tmp_path, layout):
    t = synth.make_trace(layout=layout)
    p = synth.write_trace(t, tmp_path / "t.json")
    r = flatten(p, tmp_path / "out", link=False, workers=1)
    evt = pq.read_table(r.out_dir / "events.parquet")
    assert evt.column("ts_ns").to_pylist() == [synth.ns(e.get("ts")) for e in t["traceEvents"]]
    assert evt.column("dur_ns").to_pylist() == [synth.ns(e.get("dur")) for e in t["traceEvents"]]


# ------------------------------------------------------------------ truncation and chunk sizes (property)
_TEXTS: dict = {}


def _text(metadata_after: bool) -> bytes:
    if metadata_after not in _TEXTS:
        t = synth.make_trace(n_steps=3, ops_per_step=3, tricky=True, metadata_after=metadata_after)
        _TEXTS[metadata_after] = synth.dumps_trace(t, indent=None if metadata_after else 2)
    return _TEXTS[metadata_after]


def test_a_document_cut_before_its_events_array_has_no_complete_event():
    # hypothesis found the cut between the key and its `[` (the helper raised instead of saying none)
    assert synth.complete_events('{"schemaVersion": 1, "traceEvents"') == []
    assert synth.complete_events('{"schemaVersion": 1, "traceEvents": ') == []
    assert synth.complete_events('{"traceEvents": [{"ph": "X"}, {"ph"') == [{"ph": "X"}]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.booleans(), st.floats(0, 1), st.integers(1024, 6000))
def test_truncation_keeps_exactly_the_complete_events(metadata_after, frac, chunk_bytes):
    text = _text(metadata_after)
    cut = int(len(text) * frac)
    prefix = text[:cut]
    want = synth.complete_events(prefix.decode())
    array_open = text.index(b"[", text.index(b'"traceEvents"')) + 1
    array_close = len(text) - text[::-1].index(b"]") if not metadata_after else None
    if metadata_after:
        # the `]` that closes traceEvents is the one just before `, "deviceProperties"`
        array_close = text.index(b"]", text.rindex(b"}", 0, text.index(b'"deviceProperties"'))) + 1
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "cut.json"
        p.write_bytes(prefix)
        if cut < array_open:
            with pytest.raises(BadTrace):
                read_all(p, chunk_bytes)
            return
        events, meta, tail, _ = read_all(p, chunk_bytes)
    assert events == want
    if cut < array_close:
        assert tail.truncated
    if cut == len(text):
        assert not tail.truncated
        assert len(events) == len(json.loads(text)["traceEvents"])


_TABLES: dict = {}


def _flat_tables(path, out, **kw):
    r = flatten(path, out, link=False, **kw)
    return {
        n: pq.read_table(r.out_dir / f"{n}.parquet").drop_columns([c for c in ("flattened_at",) if n == "trace"])
        for n in ("events", "gpu_ops", "flows", "devices", "trace")
    }


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1024, 20000))
def test_random_chunk_sizes_give_identical_tables(chunk_bytes):
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        if "ref" not in _TABLES:
            t = synth.make_trace(n_steps=5, ops_per_step=4, tricky=True, metadata_after=True, gpu_devices=(0, 1))
            src = synth.write_trace(t, Path(tempfile.mkdtemp()) / "ref.json", indent=2)
            _TABLES["src"] = src
            _TABLES["ref"] = _flat_tables(src, d / "ref", workers=1)
            assert _TABLES["ref"]["events"].num_rows == len(t["traceEvents"])
        got = _flat_tables(_TABLES["src"], d / "got", workers=1, chunk_bytes=chunk_bytes)
    for name, ref in _TABLES["ref"].items():
        assert got[name].equals(ref), name


def test_salvaged_piece_when_truncated(tmp_path):
    """The tail of a truncated trace is handed over as already-parsed events (Salvaged)."""
    text = synth.dumps_trace(synth.make_trace(n_steps=1))
    p = tmp_path / "cut.json"
    p.write_bytes(text[: len(text) - 300])
    with TraceSource(str(p)) as src:
        pieces = list(src.pieces())
        assert src.tail.truncated
    assert isinstance(pieces[-1], Salvaged)
    assert norm(pieces[-1].events) == synth.complete_events(text[: len(text) - 300].decode())


def test_not_a_trace_inputs_raise_badtrace(tmp_path):
    cases = {
        "empty": b"",
        "ws": b"  \n ",
        "not json": b"hello",
        "no events": b'{"a": [1, 2]}',
        "events not list": b'{"traceEvents": {"a": 1}}',
        "events scalar": b'{"traceEvents": 5}',
        "random": random.Random(7).randbytes(3000),
        "bracket then bytes": b"[\x8f\x02garbage",
        "events of other bytes": b'{"traceEvents": [ \xff\x00}',
    }
    for name, data in cases.items():
        p = tmp_path / f"{name}.json"
        p.write_bytes(data)
        with pytest.raises(BadTrace):
            read_all(p)


@pytest.mark.parametrize(
    "text, said",
    [
        (
            b'{"schemaVersion": 1, "deviceProperties": [{"id": 0, "na',
            "truncated: the file ends before traceEvents, after 55 bytes of JSON",
        ),
        (b'{"schemaVersion": 1, "x": oops}', "not JSON: unexpected character, expected a JSON value at line 1 col"),
        (b'{"schemaVersion": 1,\n "x": [1, 2}', "not JSON: unexpected character, expected ',' or ']' at line 2 column"),
        (b'{"schemaVersion": NaN, "x": 1}', "valid JSON but not a trace: no traceEvents list"),  # as torch writes NaN
        (b'{"a": [1, 2]}', "valid JSON but not a trace: no traceEvents list"),
    ],
)
def test_a_document_without_events_says_why(tmp_path, text, said):
    """A file with no traceEvents list says whether it was cut short before them, is not JSON
    (what and where), or is JSON of something else."""
    p = tmp_path / "t.json"
    p.write_bytes(text)
    with pytest.raises(BadTrace, match=re.escape(said)):
        read_all(p)


def test_utf8_byte_order_mark_before_the_document_is_accepted(tmp_path):
    """Some tools write a BOM; it is not content, and the trace must still read."""
    import json as _json

    from pipeline.read.chunks import parse_chunk
    from pipeline.read.source import TraceSource

    doc = {"schemaVersion": 1, "traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 2}], "traceName": "t"}
    path = tmp_path / "bom.json"
    path.write_bytes(b"\xef\xbb\xbf" + _json.dumps(doc).encode())
    with TraceSource(str(path)) as src:
        events = [e for p in src.pieces() for e in parse_chunk(p)]
        assert events == doc["traceEvents"]
        assert src.metadata == {"schemaVersion": 1, "traceName": "t"}


# ------------------------------------------------------------------ uncompressed files cut by position
def spans_of(path, chunk_bytes):
    with TraceSource(str(path), chunk_bytes=chunk_bytes) as src:
        return list(src.pieces(spans=True))


@pytest.mark.parametrize("indent", [None, 2])
@pytest.mark.parametrize("metadata_after", [False, True])
def test_file_spans_equal_reading_through(tmp_path, indent, metadata_after):
    """An uncompressed file is cut by position (its end found first, from its tail, then a small
    window read at each cut): the same events and metadata as reading the stream through."""
    t = synth.make_trace(n_steps=8, ops_per_step=4, tricky=True, metadata_after=metadata_after)
    p = synth.write_trace(t, tmp_path / "t.json", indent=indent)
    pieces = spans_of(p, 2048)
    assert len(pieces) > 10 and all(isinstance(x, FileSpan) for x in pieces)
    assert read_all(p, 2048, spans=True)[:3] == read_all(p, 2048)[:3]
    assert read_all(p, 2048, spans=True)[0] == load(p)["traceEvents"]


@pytest.mark.parametrize(
    "text",
    [
        b'{"traceEvents": []}',
        b'{"traceEvents": [ ], "x": 1}',
        b"[]",
        b'[ {"ph": "X"} ]',
        b'{"a": [1], "traceEvents": [{"ph": "X"}, {"ph": "i"}]\n}\n',
    ],
)
def test_file_spans_of_tiny_documents(tmp_path, text):
    p = tmp_path / "t.json"
    p.write_bytes(text)
    assert read_all(p, 1024, spans=True)[:3] == read_all(p, 1024)[:3]


def test_metadata_beyond_the_tail_window_falls_back_to_reading_through(tmp_path, monkeypatch):
    """Trailing metadata larger than the window the end is looked for in: the `]` found there
    closes a list of objects inside the metadata, which the check (events have `ph`) rejects."""
    t = synth.make_trace(n_steps=6, metadata_after=True)
    t["deviceProperties"] = [dict(synth.DEVICE_PROPS, id=i) for i in range(64)]  # ~30 KB after the events
    p = synth.write_trace(t, tmp_path / "t.json", indent=1)
    monkeypatch.setattr(source, "TAIL_BYTES", (8192,))
    with TraceSource(str(p), chunk_bytes=4096) as src:
        assert src._events_end() is None
    events, meta, tail, _ = read_all(p, 4096, spans=True)
    assert not tail.truncated and events == load(p)["traceEvents"] and len(meta["deviceProperties"]) == 64
    monkeypatch.setattr(source, "TAIL_BYTES", (8192, 1 << 20))
    with TraceSource(str(p), chunk_bytes=4096) as src:
        assert src._events_end() is not None


def test_truncated_file_cut_by_position_salvages_like_reading_through(tmp_path):
    t = synth.make_trace(n_steps=6, ops_per_step=4)
    data = synth.dumps_trace(t, indent=2)
    p = tmp_path / "t.json"
    p.write_bytes(data[: len(data) * 2 // 3])
    spans, through = read_all(p, 2048, spans=True), read_all(p, 2048)
    assert spans[2].truncated and spans[:2] == through[:2] and len(spans[0]) > 10


# ------------------------------------------------------------------ gzip
@pytest.fixture(params=["isal", "zlib"])
def inflate(request, monkeypatch):
    """GzipStream with ISA-L (when installed) and with the stdlib's zlib."""
    import zlib

    if request.param == "isal":
        isal_zlib = pytest.importorskip("isal.isal_zlib")
        monkeypatch.setattr(reader, "_inflate", isal_zlib)
    else:
        monkeypatch.setattr(reader, "_inflate", zlib)


def _read_through(data: bytes, n: int = 1000) -> tuple[bytes, BaseException | None]:
    import io

    stream, out = reader.GzipStream(io.BytesIO(data)), bytearray()
    try:
        while block := stream.read1(n):
            out += block
    except Exception as e:
        return bytes(out), e
    return bytes(out), None


def test_gzip_members_and_padding(inflate):
    a, b = os.urandom(5000).hex().encode(), b"second member" * 300
    assert _read_through(gzip.compress(a) + gzip.compress(b) + b"\0" * 700) == (a + b, None)
    got, err = _read_through(gzip.compress(a) + b"garbage")
    assert got == a and isinstance(err, OSError)


def test_gzip_breaking_off_returns_every_byte_before_the_error(inflate):
    import zlib

    data = os.urandom(300_000).hex().encode()
    comp = gzip.compress(data)
    got, err = _read_through(comp[: len(comp) // 2], n=4096)
    assert isinstance(err, EOFError) and 0 < len(got) < len(data) and data.startswith(got)
    broken = comp[: len(comp) // 2] + bytes(255 - x for x in comp[len(comp) // 2 : len(comp) // 2 + 64]) + comp[-100:]
    got, err = _read_through(broken, n=4096)  # deflate has no checksum before the end: bytes may be wrong
    assert isinstance(err, (zlib.error, OSError, EOFError)) and got != data


def test_json_bytes_estimate_sees_through_compression(tmp_path):
    """Plain: the file's size. gzip: its trailer's size, at least 4x the file (a trailer modulo
    2**32 or of a last small member says less). zstd: the declared size, else at least 4x."""
    zstandard = pytest.importorskip("zstandard")
    text = json.dumps({"traceEvents": [{"ph": "X", "name": f"op{i}", "ts": i, "dur": 1} for i in range(5000)]}).encode()
    plain, gz, two, zst, zst_undeclared = (
        tmp_path / n for n in ("t.json", "t.json.gz", "two.json.gz", "t.json.zst", "u.json.zst")
    )
    plain.write_bytes(text)
    gz.write_bytes(gzip.compress(text))
    two.write_bytes(gzip.compress(text) + gzip.compress(b" "))  # the trailer is the small member's
    zst.write_bytes(zstandard.ZstdCompressor().compress(text))
    with open(zst_undeclared, "wb") as f, zstandard.ZstdCompressor().stream_writer(f) as w:
        w.write(text)
    assert reader.json_bytes_estimate(str(plain)) == len(text)
    assert reader.json_bytes_estimate(str(gz)) == len(text)
    assert reader.json_bytes_estimate(str(two)) == reader.MIN_COMPRESSION_RATIO * two.stat().st_size
    assert reader.json_bytes_estimate(str(zst)) == len(text)
    assert (
        reader.json_bytes_estimate(str(zst_undeclared)) == reader.MIN_COMPRESSION_RATIO * zst_undeclared.stat().st_size
    )
    assert reader.json_bytes_estimate(str(two)) < len(text)  # a floor, not the truth: a 2-member file reads less


def test_a_compressed_trace_gets_workers_by_its_json_size(tmp_path, monkeypatch):
    """A 1 GB trace gzips to ~50 MB: whether it is parsed in workers depends on the JSON it holds,
    not on the file's size (it was parsed on one core below 48 MB of gzip)."""
    from pipeline.read import workers as flatten_module

    text = json.dumps({"traceEvents": [{"ph": "X", "name": "op", "ts": i, "dur": 1} for i in range(20000)]}).encode()
    gz = tmp_path / "t.json.gz"
    gz.write_bytes(gzip.compress(text))
    monkeypatch.setattr(flatten_module, "PARALLEL_MIN_BYTES", len(text) - 1)
    assert gz.stat().st_size < flatten_module.PARALLEL_MIN_BYTES < len(text)
    assert flatten_module.default_workers(str(gz)) == min(len(os.sched_getaffinity(0)), 8)
    monkeypatch.setattr(flatten_module, "PARALLEL_MIN_BYTES", len(text) + 1)
    assert flatten_module.default_workers(str(gz)) == 1


def test_a_corrupt_stream_is_reported_in_the_decompressors_words(inflate):
    """The problem says what broke (the decompressor's message), not only an error class's name
    (zlib's is `error`)."""
    import io

    data = os.urandom(200_000).hex().encode()
    comp = gzip.compress(data)
    mid = len(comp) // 2
    broken = comp[:mid] + bytes(255 - x for x in comp[mid : mid + 64]) + comp[mid + 64 :]
    got, problem = reader.read_some(reader.GzipStream(io.BytesIO(broken)), 2 * len(data))  # on to the trailer
    assert data.startswith(got[:1000]) and problem.startswith("corrupt compressed data (")
    assert problem not in ("corrupt compressed data (error)", "corrupt compressed data ()") and "\n" not in problem


def _events_text(n: int) -> str:
    """n kernel-launch-like events whose args hold lists (a `]` followed by `, "` in each) and
    non-ASCII names: each such `]` is a candidate end of traceEvents that `split_tail` must refuse."""
    return ", ".join(
        json.dumps({"ph": "X", "name": f"opé€{i}", "ts": i, "args": {"Input Dims": [[i, 2]], "Input type": ["f"]}})
        for i in range(n)
    )


def test_the_end_of_trace_events_is_found_among_many_false_candidates():
    """A tail buffer well beyond `document._PROBE_BYTES` with thousands of `]`s inside events' args:
    the metadata after traceEvents (non-ASCII, a NaN as torch writes it) is found; the same buffer
    cut inside an event is truncated (None)."""
    from pipeline.read.document import _PROBE_BYTES, split_tail

    events = _events_text(3000)
    assert len(events) > 2 * _PROBE_BYTES
    tail = f'{events}], "distributedInfo": {{"backend": "nccl", "名": NaN}}, "x": [1]}}\n'.encode()
    got = split_tail(tail, bare_list=False)
    assert got is not None and got[0] == events.encode()
    assert got[1]["x"] == [1] and got[1]["distributedInfo"]["backend"] == "nccl"
    assert got[1]["distributedInfo"]["名"] != got[1]["distributedInfo"]["名"]  # NaN
    assert split_tail(tail[: len(events) // 2], bare_list=False) is None
    assert split_tail(events.encode() + b"}", bare_list=False) is None  # ends in a `}`: still cut


def test_metadata_with_non_finite_floats_after_non_ascii_text():
    """orjson counts its error position in characters: the NaN/-Infinity fallback finds the token in
    the bytes after non-ASCII text too, and other errors still raise."""
    import orjson

    from pipeline.read.document import loads_metadata

    assert loads_metadata('{"é€": "ü", "a": -Infinity}'.encode()) == {"é€": "ü", "a": float("-inf")}
    assert loads_metadata(memoryview(b'{"a": NaN}'))["a"] != 0
    with pytest.raises(orjson.JSONDecodeError):
        loads_metadata('{"é": 1}, {"b": NaN}'.encode())
