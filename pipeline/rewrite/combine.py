"""combine: one trace from several, streamed, with ids renumbered so nothing collides.

Input k of n (0-based) is renumbered with one injective scheme, "append k as extra digits":
integers become `v * 10**d + k` with d the decimal digits of n-1 (so for up to 10 inputs GPU 0 of
inputs 0, 1, 2 becomes pid 0, 1, 2 and process 3113936 becomes 31139360, 31139361, ...; small
pids stay small and `pid // 10**d` is the original); string ids get k appended as hex digits
(Chrome/Perfetto read string flow ids as hex, so this is the same scheme in base 16).
What is renumbered, always the same way within an input, so links stay inside their input:

- integer `pid`s; string pseudo-pids ("Spans", "Traces") get " [label]" appended: shared, each
  input's profiler spans would overlap the others' on one track, which Perfetto cannot draw;
- `id`, `bind_id` and `id2` values, so no (cat, id, ph) flow/async triple is shared by two inputs;
- args that link events (`LINK_ARGS`: External id, correlation, Python id, ...) when positive
  (0 and negative values are "no link" sentinels and stay as they are);
- device ids (`args.device`, `args["Device Id"]` when >= 0, and `deviceProperties[].id`), so a
  GPU's pid and device id stay equal as Kineto writes them and every device entry is distinct.

`process_name` metadata events get " [label]" appended (label: the file stem unless given).
Top-level metadata: `deviceProperties` is the list of every input's entries tagged with
`"source": label` (exact duplicates dropped), `combinedFrom` lists per input its label, path,
index, timestamp shift and its own top-level keys (distributedInfo, baseTimeNanoseconds, ...);
keys with the same value in every input (other than distributedInfo) are kept at the top level.
Metadata is written after traceEvents: inputs may place theirs after their events.
With align="start" each input is read twice: once for its first timestamp, then shifted so all
inputs start when the earliest one does (metadata events keep their ts).
"""

from __future__ import annotations

import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from pipeline.errors import UsageError
from pipeline.kineto import is_trace_name, trace_stem
from pipeline.read.values import FLOAT_EXACT_US, Problems, us_to_ns
from pipeline.rewrite.jsonout import TraceWriter, open_trace, read_events, us_number
from pipeline.rewrite.lanes import Lanes
from pipeline.rewrite.lanes import plan as plan_lanes
from pipeline.rewrite.run_timeline import WAITS_NAME, WAITS_TID, RunPlan

ALIGNS = ("none", "start", "clocks")
ID_KEYS = ("id", "bind_id")
LINK_ARGS = ("External id", "external id", "correlation", "Python id", "Python parent id", "Sequence number")
DEVICE_ARGS = ("device", "Device Id")
SHARED_ONLY_PER_INPUT = frozenset(("deviceProperties", "distributedInfo"))


class Renumber:
    """The id scheme of input k of n: integers v -> v * 10**d + k, strings s -> s + hex(k)."""

    def __init__(self, k: int, n: int):
        self.k = k
        self.scale = 10 ** len(str(max(n - 1, 0)))
        self.suffix = format(k, f"0{len(format(max(n - 1, 0), 'x'))}x")

    def num(self, v: int) -> int:
        return v * self.scale + self.k

    def link(self, v):
        """A linking id (External id, correlation, ...): positive ints only, <= 0 means "none"."""
        return self.num(v) if type(v) is int and v > 0 else v

    def device(self, v):
        """A device id: ints >= 0 (-1 means the CPU)."""
        return self.num(v) if type(v) is int and v >= 0 else v

    def id(self, v):
        """A flow/async id: every int, and strings (as hex digits)."""
        t = type(v)
        if t is int:
            return self.num(v)
        if t is str:
            return v + self.suffix
        return v


@dataclass
class Input:
    path: str
    label: str
    renumber: Renumber
    shift_ns: int = 0
    n_events: int = 0
    truncated: bool = False
    rank: int | None = None  # a run's rank (align="clocks"): its processes are named "rank N · ..."
    offset_ns: float | None = None  # its clock's offset as `ranks` estimated it (None: not aligned)
    marks: dict = field(default_factory=dict)  # (ts_ns, dur_ns) of an event -> events to add beside it
    lanes: Lanes = field(default_factory=Lanes)  # slices that move to sibling tracks
    pids: dict = field(default_factory=dict)  # written pids, for the unnamed ones
    dataset: str | None = None  # read from this dataset's tables (trace `trace_id`), not from `path`
    trace_id: str | None = None
    named: set = field(default_factory=set)  # written pids with a process_name
    waits_named: set = field(default_factory=set)  # written pids whose waits track has its name
    truncation_reason: str | None = None


@dataclass
class CombineResult:
    out_path: Path
    n_events: int
    inputs: list
    run: RunPlan | None = None  # a run's: its collectives linked, flows

    @property
    def n_moved(self) -> int:
        return sum(i.lanes.moved for i in self.inputs)

    @property
    def truncated_inputs(self) -> list:
        return [i for i in self.inputs if i.truncated]


# ------------------------------------------------------------------ per event
def _renumber_args(args: dict, r: Renumber):
    for key in LINK_ARGS:
        if key in args:
            args[key] = r.link(args[key])
    for key in DEVICE_ARGS:
        if key in args:
            args[key] = r.device(args[key])


def rewrite(e, inp: Input, problems: Problems):
    """Renumber one event of input `inp` in place (see the module docstring)."""
    if type(e) is not dict:
        return
    r = inp.renumber
    pid = e.get("pid")
    if type(pid) is int:
        e["pid"] = r.num(pid)
    elif type(pid) is str:
        e["pid"] = f"{pid} [{inp.label}]"
    for key in ID_KEYS:
        if key in e:
            e[key] = r.id(e[key])
    if type(e.get("id2")) is dict:
        e["id2"] = {k: r.id(v) for k, v in e["id2"].items()}
    args = e.get("args")
    if type(args) is dict:
        _renumber_args(args, r)
    is_meta = e.get("ph") == "M"
    if is_meta and e.get("name") == "process_name" and type(args) is dict and type(args.get("name")) is str:
        args["name"] = f"{args['name']} [{inp.label}]" if inp.rank is None else f"rank {inp.rank} · {args['name']}"
        if type(e.get("pid")) in (int, str):
            inp.named.add(e["pid"])
    if inp.shift_ns and not is_meta and "ts" in e:
        ns = us_to_ns(e["ts"], "ts", problems)
        if ns is not None:
            e["ts"] = us_number(ns - inp.shift_ns)


# ------------------------------------------------------------------ per input
def first_ts_ns(path: str) -> int | None:
    """The earliest timestamp of the trace's events (metadata events aside), in ns."""
    problems, first = Problems(), None
    with open_trace(path) as src:
        for events in read_events(src):
            for e in events:
                if type(e) is dict and e.get("ph") != "M" and "ts" in e:
                    ns = us_to_ns(e["ts"], "ts", problems)
                    if ns is not None and (first is None or ns < first):
                        first = ns
    return first


@contextmanager
def _opened(inp: Input):
    """(batches of events, the source: metadata and tail) of an input: a trace file, or a trace's
    rows in a dataset (`from_tables`)."""
    if inp.dataset is not None:
        from pipeline.rewrite.from_tables import TableSource

        table = TableSource(inp.dataset, inp.trace_id or "")
        yield table.events(), table
        return
    with open_trace(inp.path) as src:
        yield read_events(src), src


def _copy_events(inp: Input, out: TraceWriter) -> dict:
    """Write every event of one input, renumbered, moved off overlaps (`lanes`), with what its
    marks add beside their events; return its top-level metadata."""
    problems = Problems()
    marks, base = dict(inp.marks), 0
    with _opened(inp) as (batches, src):
        for events in batches:
            inp.lanes.apply(events, base)
            base += len(events)
            added: list = []
            for e in events:
                key = _key(e, problems) if marks else None
                rewrite(e, inp, problems)
                if type(e) is dict and type(e.get("pid")) in (int, str):
                    inp.pids.setdefault(e["pid"], None)
                if key is not None and key in marks:
                    added += _beside(e, marks.pop(key), problems)
            out.write(events)
            out.write(added + _waits_names(inp, added))
            inp.n_events += len(events)
        out.write(_process_names(inp))
        inp.truncated, inp.truncation_reason = src.tail.truncated, src.tail.reason
        return src.metadata


def _key(e, problems: Problems) -> tuple | None:
    """(ts_ns, dur_ns) of a complete event (on its own clock), the key of the run's marks."""
    if type(e) is not dict or e.get("ph") != "X" or "dur" not in e:
        return None
    ts, dur = us_to_ns(e.get("ts"), "ts", problems), us_to_ns(e.get("dur"), "dur", problems)
    return None if ts is None or dur is None else (ts, dur)


def _beside(e: dict, marks: list, problems: Problems) -> list:
    """The marks of one (renumbered, shifted) event: flows on it, waits and instants on its process."""
    start = us_to_ns(e.get("ts"), "ts", problems) or 0
    out = []
    for m in marks:
        m = {**m, "pid": e.get("pid"), "tid": m.get("tid", e.get("tid")), "ts": e.get("ts")}
        if "dur_ns" in m:
            m["dur"] = us_number(m.pop("dur_ns"))
            m["ts"] = us_number(start)
        out.append(m)
    return out


def _waits_names(inp: Input, added: list) -> list:
    """A thread_name for the waits track of each process that got one first in this batch."""
    out = []
    for m in added:
        pid = m.get("pid")
        if m.get("tid") == WAITS_TID and pid not in inp.waits_named:
            inp.waits_named.add(pid)
            out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": WAITS_TID, "args": {"name": WAITS_NAME}})
    return out


def _process_names(inp: Input) -> list:
    """A run's rank names its processes: those the trace left unnamed get `rank N · process P`."""
    if inp.rank is None:
        return []
    scale = inp.renumber.scale
    return [
        {
            "ph": "M",
            "name": "process_name",
            "pid": p,
            "tid": 0,
            "args": {"name": f"rank {inp.rank} · process {p // scale}"},
        }
        for p in inp.pids
        if p not in inp.named and type(p) is int  # a string pid names itself ("Spans [rank 0]")
    ]


def _unique_labels(labels: list[str]) -> list[str]:
    seen: dict = {}
    out = []
    for label in labels:
        n = seen[label] = seen.get(label, 0) + 1
        out.append(label if n == 1 else f"{label}#{n}")
    return out


def _inputs(paths: list[str], labels, align: str) -> list[Input]:
    if align not in ALIGNS:
        raise UsageError(f"--align must be one of {', '.join(ALIGNS)}, not {align!r}")
    if not paths:
        raise UsageError("combine needs at least one trace")
    if labels is not None and len(labels) != len(paths):
        raise UsageError(f"{len(labels)} labels for {len(paths)} traces: give one label per trace")
    for p in paths:  # every input's header is checked before anything is written
        open_trace(p).close()
    names = _unique_labels(list(labels) if labels is not None else [trace_stem(p) for p in paths])
    inputs = [Input(p, name, Renumber(k, len(paths))) for k, (p, name) in enumerate(zip(paths, names))]
    if align == "start":
        starts = [first_ts_ns(p) for p in paths]
        common = min((s for s in starts if s is not None), default=0)
        for inp, s in zip(inputs, starts):
            inp.shift_ns = 0 if s is None else s - common
    return inputs


# ------------------------------------------------------------------ metadata
def _offset_us(ns: float | None) -> float | None:
    return None if ns is None else round(ns) / 1000


def _device_entries(inp: Input, props) -> list:
    out = []
    for p in props if isinstance(props, list) else []:
        if isinstance(p, dict):
            p = {**p, "source": inp.label}
            if "id" in p:
                p["id"] = inp.renumber.device(p["id"])
        out.append(p)
    return out


def combined_metadata(inputs: list[Input], metas: list[dict]) -> dict:
    """The top-level keys of the combined trace (see the module docstring)."""
    common = {
        k: v
        for k, v in metas[0].items()
        if k not in SHARED_ONLY_PER_INPUT and all(k in m and m[k] == v for m in metas[1:])
    }
    devices: list = []
    for inp, m in zip(inputs, metas):
        devices += [p for p in _device_entries(inp, m.get("deviceProperties")) if p not in devices]
    sources = [
        {
            **{k: v for k, v in m.items() if k != "deviceProperties"},
            "label": inp.label,
            "path": inp.path,
            "index": inp.renumber.k,
            "ts_shift_us": us_number(-inp.shift_ns),
            **({} if inp.rank is None else {"rank": inp.rank, "clock_offset_us": _offset_us(inp.offset_ns)}),
        }
        for inp, m in zip(inputs, metas)
    ]
    return {**common, **({"deviceProperties": devices} if devices else {}), "combinedFrom": sources}


def shift_of(offset_ns: float, some_ts_ns: int) -> int:
    """The shift (ns) that puts a rank on the run's clock: its offset, to the ns; to the µs where
    its times are past FLOAT_EXACT_US (µs since the epoch: a viewer reads them as float64 µs, on a
    ~0.25 µs grid, so a sub-µs shift would make whole-µs times inexact and nested slices overlap)."""
    if abs(some_ts_ns) >= FLOAT_EXACT_US * 1000:
        return round(offset_ns / 1000) * 1000
    return round(offset_ns)


def _lanes(inp: Input) -> Lanes:
    """Where the input's slices that Perfetto cannot nest move (`lanes`), from its events as they
    are written (shifted): a dataset's rows, or the trace flattened (no link) into a temporary
    directory."""
    shifted = pl.col("ts_ns") - inp.shift_ns
    if inp.dataset is not None:
        from pipeline.dataset.tables import tables

        t = tables(inp.dataset, {"events", "flows"})
        key = pl.col("trace_id") == inp.trace_id
        return plan_lanes(t["events"].filter(key).with_columns(shifted), t["flows"].filter(key).with_columns(shifted))
    from pipeline.flatten import flatten

    with tempfile.TemporaryDirectory(prefix="tracepipe-combine-") as tmp:
        flat = flatten(inp.path, tmp, link=False).out_dir
        events, flows = pl.scan_parquet(flat / "events.parquet"), pl.scan_parquet(flat / "flows.parquet")
        return plan_lanes(events.with_columns(shifted), flows.with_columns(shifted))


def _first_ns(inp: Input) -> int | None:
    if inp.dataset is None:
        return first_ts_ns(inp.path)
    from pipeline.dataset.tables import tables

    ev = tables(inp.dataset, {"events"})["events"].filter((pl.col("trace_id") == inp.trace_id) & (pl.col("ph") != "M"))
    return ev.select(pl.col("ts_ns").min()).collect().item()


def _dataset_run(ds: str, run_by: str | None, run: str | None) -> tuple[RunPlan, dict]:
    """The run plan of a batch dataset's run, and source path -> trace_id of its traces."""
    from pipeline.dataset.tables import tables
    from pipeline.rewrite.run_timeline import plan
    from pipeline.runs.from_tables import extracts_of_tables

    ids = tables(ds, {"trace"})["trace"].select("source_path", "trace_id").collect()
    with tempfile.TemporaryDirectory(prefix="tracepipe-combine-") as tmp:
        rp = plan(extracts_of_tables(ds, Path(tmp)), run_by, run)
    return rp, dict(ids.iter_rows())


def _run_inputs(paths: list[str], align: str, run_by: str | None, run: str | None) -> tuple[list[Input], RunPlan]:
    """The ranks of one run (a run folder, archive or list, or several rank traces) as inputs, with
    their clock shifts (align="clocks") and the flows, waits and names `run_timeline` adds."""
    from pipeline.rewrite.run_timeline import plan, run_sources
    from pipeline.runs.report import is_trace_folder

    ids = None
    if len(paths) == 1 and not is_trace_folder(Path(paths[0])):  # a batch dataset (or flattened traces)
        rp, ids = _dataset_run(paths[0], run_by, run)
    else:
        with tempfile.TemporaryDirectory(prefix="tracepipe-combine-") as tmp:
            src = paths[0]
            if len(paths) > 1 or is_trace_name(src):  # rank traces: scanned from a list of them
                src = str(Path(tmp) / "traces.txt")
                Path(src).write_text("".join(f"{Path(p).resolve()}\n" for p in paths))
            with run_sources(Path(src)) as extracts:
                rp = plan(extracts, run_by, run)
    if not rp.ranks:
        raise UsageError(f"{paths[0]}: no rank trace of run {rp.run} could be read")
    if ids is None:
        for r in rp.ranks:
            open_trace(r.path).close()
    inputs = []
    for k, r in enumerate(rp.ranks):
        inp = Input(r.path, f"rank {r.rank}", Renumber(k, len(rp.ranks)), rank=r.rank, offset_ns=r.offset_ns)
        if ids is not None:
            inp.dataset, inp.trace_id = paths[0], ids.get(r.path)
        inp.marks = r.marks
        if align == "clocks" and r.offset_ns is not None:
            inp.shift_ns = shift_of(r.offset_ns, next(iter(r.marks), (0, 0))[0])
        inputs.append(inp)
    if align == "start":
        starts = [_first_ns(i) for i in inputs]
        common = min((s for s in starts if s is not None), default=0)
        for inp, s in zip(inputs, starts):
            inp.shift_ns = 0 if s is None else s - common
    return inputs, rp


def is_run(paths, align: str) -> bool:
    """Whether `combine` puts the ranks of a run together: a folder (or archive) given, or clocks asked."""
    return align == "clocks" or (len(paths) == 1 and Path(paths[0]).is_dir())


def combine(
    paths,
    out_path,
    align: str = "none",
    labels=None,
    keep_secrets: bool = False,
    run_by: str | None = None,
    run: str | None = None,
) -> CombineResult:
    """Write one trace holding every event of every input, ids renumbered apart (module docstring).
    A run (a folder, archive or list of a run's rank traces; or align="clocks"): its ranks, each
    named `rank N` and, with align="clocks", shifted by the clock offset `ranks` estimates, its
    collectives linked across ranks by flows (`run_timeline`)."""
    paths = [str(p) for p in paths]
    if align not in ALIGNS:
        raise UsageError(f"--align must be one of {', '.join(ALIGNS)}, not {align!r}")
    rp = None
    if is_run(paths, align):
        if labels is not None:
            raise UsageError("--label names single traces: a run's ranks are named by their rank")
        inputs, rp = _run_inputs(paths, align, run_by, run)
    else:
        inputs = _inputs(paths, labels, align)
    for inp in inputs:
        inp.lanes = _lanes(inp)
    with TraceWriter(out_path, keep_secrets=keep_secrets) as out:
        metas = [_copy_events(inp, out) for inp in inputs]
        tail = combined_metadata(inputs, metas)
        if rp is not None:
            tail["run"] = {
                "name": rp.run,
                "align": align,
                "ranks": [i.rank for i in inputs],
                "collectives_linked": rp.n_collectives,
                "unaligned_ranks": [i.rank for i in inputs if i.offset_ns is None],
            }
        out.tail = tail
    return CombineResult(Path(out_path), out.n_events, inputs, rp)
