"""document: the top level of a trace document: where `traceEvents` opens and closes, the
metadata before and after it, where events separate, and how a document that never closes ends.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import orjson

from pipeline.errors import BadTrace
from pipeline.read.stream import READ_BYTES, read_some

MAX_HEADER_BYTES = 256 << 20
WS = b" \t\r\n"
BOUNDARY = re.compile(rb'\}(\s*,\s*)\{\s*"')  # between two events (or inside a string: cuts are checked)
_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"|[{}\[\]:,]')
# where traceEvents may close: after an event (or at once), followed by more keys or the document's end
_CLOSE_CANDIDATE = re.compile(rb"\}\s*\]")  # starts with a literal: re scans for it fast
_AFTER_CLOSE = re.compile(rb'\s*(?:,\s*"|\}|\Z)')
_CLOSE_DOC = re.compile(rb"\s*\}\s*\Z")  # an object document closes with its `}`: without it, it was cut
_MORE_KEYS = re.compile(rb'\s*,\s*"')
_ONLYWS = re.compile(rb"\s*\Z")


def may_close(buf, end: int) -> bool:
    """Whether traceEvents may close before `end`: an event's `}` then `]` then more keys or `}`."""
    if buf[:end].lstrip(WS)[:1] == b"]":
        return True
    return any(_AFTER_CLOSE.match(buf, m.end()) for m in _CLOSE_CANDIDATE.finditer(buf, 0, end))


@dataclass
class Header:
    metadata: dict
    bare_list: bool
    rest: bytearray  # bytes after the `[` that opens traceEvents


def _find_events_array(buf: bytes | bytearray) -> tuple[str, int, int] | None:
    """Scan the top level of a JSON document for `"traceEvents": [`.

    Returns (kind, pos, key_pos): kind "list" for a bare list (pos after `[`), "object" with pos
    after the array's `[` and key_pos at the key's quote; None when more bytes are needed.
    Raises BadTrace when the document cannot be a trace.
    """
    i = 3 if buf[:3] == b"\xef\xbb\xbf" else 0  # a UTF-8 byte-order mark is not content
    while i < len(buf) and buf[i] in WS:
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
                raise not_a_trace(bytes(buf[: m.end()]))
        elif c == b",":
            pass
    # a scalar value right after "traceEvents": is reported when the next token arrives
    return None


_NON_FINITE = re.compile(rb"-?(?:NaN|Infinity)")


def _byte_pos(text: bytes | memoryview, pos: int) -> int:
    """The byte offset in UTF-8 `text` of orjson's error position `pos`, which counts characters."""
    head = bytes(text[: 4 * pos + 4])  # pos characters take at most 4 * pos bytes
    return pos if head.isascii() else len(head.decode("utf-8", "ignore")[:pos].encode())


def loads_metadata(text: bytes | memoryview):
    """Top-level metadata text parsed: strict JSON, or as Python's json reads it (NaN, Infinity),
    which is how torch writes a trace whose metadata holds such floats. Python's json is tried only
    when strict parsing stopped at such a float (orjson's error position: at the token, or after
    its sign): looking for one anywhere in the text made each failed candidate of `split_tail` cost
    the whole rest of the buffer."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as e:
        at = _byte_pos(text, e.pos)
        if not (_NON_FINITE.match(text, at) or (at and _NON_FINITE.match(text, at - 1))):
            raise
    text = bytes(text)
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        raise orjson.JSONDecodeError("not JSON", text.decode("utf-8", "replace"), 0) from None


def _metadata_before(buf: bytes | bytearray, key_pos: int) -> dict:
    body = bytes(buf[buf.index(b"{") + 1 : key_pos]).rstrip(WS)
    if body.endswith(b","):
        body = body[:-1]
    try:
        meta = loads_metadata(b"{" + body + b"}")
    except orjson.JSONDecodeError as e:
        raise BadTrace(f"not JSON: top-level metadata does not parse ({e})") from None
    return meta


_VALUE_START = frozenset(b'{["-0123456789tfn]')  # what may follow traceEvents' `[`: a value or its end


def _check_first_value(buf: bytes | bytearray, pos: int):
    """Raise BadTrace when what follows the `[` that opens traceEvents (at pos) cannot start a JSON
    value: a file of other bytes that happens to begin with `[` is no trace (salvaging it would
    keep nothing and call it truncated)."""
    rest = bytes(buf[pos : pos + 64]).lstrip(WS)
    if rest and rest[0] not in _VALUE_START:
        raise BadTrace("not JSON: traceEvents does not hold JSON values")


def read_header(stream) -> tuple[Header, str | None]:
    buf = bytearray()
    problem = None
    while True:
        block, problem = read_some(stream, READ_BYTES)
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
    raise not_a_trace(bytes(buf), problem)


def not_a_trace(text: bytes, problem: str | None = None) -> BadTrace:
    """The error for a whole document (`text`, the file's bytes) without a traceEvents list: cut
    short before it, not JSON (what and where), or JSON of something else."""
    said = f" ({problem})" if problem else ""
    try:
        loads_metadata(text)  # NaN and Infinity as torch writes them are JSON here
    except orjson.JSONDecodeError as e:
        what, _, where = str(e).partition(": line ")
        if what == "unexpected end of data":  # cut before its events: nothing to keep
            return BadTrace(f"truncated: the file ends before traceEvents, after {len(text):,} bytes of JSON{said}")
        at = f" at line {where.split(' (')[0]}" if where and what != "not JSON" else ""
        return BadTrace("not JSON" + (f": {what}{at}" if at else "") + said)
    return BadTrace(f"valid JSON but not a trace: no traceEvents list{said}")


_PROBE_BYTES = 1 << 16


def _closes_early(text: memoryview) -> bool:
    """Whether the JSON value `text` begins with is complete before the text ends, as its first
    _PROBE_BYTES show: parsed, they stop at some position, and the bytes before it parse whole. Then
    the whole text is that value and more, not a document's last value. Parsing the whole rest for
    every `]` of a truncated trace's last chunk (orjson reads all of it first) took minutes."""
    if len(text) <= _PROBE_BYTES:
        return False
    probe = text[:_PROBE_BYTES]
    try:
        orjson.loads(probe)
    except orjson.JSONDecodeError as e:
        try:
            orjson.loads(probe[: _byte_pos(probe, e.pos)])
        except orjson.JSONDecodeError:
            return False
        return True
    return False


def split_tail(buf: bytes, bare_list: bool) -> tuple[bytes, dict] | None:
    """Find where traceEvents closes in the last bytes of a document.

    Returns (events_text, metadata_after) or None if the array never closes (truncated).
    The leftmost `]` that is followed by a valid end of document is the array's end: any `]`
    before it is followed by more events, which is not a valid document tail.
    """
    mv = memoryview(buf)
    work: bytearray | None = None  # buf, where a candidate's metadata object gets its `{` in place
    for strict in (True, False):
        for m in re.finditer(rb"\]", buf):
            p = m.start()
            if strict:
                j = p - 1
                while j >= 0 and buf[j] in WS:
                    j -= 1
                if j >= 0 and buf[j] not in b"}":
                    continue
            if bare_list:
                if _ONLYWS.match(buf, p + 1):
                    return bytes(mv[:p]), {}
                continue
            if _CLOSE_DOC.match(buf, p + 1):
                return bytes(mv[:p]), {}
            mk = _MORE_KEYS.match(buf, p + 1)
            if mk:  # `{` over the byte before the key's quote: no copy of the rest per candidate
                work = bytearray(buf) if work is None else work
                at = mk.end() - 2
                was, work[at] = work[at], ord("{")
                try:
                    if _closes_early(memoryview(work)[at:]):
                        continue  # an object of the events (args around a `]`), not the metadata
                    meta = loads_metadata(memoryview(work)[at:])
                except orjson.JSONDecodeError:
                    continue
                finally:
                    work[at] = was
                if isinstance(meta, dict):
                    return bytes(mv[:p]), meta
    return None


_EVENTS_CLOSED = re.compile(rb'\}\s*\]\s*(?:,\s*"[^"]*"\s*:[\s\S]*|,\s*)?\Z')


def where_it_ends(buf: bytes, bare_list: bool) -> str:
    """Why a document without a valid end is truncated, as far as its last bytes tell."""
    if not bare_list and _EVENTS_CLOSED.search(buf[-(1 << 20) :]):
        return "the file ends after traceEvents but before the document closes (metadata after it lost)"
    return "the file ends before traceEvents closes"
