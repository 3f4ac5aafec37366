"""The Chrome Trace Event Format as specified: B/E pairs as one duration on the B row (nested per
thread, across chunks and workers alike), ids beyond int64 kept, every phase kept."""

from __future__ import annotations

import json
import random
from decimal import Decimal
from pathlib import Path

import polars as pl
import pytest

from pipeline.flatten import flatten

UINT64_TID = 2**64 - 1


def be_trace(n_threads: int = 3, depth: int = 4, rounds: int = 60, seed: int = 1) -> list:
    """Nested B/E events on threads with uint64 ids, interleaved across threads, in time order per
    thread; a few args on the B and E rows."""
    rng = random.Random(seed)
    ts = {t: 1000.0 for t in range(n_threads)}
    open_: dict = {t: [] for t in range(n_threads)}
    out = []
    for k in range(rounds * n_threads):
        t = rng.randrange(n_threads)
        ts[t] += rng.choice([0.5, 1.25, 3.0])
        tid = UINT64_TID - t
        if open_[t] and (len(open_[t]) >= depth or rng.random() < 0.45):
            name = open_[t].pop()
            out.append({"ph": "E", "pid": 7, "tid": tid, "ts": ts[t], "args": {"out": k}})
        else:
            name = f"op{k}"
            open_[t].append(name)
            out.append({"ph": "B", "name": name, "cat": "aiu", "pid": 7, "tid": tid, "ts": ts[t], "args": {"in": k}})
    for t in range(n_threads):  # close all but one B, left open: unmatched
        while len(open_[t]) > (1 if t == 0 else 0):
            ts[t] += 1
            open_[t].pop()
            out.append({"ph": "E", "pid": 7, "tid": UINT64_TID - t, "ts": ts[t]})
    return out


def durations_of(events: list) -> tuple[dict, int]:
    """The reference pairing: per (pid, tid), an E closes the latest open B; B index -> dur (ns)."""
    open_: dict = {}
    out = {}
    for i, e in enumerate(events):
        key = (e.get("pid"), e.get("tid"))
        if e["ph"] == "B":
            open_.setdefault(key, []).append(i)
        elif e["ph"] == "E" and open_.get(key):
            b = open_[key].pop()
            out[b] = round((e["ts"] - events[b]["ts"]) * 1000)
    return out, sum(map(len, open_.values()))


@pytest.mark.parametrize("workers, chunk_bytes", [(1, None), (1, 1024), (2, 1024)])
def test_begin_end_pairs_are_one_duration_on_the_begin_row(tmp_path, workers, chunk_bytes):
    events = be_trace()
    path = tmp_path / "aiu.json"
    path.write_text(json.dumps(events))
    r = flatten(path, tmp_path / "out", workers=workers, chunk_bytes=chunk_bytes, link=False)
    ev = pl.read_parquet(r.out_dir / "events.parquet")
    want, left_open = durations_of(events)
    assert left_open == 1
    got = dict(zip(ev["event_idx"], ev["dur_ns"]))
    assert {i: got[i] for i in want} == want
    assert all(got[i] is None for i, e in enumerate(events) if e["ph"] == "E")
    assert ev.height == len(events)
    assert r.problems.get("unmatched:B_never_ended") == 1
    assert not any(k.startswith("dropped:") for k in r.problems)
    assert set(ev["tid_str"]) == {str(UINT64_TID - t) for t in range(3)}
    assert set(ev["tid"]) == {-1 - t for t in range(3)}  # the uint64's bits, for grouping and joins


def test_unmatched_begin_end_are_counted_by_reason(tmp_path):
    events = [
        {"ph": "E", "pid": 1, "tid": 1, "ts": 1},  # closes nothing
        {"ph": "B", "pid": 1, "tid": 1, "ts": 5, "name": "late"},
        {"ph": "E", "pid": 1, "tid": 1, "ts": 4},  # before its B in time
        {"ph": "B", "pid": 1, "tid": 2, "name": "no time"},
        {"ph": "E", "pid": 1, "tid": 2, "ts": 6},
        {"ph": "B", "pid": 1, "tid": 1, "ts": 7, "name": "open"},
    ]
    path = tmp_path / "odd.json"
    path.write_text(json.dumps({"traceEvents": events}))
    r = flatten(path, tmp_path / "out", link=False)
    assert {k: v for k, v in r.problems.items() if k.startswith("unmatched:")} == {
        "unmatched:E_without_open_B_on_its_thread": 1,
        "unmatched:E_before_its_B_in_time": 1,
        "unmatched:B_or_E_without_ts": 1,
        "unmatched:B_never_ended": 1,
    }
    assert pl.read_parquet(r.out_dir / "events.parquet")["dur_ns"].null_count() == len(events)


EVERY_PHASE = [  # one event of each phase the format defines, with the keys it allows
    {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "runtime"}},
    {"ph": "X", "name": "x", "cat": "c", "pid": 1, "tid": 2, "ts": 1, "dur": 2, "tts": 1, "tdur": 1, "cname": "good"},
    {"ph": "B", "name": "b", "pid": 1, "tid": 2, "ts": 3, "sf": 7, "stack": ["0x1", "0x2"]},
    {"ph": "E", "pid": 1, "tid": 2, "ts": 4, "args": {"result": 0}},
    {"ph": "i", "name": "i", "pid": 1, "tid": 2, "ts": 4, "s": "g"},
    {"ph": "I", "name": "I", "pid": 1, "tid": 2, "ts": 4},
    {"ph": "C", "name": "ctr", "pid": 1, "ts": 5, "id": "0x1", "args": {"cats": 0, "dogs": 7.5}},
    {"ph": "b", "name": "async", "cat": "a", "pid": 1, "tid": 2, "ts": 5, "id2": {"local": "0xeb"}, "scope": "s"},
    {"ph": "n", "name": "async", "cat": "a", "pid": 1, "tid": 2, "ts": 6, "id2": {"global": "0xea"}},
    {"ph": "e", "name": "async", "cat": "a", "pid": 1, "tid": 2, "ts": 7, "id": 18446744073709551615},
    {"ph": "s", "name": "flow", "cat": "f", "pid": 1, "tid": 2, "ts": 5, "id": "0x5"},
    {"ph": "t", "name": "flow", "cat": "f", "pid": 1, "tid": 2, "ts": 6, "id": "0x5"},
    {"ph": "f", "name": "flow", "cat": "f", "pid": 1, "tid": 2, "ts": 7, "id": "0x5", "bp": "e"},
    {"ph": "X", "name": "v2", "pid": 1, "tid": 2, "ts": 8, "dur": 1, "bind_id": "0x9", "flow_out": True},
    {"ph": "X", "name": "v2in", "pid": 1, "tid": 3, "ts": 9, "dur": 1, "bind_id": "0x9", "flow_in": True},
    {"ph": "P", "name": "sample", "pid": 1, "tid": 2, "ts": 9, "sf": 7},
    {"ph": "N", "name": "obj", "pid": 1, "ts": 10, "id": "0x100"},
    {"ph": "O", "name": "obj", "pid": 1, "ts": 11, "id": "0x100", "args": {"snapshot": {"a": [1, 2]}}},
    {"ph": "D", "name": "obj", "pid": 1, "ts": 12, "id": "0x100"},
    {"ph": "R", "name": "mark", "pid": 1, "tid": 2, "ts": 12},
]


@pytest.mark.parametrize("form", ["object", "array"])
def test_every_phase_and_key_the_format_allows_is_kept(tmp_path, form):
    doc = {"traceEvents": EVERY_PHASE, "displayTimeUnit": "ns", "otherData": {"v": 1}}
    doc = doc if form == "object" else EVERY_PHASE
    path = tmp_path / "every.json"
    path.write_text(json.dumps(doc))
    r = flatten(path, tmp_path / "out", link=False)
    assert not any(k.startswith(("dropped:", "unmatched:")) for k in r.problems), r.problems
    ev = pl.read_parquet(r.out_dir / "events.parquet").sort("event_idx")
    assert ev["ph"].to_list() == [e["ph"] for e in EVERY_PHASE]
    known = {"ph", "cat", "name", "pid", "tid", "ts", "dur", "args", "id"}
    for e, row in zip(EVERY_PHASE, ev.iter_rows(named=True)):
        extra = {k: v for k, v in e.items() if k not in known}
        assert (json.loads(row["extra_json"]) if row["extra_json"] else {}) == extra
        assert (json.loads(row["args_json"]) if row["args_json"] else None) == e.get("args")
        if isinstance(e.get("id"), str):
            assert row["id_str"] == e["id"]
    assert ev.filter(pl.col("ph") == "B")["dur_ns"].to_list() == [1000]
    assert ev.filter(pl.col("ph") == "e")["id_str"].to_list() == ["18446744073709551615"]
    if form == "object":
        meta = json.loads(pl.read_parquet(r.out_dir / "trace.parquet")["metadata_json"][0])
        assert meta["displayTimeUnit"] == "ns" and meta["otherData"] == {"v": 1}


def test_batch_pairs_begin_end_of_each_trace_apart(tmp_path):
    """Small traces decoded together in a batch group pair their B/E each on its own."""
    from pipeline.dataset.batch import run_batch
    from pipeline.dataset.query import run as query

    src = tmp_path / "src"
    src.mkdir()
    for k in range(3):  # the same thread in each: pairs must not cross traces
        events = [{"ph": "B", "name": f"t{k}", "pid": 1, "tid": UINT64_TID, "ts": 10 + k}]
        if k != 1:
            events.append({"ph": "E", "pid": 1, "tid": UINT64_TID, "ts": 20 + 2 * k})
        (src / f"t{k}.json").write_text(json.dumps(events))
    run_batch(src, tmp_path / "ds", jobs=1)
    sql = "select t.stem, e.ph, e.dur_ns from events e join trace t using (trace_id) order by 1, 2"
    got = {(r["stem"], r["ph"]): r["dur_ns"] for r in query(tmp_path / "ds", sql).to_dicts()}
    assert got[("t0", "B")] == 10_000 and got[("t2", "B")] == 12_000 and got[("t1", "B")] is None
    problems = query(tmp_path / "ds", "select stem, problems_json from trace order by 1").to_dicts()
    assert [json.loads(p["problems_json"]).get("unmatched:B_never_ended") for p in problems] == [None, 1, None]


# ------------------------------------------------------------------ B/E slices downstream
GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}


def _sum_us(ts, dur):
    """ts + dur as the JSON number of their exact decimal sum (a float sum can be 1 ns off)."""
    exact = Decimal(repr(ts)) + Decimal(repr(dur))
    return int(exact) if exact == exact.to_integral_value() else float(exact)


def as_begin_end(trace: dict) -> dict:
    """The trace with every CPU slice written as a B/E pair: the Bs in start order (the longer
    first), then the Es in reverse (each closes the latest open B on its thread: its own)."""
    keep, cpu = [], []
    for i, e in enumerate(trace["traceEvents"]):
        x = e.get("ph") == "X" and str(e.get("cat", "")).lower() not in GPU_CATS
        (cpu if x else keep).append((i, e) if x else e)
    cpu.sort(key=lambda p: (p[1]["ts"], -p[1]["dur"], p[0]))
    begins = [{**{k: v for k, v in e.items() if k != "dur"}, "ph": "B"} for _, e in cpu]
    ends = [{"ph": "E", "pid": e["pid"], "tid": e["tid"], "ts": _sum_us(e["ts"], e["dur"])} for _, e in cpu]
    return {**trace, "traceEvents": keep + begins + ends[::-1]}


def test_begin_end_slices_are_linked_and_analysed_as_complete_events(tmp_path, run_cli):
    """A trace whose CPU ops, launches and annotations are B/E pairs analyses exactly as the same
    trace of X events: links, costs, idle, queue, ops, critical path, findings."""
    from pipeline import synthetic as synth

    t = synth.make_trace(n_steps=4, ops_per_step=6)
    x, be = synth.write_trace(t, tmp_path / "x.json"), synth.write_trace(as_begin_end(t), tmp_path / "be.json")
    a, b = (json.loads(run_cli(["analyze", p, "--format", "json"]).stdout) for p in (x, be))
    for doc in (a, b):
        doc.pop("trace")
    assert a["ops"] and a["critical_path"]["breakdown_us"]["cpu"] > 0 and a == b


def test_begin_end_slices_move_whole_to_sibling_tracks(tmp_path):
    """A B/E slice that partially overlaps an X slice on its thread moves with its E (augment,
    slice): every track nests and every pair stays whole."""
    from perfetto_model import import_trace

    from pipeline.rewrite.augment import augment
    from pipeline.rewrite.slice import slice_trace

    ev = [
        {"ph": "X", "cat": "cpu_op", "name": "outer", "pid": 1, "tid": 1, "ts": 0, "dur": 10},
        {"ph": "B", "cat": "cpu_op", "name": "late", "pid": 1, "tid": 1, "ts": 5},
        {"ph": "X", "cat": "cpu_op", "name": "inner", "pid": 1, "tid": 1, "ts": 6, "dur": 2},
        {"ph": "E", "pid": 1, "tid": 1, "ts": 15},
        {"ph": "B", "cat": "cpu_op", "name": "next", "pid": 1, "tid": 1, "ts": 20},
        {"ph": "E", "pid": 1, "tid": 1, "ts": 30},
    ]
    src = tmp_path / "be.json"
    src.write_text(json.dumps({"traceEvents": ev}))
    assert import_trace({"traceEvents": ev}).overlaps
    for out in (tmp_path / "aug.json", tmp_path / "cut.json"):
        if out.name == "aug.json":
            augment(src, out)
        else:
            slice_trace(src, out, start_us=0, end_us=40)
        doc = json.loads(out.read_text())
        got = [e for e in doc["traceEvents"] if e.get("pid") == 1 and e.get("ph") in ("X", "B", "E")]
        tid = {(e["ph"], e.get("name"), e["ts"]): e["tid"] for e in got}
        assert tid[("B", "late", 5)] == tid[("E", None, 15)] != 1 and tid[("X", "inner", 6)] == 1, out.name
        assert tid[("B", "next", 20)] == tid[("E", None, 30)] == 1 and tid[("X", "outer", 0)] == 1
        assert not import_trace(doc).overlaps


def test_a_begin_rebuilt_from_its_row_has_no_duration():
    """combine DATASET writes a B as the trace had it: its E gives its duration, no `dur`."""
    from pipeline.rewrite.from_tables import event_of

    row = {"ph": "B", "cat": None, "name": "op", "pid": 1, "pid_str": None, "tid": 2, "tid_str": None}
    row |= {"ts_ns": 5000, "dur_ns": 3000, "id": None, "id_str": None}
    assert event_of(row, None, None) == {"ph": "B", "name": "op", "pid": 1, "tid": 2, "ts": 5}
    assert event_of({**row, "ph": "X"}, None, None)["dur"] == 3


def test_a_run_of_begin_end_traces_reads_as_the_same_run_of_complete_events(tmp_path, run_cli):
    """`ranks` of a real gloo run (tests/data/runs/gloo4) with every CPU slice of every rank written
    as a B/E pair: the same collectives, waits, steps and stragglers as the run as recorded."""
    import gzip

    src = Path(__file__).parent / "data" / "runs" / "gloo4"
    for form in ("x", "be"):
        (tmp_path / form).mkdir()
        for rank in sorted(src.glob("rank-*.json.gz")):
            trace = json.loads(gzip.decompress(rank.read_bytes()))
            for e in trace["traceEvents"]:
                e.setdefault("dur", 0) if e.get("ph") == "X" else None
            (tmp_path / form / rank.name.removesuffix(".gz")).write_text(
                json.dumps(as_begin_end(trace) if form == "be" else trace)
            )
    x, be = (run_cli(["ranks", tmp_path / form, "--format", "json"]) for form in ("x", "be"))
    assert x.returncode == be.returncode == 0, x.stderr + be.stderr
    a, b = (json.loads(p.stdout.replace(f"{tmp_path}/be", f"{tmp_path}/x")) for p in (x, be))
    runs = a["runs"][0]
    assert runs["collectives"] and any(max(c["wait_us"].values()) > 0 for c in runs["collectives"])
    assert a == b
