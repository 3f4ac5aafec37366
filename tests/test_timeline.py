"""Timelines for Perfetto: slice (a window of a trace), lanes (slices that cannot nest moved to
sibling tracks), augment's counter and critical-path tracks, combine of a run on one clock.

Drawability is judged by `perfetto_model` (Perfetto's JSON importer, modelled from its sources)."""

from __future__ import annotations

import gzip
import json
from dataclasses import replace
from pathlib import Path

import polars as pl
import pytest
from perfetto_model import import_trace, load

from conftest import run_cli
from pipeline import synthetic as synth
from pipeline.analyses.window import Window
from pipeline.errors import UsageError
from pipeline.flatten import flatten
from pipeline.rewrite import lanes
from pipeline.rewrite.augment import augment
from pipeline.rewrite.combine import combine
from pipeline.rewrite.run_slice import parse_ranks, slice_run
from pipeline.rewrite.slice import slice_trace


def write(path: Path, events: list, **top) -> Path:
    doc = {"schemaVersion": 1, "traceEvents": events, **top}
    op = gzip.open if path.name.endswith(".gz") else open
    with op(path, "wt") as f:
        json.dump(doc, f)
    return path


def x(name, ts, dur, pid=1, tid=1, cat="cpu_op", **args) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def flow(ph, fid, ts, pid, tid, cat="ac2g") -> dict:
    e = {"ph": ph, "id": fid, "pid": pid, "tid": tid, "ts": ts, "cat": cat, "name": cat}
    if ph == "f":
        e["bp"] = "e"
    return e


def as_float(v) -> float:
    return float(v) if v is not None else 0.0


# ------------------------------------------------------------------ lanes
def test_partial_overlap_moves_to_a_named_sibling_track_with_its_flow(tmp_path):
    evs = [
        {"ph": "M", "name": "thread_name", "pid": 0, "tid": 7, "args": {"name": "stream 7"}},
        x("A", 100, 10, pid=0, tid=7, cat="kernel"),
        x("B", 105, 10, pid=0, tid=7, cat="kernel", correlation=5),  # starts inside A, ends after it
        x("C", 120, 2, pid=0, tid=7, cat="kernel"),
        x("launch", 90, 1, pid=1, tid=1, cat="cuda_runtime", correlation=5),
        flow("s", 5, 90, 1, 1),
        flow("f", 5, 105, 0, 7),
    ]
    src = write(tmp_path / "t.json", evs)
    r = flatten(src, tmp_path / "flat", link=False)
    plan = lanes.plan(pl.scan_parquet(r.out_dir / "events.parquet"), pl.scan_parquet(r.out_dir / "flows.parquet"))
    assert plan.moved == 1
    b_idx, f_idx = 2, 6
    # the slice and the flow end bound to it move together, to a thread named by its tid
    assert plan.tid[b_idx] == plan.tid[f_idx] == "stream 7 · overlapping slices"
    assert import_trace({"traceEvents": evs}).overlaps  # the model sees what Perfetto would spill
    out = tmp_path / "aug.json"
    augment(src, out)
    m = import_trace(load(out))
    assert not m.overlaps and m.flows == 1 and m.unbound == 0


def test_nested_and_adjacent_slices_stay_put():
    evs = pl.DataFrame(
        {
            "event_idx": [0, 1, 2, 3, 4],
            "pid": [1] * 5,
            "pid_str": [None] * 5,
            "tid": [1] * 5,
            "tid_str": [None] * 5,
            "ts_ns": [0, 0, 10, 10, 30],  # equal starts: the longer is the parent
            "end_ns": [50, 10, 30, 10, 50],  # ends at a parent's end, zero-length, adjacent
        },
        schema_overrides={"pid_str": pl.String, "tid_str": pl.String},
    )
    assert lanes.lanes_of(evs).height == 0


def test_lanes_cascade_until_every_track_nests():
    """Three slices each starting inside the previous one: two lanes, each nesting."""
    evs = pl.DataFrame(
        {"event_idx": [0, 1, 2], "pid": [1] * 3, "tid": [1] * 3, "ts_ns": [0, 5, 8], "end_ns": [10, 15, 20]}
    ).with_columns(pid_str=pl.lit(None, pl.String), tid_str=pl.lit(None, pl.String))
    moved = lanes.lanes_of(evs).sort("event_idx")
    assert moved["event_idx"].to_list() == [1, 2] and moved["lane"].to_list() == [1, 2]


@pytest.mark.parametrize(
    "trace,moved",
    [
        ("tracelens/b200_eager", 42),
        ("hta/diff_test_v100", 24),
        ("tracelens/mi300x_vllm_graph_capture", 100),
        ("ascend/npu_2024_msprof_advisor", 38),
    ],
)
def test_augment_of_real_traces_draws_in_perfetto(shared_traces, tmp_path, trace, moved):
    src = shared_traces / f"{trace}.json.gz"
    before = import_trace(load(src))
    out = tmp_path / "aug.json.gz"
    r = augment(src, out)
    after = import_trace(load(out))
    assert len(before.overlaps) > 0 and r.n_moved == moved
    assert after.overlaps == [] and after.flows == before.flows and after.dropped == before.dropped
    strings = lambda doc: {e["tid"] for e in doc["traceEvents"] if isinstance(e.get("tid"), str)}
    moved_to = strings(load(out)) - strings(load(src))
    assert moved_to and all("· overlapping slices" in t for t in moved_to)


# ------------------------------------------------------------------ augment's tracks
def test_augment_carries_queue_memory_and_critical_path(shared_traces, tmp_path):
    out = tmp_path / "aug.json.gz"
    r = augment(shared_traces / "tracelens/h100_qwen1.5_0.5b.json.gz", out)
    d = load(out)
    ev = d["traceEvents"]
    queue = [e for e in ev if e.get("ph") == "C" and e["name"] == "launch queue"]
    memory = [e for e in ev if e.get("ph") == "C" and e["name"] == "memory allocated"]
    assert queue and memory and r.added["launch queue"] == len(queue)
    assert all(v >= 0 for e in queue for v in e["args"].values())
    # the queue's depth ends at 0 on every stream: each launch was matched by its start
    last = {}
    for e in sorted(queue, key=lambda e: as_float(e["ts"])):
        last.update(e["args"])
    assert set(last.values()) == {0}
    path = [e for e in ev if e.get("cat") == "critical_path"]
    proc = {e["pid"] for e in ev if e.get("name") == "process_name" and e["args"]["name"] == "critical path"}
    assert path and {e["pid"] for e in path} == proc
    # contiguous segments: each ends at most a ns or two before the next starts
    path.sort(key=lambda e: as_float(e["ts"]))
    gaps = [as_float(b["ts"]) - (as_float(a["ts"]) + as_float(a["dur"])) for a, b in zip(path, path[1:])]
    assert min(gaps) >= -1e-6 and max(gaps) <= 0.0021
    m = import_trace(d)
    assert not m.overlaps
    assert any(name.startswith("launch queue stream") for _, name in m.counter_tracks)
    # the findings: an instant each, with the findings section's own record (id, title, saving range)
    doc = json.loads(
        run_cli(["analyze", shared_traces / "tracelens/h100_qwen1.5_0.5b.json.gz", "--format", "json"]).stdout
    )
    instants = [e["args"] for e in ev if e.get("cat") == "finding"]
    assert doc["findings"] and r.added["findings"] == len(instants) == len(doc["findings"])
    for got, want in zip(instants, doc["findings"]):
        assert (got["id"], got["title"], got["remedy"]) == (want["id"], want["title"], want["remedy"])
        assert [got["gain_low_us"], got["gain_high_us"]] == want["gain_us"]
        assert [got["gain_low_pct"], got["gain_high_pct"]] == want["gain_pct"]


# ------------------------------------------------------------------ slice
def _slice_truth(src: Path, a_frac: float, b_frac: float):
    d = load(src)
    ev = d["traceEvents"]
    t0 = min(as_float(e["ts"]) for e in ev if e.get("ph") != "M" and e.get("ts") is not None)
    xs = [e for e in ev if e.get("ph") == "X"]
    span = max(as_float(e["ts"]) + as_float(e.get("dur")) for e in xs) - t0
    return d, t0, xs, a_frac * span, b_frac * span


@pytest.mark.parametrize("a,b", [(0.4, 0.6), (0.3, 0.301)])
def test_slice_of_a_real_trace(shared_traces, tmp_path, a, b):
    src = shared_traces / "hta/a100_nccl.json.gz"
    d, t0, xs, a, b = _slice_truth(src, a, b)
    out = tmp_path / "slice.json.gz"
    r = slice_trace(src, out, Window(start_us=a, end_us=b))
    o = load(out)
    oev = o["traceEvents"]

    def inwin(e):
        return as_float(e["ts"]) < t0 + b and as_float(e["ts"]) + as_float(e.get("dur")) > t0 + a

    key = lambda e: (e.get("name"), e.get("ts"), e.get("dur"), e.get("pid"), e.get("tid"))
    want = {key(e) for e in xs if inwin(e)}
    got = [e for e in oev if e.get("ph") == "X"]
    assert want <= {key(e) for e in got}
    corr = {(e.get("args") or {}).get("correlation") for e in xs if inwin(e)} - {None}
    extra = [e for e in got if not inwin(e)]
    assert all(e["args"].get("correlation") in corr for e in extra)
    # links survive: every kept launch's kernel and every kept kernel's launch
    kept_corr = {}
    for e in got:
        c = (e.get("args") or {}).get("correlation")
        if c:
            kept_corr.setdefault(c, set()).add(e["cat"])
    every = {}
    for e in xs:
        c = (e.get("args") or {}).get("correlation")
        if c in kept_corr:
            every.setdefault(c, set()).add(e["cat"])
    assert kept_corr == every
    if b - a < 10_000:
        assert r.n_linked > 0  # a narrow window cuts launches from their kernels: they are brought in
    ends = {}
    for e in oev:
        if e.get("ph") in ("s", "f"):
            ends.setdefault((e["cat"], e["id"], e["name"]), set()).add(e["ph"])
    assert ends and all(v == {"s", "f"} for v in ends.values())
    assert set(d) - {"traceEvents"} <= set(o) and "slicedFrom" in o
    assert sum(1 for e in oev if e.get("ph") == "M") == sum(1 for e in d["traceEvents"] if e.get("ph") == "M")
    assert len(oev) < len(d["traceEvents"]) and out.stat().st_size < src.stat().st_size
    m = import_trace(o)
    assert not m.overlaps and m.unbound == 0 and m.flows == len(ends)


@pytest.mark.parametrize("workers", [1, 2])
def test_slice_parses_only_the_pieces_it_keeps_events_of(shared_traces, tmp_path, monkeypatch, workers):
    """The writing pass reads the pieces as flatten did and parses those holding kept events
    only (a narrow window of a100_nccl read in 64 kB pieces: a few of them); the output is the one of a
    pass that parses every piece, also where the pieces disagree with flatten's counts."""
    import zlib

    from pipeline.flatten import flatten as real_flatten
    from pipeline.rewrite import jsonout
    from pipeline.rewrite import slice as sl

    src = tmp_path / "a100_nccl.json"  # uncompressed: with workers, pieces are file spans
    src.write_bytes(zlib.decompress((shared_traces / "hta/a100_nccl.json.gz").read_bytes(), 31))
    _, _, _, a, b = _slice_truth(src, 0.5, 0.501)
    parsed = []

    def counted(text):
        parsed.append(len(text))
        return jsonout.parse_events(text)

    monkeypatch.setattr(sl, "parse_events", counted)
    kw = {"workers": workers, "chunk_bytes": 1 << 16}
    sl.slice_trace(src, tmp_path / "fast.json", Window(start_us=a, end_us=b), **kw)
    flat = real_flatten(src, tmp_path / "flat", link=False, **kw)
    assert flat.chunking is not None and 2 <= len(parsed) <= len(flat.chunking.rows) // 4
    monkeypatch.setattr(sl, "flatten", lambda *a, **k: replace(real_flatten(*a, **k), chunking=None))
    sl.slice_trace(src, tmp_path / "all.json", Window(start_us=a, end_us=b), **kw)
    assert (tmp_path / "fast.json").read_bytes() == (tmp_path / "all.json").read_bytes()
    wrong = replace(flat.chunking, rows=(1, *flat.chunking.rows))  # pieces and counts disagree
    monkeypatch.setattr(sl, "flatten", lambda *a, **k: replace(real_flatten(*a, **k), chunking=wrong))
    sl.slice_trace(src, tmp_path / "again.json", Window(start_us=a, end_us=b), **kw)
    assert (tmp_path / "again.json").read_bytes() == (tmp_path / "all.json").read_bytes()


def test_slice_pairs_counters_flows_and_steps(tmp_path):
    evs = [
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "python"}},
        x("ProfilerStep#1", 0, 100, cat="user_annotation"),
        x("ProfilerStep#2", 100, 100, cat="user_annotation"),
        x("op1", 10, 20),
        x("op2", 120, 20),
        {"ph": "B", "name": "long", "pid": 1, "tid": 2, "ts": 50},
        {"ph": "E", "pid": 1, "tid": 2, "ts": 150},
        {"ph": "B", "name": "early", "pid": 1, "tid": 2, "ts": 10},
        {"ph": "E", "pid": 1, "tid": 2, "ts": 20},
        {"ph": "C", "name": "mem", "pid": 1, "ts": 5, "args": {"v": 1}},
        {"ph": "C", "name": "mem", "pid": 1, "ts": 60, "args": {"v": 2}},
        {"ph": "C", "name": "mem", "pid": 1, "ts": 130, "args": {"v": 3}},
        x("fwd", 20, 5, tid=3),
        x("bwd", 125, 5, tid=3),
        flow("s", 9, 20, 1, 3, cat="fwdbwd"),  # from step 1 to step 2: not whole in step 2
        flow("f", 9, 125, 1, 3, cat="fwdbwd"),
    ]
    src = write(tmp_path / "t.json", evs, distributedInfo={"rank": 0})
    out = tmp_path / "s.json"
    slice_trace(src, out, Window(steps="2"))
    o = load(out)
    names = [e.get("name") for e in o["traceEvents"]]
    assert "op2" in names and "op1" not in names and "early" not in names
    assert names.count("long") == 1 and sum(1 for e in o["traceEvents"] if e.get("ph") == "E") == 1
    mem = sorted((e["ts"], e["args"]["v"]) for e in o["traceEvents"] if e.get("ph") == "C")
    assert mem == [(100, 2), (130, 3)]  # the value in force at the window's start, then the window's
    assert not [e for e in o["traceEvents"] if e.get("ph") in ("s", "f")]
    assert o["distributedInfo"] == {"rank": 0} and o["slicedFrom"]["window_us"] == [[100, 200]]


def test_slice_refuses_no_window_and_empty_windows(tmp_path):
    src = write(tmp_path / "t.json", [x("a", 0, 10)])
    with pytest.raises(UsageError):
        slice_trace(src, tmp_path / "o.json", Window())
    with pytest.raises(UsageError):
        slice_trace(src, tmp_path / "o.json", Window(steps="3"))
    p = run_cli(["slice", src, "-o", tmp_path / "o.json"])
    assert p.returncode == 2 and "needs a window" in p.stderr and "Traceback" not in p.stderr
    p = run_cli(["slice", src, "--ranks", "0", "--steps", "1", "-o", tmp_path / "o.json"])
    assert p.returncode == 2 and "run folder" in p.stderr
    assert not (tmp_path / "o.json").exists()


def test_parse_ranks():
    assert parse_ranks("all") is None and parse_ranks("0,2-3") == {0, 2, 3}
    with pytest.raises(UsageError):
        parse_ranks("3-1")


# ------------------------------------------------------------------ a run on one clock
OFFSETS = [0.0, 850.0, -400.0, 1200.0]


@pytest.fixture(scope="module")
def skewed_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("skewed") / "run"
    truth = synth.write_run(d, 4, 24, straggler=1, delay_us=3000.0, delayed=5, offsets_us=OFFSETS)
    return d, truth


def _ends_by_rank(ev: list) -> dict:
    rank_of = {}
    for e in ev:
        if e.get("ph") == "M" and e.get("name") == "process_name" and str(e["args"]["name"]).startswith("rank "):
            rank_of[e["pid"]] = int(e["args"]["name"].split()[1])
    ends: dict = {}
    for e in ev:
        if e.get("ph") == "X" and e.get("cat") == "kernel" and "nccl" in e["name"].lower() and e["pid"] in rank_of:
            ends.setdefault(rank_of[e["pid"]], []).append(as_float(e["ts"]) + as_float(e["dur"]))
    return ends


def test_combine_run_on_aligned_clocks(skewed_run, tmp_path):
    run_dir, truth = skewed_run
    out = tmp_path / "run.json.gz"
    r = combine([run_dir], out, align="clocks")
    d = load(out)
    ev = d["traceEvents"]
    ends = _ends_by_rank(ev)
    assert sorted(ends) == [0, 1, 2, 3]
    n = min(len(v) for v in ends.values())
    spread = max(max(sorted(v)[i] for v in ends.values()) - min(sorted(v)[i] for v in ends.values()) for i in range(n))
    assert spread < 20  # µs; clocks were off by up to 1.6 ms
    shifts = {s["rank"]: s["clock_offset_us"] for s in d["combinedFrom"]}
    assert shifts == pytest.approx({k: v - OFFSETS[0] for k, v in enumerate(OFFSETS)}, abs=5)
    flows = {}
    for e in ev:
        if e.get("cat") == "collective" and e.get("ph") in ("s", "f"):
            flows.setdefault(e["id"], set()).add(e["ph"])
    assert r.run.n_collectives == 24 and len(flows) == 24 * 3 and all(v == {"s", "f"} for v in flows.values())
    waits = [e for e in ev if e.get("cat") == "collective_wait"]
    late = [e for e in ev if e.get("cat") == "collective_straggler"]
    assert any("rank 1" in e["name"] and e["args"]["longest_wait_caused_us"] > 2500 for e in late)
    assert sum(1 for e in waits if e["args"]["wait_us"] > 2500) == 3  # the three ranks that waited for rank 1
    m = import_trace(d)
    assert not m.overlaps and m.unbound == 0


def test_slice_of_a_run_then_combine(skewed_run, tmp_path):
    run_dir, _ = skewed_run
    res = slice_run(run_dir, tmp_path / "cut", Window(steps="1:2"))
    assert sorted(p.out_path.name for p in res) == [f"rank-{r}.json.gz" for r in range(4)]
    p = run_cli(["combine", tmp_path / "cut", "--align", "clocks", "-o", tmp_path / "cut.json"])
    assert p.returncode == 0, p.stderr
    assert "collectives linked across ranks" in p.stdout
    ends = _ends_by_rank(load(tmp_path / "cut.json")["traceEvents"])
    assert sorted(ends) == [0, 1, 2, 3] and len(ends[0]) < 24


def test_combine_a_runs_dataset_as_its_folder(skewed_run, tmp_path):
    """A batch dataset is often all that is kept of a run: its events table rebuilds each rank."""
    from pipeline.dataset.batch import run_batch

    run_dir, _ = skewed_run
    run_batch(run_dir, tmp_path / "ds", jobs=1)
    combine([run_dir], tmp_path / "folder.json", align="clocks")
    r = combine([tmp_path / "ds"], tmp_path / "ds.json", align="clocks")
    a, b = load(tmp_path / "folder.json"), load(tmp_path / "ds.json")
    assert r.run.n_collectives == 24 and all(i.trace_id for i in r.inputs)

    def key(e: dict) -> str:  # times as numbers: 50.0 in a trace is 50 once rebuilt from ns
        return json.dumps({**e, **{k: float(e[k]) for k in ("ts", "dur") if k in e}}, sort_keys=True)

    assert sorted(map(key, a["traceEvents"])) == sorted(map(key, b["traceEvents"]))

    def meta(d: dict) -> dict:  # the top-level keys, but where each input was read from
        return {k: v for k, v in d.items() if k != "traceEvents"} | {
            "combinedFrom": [{k: v for k, v in s.items() if k != "path"} for s in d["combinedFrom"]]
        }

    assert len(a["deviceProperties"]) == 4 and all("distributedInfo" in s for s in a["combinedFrom"])
    assert meta(a) == meta(b)  # each rank's deviceProperties and distributedInfo too


def test_combine_a_real_run_draws(shared_traces, tmp_path):
    """dlrm8_v100: 8 real ranks with epoch-µs times and a shared "Spans" pseudo-process: shifts in
    whole µs keep the times exact, each rank's spans stay on its own track."""
    run = shared_traces.parent / "runs" / "dlrm8_v100"
    if not run.is_dir():
        pytest.skip("no real runs beside the traces")
    r = combine([run], tmp_path / "dlrm.json.gz", align="clocks")
    d = load(tmp_path / "dlrm.json.gz")
    assert r.run.n_collectives == 8 and all(i.shift_ns % 1000 == 0 for i in r.inputs)
    m = import_trace(d)
    assert not m.overlaps and m.unbound == 0
    names = {e["args"]["name"] for e in d["traceEvents"] if e.get("name") == "process_name"}
    assert {n.split(" · ")[0] for n in names if n.startswith("rank ")} == {f"rank {k}" for k in range(8)}
    assert sum(1 for e in d["traceEvents"] if e.get("cat") == "collective" and e["ph"] == "f") == 8 * 7
