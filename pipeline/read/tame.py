"""tame: values of an event that no parser should be asked to hold, kept as bounded text.

A valid event may hold a value nested thousands of levels deep (`[[[[...]]]]`): every JSON
library here recurses on nesting (msgspec and Python's json raise RecursionError near 1,000
levels, orjson refuses 1,024 and writes no more than 255). Such a value is kept, as the JSON
string of its own text, and counted; the event and its chunk are kept as they are otherwise.
"""

from __future__ import annotations

import re
from typing import TypeVar

import orjson

MAX_DEPTH = 64  # levels of nesting inside an event kept as values; Kineto's args nest 4 deep
TOO_DEEP = "value_nested_too_deep_kept_as_text"  # the reason such a value is counted under

_STRUCTURE = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{}]')  # strings skipped whole, brackets counted


class TooDeep(ValueError):
    """A chunk holds a value nested deeper than a parser can take: tame it (`tame_deep`)."""


def tame_deep(text: bytes, max_depth: int = MAX_DEPTH) -> tuple[bytes, int]:
    """Chunk text (events separated by commas) with every value nested more than `max_depth`
    levels inside its event replaced by a JSON string of that value's text; and how many were.

    An event is level 1, its args level 2, and so on. A value still open at the end of the text
    (a chunk cut inside an event) is left as it is.
    """
    out: list[bytes] = []
    last, depth, start, replaced = 0, 0, -1, 0
    for m in _STRUCTURE.finditer(text):
        c = text[m.start()]
        if c == 0x22:  # a string
            continue
        if c in b"[{":
            depth += 1
            if depth == max_depth + 1 and start < 0:
                start = m.start()
            continue
        if depth == max_depth + 1 and start >= 0:
            out += (text[last:start], orjson.dumps(text[start : m.end()].decode("utf-8", "replace")))
            last, start = m.end(), -1
            replaced += 1
        depth -= 1
    if not replaced:
        return text, 0
    out.append(text[last:])
    return b"".join(out), replaced


def is_too_deep(e: BaseException) -> bool:
    """Whether a parser's error says a value is nested too deep for it."""
    return isinstance(e, (RecursionError, TooDeep)) or "depth limit" in str(e) or "Recursion limit" in str(e)


# ------------------------------------------------------------------ values too large
VALUE_LIMIT = 8 << 20  # a string, key, object or array longer than this (as text) is cut
KEEP_BYTES = 64 << 10  # ... to about this much of its text
TOO_LARGE = "value_too_large_kept_truncated"

_OUTSIDE = re.compile(rb'["\[\]{}]')  # what changes the state outside a string
_LONG_SPACE = re.compile(rb"\s{64,}")


def _string_end(data: bytes | bytearray, pos: int) -> int:
    """Where the string that `pos` is inside of ends in data (just past its closing quote), -1
    if not in data. `data[pos]` is not the byte after an unpaired backslash."""
    while True:
        q = data.find(b'"', pos)
        if q < 0:
            return -1
        if not _ends_escaping(data, pos, q):
            return q + 1
        pos = q + 1


def _ends_escaping(data: bytes | bytearray, start: int, end: int) -> bool:
    """Whether data[start:end] ends with an unpaired backslash (escaping the next byte)."""
    n = end
    while n > start and data[n - 1] == 0x5C:
        n -= 1
    return (end - n) % 2 == 1


def _safe_cut(content: bytes | bytearray, n: int) -> int:
    """A cut at most n bytes into string content that splits no escape and no UTF-8 character."""
    n = min(n, len(content))
    head = content[:n]
    if (len(head) - len(head.rstrip(b"\\"))) % 2:  # an escape's backslash would be left alone
        n -= 1
    esc = content.rfind(b"\\u", max(0, n - 5), n)
    if esc >= 0 and n - esc < 6 and (len(content[:esc]) - len(content[:esc].rstrip(b"\\"))) % 2 == 0:
        n = esc  # inside a \uXXXX escape
    while 0 < n < len(content) and 0x80 <= content[n] < 0xC0:  # inside a UTF-8 character
        n -= 1
    return n


class EventSqueezer:
    """One oversized event, streamed into a bounded copy: fed the event's bytes block by block
    (from its first byte), it keeps every value shorter than `value_limit` and cuts longer ones
    (a string to its first `keep` bytes, an object or array to a JSON string of its first `keep`
    bytes of text), counting them. Memory holds the copy, never the value. Past 4 x `value_limit`
    bytes of event, every further value is cut at `keep`.

    `feed` returns how many bytes of the block belong to the event (all of them until it ends);
    then `done` is set, `text` is the event's bounded text and `cut` how many values were cut.
    Whitespace before the event is dropped; a `]` there means traceEvents ended (`text` empty).
    """

    def __init__(self, value_limit: int | None = None, keep: int | None = None):
        self.value_limit = VALUE_LIMIT if value_limit is None else value_limit
        self.keep = KEEP_BYTES if keep is None else keep
        self.event_limit = 4 * self.value_limit
        self.out = bytearray()
        self.open: list[int] = []  # where each open container starts in `out`
        self.string_at = -1  # where the string being copied starts in `out` (its quote); -1: none
        self.skipping = 0  # brackets of a cut container still open: its rest is skipped
        self.skip_string = False  # inside a string whose rest is skipped
        self.escaped = False  # the block ended inside a string right after an unpaired backslash
        self.scalar_run = 0  # bytes copied outside strings since the last bracket or quote
        self.cut = 0
        self.done = False

    @property
    def text(self) -> bytes:
        return bytes(self.out)

    def _limit(self) -> int:
        return self.keep if len(self.out) > self.event_limit else self.value_limit

    def feed(self, data: bytes | bytearray) -> int:
        pos, n = 0, len(data)
        while pos < n and not self.done:
            in_string = self.skip_string or self.string_at >= 0
            pos = self._in_string(data, pos) if in_string else self._outside(data, pos)
        return pos

    # ---- inside a string: copied, or skipped when cut (or within a cut container)
    def _in_string(self, data: bytes | bytearray, pos: int) -> int:
        start = pos
        if self.escaped:  # the escaped byte after a backslash that ended the last block
            self.escaped, pos = False, pos + 1
        closing = _string_end(data, pos)
        end = len(data) if closing < 0 else closing
        if closing < 0:
            self.escaped = _ends_escaping(data, pos, end)
        if self.skip_string:
            if closing >= 0:
                self.skip_string = False
                if not self.skipping:  # a cut string ended: close what was kept of it
                    self.out += b'"'
            return end
        self.out += data[start:end]
        if len(self.out) - self.string_at > self._limit() + (closing >= 0):
            content = self.out[self.string_at + 1 : -1] if closing >= 0 else self.out[self.string_at + 1 :]
            del self.out[self.string_at + 1 + _safe_cut(content, self.keep) :]
            self.cut += 1
            if closing >= 0:
                self.out += b'"'
            else:
                self.skip_string, self.escaped = True, False
        if closing >= 0 or self.skip_string:
            self.string_at = -1
        return end

    # ---- outside strings: brackets and quotes
    def _outside(self, data: bytes | bytearray, pos: int) -> int:
        m = _OUTSIDE.search(data, pos)
        end = m.start() if m else len(data)
        if not self.skipping:
            self._copy_between(data[pos:end])
        if not m:
            return end
        self.scalar_run = 0
        c = data[end]
        if c == 0x22:  # a quote
            if self.skipping:
                self.skip_string = True
            else:
                self.string_at = len(self.out)
                self.out += b'"'
        elif self.skipping:
            self.skipping += 1 if c in b"[{" else -1
        elif c in b"[{":
            self.open.append(len(self.out))
            self.out.append(c)
        elif not self.open:  # `]` where an event would start: traceEvents ends here
            self.done = True
            return end
        else:
            self.out.append(c)
            start = self.open.pop()
            if not self.open:
                self.done = True
            elif len(self.out) - start > self._limit():
                self._cut_container(start, still_open=False)
        self._check_open()
        return end + 1

    def _copy_between(self, between: bytes | bytearray):
        """Copy what stands between brackets and strings: separators, numbers, literals."""
        if not self.open:  # before the event: only whitespace (or a separator) may stand there
            if between.strip(b" \t\r\n,"):
                raise ValueError("no event where one should start")
            return
        between = _LONG_SPACE.sub(b" ", between)
        last_sep = max(between.rfind(b","), between.rfind(b":"))
        self.scalar_run = len(between) - last_sep - 1 if last_sep >= 0 else self.scalar_run + len(between)
        if self.scalar_run > self.value_limit:
            raise ValueError("a number or literal too long to be one")
        self.out += between
        self._check_open()

    def _check_open(self):
        """Cut the innermost open container inside the event once it has grown past the limit."""
        if len(self.open) > 1 and len(self.out) - self.open[-1] > self._limit():
            self._cut_container(self.open.pop(), still_open=True)

    def _cut_container(self, start: int, still_open: bool):
        """Replace the container that starts at `start` in `out` by a JSON string of its first
        `keep` bytes of text; if it is still open, skip the rest of it."""
        text = bytes(self.out[start : start + self.keep])
        del self.out[start:]
        self.out += orjson.dumps(text.decode("utf-8", "replace"))
        self.cut += 1
        if still_open:
            self.skipping = 1


# ------------------------------------------------------------------ strings that are not Unicode
BAD_UNICODE = "string_lone_surrogate_replaced"


V = TypeVar("V")  # a parsed JSON value, of the same type once scrubbed


def scrub(value: V) -> tuple[V, int]:
    """A parsed value with each lone UTF-16 surrogate in its strings (JSON allows `"\\ud800"`,
    UTF-8 has no such character) replaced by U+FFFD; and how many strings were changed."""
    changed = 0

    def fix(v):
        nonlocal changed
        t = type(v)
        if t is str:
            try:
                v.encode("utf-8")
                return v
            except UnicodeEncodeError:
                changed += 1
                return v.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
        if t is dict:
            return {fix(k): fix(x) for k, x in v.items()}
        if t is list:
            return [fix(x) for x in v]
        return v

    return fix(value), changed
