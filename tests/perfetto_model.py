"""A model of Perfetto's JSON importer (trace_processor, 2026), for tests of the traces we write.

What it follows, from Perfetto's sources (src/trace_processor/importers/json/json_trace_tokenizer.cc,
json_trace_parser.cc, importers/common/slice_tracker.cc, sorter/trace_sorter.h):
- times: an integer µs value x 1000; a float `llround(v * 1000)` ns; a numeric string likewise;
  events with a negative time are dropped;
- order: by time, then (JSON) E events first, X events longer first, everything else after, then
  file order;
- each thread (pid, tid) is one track of nested slices (X, B/E, thread-scoped instants): a new
  slice pops the open slices that ended before it (or at its start, unless both are instants); if
  it starts inside the innermost open one and ends after it, it cannot nest: Perfetto spills it
  to an overflow track and counts an import error (`slice_spill_overlapping_complete_event`);
- flows v1 (s, t, f; keyed by id, cat and name): `s`/`t` and `f` with `bp: e` bind to the innermost
  slice on their thread's stack (none: `flow_no_enclosing_slice`); an `f` without `bp` binds to the
  next slice that begins on its thread;
- counters (C): a track per process and `name + " " + arg key`.
"""

from __future__ import annotations

import gzip
import json
import math
from dataclasses import dataclass, field

MAX = 1 << 62


def load(path) -> dict:
    op = gzip.open if str(path).endswith(".gz") else open
    with op(path, "rt") as f:
        d = json.load(f)
    return d if isinstance(d, dict) else {"traceEvents": d}


def ns(v) -> int | None:
    """A JSON time value as Perfetto reads it (None: not a time)."""
    if isinstance(v, str):
        try:
            v = json.loads(v.strip())
        except ValueError:
            return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    if isinstance(v, int):
        return v * 1000
    if v != v or math.isinf(v):
        return None
    return int(v) * 1000 if v == math.trunc(v) else llround(v * 1000.0)


def llround(x: float) -> int:
    """C's llround: to the nearest integer, halves away from zero (no float addition)."""
    r = math.floor(abs(x))
    r += 1 if abs(x) - r >= 0.5 else 0
    return int(r if x >= 0 else -r)


@dataclass
class Model:
    slices: int = 0
    overlaps: list = field(default_factory=list)  # (track, name, ts_ns) of slices that could not nest
    tracks: set = field(default_factory=set)
    counter_tracks: set = field(default_factory=set)
    flows: int = 0  # flows with a bound start and a bound end
    unbound: int = 0  # flow endpoints bound to no slice
    dropped: int = 0  # negative times, X without dur


def _track(e: dict) -> tuple:
    pid = e.get("pid", 0)
    return (pid, e.get("tid", pid))


def _ended(top: tuple, t: int, new_dur: int) -> bool:
    """Whether an open slice is popped by a new one at t: it ended before, or at t unless both are instants."""
    start, dur = top[0], top[1]
    if dur == MAX:
        return False
    return start + dur < t or (start + dur == t and not (dur == 0 and new_dur == 0))


def import_trace(doc: dict) -> Model:
    m = Model()
    items = []
    for i, e in enumerate(doc.get("traceEvents", [])):
        if not isinstance(e, dict):
            continue
        ph = e.get("ph")
        if ph == "M":
            continue
        t = ns(e.get("ts"))
        if t is None or t < 0:
            m.dropped += 1
            continue
        dur = ns(e.get("dur")) if ph == "X" else 0
        if ph == "X" and dur is None:
            m.dropped += 1
            continue
        key = -MAX if ph == "E" else (MAX - dur if ph == "X" else MAX)
        items.append((t, key, i, ph, dur, e))
    items.sort(key=lambda x: (x[0], x[1], x[2]))
    stacks: dict = {}
    flows: dict = {}
    pending_next: dict = {}  # track -> [flow keys waiting for the next slice]
    for t, _, _, ph, dur, e in items:
        track = _track(e)
        if ph in ("X", "i", "I", "B") and (ph != "i" and ph != "I" or e.get("s", "t") == "t"):
            stack = stacks.setdefault(track, [])
            new_dur = MAX if ph == "B" else dur
            while stack and _ended(stack[-1], t, new_dur):
                stack.pop()
            top = stack[-1] if stack else None
            if ph == "X" and top is not None and top[1] != MAX and t < top[0] + top[1] < t + dur:
                m.overlaps.append((track, e.get("name"), t))
                continue
            stack.append((t, new_dur, e.get("name")))
            m.slices += 1
            m.tracks.add(track)
            for k in pending_next.pop(track, []):
                flows.setdefault(k, {})["f"] = True
        elif ph == "E":
            stack = stacks.get(track, [])
            for j in range(len(stack) - 1, -1, -1):
                if stack[j][1] == MAX:
                    s, _, name = stack[j]
                    stack[j] = (s, t - s, name)
                    # it cannot nest: it ends after the slice it started in, or a slice it holds outlasts it
                    outer = j and stack[j - 1][1] != MAX and stack[j - 1][0] + stack[j - 1][1] < t
                    if outer or any(x[1] == MAX or x[0] + x[1] > t for x in stack[j + 1 :]):
                        m.overlaps.append((track, name, s))
                    break
        elif ph == "C":
            for k in e.get("args") or {}:
                m.counter_tracks.add((e.get("pid"), f"{e.get('name')} {k}"))
        elif ph in ("s", "t", "f"):
            fk = (e.get("id"), e.get("cat"), e.get("name"))
            stack = stacks.get(track, [])
            if ph == "f" and e.get("bp") != "e":
                pending_next.setdefault(track, []).append(fk)
                continue
            if not stack:
                m.unbound += 1
                continue
            flows.setdefault(fk, {})["s" if ph in ("s", "t") else "f"] = True
    m.flows = sum(1 for v in flows.values() if v.get("s") and v.get("f"))
    m.unbound += sum(len(v) for v in pending_next.values())
    return m
