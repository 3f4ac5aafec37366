"""expectations: what a synthetic (or any) trace should give, computed independently of
tracepipe's reader: exact ns of a µs value, the GPU and flow events, the complete events of a
cut document (as the acceptance check reads them)."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

from pipeline.synthetic.traces import ALL_GPU_CATS


def ns(v) -> int | None:
    """Independent expectation: a µs value (as written in the JSON text) in integer ns."""
    if v is None:
        return None
    if type(v) is int:
        return v * 1000
    if type(v) is float:
        return int(Decimal(repr(v)) * 1000)
    if isinstance(v, Decimal):
        return int(v * 1000)
    raise TypeError(type(v))


def tid(v):
    """Independent expectation: the integer thread id a `tid` value names (the 2021 layout writes
    `"1670242"` and `"stream 7"`); None for a name that is no number."""
    if type(v) is int:
        return v
    text = str(v).removeprefix("stream ")
    return int(text) if text.isdigit() else None


def gpu_events(trace: dict) -> list[tuple[int, dict]]:
    return [
        (i, e)
        for i, e in enumerate(trace["traceEvents"])
        if isinstance(e, dict) and e.get("ph") == "X" and e.get("cat") in ALL_GPU_CATS
    ]


def flow_events(trace: dict) -> list[tuple[int, dict]]:
    return [
        (i, e) for i, e in enumerate(trace["traceEvents"]) if isinstance(e, dict) and e.get("ph") in ("s", "f", "t")
    ]


def complete_events(text: str) -> list:
    """The complete traceEvents elements in a (possibly cut) document, by raw_decode (as check.py)."""
    dec = json.JSONDecoder()
    out: list[Any] = []
    if '"traceEvents"' in text:
        opened = text.find("[", text.index('"traceEvents"'))
        if opened < 0:  # cut between the key and its array: no event yet
            return out
        pos = opened + 1
    elif text.lstrip().startswith("["):
        pos = text.index("[") + 1
    else:
        return out
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text) or text[pos] == "]":
            return out
        try:
            v, pos = dec.raw_decode(text, pos)
        except json.JSONDecodeError:
            return out
        out.append(v)
