"""The bounded-memory sweeps the reports are made of (pipeline.analyses.sweep, Flat.activity / cpu).

Every piece that folds windows is checked against the whole-table answer: unions, percentiles,
float sums, prefix sums per thread, nesting with pending slices; and the reports of a trace read
in windows of a few events each equal those read in one window.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import polars as pl
import pytest

from pipeline import report as rp
from pipeline import synthetic as synth
from pipeline.analyses import sweep
from pipeline.analyses.cpu import is_slice
from pipeline.flatten import flatten
from pipeline.kineto import OP_CAT
from pipeline.link import nesting

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"


def _windows(cuts):
    edges = [None, *sorted(set(cuts)), None]
    return list(zip(edges[:-1], edges[1:], strict=False))


def _in(window, col="ts_ns"):
    a, b = window
    return (pl.lit(True) if a is None else pl.col(col) >= a) & (pl.lit(True) if b is None else pl.col(col) < b)


def _same(a, b, path="", rel=1e-12):
    """Equal documents: floats within `rel`, everything else exactly."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), path
        for k in a:
            _same(a[k], b[k], f"{path}.{k}", rel)
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            _same(x, y, f"{path}[{i}]", rel)
    elif isinstance(a, float) and isinstance(b, float):
        both_nan = math.isnan(a) and math.isnan(b)
        assert both_nan or math.isclose(a, b, rel_tol=rel, abs_tol=1e-9), f"{path}: {a} != {b}"
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


# ------------------------------------------------------------------ folding pieces
def test_run_tally_in_windows_equals_the_union_of_all_intervals():
    rng = random.Random(3)
    for _ in range(60):
        n = rng.randint(1, 120)
        ts = [rng.randint(0, 1000) for _ in range(n)]
        df = pl.DataFrame(
            {
                "k": [rng.randint(0, 2) for _ in range(n)],
                "s": [rng.choice([None, 1, 2]) for _ in range(n)],
                "ts_ns": ts,
                "end_ns": [t + rng.choice([0, rng.randint(0, 50)]) for t in ts],
            },
            schema={"k": pl.Int64, "s": pl.Int64, "ts_ns": pl.Int64, "end_ns": pl.Int64},
        )
        by = ["k", "s"]
        runs = sweep.interval_union(df, by).collect()
        want = (
            runs.group_by(by, maintain_order=True)
            .agg(
                start_ns=pl.col("start_ns").min(),
                end_ns=pl.col("end_ns").max(),
                busy_ns=(pl.col("end_ns") - pl.col("start_ns")).sum(),
                runs=pl.len().cast(pl.Int64),
                largest_gap_ns=(pl.col("start_ns") - pl.col("end_ns").shift(1)).max(),
            )
            .sort(by)
        )
        tally = sweep.RunTally(by)
        for w in _windows(rng.randint(0, 1000) for _ in range(rng.randint(0, 9))):
            tally.add(df.filter(_in(w)))
        assert tally.result({"k": pl.Int64, "s": pl.Int64}).sort(by).equals(want)


def test_quantiles_from_value_counts_equal_polars_nearest():
    rng = random.Random(5)
    qs = (0.5, 0.9, 0.99, 0.25)
    for _ in range(100):
        n = rng.randint(1, 80)
        df = pl.DataFrame({"d": [rng.randint(0, 2) for _ in range(n)], "v": [rng.randint(0, 30) for _ in range(n)]})
        got = sweep.quantiles_from_counts(df.group_by("d", "v").agg(n=pl.len()), ["d"], "v", qs).sort("d")
        want = df.group_by("d").agg(pl.col("v").quantile(q).alias(f"q{i}") for i, q in enumerate(qs)).sort("d")
        assert got.select(pl.all().cast(pl.Float64)).equals(want.select(pl.all().cast(pl.Float64)))


def test_float_sum_is_correctly_rounded_the_same_every_run():
    rng = random.Random(7)
    values = [rng.random() * rng.choice([1e-9, 1.0, 1e6, 1e15]) for _ in range(50_000)]
    df = pl.DataFrame({"g": [rng.randint(0, 40) for _ in values], "x": values})
    runs = {tuple(df.group_by("g").agg(s=sweep.float_sum("x")).sort("g")["s"]) for _ in range(5)}
    assert len(runs) == 1
    got = dict(zip(range(41), runs.pop(), strict=False))
    for g, part in df.group_by("g"):
        assert got[g[0]] == math.fsum(part["x"])
    edge = pl.DataFrame({"g": [1, 1, 2, 3, 3], "x": [None, None, 0.0, 1.0, float("inf")]})
    assert edge.group_by("g").agg(s=sweep.float_sum("x")).sort("g")["s"].to_list() == [0.0, 0.0, float("inf")]


def test_thread_prefix_sums_over_windows_equal_brute_force():
    rng = random.Random(11)
    points = [(rng.randint(1, 2), rng.randint(0, 500), rng.randint(1, 9)) for _ in range(300)]
    queries = [(rng.randint(1, 2), rng.randint(0, 500)) for _ in range(200)]
    prefix = sweep.ThreadPrefix(["tid"], ["v"])
    pts = pl.DataFrame(points, schema={"tid": pl.Int64, "t": pl.Int64, "v": pl.Int64}, orient="row")
    qs = pl.DataFrame(queries, schema={"tid": pl.Int64, "q": pl.Int64}, orient="row").with_row_index("i")
    for w in _windows([rng.randint(0, 500) for _ in range(6)]):
        prefix.enter(pts.filter(_in(w, "t")))
        mine = qs.filter(_in(w, "q"))
        before = prefix.at(mine, "q", inclusive=False)["v"].to_list()
        upto = prefix.at(mine, "q", inclusive=True)["v"].to_list()
        for (_i, tid, q), lo, hi in zip(mine.iter_rows(), before, upto, strict=False):
            assert lo == sum(v for p, t, v in points if p == tid and t < q)
            assert hi == sum(v for p, t, v in points if p == tid and t <= q)


def _nested_slices(rng: random.Random, n_threads=2, n_roots=30) -> list[tuple]:
    """Slices (event_idx, tid, ts, end), nested, zero-length and identical ones included, and some
    overlapping without nesting."""
    out = []

    def grow(tid, lo, hi, depth):
        t = lo
        while t < hi and depth < 5:
            length = rng.choice([0, 0, rng.randint(1, max(1, (hi - t) // 2))])
            end = min(hi, t + length)
            out.append((len(out), tid, t, end))
            if rng.random() < 0.2:
                out.append((len(out), tid, t, end))  # identical: nests in file order
            grow(tid, t, end, depth + 1)
            t = end + rng.randint(0, 20)

    for tid in range(n_threads):
        grow(tid, 0, 10_000, 0)
    for _ in range(n_roots):  # and some that overlap others without nesting
        t = rng.randint(0, 10_000)
        out.append((len(out), rng.randrange(n_threads), t, t + rng.randint(0, 3_000)))
    return out


@pytest.mark.parametrize("seed", [13, 14, 15])
def test_slice_sweep_nests_slices_as_all_of_them_at_once(tmp_path, seed):
    rng = random.Random(seed)
    slices = _nested_slices(rng)
    rng.shuffle(slices)  # file order is not time order
    events = [
        {"ph": "X", "cat": "cpu_op", "name": f"op{i}", "pid": 1, "tid": tid, "ts": ts, "dur": end - ts}
        for i, (_, tid, ts, end) in enumerate(slices)
    ]
    flat = rp.Flat(flatten(_write(tmp_path, events), tmp_path / "flat").out_dir)
    ev = pl.read_parquet(flat.path / "events.parquet")
    want = nesting.nesting(
        ev.select(iv_idx="event_idx", pid="pid", tid="tid", ts_ns="ts_ns", end_ns=pl.col("ts_ns") + pl.col("dur_ns")),
        nesting.LONGER_FIRST,
    )
    where = is_slice(OP_CAT)
    events_file = flat.path / "events.parquet"
    seen, final = [], []
    for per_window in (1, 5, 40):
        windows = sweep.time_windows(events_file, where, per_window)
        got = sweep.SliceSweep(events_file, where, (sweep.Nest("op"),), windows)
        seen, final = [], []
        for _, owned, done in got.windows():
            seen.append(owned.select("event_idx", "parent_op"))
            final.append(done.select("event_idx", "dur_ns", "child_op_ns"))
        parents = pl.concat(seen).sort("event_idx")
        expect = want.sort("iv_idx")
        assert parents["event_idx"].to_list() == expect["iv_idx"].to_list()
        assert parents["parent_op"].to_list() == expect["parent_idx"].to_list()
        done = pl.concat(final)
        assert done["event_idx"].is_unique().all() and done.height == ev.height
        child = (
            expect.drop_nulls("parent_idx")
            .join(ev.select("event_idx", "dur_ns"), left_on="iv_idx", right_on="event_idx")
            .group_by("parent_idx")
            .agg(pl.col("dur_ns").sum())
        )
        got_child = done.join(child, left_on="event_idx", right_on="parent_idx", how="left")
        assert got_child["child_op_ns"].to_list() == got_child["dur_ns_right"].fill_null(0).to_list()


def _write(tmp_path: Path, events: list) -> Path:
    src = tmp_path / "t.json"
    src.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    return src


# ------------------------------------------------------------------ reports in many windows
def _all_outputs(flat_dir: Path) -> dict:
    """Every report of a flattened directory (a fresh Flat: nothing cached)."""
    f = rp.Flat(flat_dir)
    out = {"analyze": rp.analysis_json(rp.analyze(f))}
    for g in ("input-shape", "overload", "stack"):
        out[g] = rp.op_table(f, group_by=g).to_dicts()
    for m in rp.STACK_METRICS:
        out[m] = rp.collapsed_stacks(f, m).to_dicts()
    out["diff"] = rp.diff_json(rp.diff(f, f))
    return out


@pytest.fixture(scope="module")
def synth_flat(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sweep")
    path = synth.write_trace(synth.make_trace(n_steps=6, ops_per_step=5, gpu_devices=(0, 1)), tmp / "s.json")
    return flatten(path, tmp / "flat").out_dir


@pytest.mark.parametrize("per_window", [1, 3, 17])
def test_reports_read_in_small_windows_equal_one_window(synth_flat, per_window, monkeypatch):
    whole = _all_outputs(synth_flat)
    monkeypatch.setattr(sweep, "PER_WINDOW", per_window)
    _same(_all_outputs(synth_flat), whole)


def test_cpu_only_reports_in_small_windows_equal_one_window(tmp_path, monkeypatch):
    ev = [
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": f"ProfilerStep#{s}",
            "pid": 1,
            "tid": 1,
            "ts": s * 100,
            "dur": 90,
            "args": {},
        }
        for s in range(4)
    ]
    ev += [
        {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": s * 100 + off, "dur": dur, "args": {}}
        for s in range(4)
        for name, off, dur in (("CompiledFunction", 5, 60), ("cpp_fused_add_0", 10, 20), ("aten::empty", 40, 5))
    ]
    out = flatten(_write(tmp_path, ev), tmp_path / "flat").out_dir
    whole = _all_outputs(out)
    assert whole["analyze"]["devices"][0]["device"] == rp.CPU_DEVICE
    monkeypatch.setattr(sweep, "PER_WINDOW", 1)
    _same(_all_outputs(out), whole)


@pytest.mark.real
def test_real_trace_in_small_windows_equals_one_window(tmp_path, monkeypatch):
    src = TRACES / "tracelens/h100_qwen1.5_0.5b.json.gz"
    if not src.is_file():
        pytest.skip("h100 qwen trace not present")
    out = flatten(src, tmp_path).out_dir
    whole = _all_outputs(out)
    monkeypatch.setattr(sweep, "PER_WINDOW", 500)
    _same(_all_outputs(out), whole)


def test_reports_do_not_hold_the_gpu_op_table(synth_flat):
    f = rp.Flat(synth_flat)
    rp.analyze(f)
    rp.collapsed_stacks(f)
    rp.diff_side(f)
    assert "gpu" not in f.__dict__  # the whole table (Flat.gpu) is for notebooks only
    assert f.activity.names.height < 100  # per name, not per GPU op


def test_times_are_exact_and_reports_the_same_every_run(tmp_path):
    """Sums of nanoseconds become µs once: 3,000 kernels of 0.1 µs sum to exactly 300 µs (float
    sums of 0.1 do not), and the document comes out byte for byte the same in a fresh process."""
    ev = [
        {
            "ph": "X",
            "cat": "kernel",
            "name": "k",
            "pid": 0,
            "tid": 7,
            "ts": i * 0.5,
            "dur": 0.1,
            "args": {"device": 0, "stream": 7},
        }
        for i in range(3000)
    ]
    out = flatten(_write(tmp_path, ev), tmp_path / "flat").out_dir
    docs = [rp.format_analysis(f, rp.analyze(f), "json") for f in (rp.Flat(out), rp.Flat(out))]
    assert docs[0] == docs[1]
    k = json.loads(docs[0])["devices"][0]["kernels"][0]
    assert (k["count"], k["dur_us"], k["mean_us"]) == (3000, 300.0, 0.1)
    assert sum([0.1] * 3000) != 300.0
