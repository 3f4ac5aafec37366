"""launches: the calls that put work on a device, counted as a trace is read, against the device
activity it holds: a trace whose device activity the profiler lost says so.

A launch (a runtime or driver call of `kineto.LAUNCH_CATS` whose name `kineto.DEVICE_LAUNCH`
matches: `cudaLaunchKernel`, `hipGraphLaunch`, `urEnqueueKernelLaunch`, ...) makes at least one
device op (a graph launch makes many), so a trace with launches and no device ops, or far fewer
device ops than launches, lost them: CUPTI's activity buffers overflowed, the device activity was
not enabled, or the trace was cut. A real A100 trace with 270 launches and no device event was
analysed as a CPU-only one. Legitimately fewer: a trace that captures CUDA/HIP graphs (its captured
launches run nothing: `kineto.CAPTURE_BEGIN` calls), which is not judged.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.kineto import CAPTURE_BEGIN, DEVICE_LAUNCH, LAUNCH_CATS, NOT_DEVICE_LAUNCH

LOST_SHARE = 0.5  # fewer device ops than this share of the launches: lost (each launch makes one or more)
MIN_LAUNCHES = 20  # below this many launches, only a trace with no device op at all is judged
LAUNCHES, WITHOUT = "lost:launches", "lost:launches_without_device_activity"  # problems_json keys
LAUNCH_CATS_LOWER = frozenset(LAUNCH_CATS)  # lower case


def launch_counts(events: pa.Table, cats: set) -> Counter:
    """The launches and graph capture calls of a chunk's events table (as the worker that built
    it counts them); `cats`: the categories it holds."""
    return launch_counts_of_parts(events, [0, events.num_rows], cats)[0]


def launch_counts_of_parts(events: pa.Table, starts: Sequence[int] | np.ndarray, cats: set) -> list[Counter]:
    """`launch_counts` of each part [starts[k], starts[k + 1]) of an events table (a group of
    traces read together: one pass, not a dozen small calls per trace); `cats`: the categories
    the table holds."""
    parts = len(starts) - 1
    counts: list[Counter] = [Counter() for _ in range(parts)]
    runtime_cats = [c for c in cats if c is not None and c.lower() in LAUNCH_CATS_LOWER]
    if not runtime_cats or not parts:
        return counts
    runtime = pc.is_in(events.column("cat"), pa.array(runtime_cats, pa.string()))
    is_call = pc.fill_null(pc.and_(pc.equal(events.column("ph"), "X"), runtime), False)
    rows = np.flatnonzero(is_call.to_numpy(zero_copy_only=False))
    if not rows.size:
        return counts
    calls = events.column("name").take(pa.array(rows))
    if pa.types.is_dictionary(calls.type):
        calls = calls.cast(pa.string())
    if isinstance(calls, pa.ChunkedArray):
        calls = calls.combine_chunks()
    # the calls have a few distinct names: the patterns are matched once per name
    coded = pc.dictionary_encode(calls, null_encoding="encode")
    names, which = coded.dictionary, coded.indices.to_numpy(zero_copy_only=False)

    def of_calls(hit: pa.Array) -> np.ndarray:
        return pc.fill_null(hit, False).to_numpy(zero_copy_only=False)[which]

    launch, capture = _launch_and_capture(names)
    hits = {"launches": of_calls(launch), "captures": of_calls(capture)}
    if parts == 1:  # a chunk's table
        counts[0].update({key: int(np.count_nonzero(h)) for key, h in hits.items()})
        return counts
    part = np.searchsorted(np.asarray(starts), rows, side="right") - 1
    called = np.flatnonzero(np.bincount(part, minlength=parts))  # a part with calls counts both
    for key, h in hits.items():
        per_part = np.bincount(part, weights=h, minlength=parts)
        for k in called:
            counts[k][key] += int(per_part[k])
    return counts


def _launch_and_capture(names: pa.Array) -> tuple[pa.Array, pa.Array]:
    """Which call names launch device work (`kineto.DEVICE_LAUNCH`, not `NOT_DEVICE_LAUNCH`) and
    which begin a graph capture (`kineto.CAPTURE_BEGIN`), by Arrow's regexes."""
    launch = pc.and_(
        pc.match_substring_regex(names, DEVICE_LAUNCH), pc.invert(pc.match_substring_regex(names, NOT_DEVICE_LAUNCH))
    )
    return launch, pc.match_substring_regex(names, CAPTURE_BEGIN)


def launch_counts_of_calls(calls: dict) -> Counter:
    """`launch_counts` of a chunk whose launch calls are counted by name already (the native pass's
    `calls`: name -> count): the name patterns matched once per name, as `launch_counts` matches
    them (Arrow's regexes), and remembered."""
    if not calls:
        return Counter()
    new = [name for name in calls if name not in _CALL_KINDS]
    if new:
        if len(_CALL_KINDS) + len(new) > _CALL_KINDS_HELD:
            _CALL_KINDS.clear()
        launch, capture = _launch_and_capture(pa.array(new, pa.string()))
        _CALL_KINDS.update(zip(new, zip(launch.to_pylist(), capture.to_pylist())))
    counts = Counter({"launches": 0, "captures": 0})
    for name, n in calls.items():
        launch, capture = _CALL_KINDS[name]
        counts["launches"] += n * launch
        counts["captures"] += n * capture
    return counts


_CALL_KINDS: dict[str, tuple[bool, bool]] = {}  # call name -> (a launch, a capture begin), in this process
_CALL_KINDS_HELD = 1 << 12  # names remembered at most (a trace calls a few dozen)


@dataclass
class LaunchCount:
    """Launches and graph capture calls seen so far (`add` a chunk's `launch_counts` at a time)."""

    counts: Counter = field(default_factory=Counter)

    def add(self, counts: Counter | None):
        if counts:
            self.counts.update(counts)

    def problems(self, n_device_ops: int) -> dict:
        """The problems_json entries when the trace lost device activity (else none)."""
        return lost_activity(self.counts["launches"], self.counts["captures"], n_device_ops)


def lost_activity(n_launches: int, n_captures: int, n_device_ops: int) -> dict:
    """{LAUNCHES: n, WITHOUT: how many launches have no device op at least} when that is all of
    them or more than LOST_SHARE of MIN_LAUNCHES or more; {} otherwise or in a capture trace."""
    if not n_launches or n_captures:
        return {}
    if n_device_ops and (n_launches < MIN_LAUNCHES or n_device_ops >= LOST_SHARE * n_launches):
        return {}
    return {LAUNCHES: n_launches, WITHOUT: n_launches - n_device_ops}


def lost_activity_line(problems: dict, n_device_ops: int | None = None) -> str | None:
    """The one line that says a trace lost its device activity (None: it did not)."""
    n, without = problems.get(LAUNCHES), problems.get(WITHOUT)
    if not n:
        return None
    ops = n - without if n_device_ops is None else n_device_ops
    held = "no device activity (kernels, copies, memsets)" if not ops else f"only {ops} device ops"
    return (
        f"{n} kernel launches but {held}: the profiler lost the device activity "
        "(its activity buffers full, or device activity not recorded); times and costs of the device are missing"
    )
