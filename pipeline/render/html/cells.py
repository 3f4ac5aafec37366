"""cells: one value of a table as the page shows it, and as it carries it in full.

Every cell has two faces: its text (units chosen per value, long names shortened in the middle
as the text tables shorten them, the whole name on hover) and `data-value`, the value itself
(numbers as Python writes them, names whole, lists and records as JSON): the page's contract for
sorting, filtering and scripts. The style of a column comes from its name, as in the text tables
(`pipeline.render.tables`): `*_us` / `*_ns` / `*_ms` / `*_s` times, `*_pct` shares (with a bar),
`bytes` / `*_bytes` sizes, `flops` counts of FLOPs, `*_gbps` and `*_tflops` rates.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from decimal import Decimal

import orjson

from pipeline.render.tables import SEQUENCE, THEN, engineering, is_id, shorten

NAME_CHARS = 64  # a longer name is shortened in the cell (whole in data-value and on hover)
PROSE_CHARS = 400  # a longer sentence (a text of PROSE_WORDS words or more) is shortened
PROSE_WORDS = 5
CODE = re.compile(r"::|<|\w\(")  # a C++ name has these; a sentence does not
TIME_UNITS = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}  # a column suffix -> µs per unit
TIME_STEPS = ((1e6, "s"), (1e3, "ms"), (1.0, "µs"))


@dataclass(frozen=True)
class Cell:
    text: str  # what the cell shows
    value: str  # data-value: the whole value
    cut: bool = False  # the text is shortened (the page shows the value on hover)
    share: float | None = None  # a percentage drawn as a bar behind the text
    prose: bool = False  # a sentence, not a name: wrapped in the cell
    lines: tuple[str, ...] = ()  # a sequence: one line each (text is then unused)


def kind(column: str) -> str:
    """The style of a column, from its name: id, time, pct, bytes, flops, gbps, tflops or plain."""
    c = column.lower()
    suffix = c.rsplit("_", 1)[-1] if "_" in c else c
    if is_id(c):
        return "id"
    per = "_per_" + suffix
    if (suffix in TIME_UNITS and not c.endswith(per)) or _time_token(c):
        return "time"  # `dur_us`, `gpu_us_per_replay`; not `tokens_per_s` (a rate)
    if c == "pct" or c.endswith("_pct"):
        return "pct"
    if c == "bytes" or c.endswith("_bytes"):
        return "bytes"
    if c == "flops" or c.endswith("_flops") or c.startswith("flops_"):
        return "flops"
    if c.endswith("_gbps"):
        return "gbps"
    if c.endswith("_tflops"):
        return "tflops"
    return "plain"


def _time_token(column: str) -> str | None:
    """The unit of a time per something (`gpu_us_per_replay`: us), else None."""
    parts = column.split("_")
    return next((p for p in parts[:-1] if p in ("ns", "us", "ms")), None)


def time_unit(column: str) -> str:
    """The unit a time column's values are in: its suffix, else its `_us_`-like token."""
    c = column.lower()
    suffix = c.rsplit("_", 1)[-1]
    return suffix if suffix in TIME_UNITS else _time_token(c) or "us"


def duration(us: float) -> str:
    """A time in µs in the unit that suits it, 4 significant digits: 12.79 ms, 53.07 µs, 1.234 s."""
    a = abs(us)
    for scale, unit in TIME_STEPS:
        if a >= scale:
            return f"{_digits(us / scale)} {unit}"
    return f"{_digits(us)} µs" if a else "0"


def _digits(v: float) -> str:
    """4 significant digits at most, thousands separated, no trailing exponent."""
    a = abs(v)
    if a >= 1000:
        return f"{v:,.0f}"
    if a >= 100:
        return f"{v:.1f}"
    if a >= 10:
        return f"{v:.2f}"
    return f"{v:.3f}" if a >= 0.001 else f"{v:.2g}"


def engineering_bytes(v: float | int) -> str:
    return engineering(float(v), "B")


def rate(v: float, unit: str) -> str:
    """A rate: GB/s as TB/s past 1000; TFLOP/s with 4 significant digits."""
    if unit == "GB/s" and abs(v) >= 1000:
        return f"{_digits(v / 1000)} TB/s"
    return f"{_digits(v)} {unit}"


def percent(v: float) -> str:
    if v and abs(v) < 0.05:
        return "<0.1%" if v > 0 else ">-0.1%"
    return f"{v:,.1f}%"


def whole(v: object) -> str:
    """The value as data-value: numbers as Python writes them (shortest exact), texts as they are,
    lists and records as JSON."""
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else ""
    if isinstance(v, (int, str)):
        return str(v)
    if isinstance(v, Decimal):
        return str(v)
    return orjson.dumps(v, default=str, option=orjson.OPT_NON_STR_KEYS).decode()


def number_text(v: float | int, style: str, column: str) -> tuple[str, float | None]:
    """(text, share) of a number in its column's style."""
    if isinstance(v, float) and not math.isfinite(v):
        return "", None
    if style == "time":
        us = float(v) * TIME_UNITS[time_unit(column)]
        return duration(us), None
    if style == "pct":
        return percent(float(v)), max(0.0, min(float(v), 100.0))
    if style == "bytes":
        return engineering(float(v), "B"), None
    if style == "flops":
        return engineering(float(v)), None
    if style == "gbps":
        return rate(float(v), "GB/s"), None
    if style == "tflops":
        return rate(float(v), "TFLOP/s"), None
    if isinstance(v, int):
        return (str(v) if style == "id" else f"{v:,}"), None
    a = abs(v)
    return (f"{v:.3g}" if a >= 1e6 or (a and a < 0.01) else f"{v:,.2f}"), None


def cell(v: object, column: str, style: str | None = None, name_chars: int = NAME_CHARS) -> Cell:
    """One value of `column` as a Cell."""
    style = style or kind(column)
    if v is None:
        return Cell("", "")
    if isinstance(v, Decimal):
        v = float(v)
    if isinstance(v, bool):
        return Cell(whole(v), whole(v))
    if isinstance(v, (int, float)):
        text, share = number_text(v, style, column)
        return Cell(text, whole(v), share=share)
    if isinstance(v, (list, tuple)) and column == SEQUENCE and all(isinstance(x, str) for x in v):
        lines = tuple((THEN if i else "") + shorten(str(k), name_chars) for i, k in enumerate(v))
        return Cell("", whole(list(v)), cut=any(len(str(k)) > name_chars for k in v), lines=lines)
    if isinstance(v, (list, tuple)):
        text = ", ".join(_short(x) for x in v)
        return _text_cell(text, whole(list(v)), name_chars)
    if isinstance(v, dict):
        text = v["name"] if isinstance(v.get("name"), str) else ", ".join(f"{k}: {_short(x)}" for k, x in v.items())
        return _text_cell(str(text), whole(v), name_chars)
    s = str(v)
    return _text_cell(s, s, name_chars)


def _short(v: object) -> str:
    """An element of a list or record, briefly."""
    if isinstance(v, float):
        return _digits(v) if math.isfinite(v) else ""
    if isinstance(v, dict):
        return str(v.get("name", whole(v)))
    return "" if v is None else str(v)


def _text_cell(text: str, value: str, limit: int) -> Cell:
    one_line = " ".join(text.split()) if "\n" in text else text
    prose = one_line.count(" ") >= PROSE_WORDS - 1 and not CODE.search(one_line)
    limit = PROSE_CHARS if prose else limit
    if len(one_line) <= limit:
        return Cell(one_line, value, prose=prose)
    short = one_line[: limit - 1] + "…" if prose else shorten(one_line, limit)
    return Cell(short, value, cut=True, prose=prose)
