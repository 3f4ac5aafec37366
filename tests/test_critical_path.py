"""The critical path (pipeline.analyses.critical_path): exact breakdowns of tiny hand-built traces,
the same path whatever the windows, and its bounds on every real trace."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from conftest import SHARED_TRACES
from pipeline import synthetic as synth
from pipeline.analyses.critical_path import (
    CATEGORIES,
    CPU_WORK,
    LAUNCH,
    SYNC,
    WAITING,
    _Items,
    critical_path,
    critical_path_items,
)
from pipeline.analyses.flat import Flat
from pipeline.analyses.window import Window
from pipeline.flatten import flatten
from pipeline.kineto import trace_stem

PID, TID = 100, 1


def op(name, ts, dur, tid=TID, cat="cpu_op", **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": PID, "tid": tid, "ts": ts, "dur": dur, "args": args}


def call(name, ts, dur, corr=None, tid=TID):
    return op(name, ts, dur, tid, "cuda_runtime", **({"correlation": corr} if corr is not None else {}))


def gpu(name, ts, dur, corr=None, stream=7, cat="kernel"):
    args = {"device": 0, "stream": stream, **({"correlation": corr} if corr is not None else {})}
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur, "args": args}


def flat_of(tmp_path: Path, events: list, name: str = "t") -> Flat:
    src = tmp_path / f"{name}.json"
    src.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    return Flat(flatten(src, tmp_path / "flat").out_dir)


def breakdown(**us) -> dict:
    return {c: float(us.get(c, 0)) for c in CATEGORIES}


def rows(f: Flat) -> list[tuple]:
    """(name, category, start µs, end µs) of the path's segments, times since the trace's first item."""
    items = critical_path_items(f)
    t0 = items["start_ns"].min() if items.height else 0
    return [(n, c, (a - t0) / 1000, (b - t0) / 1000) for _, n, c, a, b in items.iter_rows()]


def check_contiguous(f: Flat, r: dict) -> pl.DataFrame:
    items = critical_path_items(f)
    if items.height:
        assert (items["start_ns"].slice(1) == items["end_ns"].slice(0, items.height - 1)).all()
        assert (items["end_ns"] >= items["start_ns"]).all()
        length = (items["end_ns"].max() - items["start_ns"].min()) / 1000
        assert length == pytest.approx(r["length_us"], abs=1e-9)
    assert sum(r["breakdown_us"].values()) == pytest.approx(r["length_us"], abs=1e-3)
    return items


# ------------------------------------------------------------------ exact cases
def test_cpu_only_two_ops_with_a_gap(tmp_path):
    f = flat_of(tmp_path, [op("aten::a", 0, 10), op("aten::b", 25, 15)])
    r = critical_path(f)
    assert r["breakdown_us"] == breakdown(cpu=25, waiting=15)
    assert (r["length_us"], r["start_us"], r["end_us"], r["items"]) == (40, 0, 40, 2)
    assert {t["name"]: t["us"] for t in r["top"]} == {"aten::a": 10, "aten::b": 15}
    assert rows(f) == [("aten::a", "cpu", 0, 10), (None, "waiting", 10, 25), ("aten::b", "cpu", 25, 40)]
    check_contiguous(f, r)


def test_annotations_are_work_only_without_gpu_activity(tmp_path):
    """Without GPU activity, user annotations are the trace's work as its device tables count it
    (gloo's collectives are annotations): on the path as `cpu`; a ProfilerStep#N is not (it holds
    the others). With a kernel in the trace they are not work."""
    ann = lambda name, ts, dur, tid=TID: op(name, ts, dur, tid, "user_annotation")
    events = [ann("ProfilerStep#1", 0, 100), op("aten::empty", 0, 5), ann("gloo:all_reduce", 10, 80, tid=2)]
    f = flat_of(tmp_path, events, "cpu")
    r = critical_path(f)
    assert r["breakdown_us"] == breakdown(cpu=80) and r["length_us"] == 80
    assert [t["name"] for t in r["top"]] == ["gloo:all_reduce"]
    check_contiguous(f, r)
    g = flat_of(tmp_path, [*events, gpu("k", 3, 1)], "gpu")
    assert "gloo:all_reduce" not in {t["name"] for t in critical_path(g)["top"]}


@pytest.mark.real
def test_a_cpu_only_trace_s_path_spans_its_collectives(shared_traces, real_flat):
    """The HTA CPU-only trace: 4 aten::empty ops and 10 gloo:all_reduce annotations over 1.26 s; its
    path was the ops' 15 µs, it is now the collectives' chain (86% of it in them)."""
    f = real_flat(shared_traces / "hta" / "cpu_only.json.gz")
    r = critical_path(f)
    assert r["length_us"] >= 0.95 * span_us(f)
    assert r["top"][0]["name"] == "gloo:all_reduce" and r["breakdown_us"]["cpu"] >= 0.8 * r["length_us"]


def test_launch_then_kernel(tmp_path):
    """An op [0, 50] launches at 20 a kernel starting 30 µs later, which ends the trace."""
    ev = [op("aten::mm", 0, 50), call("cudaLaunchKernel", 20, 5, corr=1), gpu("gemm", 50, 100, corr=1)]
    f = flat_of(tmp_path, ev)
    r = critical_path(f)
    assert r["breakdown_us"] == breakdown(cpu=20, launch=30, kernel=100)
    assert r["length_us"] == 150 and r["items"] == 3
    assert rows(f) == [
        ("aten::mm", "cpu", 0, 20),
        ("cudaLaunchKernel", "launch", 20, 20),  # left at its start: the kernel waited for its launch
        (None, "launch", 20, 50),
        ("gemm", "kernel", 50, 150),
    ]


def test_stream_predecessor_binds_when_it_ends_after_the_launch(tmp_path):
    """The second kernel is launched at 12 but waits for the first one (ends at 80) on its stream."""
    ev = [
        call("cudaLaunchKernel", 0, 5, corr=1),
        call("cudaLaunchKernel", 12, 5, corr=2),
        gpu("k1", 10, 70, corr=1),
        gpu("k2", 90, 10, corr=2),
    ]
    f = flat_of(tmp_path, ev)
    r = critical_path(f)
    assert r["breakdown_us"] == breakdown(launch=10, kernel=80, waiting=10)
    assert [x[:2] for x in rows(f)] == [
        ("cudaLaunchKernel", "launch"),
        (None, "launch"),
        ("k1", "kernel"),
        (None, "waiting"),
        ("k2", "kernel"),
    ]


def test_sync_waits_for_a_long_kernel(tmp_path):
    ev = [
        op("aten::add", 0, 8),
        call("cudaLaunchKernel", 2, 4, corr=1),
        gpu("long_kernel", 10, 1000, corr=1),
        call("cudaDeviceSynchronize", 20, 1000),
    ]
    f = flat_of(tmp_path, ev)
    r = critical_path(f)
    assert r["breakdown_us"] == breakdown(cpu=2, launch=8, kernel=1000, sync=10)
    assert r["length_us"] == 1020
    assert rows(f)[-2:] == [("long_kernel", "kernel", 10, 1010), ("cudaDeviceSynchronize", "sync", 1010, 1020)]


def test_sync_with_nothing_to_wait_for_and_a_blocking_memcpy(tmp_path):
    """A sync call during which no GPU work ends is a CPU item (its time `sync`); a blocking
    cudaMemcpy waits for its copy."""
    ev = [
        call("cudaStreamSynchronize", 0, 10),
        call("cudaMemcpy", 20, 100, corr=1),
        gpu("Memcpy DtoH", 30, 80, corr=1, cat="gpu_memcpy"),
    ]
    f = flat_of(tmp_path, ev)
    r = critical_path(f)
    assert r["breakdown_us"] == breakdown(launch=10, memcpy=80, sync=20, waiting=10)
    assert rows(f) == [
        ("cudaStreamSynchronize", "sync", 0, 10),
        (None, "waiting", 10, 20),
        ("cudaMemcpy", "sync", 20, 20),
        (None, "launch", 20, 30),
        ("Memcpy DtoH", "memcpy", 30, 110),
        ("cudaMemcpy", "sync", 110, 120),
    ]


def test_an_enclosing_op_still_running_is_not_waiting(tmp_path):
    """A [0, 100] calls at 10; B starts at 150: [20, 100] is A's (after its last child), only
    [100, 150] is waiting. P's time between its children c1 and c2 (which launches the last
    kernel) is P's."""
    ev = [
        op("A", 0, 100),
        call("cudaGetDevice", 10, 10),
        op("B", 150, 10),
        op("P", 200, 100),
        op("c1", 210, 10),
        call("cudaLaunchKernel", 250, 10, corr=1),
        gpu("k", 270, 130, corr=1),
    ]
    f = flat_of(tmp_path, ev)
    r = critical_path(f)
    assert r["breakdown_us"] == breakdown(cpu=150, launch=30, kernel=130, waiting=90)
    assert rows(f) == [
        ("A", "cpu", 0, 10),
        ("cudaGetDevice", "launch", 10, 20),
        ("A", "cpu", 20, 100),
        (None, "waiting", 100, 150),
        ("B", "cpu", 150, 160),
        (None, "waiting", 160, 200),
        ("P", "cpu", 200, 210),
        ("c1", "cpu", 210, 220),
        ("P", "cpu", 220, 250),
        ("cudaLaunchKernel", "launch", 250, 250),
        (None, "launch", 250, 270),
        ("k", "kernel", 270, 400),
    ]
    assert r["items"] == 7
    assert r["top"][:2] == [{"name": "k", "category": "kernel", "us": 130}, {"name": "A", "category": "cpu", "us": 90}]


def test_longest_path_over_resources(tmp_path):
    """The trace ends with a short op on a side thread; the stream was busy long before (kernels
    launched before the profiler started): the path is the stream's, not the side thread's."""
    ev = [gpu("k", 100 * i, 90) for i in range(10)] + [op("side", 1000, 10, tid=2)]
    f = flat_of(tmp_path, ev)
    r = critical_path(f)
    assert r["breakdown_us"] == breakdown(kernel=900, waiting=90)
    assert r["length_us"] == 990 and r["end_us"] == 990


def test_analysis_window_keeps_the_items_starting_in_it(tmp_path):
    f = flat_of(tmp_path, [op("aten::a", 0, 10), op("aten::b", 25, 15), op("aten::c", 50, 5)])
    r = critical_path(Flat(f.path, window=Window(start_us=5, end_us=45)))
    assert r["breakdown_us"] == breakdown(cpu=15) and r["top"][0]["name"] == "aten::b"


def test_no_work_items(tmp_path):
    f = flat_of(tmp_path, [op("ProfilerStep#1", 0, 10, cat="user_annotation"), op("f", 1, 5, cat="python_function")])
    r = critical_path(f)
    assert r == {
        "length_us": 0.0,
        "breakdown_us": breakdown(),
        "start_us": 0.0,
        "end_us": 0.0,
        "items": 0,
        "top": [],
    }
    assert critical_path_items(f).height == 0


def test_zero_length_items_at_one_instant_end(tmp_path):
    """Zero-length items sharing a start (integer-µs traces): on a stream no one's predecessor at
    that instant (k has none: 5 µs), on a thread in file order (a, b, c: 10 µs, the longest)."""
    ev = [gpu("z1", 10, 0), gpu("z2", 10, 0), gpu("k", 10, 5), op("a", 0, 10), op("b", 10, 0), op("c", 10, 0)]
    f = flat_of(tmp_path, ev)
    r = critical_path(f)
    assert r["length_us"] == 10 and r["breakdown_us"] == breakdown(cpu=10)
    assert [x[0] for x in rows(f)] == ["a", "b", "c"]


# ------------------------------------------------------------------ windows
def test_windows_do_not_change_the_path(tmp_path):
    """Every item's predecessors are the same whatever the windows the items are read in."""
    long_kernels = [gpu("long", 1000 * i, 1500, stream=9) for i in range(20)]  # each overlaps the next
    trace = synth.make_trace(n_steps=6, ops_per_step=5, gpu_devices=(0, 1), extra_events=long_kernels)
    src = synth.write_trace(trace, tmp_path / "s.json")
    f = Flat(flatten(src, tmp_path / "flat").out_dir)
    whole, items, one = critical_path(f), critical_path_items(f), _Items(f)
    assert whole["length_us"] > 0 and one.via_launch.any() and (one.outer >= 0).any()
    for per_window in (1, 7, 40):
        some = _Items(f, per_window)
        for name in (*_Items.ARRAYS, "via_launch", "sync_to"):
            assert (getattr(some, name) == getattr(one, name)).all(), name
        assert some.lasts == one.lasts
        assert critical_path(f, per_window=per_window) == whole
        assert critical_path_items(f, per_window=per_window).equals(items)
    check_contiguous(f, whole)


# ------------------------------------------------------------------ real traces
REAL = sorted(SHARED_TRACES.glob("*/*.json.gz")) if SHARED_TRACES.is_dir() else []


@pytest.fixture(scope="module")
def real_flat(tmp_path_factory):
    out = tmp_path_factory.mktemp("real")
    return lambda p: Flat(out / trace_stem(p)) if (out / trace_stem(p)).is_dir() else Flat(flatten(p, out).out_dir)


def busiest_stream_us(f: Flat) -> float:
    """The largest union of activity intervals of one (device, stream)."""
    g = pl.read_parquet(f.path / "gpu_ops.parquet", columns=["device", "stream", "ts_ns", "dur_ns"])
    g = g.drop_nulls("ts_ns").with_columns(end=pl.col("ts_ns") + pl.col("dur_ns").fill_null(0))
    if not g.height:
        return 0.0
    runs = (
        g.sort("device", "stream", "ts_ns")
        .with_columns(reach=pl.col("end").cum_max().shift(1).over("device", "stream"))
        .with_columns(run=(pl.col("reach").is_null() | (pl.col("ts_ns") > pl.col("reach"))).cum_sum())
        .group_by("device", "stream", "run")
        .agg(ns=pl.col("end").max() - pl.col("ts_ns").min())
    )
    return runs.group_by("device", "stream").agg(pl.col("ns").sum())["ns"].max() / 1000


def span_us(f: Flat) -> float:
    e = pl.read_parquet(f.path / "events.parquet", columns=["ph", "ts_ns", "dur_ns"])
    e = e.filter((pl.col("ph") == "X") & pl.col("ts_ns").is_not_null())
    return ((e["ts_ns"] + e["dur_ns"].fill_null(0)).max() - e["ts_ns"].min()) / 1000


@pytest.mark.real
@pytest.mark.parametrize("trace", REAL, ids=[f"{p.parent.name}/{trace_stem(p)}" for p in REAL])
def test_real_trace_bounds(trace, shared_traces, real_flat):
    f = real_flat(trace)
    r = critical_path(f)
    items = check_contiguous(f, r)
    assert r["length_us"] > 0 and r["items"] > 0
    assert r["length_us"] >= busiest_stream_us(f) * 0.999
    assert r["length_us"] <= span_us(f) + 1
    assert 0 <= r["start_us"] <= r["end_us"] and len(r["top"]) <= 10
    # waiting between two items of a thread: no item of that thread ran then
    ev = pl.read_parquet(f.path / "events.parquet", columns=["event_idx", "ph", "cat", "pid", "tid", "ts_ns", "dur_ns"])
    ev = ev.filter(CPU_WORK).select("event_idx", "pid", "tid", "ts_ns", end=pl.col("ts_ns") + pl.col("dur_ns"))
    seg = items.with_columns(before=pl.col("event_idx").shift(1), after=pl.col("event_idx").shift(-1))
    gaps = seg.filter(pl.col("category") == "waiting")
    gaps = gaps.join(ev.select(before="event_idx", pid="pid", tid="tid"), on="before")
    gaps = gaps.join(ev.select(after="event_idx", pid_after="pid", tid_after="tid"), on="after")
    gaps = gaps.filter((pl.col("pid") == pl.col("pid_after")) & (pl.col("tid") == pl.col("tid_after")))
    reach = ev.sort("ts_ns").with_columns(reach=pl.col("end").cum_max().over("pid", "tid"))
    found = gaps.sort("end_ns").join_asof(  # the latest end of the thread's items started before the gap ends
        reach.select("pid", "tid", "ts_ns", "reach"),
        left_on="end_ns",
        right_on="ts_ns",
        by=["pid", "tid"],
        allow_exact_matches=False,
        check_sortedness=False,
    )
    assert gaps.height == found.height and (found["reach"] <= found["start_ns"]).all()


def test_real_trace_windows(shared_traces, real_flat):
    f = real_flat(shared_traces / "tracelens" / "h100_qwen1.5_0.5b.json.gz")
    assert critical_path(f, per_window=700) == critical_path(f)


# ------------------------------------------------------------------ the walks, step by step
def step(it: _Items, i: int, t: int) -> tuple[int, int, int, int]:
    """The module docstring's rule, one step at a time (what `_Items` computes for all steps at
    once): (start of i's segment, its category, the binding predecessor or -1, the time r the
    walk reaches it at)."""
    g = int(it.sync_to[i])
    if g >= 0 and t == it.end[i]:
        return int(it.end[g]), SYNC, g, int(it.end[g])
    s, p = int(it.start[i]), int(it.pred[i])
    if p < 0:
        return s, int(it.code[i]), -1, s
    return s, int(it.code[i]), p, int(it.start[p] if it.via_launch[i] else min(it.end[p], s))


def walk_by_steps(it: _Items, i: int) -> tuple[list, list, list, int]:
    items, codes, starts = [], [], []  # backwards
    end = t = int(it.end[i])
    while True:
        s, code, p, r = step(it, i, t)
        items.append(i), codes.append(code), starts.append(s)
        if p < 0:
            return items[::-1], codes[::-1], starts[::-1], end
        if r < s:
            x = int(it.outer[i])
            held = min(int(it.end[x]), s) if x >= 0 and it.end[x] > r else r
            if held < s:
                items.append(-1), codes.append(LAUNCH if it.via_launch[i] else WAITING), starts.append(held)
            if held > r:
                items.append(x), codes.append(int(it.code[x])), starts.append(r)
        i, t = p, r


def check_walks(f: Flat) -> int:
    """Every resource's walk and its origin, as `_Items` finds them, equal the step-by-step walk's."""
    it = _Items(f)
    origins = it.origins(it.lasts)
    for k, i in enumerate(it.lasts):
        items, codes, starts, end = walk_by_steps(it, i)
        got = it.walk(i)
        assert got[3] == end and origins[k] == starts[0]
        assert got[0].tolist() == items and got[1].tolist() == codes and got[2].tolist() == starts
        assert (got[0].dtype, got[1].dtype, got[2].dtype) == (np.int32, np.int8, np.int64)
    return len(it.lasts)


def test_walks_equal_the_step_by_step_walk(tmp_path):
    """Syncs (one waiting for a kernel, one for nothing), launches, nesting and two threads."""
    ev = [
        call("cudaLaunchKernel", 0, 10, corr=1),
        gpu("long_kernel", 10, 1000, corr=1),
        op("outer", 0, 2000),
        call("cudaDeviceSynchronize", 1000, 20),
        call("cudaStreamSynchronize", 1500, 10),
        op("other_thread", 5, 3000, tid=2),
        call("cudaMemcpy", 1600, 30),
    ]
    assert check_walks(flat_of(tmp_path, ev)) >= 3


@pytest.mark.real
@pytest.mark.parametrize("trace", REAL, ids=[f"{p.parent.name}/{trace_stem(p)}" for p in REAL])
def test_real_trace_walks_equal_the_step_by_step_walk(trace, shared_traces, real_flat):
    assert check_walks(real_flat(trace)) >= 1


def test_top_cuts_the_names_on_the_path_not_the_breakdown(tmp_path):
    """`--top N` cuts critical-path-top to its N longest names; the breakdown by category (a whole,
    with its total) is never cut."""
    from conftest import run_cli

    trace = synth.make_trace(n_steps=6, ops_per_step=5)
    src = synth.write_trace(trace, tmp_path / "s.json")
    full = run_cli(["analyze", src, "--section", "critical-path", "-w", "0"])
    cut = run_cli(["analyze", src, "--section", "critical-path", "-w", "0", "--top", "2"])
    assert full.returncode == cut.returncode == 0, full.stderr + cut.stderr

    def table(out: str, name: str) -> list[str]:
        rows = []
        for line in out.split(f"\n{name}:\n", 1)[1].splitlines()[2:]:  # after its header and rule
            if not line.strip() or line.endswith(":") or line.startswith("pct:"):
                break  # the next table, or the legend
            rows.append(line.split())
        return rows

    assert len(table(full.stdout, "critical-path-top")) > 2
    assert table(cut.stdout, "critical-path-top") == table(full.stdout, "critical-path-top")[:2]
    assert table(cut.stdout, "critical-path") == table(full.stdout, "critical-path")
    assert table(cut.stdout, "critical-path")[-1][0] == "total"
