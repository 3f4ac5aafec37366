"""source: a trace as a stream of traceEvents chunks plus its top-level metadata.

The array's text is cut into bounded chunks at event boundaries: read through (compressed input),
or, for an uncompressed file whose end is found first, by position (workers then read their
chunk's bytes themselves). An event longer than a value may be is read through `EventSqueezer`;
a stream that ends early yields every complete event and says it was truncated.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from dataclasses import dataclass, field

from pipeline.errors import BadTrace
from pipeline.read import tame
from pipeline.read.chunks import (
    MAX_CARRY_CHUNKS,
    ChunkParseError,
    FileSpan,
    Salvaged,
    parse_chunk_tamed,
    salvage_events,
)
from pipeline.read.document import BOUNDARY, WS, may_close, read_header, split_tail, where_it_ends
from pipeline.read.limits import inflate_limit, too_inflated
from pipeline.read.stream import READ_BYTES, open_stream_and_file, read_some
from pipeline.read.tame import EventSqueezer

DEFAULT_CHUNK_BYTES = 2 << 20  # parsed, a chunk takes ~25x its size in Python objects
# with the native builder (`read.by_native`) in worker processes: per-chunk costs (tables made,
# handed over, written) were ~1.2 CPU-s per GB more at 2 MB, at 35 MB less peak memory; in one
# process, chunks of 4 MB made the peak grow with the trace (50 MB more at 150 MB than at 30 MB)
NATIVE_CHUNK_BYTES = 4 << 20
TAIL_BYTES = (1 << 20, 16 << 20)  # windows of an uncompressed file's end to find traceEvents' end in
CHECK_BYTES = 256 << 10  # the events before that end parsed to make sure of it
CUT_WINDOW_BYTES = 64 << 10  # read at each cut of an uncompressed file, to find an event boundary
ARRAY_NOT_CLOSED = "json_array_not_closed"  # counted (coerced) when a JSON array trace lacks its `]`


@dataclass
class Tail:
    metadata: dict = field(default_factory=dict)
    truncated: bool = False
    reason: str | None = None
    unclosed: bool = False  # a JSON Array Format trace without its closing `]`, as the format allows


def _pread(path: str, start: int, end: int) -> bytes:
    return FileSpan(path, start, end).read()


def _are_events(text: bytes) -> bool:
    """Whether the text is a comma-separated run of complete trace events (objects with `ph`)."""
    try:
        events, _ = parse_chunk_tamed(text)
    except ChunkParseError:
        return False
    return bool(events) and all(type(e) is dict and "ph" in e for e in events)


def _unclosed_array(buf: bytes) -> tuple[bytes, dict] | None:
    """(events text, no metadata) when the end of a JSON Array Format trace that never closes is
    complete events, a trailing comma allowed: the Trace Event Format lets a writer omit the closing
    `]` (a trace written as it runs; Chrome's importer adds it). None when the text ends inside an
    event (a truncated trace)."""
    text = buf.rstrip(WS)
    if text.endswith(b","):
        text = text[:-1]
    return (text, {}) if text.strip(WS) and _are_events(text) else None


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
        self._stream, self._file = open_stream_and_file(path)  # _file: the file the stream reads
        try:
            self.header, problem = read_header(self._stream)
        except BaseException:
            self._stream.close()
            raise
        self._problem = problem
        self.metadata.update(self.header.metadata)
        # file offset of header.rest[0], when the stream is the file itself (not decompressed)
        self._rest_offset = (
            self._stream.tell() - len(self.header.rest) if isinstance(self._stream, io.BufferedReader) else None
        )
        # a compressed file may inflate to this many bytes (`pipeline.limits`)
        self._inflate_limit = (
            None if self._rest_offset is not None else inflate_limit(os.path.getsize(path), max_inflate)
        )

    @property
    def file_bytes_read(self) -> int:
        """How far into the file reading has come, in the file's own bytes (compressed ones for
        .gz and .zst): progress against its size. `bytes_read` counts the JSON text instead."""
        if self._rest_offset is None:  # compressed: the decompressor's position in the file
            return self._file.tell()
        return max(self._file.tell(), self.bytes_read)  # chunks cut by position (`_spans`) are not read here

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
                chunk: bytes | FileSpan
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
                    self.tail = Tail(
                        truncated=True,
                        reason="traceEvents holds text that is not JSON; complete events before it were kept",
                    )
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
        block, problem = read_some(self._stream, READ_BYTES)
        self.bytes_read += len(block)
        if self._inflate_limit is not None and self.bytes_read > self._inflate_limit:
            raise BadTrace(too_inflated(self._inflate_limit, os.path.getsize(self.path)))
        return block, problem

    def _head_before_oversize(self, buf: bytearray) -> int:
        """Where the events before an oversized one end in buf (a separating comma), 0 if none:
        the last event boundary, if the text before it parses as events."""
        # every boundary past chunk_bytes lies after the oversized event (see `_cut`)
        last = None
        for found in BOUNDARY.finditer(buf, 0, min(len(buf), self.chunk_bytes)):
            last = found
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
        rest = bytes(buf[squeezer.feed(buf) :])
        while not squeezer.done and not eof:
            block, problem = self._next_block()
            eof = not block or problem is not None
            rest = block[squeezer.feed(block) :]
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
        rest_offset = self._rest_offset
        assert rest_offset is not None  # an uncompressed file (see `pieces`)
        size = os.path.getsize(self.path)
        for tail_bytes in TAIL_BYTES:
            window_start = max(rest_offset, size - tail_bytes)
            split = split_tail(_pread(self.path, window_start, size), self.header.bare_list)
            if split is None:
                return None  # no valid end (a truncated file): reading through salvages it
            if self._certain(*split, window_start):
                return window_start + len(split[0]), split[1]
            if window_start == rest_offset:
                return None
        return None

    def _certain(self, events_text: bytes, meta: dict, window_start: int) -> bool:
        assert self._rest_offset is not None  # an uncompressed file (see `pieces`)
        check_from = 0
        if window_start > self._rest_offset or len(events_text) > CHECK_BYTES:
            m = BOUNDARY.search(events_text, max(0, len(events_text) - CHECK_BYTES))
            if m is None:
                return False
            check_from = m.start(1) + m.group(1).index(b",") + 1
        return _are_events(events_text[check_from:])

    def _spans(self, end: int, meta: dict) -> Iterator[bytes | FileSpan | Salvaged]:
        """FileSpans of about chunk_bytes each up to `end`, cut at event boundaries found by reading
        a small window at each cut (`_cut_at`); then the metadata after the array."""
        pos = self._rest_offset
        assert pos is not None  # an uncompressed file (see `pieces`)
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
        if _pread(self.path, pos, end).strip(WS):
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
            m = BOUNDARY.search(window)
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
            m = BOUNDARY.search(buf, pos)
            if not m:
                return None
            cut = m.start(1) + m.group(1).index(b",")
            if not may_close(buf, cut):
                return cut
            try:
                parse_chunk_tamed(bytes(buf[:cut]))
                return cut
            except ChunkParseError:
                pos = m.end(1)
        return -1

    def _finish(self, buf: bytes, problem: str | None) -> Iterator[bytes | Salvaged]:
        split = None if problem else split_tail(buf, self.header.bare_list)
        if split is None and not problem and self.header.bare_list:
            split = _unclosed_array(buf)
            self.tail.unclosed = split is not None
        if split is not None:
            events_text, meta = split
            self.metadata.update(meta)
            if events_text.strip(WS):
                yield events_text
            return
        self.tail = Tail(truncated=True, reason=problem or where_it_ends(buf, self.header.bare_list))
        events = salvage_events(buf)
        yield Salvaged(events, buf)
