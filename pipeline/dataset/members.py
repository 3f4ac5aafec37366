"""members: the inputs of a batch task, and reading a small trace's events text in one go."""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import orjson

from pipeline.errors import TracepipeError

SMALL_TEXT_BYTES = 64 << 20  # a trace whose events text is longer is flattened alone
_DECODE_DOCUMENT = msgspec.json.Decoder(dict[str, msgspec.Raw])


def utc_now():
    """Now, in UTC: the manifest's started_at and finished_at."""
    return _dt.datetime.now(_dt.timezone.utc)


@dataclass(eq=False)
class Member:
    """One input of a task."""

    path: str
    source: str
    trace_id: str
    started: _dt.datetime = field(default_factory=utc_now)
    facts: dict | None = None  # its manifest facts, once known
    alone: bool = False  # flattened alone (`flatten`) into `flat`
    flat: Path | None = None
    text: bytes | None = None  # its traceEvents text, while it is read
    metadata: dict = field(default_factory=dict)
    problems: Any = None  # its read.values.Problems
    devices: Any = None  # its devices table (pa.Table), then matched (pl.DataFrame)
    row: dict = field(default_factory=dict)  # its trace row
    warnings: list[str] = field(default_factory=list)
    raw_metadata: bytes | None = None  # its top-level metadata as the file writes it (`read_document`)
    raw_devices: bytes | None = None  # ... and its deviceProperties
    devices_key: Any = None  # what its devices table is made of, when known (shared by equal ones)
    captures: tuple[str, ...] = ()  # capture traces of the CUDA/HIP graphs it replays (`dataset.captures`)


def quarantine_message(e: Exception, path: str, source: str) -> str:
    """A BadTrace's message about `path` in the words of the input's name."""
    msg = str(e).replace(path, source)
    return msg[len(source) + 2 :] if msg.startswith(f"{source}: ") else msg


FAST_DOC_BYTES = 8 << 20  # a document this small is parsed whole (`read_document`): no value can be oversized
_EVENTS_KEY = b'"traceEvents"'


def read_document(m: Member) -> bool | None:
    """Read a small trace whole: its traceEvents text and top-level metadata from one typed
    decode (each top-level value kept as its raw text), as `TraceSource` gives them. None when it
    is not that simple (larger than FAST_DOC_BYTES, not strict JSON, a bare list, a compressed
    stream that breaks off...): `TraceSource` then reads it."""
    from pipeline.read.document import loads_metadata
    from pipeline.read.stream import open_stream, read_some

    try:
        stream = open_stream(m.path)
        try:
            data, problem = read_some(stream, FAST_DOC_BYTES + 1)
        finally:
            stream.close()
        if problem or len(data) > FAST_DOC_BYTES or data.count(_EVENTS_KEY) != 1:
            return None
        doc = _DECODE_DOCUMENT.decode(data)
        events = bytes(doc.pop("traceEvents")).strip()
        if events[:1] != b"[" or events[-1:] != b"]":
            return None
        meta = b",".join(orjson.dumps(k) + b":" + bytes(v) for k, v in doc.items())
        m.metadata, m.text = loads_metadata(b"{" + meta + b"}"), events[1:-1]
        m.raw_metadata, m.raw_devices = meta, bytes(doc.get("deviceProperties", b"-"))
        return True
    except (msgspec.MsgspecError, TracepipeError, OSError, ValueError, KeyError):
        return None


def read_text(m: Member, max_inflate: float | None) -> bool:
    """Read a small trace's events text and its metadata (`read_document`, else its chunks from
    `TraceSource` joined again); False when it must be flattened alone (not a regular file, not a
    trace, longer than SMALL_TEXT_BYTES, truncated, an event too long to read whole: `flatten`
    says why, or salvages it)."""
    from pipeline.read.limits import not_regular
    from pipeline.read.source import TraceSource

    try:
        if not_regular(m.path):
            return False
    except OSError:
        return False
    if read_document(m):
        return True
    try:
        src = TraceSource(m.path, max_inflate=max_inflate)
    except (TracepipeError, OSError, ValueError):
        return False
    texts, size = [], 0
    try:
        for piece in src.pieces(spans=False):
            if not isinstance(piece, bytes):
                return False
            texts.append(piece)
            size += len(piece)
            if size > SMALL_TEXT_BYTES:
                return False
        if src.tail.truncated or src.values_cut:
            return False
    except (TracepipeError, OSError, ValueError):
        return False
    finally:
        src.close()
    m.text, m.metadata = b",".join(texts), src.metadata  # chunks are cut at a comma between events
    return True
