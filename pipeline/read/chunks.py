"""chunks: parsing a chunk of traceEvents text, and mapping work over chunks in order.

A chunk is cut speculatively at an event boundary (`}` `,` `{"`); a cut inside a string or a
nested object cannot give a chunk that parses as complete values, so a chunk that fails to parse
is merged with the next one and parsed again (`ordered_results`): the split is speculative, the
result exact. orjson is the fast path; ijson (C backend) keeps decimals exact where a float64
cannot, and salvages the complete events of a truncated tail.
"""

from __future__ import annotations

import io
import json
import os
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import TypeVar

import ijson
import orjson

from pipeline.read.tame import TooDeep, is_too_deep, tame_deep

if ijson.backend != "yajl2_c":  # pragma: no cover - depends on the installed wheel
    raise ImportError(
        f"tracepipe needs ijson's C backend (yajl2_c); this ijson uses {ijson.backend!r}. "
        "Reinstall ijson from a wheel for your platform: pip install --force-reinstall ijson"
    )

T = TypeVar("T")  # a chunk's result (what `submit`'s workers return too)

# a carry (chunks merged after a failed parse) larger than this (in chunks and in bytes) means
# corrupt input, not a bad cut
MAX_CARRY_CHUNKS = 8
MAX_CARRY_BYTES = 64 << 20


class ChunkParseError(ValueError):
    """A chunk is not a list of complete JSON values (a bad cut, or corrupt input)."""


class NeedsExactParse(ValueError):
    """A float in the chunk cannot hold its decimal digits; parse it again with ijson."""


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
        size = self.end - self.start
        with open(self.path, "rb") as f:
            block = os.pread(f.fileno(), size, self.start)
        if len(block) == size:  # a regular file gives it all at once: no copy of it
            return block
        out = bytearray(size)
        out[: len(block)] = block
        FileSpan(self.path, self.start + len(block), self.end).read_into(memoryview(out)[len(block) :])
        return bytes(out)

    def read_into(self, buffer) -> None:
        """The bytes into `buffer` (writable, end - start long)."""
        with open(self.path, "rb") as f, memoryview(buffer) as view:
            done = 0
            while done < len(view):
                n = os.preadv(f.fileno(), [view[done:]], self.start + done)
                if not n:
                    raise ChunkParseError("the file shrank while it was being read")
                done += n


def text_of(piece: bytes | FileSpan) -> bytes:
    return piece.read() if isinstance(piece, FileSpan) else piece


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


def ordered_results(
    pieces: Iterator[bytes | FileSpan | Salvaged],
    work_text: Callable[[bytes], T],
    work_events: Callable[[list], T],
    submit: Callable[[bytes | FileSpan], object] | None = None,
    max_inflight: int = 4,
    on_corrupt: Callable[[str], None] | None = None,
) -> Iterator[T]:
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
        ok2, value2 = run_local(work_text, carry)
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
                    piece = Salvaged(
                        salvage_events(carry + b"," + piece.text)
                        if piece.text
                        else salvage_events(carry) + piece.events
                    )
                    carry = None
                if piece.events:
                    yield work_events(piece.events)
                continue
            if submit is None:
                inflight.append((piece, run_local(work_text, text_of(piece))))
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


def run_local(work_text, text):
    try:
        return True, work_text(text)
    except ChunkParseError as e:
        return False, e


def _outcome(fut):
    if isinstance(fut, tuple):
        return fut
    return fut.get()
