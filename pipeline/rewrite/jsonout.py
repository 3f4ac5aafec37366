"""jsonout: stream traces back out as Chrome-trace JSON (the output side of `augment` and `combine`).

`read_events` walks a trace's events chunk by chunk in file order (via the reader, never the
whole file); `TraceWriter` writes `{` + metadata + `"traceEvents": [` + one event per line +
`]` + trailing metadata + `}`, gzip-compressed when the path ends in `.gz`, into a temporary
file that replaces the target only when everything was written.

Numbers keep their value: a chunk whose float timestamps cannot hold their decimal digits in a
float64 is parsed exactly (Decimal), and `flatten.dumps` writes Decimals back as their text.
A bare-list input (`[...]`) is written as `{"traceEvents": [...]}`.
"""

from __future__ import annotations

import gzip
import io
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from decimal import Decimal
from pathlib import Path

from pipeline import store
from pipeline.errors import BadTrace, UsageError
from pipeline.read.chunks import ordered_results, parse_chunk_exact, parse_chunk_tamed
from pipeline.read.source import TraceSource
from pipeline.read.tame import tame_deep
from pipeline.read.values import FLOAT_EXACT_US, dumps
from pipeline.redact import redact

GZIP_LEVEL = 6
# events are parsed to Python objects here (~25x their text): smaller chunks than flatten's bound memory
CHUNK_BYTES = 2 << 20


def _lossy(v) -> bool:
    """A float time too large for a float64 to keep its (µs, 3-decimal) digits."""
    return type(v) is float and not -FLOAT_EXACT_US < v < FLOAT_EXACT_US


def parse_events(text: bytes) -> list:
    """The events of one chunk; parsed exactly when a float `ts`/`dur` would lose digits."""
    events, tamed = parse_chunk_tamed(text)
    if tamed:  # values nested too deep were kept as their text: parse that text exactly too
        text = tame_deep(text)[0]
    for e in events:
        if type(e) is dict and (_lossy(e.get("ts")) or _lossy(e.get("dur"))):
            return parse_chunk_exact(text)
    return events


def open_trace(path: str) -> TraceSource:
    """A TraceSource whose errors name the file."""
    try:
        return TraceSource(path, CHUNK_BYTES)
    except BadTrace as e:
        if path in str(e):
            raise
        raise BadTrace(f"{path}: {e}") from None


def read_events(src: TraceSource) -> Iterator[list]:
    """Every event of the trace in file order, one parsed chunk at a time.

    A truncated or corrupt trace yields its complete events and is marked in `src.tail`.
    """
    corrupt: list = []
    yield from ordered_results(
        src.pieces(), parse_events, lambda events: events, max_inflight=0, on_corrupt=corrupt.append
    )  # parsed here: hold one chunk at a time
    if corrupt and not src.tail.truncated:
        src.tail.truncated, src.tail.reason = True, corrupt[0]


def metadata_after(src: TraceSource) -> dict:
    """The top-level keys that stand after traceEvents (complete once the events were read)."""
    return {k: v for k, v in src.metadata.items() if k not in src.header.metadata}


def us_number(ns: int):
    """ns as a µs JSON number: an int when whole, else a float that keeps its 3 decimals (a
    Decimal, written as its text, past FLOAT_EXACT_US)."""
    if ns % 1000 == 0:
        return ns // 1000
    if abs(ns) < FLOAT_EXACT_US * 1000:
        return ns / 1000
    return Decimal(ns).scaleb(-3)


def _members(metadata: dict) -> bytes:
    return b"".join(dumps(k) + b": " + dumps(v) + b",\n" for k, v in metadata.items())


class TraceWriter:
    """Write one trace, streamed: `with TraceWriter(path, head) as w: w.write(events); w.tail = {...}`.

    `head` holds the top-level keys written before traceEvents, `tail` (set any time before the
    block ends) the ones written after it. The file appears at `path` only if the block
    completes; on an exception nothing is left behind.
    """

    def __init__(self, path, head: dict | None = None, keep_secrets: bool = False):
        self.path = Path(path)
        self.keep_secrets = keep_secrets  # else metadata is written redacted (`pipeline.redact`)
        if self.path.is_dir():
            raise UsageError(f"{self.path}: is a directory; give an output file name")
        self.head = dict(head or {})
        self.tail: dict = {}
        self.n_events = 0
        self._stack = ExitStack()
        self._out: io.BufferedIOBase | None = None  # the open file (gzip or not), inside the block

    def __enter__(self) -> TraceWriter:
        with ExitStack() as guard:
            guard.push(self._stack)  # undone (temp file removed) if opening fails
            tmp = self._stack.enter_context(store.atomic_file(self.path))
            out: io.BufferedIOBase = self._stack.enter_context(open(tmp, "wb"))
            if self.path.name.endswith(".gz"):
                out = self._stack.enter_context(gzip.GzipFile(fileobj=out, mode="wb", compresslevel=GZIP_LEVEL))
            out.write(b"{" + _members(self._shared(self.head)) + b'"traceEvents": [\n')
            self._out = out
            guard.pop_all()
        return self

    def _shared(self, metadata: dict) -> dict:
        return metadata if self.keep_secrets else redact(metadata)

    def write(self, events: list):
        if not events:
            return
        sep = b",\n" if self.n_events else b""
        assert self._out is not None  # written inside the `with` block
        self._out.write(sep + b",\n".join(map(dumps, events)))
        self.n_events += len(events)

    def _close_document(self):
        members = _members(self._shared(self.tail))[:-2]  # no comma after the last key
        self._out.write(b"\n]" + (b",\n" + members if members else b"") + b"}\n")

    def __exit__(self, *exc):
        if exc[0] is None:
            try:
                self._close_document()
            except BaseException:
                self._stack.__exit__(*sys.exc_info())  # removes the temporary file
                raise
        return self._stack.__exit__(*exc)
