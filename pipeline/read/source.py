"""reader: the only code that touches JSON bytes.

A trace is read as a byte stream (plain, gzip or zstd), never whole. The reader finds the
`traceEvents` array (collecting the top-level metadata before it), then cuts the array's text
into bounded chunks at event boundaries (`}` `,` `{"`). A cut that lands inside a string or a
nested object cannot produce a chunk that parses as a list of complete values, so a chunk that
fails to parse is merged with the next one and parsed again (see `ordered_results`): the split
is speculative but the result is exact. After the array, the remaining top-level metadata is
parsed too. A stream that ends early yields every complete event and reports truncation.

Parsing a chunk: orjson on bounded chunks is the fast path; when a float timestamp is too large
for a float64 to hold its nanosecond digits, the chunk is parsed again with ijson (C backend),
which keeps decimals exact. ijson also salvages the complete events of a truncated tail.
"""
from __future__ import annotations

import io
import json
import os
import re
import zlib
from collections import deque
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Callable, Iterator

import ijson
import orjson

from pipeline.errors import BadTrace
from pipeline.read.limits import inflate_limit, too_inflated
from pipeline.read import tame
from pipeline.read.tame import EventSqueezer, TooDeep, is_too_deep, tame_deep

if ijson.backend != "yajl2_c":  # pragma: no cover - depends on the installed wheel
    raise ImportError(
        f"tracepipe needs ijson's C backend (yajl2_c); this ijson uses {ijson.backend!r}. "
        "Reinstall ijson from a wheel for your platform: pip install --force-reinstall ijson"
    )

GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
DEFAULT_CHUNK_BYTES = 2 << 20  # parsed, a chunk takes ~25x its size in Python objects
READ_BYTES = 4 << 20
MAX_HEADER_BYTES = 256 << 20
TAIL_BYTES = (1 << 20, 16 << 20)  # windows of an uncompressed file's end to find traceEvents' end in
CHECK_BYTES = 256 << 10  # the events before that end parsed to make sure of it
CUT_WINDOW_BYTES = 64 << 10  # read at each cut of an uncompressed file, to find an event boundary
# a carry (chunks merged after a failed parse) larger than this (in chunks and in bytes) means
# corrupt input, not a bad cut
MAX_CARRY_CHUNKS = 8
MAX_CARRY_BYTES = 64 << 20

_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"|[{}\[\]:,]')
_BOUNDARY = re.compile(rb'\}(\s*,\s*)\{\s*"')
# where traceEvents may close: after an event (or at once), followed by more keys or the document's end
_CLOSE_CANDIDATE = re.compile(rb"\}\s*\]")  # starts with a literal: re scans for it fast
_AFTER_CLOSE = re.compile(rb'\s*(?:,\s*"|\}|\Z)')


def _may_close(buf, end: int) -> bool:
    """Whether traceEvents may close before `end`: an event's `}` then `]` then more keys or `}`.

    (One regex with a leading alternation did this at ~27 ns per byte; this scans for `}` first.)
    """
    if buf[:end].lstrip(_WS)[:1] == b"]":
        return True
    return any(_AFTER_CLOSE.match(buf, m.end()) for m in _CLOSE_CANDIDATE.finditer(buf, 0, end))

_CLOSE_DOC = re.compile(rb"\s*\}\s*\Z")  # an object document closes with its `}`: without it, it was cut
_MORE_KEYS = re.compile(rb'\s*,\s*"')
_ONLY_WS = re.compile(rb"\s*\Z")
_WS = b" \t\r\n"


class ChunkParseError(ValueError):
    """A chunk is not a list of complete JSON values (a bad cut, or corrupt input)."""


class NeedsExactParse(ValueError):
    """A float in the chunk cannot hold its decimal digits; parse it again with ijson."""


# ------------------------------------------------------------------ byte streams
def open_stream(path: str):
    """Open a trace file as a binary stream, decompressing gzip or zstd by magic bytes."""
    try:
        raw = open(path, "rb")
    except OSError as e:
        raise BadTrace(f"{path}: cannot open: {e.strerror or e}") from None
    magic = raw.read(4)
    raw.seek(0)
    if magic[:2] == GZIP_MAGIC:
        return GzipStream(raw)
    if magic == ZSTD_MAGIC:
        try:
            import zstandard
        except ImportError:
            raw.close()
            raise BadTrace(f"{path}: zstd-compressed; install tracepipe[zstd]") from None
        return zstandard.ZstdDecompressor().stream_reader(raw, closefd=True)
    return raw


MIN_COMPRESSION_RATIO = 4  # traces compress 7-21x (gzip, measured on the shared ones): a floor


def json_bytes_estimate(path: str) -> int:
    """About how many bytes of JSON a trace file holds, without reading it: its size when plain;
    for gzip the size its trailer records (ISIZE, the last member's size modulo 2**32), for zstd
    the size its frame header declares, each at least MIN_COMPRESSION_RATIO x the file's size
    (which covers ISIZE wrapping past 4 GiB, several members, and an undeclared size)."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(18)
        if head[:2] == GZIP_MAGIC and size >= 18:
            f.seek(-4, os.SEEK_END)
            return max(int.from_bytes(f.read(4), "little"), MIN_COMPRESSION_RATIO * size)
        if head[:4] == ZSTD_MAGIC:
            return max(_zstd_declared_size(head), MIN_COMPRESSION_RATIO * size)
    return size


def _zstd_declared_size(head: bytes) -> int:
    """The content size a zstd frame header declares; 0 when it declares none or cannot be read."""
    try:
        import zstandard
    except ImportError:
        return 0
    try:
        declared = zstandard.get_frame_parameters(head).content_size
    except zstandard.ZstdError:
        return 0
    return 0 if declared == zstandard.CONTENTSIZE_UNKNOWN else declared


try:  # ISA-L inflates ~1.8x faster than zlib (measured: 1.3 vs 2.3 s per GB of JSON): the `fast` extra
    from isal import isal_zlib as _inflate
except ImportError:  # pragma: no cover - depends on what is installed
    _inflate = zlib


class GzipStream:
    """A gzip file decompressed as it is read (`read1`), with ISA-L where it is installed.

    Like gzip.GzipFile (several members, NUL padding after the last one), but every byte inflated
    before the stream breaks off is returned before the error is raised: EOFError when it ends
    early, zlib.error / OSError when it is corrupt.
    """

    IN_BYTES = 1 << 20

    def __init__(self, raw):
        self._raw, self._dec, self._input = raw, _inflate.decompressobj(31), b""

    def read1(self, n: int) -> bytes:
        while True:
            if self._dec.eof and not self._next_member():
                return b""
            data = self._input or self._raw.read(self.IN_BYTES)
            if not data:
                raise EOFError("compressed stream ended before the end-of-stream marker")
            try:
                out = self._dec.decompress(data, n)
            except _inflate.error as e:  # ISA-L's IsalError is not a zlib.error: one kind for callers
                raise zlib.error(str(e)) from e
            self._input = self._dec.unconsumed_tail or self._dec.unused_data
            if out:
                return out

    def _next_member(self) -> bool:
        """After a member's end: start the next one, if the rest is more than NUL padding."""
        rest = self._input.lstrip(b"\x00")
        while not rest:
            more = self._raw.read(self.IN_BYTES)
            if not more:
                return False
            rest = more.lstrip(b"\x00")
        if rest[:2] != GZIP_MAGIC:
            raise OSError("not a gzipped file after the end of a gzip member")
        self._dec, self._input = _inflate.decompressobj(31), rest
        return True

    def read(self, n: int = -1) -> bytes:
        out = bytearray()
        while n < 0 or len(out) < n:
            block = self.read1((1 << 20) if n < 0 else n - len(out))
            if not block:
                break
            out += block
        return bytes(out)

    def close(self):
        self._raw.close()


def _one_line(e: BaseException) -> str:
    """What a decompressor said, on one line, else the kind of error."""
    said = " ".join(str(e).split())
    return said[:200] if said else type(e).__name__


def _read(stream, n: int) -> tuple[bytes, str | None]:
    """Read up to n bytes; a compressed stream that breaks off returns the problem as text.

    Reads with `read1` where the stream has it, so that the bytes decompressed before a
    compression error are returned too (a single `read(n)` that fails loses them all).
    """
    out = bytearray()
    read1 = getattr(stream, "read1", None)
    try:
        if read1 is None:
            return stream.read(n), None
        while len(out) < n:
            block = read1(n - len(out))
            if not block:
                break
            out += block
        return bytes(out), None
    except EOFError:
        return bytes(out), "compressed stream ended early"
    except Exception as e:  # noqa: BLE001 - zlib.error, OSError, zstandard.ZstdError and friends
        return bytes(out), f"corrupt compressed data ({_one_line(e)})"


# ------------------------------------------------------------------ the header
@dataclass
class Header:
    metadata: dict
    bare_list: bool
    rest: bytearray  # bytes after the `[` that opens traceEvents


def _find_events_array(buf: bytes) -> tuple[str, int, int] | None:
    """Scan the top level of a JSON document for `"traceEvents": [`.

    Returns (kind, pos, key_pos): kind "list" for a bare list (pos after `[`), "object" with pos
    after the array's `[` and key_pos at the key's quote; None when more bytes are needed.
    Raises BadTrace when the document cannot be a trace.
    """
    i = 3 if buf[:3] == b"\xef\xbb\xbf" else 0  # a UTF-8 byte-order mark is not content
    while i < len(buf) and buf[i] in _WS:
        i += 1
    if i == len(buf):
        return None
    first = buf[i : i + 1]
    if first == b"[":
        return ("list", i + 1, i)
    if first != b"{":
        raise BadTrace("not JSON: a trace starts with '{' or '['")
    depth, key, key_pos, after_colon = 0, None, -1, False
    for m in _TOKEN.finditer(buf, i):
        tok = m.group()
        c = tok[:1]
        if c == b'"':
            if depth == 1 and not after_colon:
                key, key_pos = tok, m.start()
            after_colon = False
            continue
        if c == b":":
            after_colon = depth == 1
            continue
        if after_colon and depth == 1 and key == b'"traceEvents"':
            if tok == b"[":
                return ("object", m.end(), key_pos)
            raise BadTrace("traceEvents is not a list")
        after_colon = False
        if c in b"{[":
            depth += 1
        elif c in b"}]":
            depth -= 1
            if depth == 0:
                raise BadTrace("valid JSON but not a trace: no traceEvents list")
        elif c == b",":
            pass
    # a scalar value right after "traceEvents": is reported when the next token arrives
    return None


def loads_metadata(text: bytes):
    """Top-level metadata text parsed: strict JSON, or as Python's json reads it (NaN, Infinity),
    which is how torch writes a trace whose metadata holds such floats."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        if b"NaN" not in text and b"Infinity" not in text:
            raise
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        raise orjson.JSONDecodeError("not JSON", text.decode("utf-8", "replace"), 0) from None


def _metadata_before(buf: bytes, key_pos: int) -> dict:
    body = bytes(buf[buf.index(b"{") + 1 : key_pos]).rstrip(_WS)
    if body.endswith(b","):
        body = body[:-1]
    try:
        meta = loads_metadata(b"{" + body + b"}")
    except orjson.JSONDecodeError as e:
        raise BadTrace(f"not JSON: top-level metadata does not parse ({e})") from None
    return meta


_VALUE_START = frozenset(b'{["-0123456789tfn]')  # what may follow traceEvents' `[`: a value or its end


def _check_first_value(buf: bytes, pos: int):
    """Raise BadTrace when what follows the `[` that opens traceEvents (at pos) cannot start a JSON
    value: a file of other bytes that happens to begin with `[` is no trace (salvaging it would
    keep nothing and call it truncated)."""
    rest = bytes(buf[pos:pos + 64]).lstrip(_WS)
    if rest and rest[0] not in _VALUE_START:
        raise BadTrace("not JSON: traceEvents does not hold JSON values")


def read_header(stream) -> tuple[Header, str | None]:
    buf = bytearray()
    problem = None
    while True:
        block, problem = _read(stream, READ_BYTES)
        buf += block
        found = _find_events_array(buf)
        if found:
            kind, pos, key_pos = found
            _check_first_value(buf, pos)
            meta = {} if kind == "list" else _metadata_before(buf, key_pos)
            return Header(meta, kind == "list", bytearray(buf[pos:])), problem
        if not block:
            break
        if len(buf) > MAX_HEADER_BYTES:
            raise BadTrace(f"no traceEvents list in the first {MAX_HEADER_BYTES >> 20} MB")
    if problem and not buf:
        raise BadTrace(f"not a readable trace: {problem}")
    if not bytes(buf).strip():
        raise BadTrace("empty file" if not problem else f"not a readable trace: {problem}")
    try:
        orjson.loads(bytes(buf))
    except orjson.JSONDecodeError:
        raise BadTrace("not JSON" + (f" ({problem})" if problem else "")) from None
    raise BadTrace("valid JSON but not a trace: no traceEvents list")


# ------------------------------------------------------------------ the tail
def _split_tail(buf: bytes, bare_list: bool) -> tuple[bytes, dict] | None:
    """Find where traceEvents closes in the last bytes of a document.

    Returns (events_text, metadata_after) or None if the array never closes (truncated).
    The leftmost `]` that is followed by a valid end of document is the array's end: any `]`
    before it is followed by more events, which is not a valid document tail.
    """
    mv = memoryview(buf)
    for strict in (True, False):
        for m in re.finditer(rb"\]", buf):
            p = m.start()
            if strict:
                j = p - 1
                while j >= 0 and buf[j] in _WS:
                    j -= 1
                if j >= 0 and buf[j] not in b"}":
                    continue
            if bare_list:
                if _ONLY_WS.match(buf, p + 1):
                    return bytes(mv[:p]), {}
                continue
            if _CLOSE_DOC.match(buf, p + 1):
                return bytes(mv[:p]), {}
            mk = _MORE_KEYS.match(buf, p + 1)
            if mk:
                try:
                    meta = loads_metadata(b"{" + bytes(mv[mk.end() - 1 :]))
                except orjson.JSONDecodeError:
                    continue
                if isinstance(meta, dict):
                    return bytes(mv[:p]), meta
    return None


# ------------------------------------------------------------------ chunk parsing
def parse_chunk(text: bytes) -> list:
    """The events of one chunk of traceEvents text (values separated by commas). Raises
    ChunkParseError when it is not a list of complete values, TooDeep when a value is nested
    deeper than the parsers take (`pipeline.tame`)."""
    try:
        return orjson.loads(b"[" + text + b"]")
    except orjson.JSONDecodeError as e:
        if is_too_deep(e):
            raise TooDeep(str(e)) from None
        # NaN/Infinity are not JSON, but Python's json writes them; orjson refuses a number that
        # overflows a float64 (`1e400`): both parse exactly with Decimals
        if b"NaN" in text or b"Infinity" in text or "infinity" in str(e):
            try:
                return json.loads(b"[" + text + b"]", parse_float=Decimal, parse_constant=float)
            except RecursionError:
                raise TooDeep("nested too deep") from None
            except ValueError:
                pass
        raise ChunkParseError(str(e)) from None


def parse_chunk_tamed(text: bytes) -> tuple[list, int]:
    """parse_chunk, with values nested too deep kept as their text (`tame_deep`); and how many."""
    try:
        return parse_chunk(text), 0
    except TooDeep:
        tamed, n = tame_deep(text)
        if not n:  # the deep value goes on past this chunk: a cut to merge
            raise ChunkParseError("a value nested too deep goes on past the chunk") from None
        return parse_chunk(tamed), n


def parse_chunk_exact(text: bytes) -> list:
    """Like parse_chunk, but non-integer numbers stay Decimal (exact decimal text)."""
    try:
        return list(ijson.items(io.BytesIO(b"[" + text + b"]"), "item"))
    except ijson.JSONError as e:
        raise ChunkParseError(str(e)) from None
    except UnicodeDecodeError:  # a "\ud800" escape (valid JSON, no UTF-8): Python's json takes it
        try:
            return json.loads(b"[" + text + b"]", parse_float=Decimal, parse_constant=float)
        except RecursionError:
            raise TooDeep("nested too deep") from None
        except ValueError as e:
            raise ChunkParseError(str(e)) from None


def salvage_events(text: bytes) -> list:
    """Every complete event at the start of a truncated or corrupt stretch of traceEvents."""
    out = []
    try:
        for item in ijson.items(io.BytesIO(b"[" + text), "item"):
            out.append(item)
    except (ijson.JSONError, ijson.IncompleteJSONError, ValueError):
        pass
    return out


# ------------------------------------------------------------------ the source
@dataclass
class Tail:
    metadata: dict = field(default_factory=dict)
    truncated: bool = False
    reason: str | None = None


@dataclass
class Salvaged:
    """Events already parsed (from a truncated stretch): handed to the work as they are."""

    events: list
    text: bytes = b""  # the stretch they come from (to salvage again with an unparsed carry before it)


@dataclass(frozen=True)
class FileSpan:
    """A chunk of an uncompressed trace file, by position: the process that parses it reads
    the bytes itself, so a chunk's text never passes through a pipe."""

    path: str
    start: int
    end: int

    def read(self) -> bytes:
        out = bytearray()
        with open(self.path, "rb") as f:
            while len(out) < self.end - self.start:
                block = os.pread(f.fileno(), self.end - self.start - len(out), self.start + len(out))
                if not block:
                    raise ChunkParseError("the file shrank while it was being read")
                out += block
        return bytes(out)


def _pread(path: str, start: int, end: int) -> bytes:
    return FileSpan(path, start, end).read()


def _are_events(text: bytes) -> bool:
    """Whether the text is a comma-separated run of complete trace events (objects with `ph`)."""
    try:
        events, _ = parse_chunk_tamed(text)
    except ChunkParseError:
        return False
    return bool(events) and all(type(e) is dict and "ph" in e for e in events)


def text_of(piece: bytes | FileSpan) -> bytes:
    return piece.read() if isinstance(piece, FileSpan) else piece


class TraceSource:
    """A trace as a stream of traceEvents chunks plus its top-level metadata.

    Iterate `pieces()` for raw chunk bytes (`pieces(spans=True)`: FileSpans where the file is
    uncompressed) and, at the end of a truncated trace, a Salvaged piece; `metadata` holds the
    top-level keys found before and after traceEvents once iteration is done; `tail` says
    whether the trace was truncated.
    """

    def __init__(self, path: str, chunk_bytes: int = DEFAULT_CHUNK_BYTES, max_inflate: float | None = None):
        self.path = path
        self.chunk_bytes = max(int(chunk_bytes), 1024)
        self.metadata: dict = {}
        self.tail = Tail()
        self.bytes_read = 0
        self.oversize = tame.VALUE_LIMIT  # an event longer than this is read through `EventSqueezer`
        self.values_cut = 0  # values longer than tame.VALUE_LIMIT, kept cut
        self._stream = open_stream(path)
        try:
            self.header, problem = read_header(self._stream)
        except BaseException:
            self._stream.close()
            raise
        self._problem = problem
        self.metadata.update(self.header.metadata)
        # file offset of header.rest[0], when the stream is the file itself (not decompressed)
        self._rest_offset = (self._stream.tell() - len(self.header.rest)
                             if isinstance(self._stream, io.BufferedReader) else None)
        # a compressed file may inflate to this many bytes (`pipeline.limits`)
        self._inflate_limit = None if self._rest_offset is not None else inflate_limit(os.path.getsize(path), max_inflate)

    def close(self):
        self._stream.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def pieces(self, spans: bool = False) -> Iterator[bytes | FileSpan | Salvaged]:
        if spans and self._rest_offset is not None:
            end = self._events_end()
            if end is not None:
                yield from self._spans(*end)
                return
        yield from self._read_pieces(spans)

    def _read_pieces(self, spans: bool, start: int | None = None) -> Iterator[bytes | FileSpan | Salvaged]:
        """Pieces by reading the stream through: the only way for compressed input, and for a file
        whose end `_events_end` cannot place (truncated, say). `start`: from this offset of an
        uncompressed file (at an event) rather than from the header's end."""
        buf = self.header.rest
        if start is not None:
            self._stream.seek(start)
            buf = bytearray()
        problem = self._problem
        eof = problem is not None
        at_end = False  # traceEvents may close in buf: cut no more, the rest is the tail
        offset = self._rest_offset if spans else None  # file offset of buf[0]
        while True:
            while not at_end and len(buf) >= self.chunk_bytes:
                cut = self._cut(buf)
                if cut is None or cut > self.oversize:  # the latter: an event too long to parse whole
                    break
                if cut < 0:
                    at_end = True
                    break
                if offset is None:
                    chunk = bytes(buf[:cut])
                else:
                    chunk = FileSpan(self.path, offset, offset + cut)
                    offset += cut + 1
                del buf[: cut + 1]
                yield chunk
            if not at_end and len(buf) >= self.oversize:  # one event holds more than a value may
                head = self._head_before_oversize(buf)
                if head:
                    yield bytes(buf[:head]) if offset is None else FileSpan(self.path, offset, offset + head)
                    del buf[: head + 1]
                offset = None  # what follows is no longer the file's bytes
                try:
                    buf, eof, problem = self._squeezed(buf, eof, problem)
                except ValueError:  # no JSON where an event should be: keep what came before
                    self.tail = Tail(truncated=True, reason="traceEvents holds text that is not JSON; "
                                                            "complete events before it were kept")
                    return
                at_end = at_end or buf[:1] == b"]"
                continue
            if eof:
                break
            block, problem = self._next_block()
            buf += block
            if not block or problem:
                eof = True
        yield from self._finish(bytes(buf), problem)

    def _next_block(self) -> tuple[bytes, str | None]:
        block, problem = _read(self._stream, READ_BYTES)
        self.bytes_read += len(block)
        if self._inflate_limit is not None and self.bytes_read > self._inflate_limit:
            raise BadTrace(too_inflated(self._inflate_limit, os.path.getsize(self.path)))
        return block, problem

    def _head_before_oversize(self, buf: bytearray) -> int:
        """Where the events before an oversized one end in buf (a separating comma), 0 if none:
        the last event boundary, if the text before it parses as events."""
        last = None  # every boundary past chunk_bytes lies after the oversized event (see `_cut`)
        for last in _BOUNDARY.finditer(buf, 0, min(len(buf), self.chunk_bytes)):
            pass
        if last is None:
            return 0
        cut = last.start(1) + last.group(1).index(b",")
        try:
            parse_chunk_tamed(bytes(buf[:cut]))
        except ChunkParseError:
            return 0  # a boundary inside a string: squeeze from the first event (one at a time)
        return cut

    def _squeezed(self, buf: bytearray, eof: bool, problem: str | None) -> tuple[bytearray, bool, str | None]:
        """buf (starting at an event) with its first event replaced by a bounded copy
        (`EventSqueezer`), reading on through the event's end; values cut are counted."""
        squeezer = EventSqueezer()
        rest = bytes(buf[squeezer.feed(buf):])
        while not squeezer.done and not eof:
            block, problem = self._next_block()
            eof = not block or problem is not None
            rest = block[squeezer.feed(block):]
        self.values_cut += squeezer.cut
        if not squeezer.done:  # the stream ended inside the event: what was kept, to salvage
            return bytearray(squeezer.text), eof, problem
        return bytearray(squeezer.text) + rest, eof, problem

    # ---- an uncompressed file: its end found first, then cut by position without reading it
    def _events_end(self) -> tuple[int, dict] | None:
        """(file offset of the `]` closing traceEvents, the metadata after it), found in the file's
        end (the leftmost `]` followed by a valid end of document, `_split_tail`), in a window that
        grows from TAIL_BYTES[0] to TAIL_BYTES[-1]; None when it is not there or not certain (the
        stream is then read through).

        Certain means: the last events before it parse as complete events (objects with a `ph`).
        Were the window to start after the real close (trailing metadata larger than the window),
        the `]` found would close a list inside the metadata, and the text before it would be
        metadata: the window grows and tries again.
        """
        size = os.path.getsize(self.path)
        for tail_bytes in TAIL_BYTES:
            window_start = max(self._rest_offset, size - tail_bytes)
            split = _split_tail(_pread(self.path, window_start, size), self.header.bare_list)
            if split is None:
                return None  # no valid end (a truncated file): reading through salvages it
            if self._certain(*split, window_start):
                return window_start + len(split[0]), split[1]
            if window_start == self._rest_offset:
                return None
        return None

    def _certain(self, events_text: bytes, meta: dict, window_start: int) -> bool:
        check_from = 0
        if window_start > self._rest_offset or len(events_text) > CHECK_BYTES:
            m = _BOUNDARY.search(events_text, max(0, len(events_text) - CHECK_BYTES))
            if m is None:
                return False
            check_from = m.start(1) + m.group(1).index(b",") + 1
        return _are_events(events_text[check_from:])

    def _spans(self, end: int, meta: dict) -> Iterator[FileSpan]:
        """FileSpans of about chunk_bytes each up to `end`, cut at event boundaries found by reading
        a small window at each cut (`_cut_at`); then the metadata after the array."""
        pos = self._rest_offset
        while end - pos > self.chunk_bytes:
            cut = self._cut_at(pos + self.chunk_bytes - 64, end)
            if cut is None:
                break
            if cut < 0 or cut - pos > self.oversize:  # an oversized event: read on from here, squeezing it
                yield from self._read_pieces(False, start=pos)
                return
            yield FileSpan(self.path, pos, cut)
            pos = self.bytes_read = cut + 1
        if end - pos > self.oversize:
            yield from self._read_pieces(False, start=pos)
            return
        if _pread(self.path, pos, end).strip(_WS):
            yield FileSpan(self.path, pos, end)
        self.bytes_read = end
        self.metadata.update(meta)

    def _cut_at(self, start: int, end: int) -> int | None:
        """File offset of the comma of the first event boundary at or after `start` and before
        `end`, reading a window that doubles until one is found; None if there is none, -1 if
        there is none within the next `oversize` bytes (an event too large to read whole)."""
        size = CUT_WINDOW_BYTES
        while True:
            window = _pread(self.path, start, min(end, start + size))
            m = _BOUNDARY.search(window)
            if m:
                return start + m.start(1) + m.group(1).index(b",")
            if start + size >= end:
                return None
            if size > self.oversize:
                return -1
            size *= 2

    def _cut(self, buf: bytearray) -> int | None:
        """Where to cut the next chunk (the position of a separating comma), None to read more,
        -1 when traceEvents may close before any usable cut.

        The chunk keeps the whitespace before the comma and the next one the whitespace after it,
        so chunks merged again with "," are the exact text. A chunk in which traceEvents may close
        (an `]` after an event followed by more top-level keys) is cut only if it parses as
        complete events: a cut in the trailing metadata would lose it.
        """
        pos = self.chunk_bytes - 64 if len(buf) > self.chunk_bytes else 0
        for _ in range(MAX_CARRY_CHUNKS):
            m = _BOUNDARY.search(buf, pos)
            if not m:
                return None
            cut = m.start(1) + m.group(1).index(b",")
            if not _may_close(buf, cut):
                return cut
            try:
                parse_chunk_tamed(bytes(buf[:cut]))
                return cut
            except ChunkParseError:
                pos = m.end(1)
        return -1

    def _finish(self, buf: bytes, problem: str | None) -> Iterator[bytes | Salvaged]:
        split = None if problem else _split_tail(buf, self.header.bare_list)
        if split is not None:
            events_text, meta = split
            self.metadata.update(meta)
            if events_text.strip(_WS):
                yield events_text
            return
        self.tail = Tail(truncated=True, reason=problem or _where_it_ends(buf, self.header.bare_list))
        events = salvage_events(buf)
        yield Salvaged(events, buf)


_EVENTS_CLOSED = re.compile(rb'\}\s*\]\s*(?:,\s*"[^"]*"\s*:[\s\S]*|,\s*)?\Z')


def _where_it_ends(buf: bytes, bare_list: bool) -> str:
    """Why a document without a valid end is truncated, as far as its last bytes tell."""
    if not bare_list and _EVENTS_CLOSED.search(buf[-(1 << 20):]):
        return "the file ends after traceEvents but before the document closes (metadata after it lost)"
    return "the file ends before traceEvents closes"


# ------------------------------------------------------------------ ordered, fault-tolerant map
def ordered_results(
    pieces: Iterator[bytes | FileSpan | Salvaged],
    work_text: Callable[[bytes], object],
    work_events: Callable[[list], object],
    submit: Callable[[bytes], object] | None = None,
    max_inflight: int = 4,
    on_corrupt: Callable[[str], None] | None = None,
) -> Iterator[object]:
    """Run `work_text` over every chunk (in workers via `submit`, else here), results in order;
    up to `max_inflight` chunks are submitted ahead of the one whose result is yielded (here, none:
    holding results computed already would only hold their memory).

    A chunk whose parse fails is merged with the next one and run again here; if the merged
    text grows past MAX_CARRY_CHUNKS chunks the input is corrupt there: its complete events are
    salvaged, `on_corrupt` is told, and reading stops.
    """
    inflight: deque = deque()
    ahead = max_inflight if submit is not None else 0  # run here, a result has nothing to wait for
    carry: bytes | None = None
    carried = 0
    next_try = 0  # parse a failing carry again once it is this long: doubling keeps it linear

    def retry():
        nonlocal carry, carried, next_try
        ok2, value2 = _run_local(work_text, carry)
        if ok2:
            carry, carried, next_try = None, 0, 0
            return [value2]
        next_try = 2 * len(carry)
        return None

    def settle(raw: bytes, outcome):
        nonlocal carry, carried
        ok, value = outcome
        if carry is None and ok:
            return [value]
        carry = text_of(raw) if carry is None else carry + b"," + text_of(raw)
        carried += 1
        if carried > 1 and len(carry) >= next_try:
            done = retry()
            if done is not None:
                return done
        if carried > MAX_CARRY_CHUNKS and len(carry) > MAX_CARRY_BYTES:
            raise _Corrupt()
        return []

    try:
        for piece in pieces:
            if isinstance(piece, Salvaged):
                while inflight:
                    raw, fut = inflight.popleft()
                    yield from settle(raw, _outcome(fut))
                if carry is not None:
                    # the carry ends inside an event that goes on in the salvaged stretch
                    piece = Salvaged(salvage_events(carry + b"," + piece.text) if piece.text
                                     else salvage_events(carry) + piece.events)
                    carry = None
                if piece.events:
                    yield work_events(piece.events)
                continue
            if submit is None:
                inflight.append((piece, _run_local(work_text, text_of(piece))))
            else:
                inflight.append((piece, submit(piece)))
            while len(inflight) > ahead:
                raw, fut = inflight.popleft()
                yield from settle(raw, _outcome(fut))
        while inflight:
            raw, fut = inflight.popleft()
            yield from settle(raw, _outcome(fut))
        if carry is not None:
            done = retry() if carried > 1 else None
            if done is None:
                raise _Corrupt()
            yield from done
    except _Corrupt:
        events = salvage_events(carry or b"")
        if on_corrupt:
            on_corrupt("traceEvents holds text that is not JSON; complete events before it were kept")
        if events:
            yield work_events(events)


class _Corrupt(Exception):
    pass


def _run_local(work_text, text):
    try:
        return True, work_text(text)
    except ChunkParseError as e:
        return False, e


def _outcome(fut):
    if isinstance(fut, tuple):
        return fut
    return fut.get()
