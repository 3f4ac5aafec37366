"""The single-trace analyses Holistic Trace Analysis users rely on (idle breakdown, launch queue,
kernel sequences, memory timeline) and analysis windows, against brute-force recounts in exact
Decimal time, on synthetic traces and on every shared trace."""

from __future__ import annotations

import bisect
import gzip
import json
from decimal import Decimal

import polars as pl
import pytest

from pipeline import report as rp
from pipeline import synthetic as synth
from pipeline.analyses.window import Window
from pipeline.cost.comm_kernels import library_of
from pipeline.flatten import flatten

GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset"}
LAUNCH_CATS = {"cuda_runtime", "cuda_driver", "runtime"}


def load_exact(path) -> list:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        d = json.load(f, parse_float=Decimal)
    return d["traceEvents"] if isinstance(d, dict) else d


def activity(ev) -> dict:
    """(device, stream) -> [(start, end, launch start or None, name, cat)] sorted by (start, end)."""
    launch = {}
    for e in ev:
        if str(e.get("cat", "")).lower() in LAUNCH_CATS and e.get("ph") == "X":
            c = e.get("args", {}).get("correlation")
            if c is not None:
                launch.setdefault(c, Decimal(str(e["ts"])))
    out: dict = {}
    for e in ev:
        cat = str(e.get("cat", "")).lower()
        a = e.get("args", {})
        if cat in GPU_CATS and e.get("ph") == "X" and a.get("device") is not None and a.get("stream") is not None:
            t = Decimal(str(e["ts"]))
            out.setdefault((a["device"], a["stream"]), []).append(
                (t, t + Decimal(str(e.get("dur") or 0)), launch.get(a.get("correlation")), e["name"], cat)
            )
    for v in out.values():
        v.sort(key=lambda x: (x[0], x[1]))
    return out


def comm_overlap(act) -> dict:
    """device -> overlap(a, b): the time in [a, b] when a communication kernel ran on the device."""
    out = {}
    for dev in {d for d, _ in act}:
        spans = sorted(
            (s, e) for (d, _), xs in act.items() if d == dev for s, e, _, n, cat in xs
            if cat == "kernel" and library_of(n)
        )  # fmt: skip
        merged: list = []
        for s, e in spans:
            if merged and s <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], e)
            else:
                merged.append([s, e])
        out[dev] = lambda a, b, m=merged, ends=[e for _, e in merged]: sum(
            (min(b, e) - max(a, s) for s, e in m[bisect.bisect_right(ends, a) :] if s < b), Decimal(0)
        )
    return out


def idle_recount(act, wait_us=30, concurrent_us=50):
    """HTA's idle breakdown: each gap from an activity's end to the next one's start, a negative one
    (consecutive kernels overlapping by the clock's jitter) summed as it is; but a stream whose
    activities run at once (an overlap of the stream's reach beyond concurrent_us) is taken as their
    union: a gap runs from the reach (the latest end before) to the next start, and an activity
    starting before the reach follows no gap. comm_wait: of the union's gaps."""
    res = {}
    overlap = comm_overlap(act)
    for key, xs in act.items():
        rows = []  # (gap, host, union gap, union host, comm)
        end = reach = xs[0][1] if xs else None
        for s1, e1, l1, _, _ in xs[1:]:
            gap, u_gap = s1 - end, s1 - reach
            comm = overlap[key[0]](reach, s1) if u_gap > 0 else 0
            rows.append((gap, l1 is not None and l1 > end, u_gap, l1 is not None and l1 > reach, comm))
            end, reach = e1, max(reach, e1)
        concurrent = any(-u > concurrent_us for _, _, u, _, _ in rows)
        hw = kw = ot = cw = Decimal(0)
        for gap, host, u_gap, u_host, comm in rows:
            if concurrent:
                if u_gap < 0:
                    continue
                gap, host = u_gap, u_host
            cw += comm
            if host:
                hw += gap
            elif gap < wait_us:
                kw += gap
            else:
                ot += gap
        res[key] = (float(hw), float(kw), float(ot), float(cw))
    return res


def queue_recount(act):
    res = {}
    for key, xs in act.items():
        pts = sorted([(x[2], 1) for x in xs if x[2] is not None] + [(x[0], -1) for x in xs if x[2] is not None])
        if not pts:
            continue
        q = mx = 0
        area, last = Decimal(0), pts[0][0]
        for t, d in pts:
            area += q * (t - last)
            last, q = t, q + d
            mx = max(mx, q)
        span = pts[-1][0] - pts[0][0]
        res[key] = (mx, float(area / span) if span else 0.0)
    return res


def sequence_recount(act, n):
    """Per device, {chain: (count, µs)} of the repeated chains, recounted from their definition: the
    runs of n kernels on a stream (m, a device's longest stream, when all are shorter than n), a run
    and the next in one chain when each occurs exactly where the other does (every occurrence of
    the one followed by the other, every occurrence of the other preceded by the one); chains that
    occur once left out, but on a device where no run repeats. A chain's µs: its kernels' in every
    occurrence, found anew as the places it occurs."""
    kernels = {key: [x for x in xs if x[4] == "kernel"] for key, xs in act.items()}
    out: dict = {}
    for dev in {d for d, _ in kernels}:
        streams = [xs for (d, _), xs in kernels.items() if d == dev]
        m = min(n, max(map(len, streams)))
        out[dev] = {}
        if m < 2:
            continue
        names = [[x[3] for x in xs] for xs in streams]
        count, after, before = {}, {}, {}
        for ns in names:
            runs = [tuple(ns[i : i + m]) for i in range(len(ns) - m + 1)]
            for i, r in enumerate(runs):
                count[r] = count.get(r, 0) + 1
                after.setdefault(r, []).append(runs[i + 1] if i + 1 < len(runs) else None)
                before.setdefault(r, []).append(runs[i - 1] if i else None)
        floor = 2 if max(count.values()) >= 2 else 1
        one = lambda xs: xs[0] if len(set(xs)) == 1 and xs[0] is not None else None
        follows = {r: one(after[r]) for r in count if count[r] >= floor}
        follows = {r: s for r, s in follows.items() if s is not None and one(before[s]) == r}
        for r in count:
            if count[r] < floor or r in follows.values():
                continue
            chain = list(r)
            while r in follows:
                r = follows[r]
                chain.append(r[-1])
            us = 0.0
            for xs in streams:
                for i in range(len(xs) - len(chain) + 1):
                    if [x[3] for x in xs[i : i + len(chain)]] == chain:
                        us += float(sum(x[1] - x[0] for x in xs[i : i + len(chain)]))
            out[dev][tuple(chain)] = (count[tuple(chain[:m])], us)
    return out


def ngram_count(act, dev, chain):
    """How often `chain` occurs as consecutive kernels on a stream of device `dev`, overlaps counted."""
    c = 0
    for (d, _), xs in act.items():
        names = [x[3] for x in xs if x[4] == "kernel"]
        if d == dev:
            c += sum(names[i : i + len(chain)] == list(chain) for i in range(len(names) - len(chain) + 1))
    return c


def check_trace(path, tmp_path):
    ev = load_exact(path)
    act = activity(ev)
    flat = flatten(path, tmp_path / "flat").out_dir
    got_idle = {(r["device"], r["stream"]): r for r in rp.idle(flat).iter_rows(named=True)}
    for key, (hw, kw, ot, cw) in idle_recount(act).items():
        r = got_idle[key]
        for name, want in (("host_wait_us", hw), ("kernel_wait_us", kw), ("other_us", ot), ("comm_wait_us", cw)):
            assert r[name] == pytest.approx(want, abs=1e-3), (path.name, key, name)
        assert r["idle_us"] == pytest.approx(hw + kw + ot, abs=1e-3)
    got_q = {(r["device"], r["stream"]): r for r in rp.queue(flat).iter_rows(named=True)}
    for key, (mx, mean) in queue_recount(act).items():
        assert got_q[key]["max"] == mx and got_q[key]["mean"] == pytest.approx(mean, rel=1e-9, abs=1e-9), key
    seqs = rp.sequences(flat, 3)
    for dev, chains in sequence_recount(act, 3).items():
        rows = seqs.filter(pl.col("device") == dev)
        assert rows.height == len(chains), dev  # every chain, once
        for kernels, count, dur_us in rows.select("kernels", "count", "dur_us").iter_rows():
            assert chains[tuple(kernels)] == (count, pytest.approx(dur_us, abs=1e-3)), (dev, kernels)
            assert ngram_count(act, dev, kernels) == count  # a chain occurs as often as its first run
        if chains:
            assert rows["count"][0] == max(c for c, _ in chains.values())  # the most frequent first
            if rows["count"][0] >= 2:
                assert rows["count"].min() >= 2  # no chain that occurs once, where some repeat
    return flat


def test_on_a_synthetic_trace(tmp_path):
    trace = synth.make_trace(n_steps=6, ops_per_step=5, gpu_devices=(0, 1))
    path = synth.write_trace(trace, tmp_path / "t.json")
    check_trace(path, tmp_path)


def test_a_device_with_short_streams_shows_its_longest_runs(tmp_path):
    """seq-len 3: device 0 has a stream of 4 kernels (runs of 3, none repeated: its stream is one
    chain); device 1 only streams of 2 kernels (runs of 2, not nothing); device 2 a single kernel
    (nothing)."""
    ev = []
    for dev, stream, names in ((0, 7, "ABAB"), (1, 7, "CD"), (1, 8, "CD"), (2, 7, "E")):
        for i, name in enumerate(names):
            ts = 100 * dev + 10 * i + stream
            ev.append(
                {"ph": "X", "cat": "kernel", "name": name, "pid": dev, "tid": stream, "ts": ts, "dur": 2,
                 "args": {"device": dev, "stream": stream, "correlation": 1000 * dev + 10 * stream + i}}
            )  # fmt: skip
    path = tmp_path / "short.json"
    path.write_text(json.dumps({"traceEvents": ev}))
    seqs = rp.sequences(flatten(path, tmp_path / "flat").out_dir, 3)
    got = {(d, tuple(k)): c for d, k, c in seqs.select("device", "kernels", "count").iter_rows()}
    assert got == {(0, ("A", "B", "A", "B")): 1, (1, ("C", "D")): 2}  # device 0 repeats no run: its stream once


@pytest.mark.real
def test_on_every_shared_trace(shared_traces, tmp_path):
    for path in sorted(shared_traces.glob("*/*.json.gz")):
        check_trace(path, tmp_path / path.stem)


@pytest.mark.real
def test_idle_equals_holistic_trace_analysis(shared_traces, tmp_path):
    """HTA 0.5.0's numbers (docs/hta_reference.json), HTA_DISABLE_NS_ROUNDING=1, on a trace where
    its quirks (a missing launch taken as event 0) do not apply."""
    flat = flatten(shared_traces / "hta/a100_nccl.json.gz", tmp_path).out_dir
    got = {r["stream"]: r for r in rp.idle(flat).iter_rows(named=True)}
    assert got[7]["host_wait_us"] == pytest.approx(540091.32, abs=0.05)
    assert got[7]["kernel_wait_us"] == pytest.approx(2150.34, abs=0.05)
    assert got[40]["host_wait_us"] == pytest.approx(583924.26, abs=0.05)


def _one_stream(tmp_path, spans):
    """The flattened trace of kernels at these (start, end) µs on device 0, stream 7."""
    ev = [
        {"ph": "X", "cat": "kernel", "name": f"k{i}", "pid": 0, "tid": 7, "ts": a, "dur": b - a}
        | {"args": {"device": 0, "stream": 7}}
        for i, (a, b) in enumerate(spans)
    ]
    path = tmp_path / "stream.json"
    path.write_text(json.dumps({"traceEvents": ev}))
    return flatten(path, tmp_path / "flat").out_dir


@pytest.mark.parametrize("per_window", [1000, 2])
def test_idle_of_overlapping_activities_is_their_unions(tmp_path, monkeypatch, per_window):
    """Activities that overlap on one stream (HCCL's tasks on Ascend) follow no gap: idle is the
    gaps of their union, never negative, also when windows of 2 rows split them."""
    from pipeline.analyses import gpu_order

    monkeypatch.setattr(gpu_order, "PER_WINDOW", per_window)
    spans = [(0, 100), (10, 20), (30, 40), (150, 160), (155, 200), (170, 180), (230, 240)]  # union gaps 50, 30
    flat = _one_stream(tmp_path, spans)
    r = rp.idle(flat).row(0, named=True)
    assert r["idle_us"] == pytest.approx(80) and r["other_us"] == pytest.approx(80) and r["kernel_wait_us"] == 0
    assert r["gaps"] == 2  # the activities inside another's span follow no gap
    stream = rp.analyze(flat, only=["streams"])["streams"].row(0, named=True)
    assert r["idle_us"] == pytest.approx(stream["span_us"] - stream["busy_us"])


def test_queue_counts_a_graph_launch_once_per_kernel(tmp_path):
    ev = [
        {
            "ph": "X",
            "cat": "cuda_runtime",
            "name": "cudaGraphLaunch",
            "pid": 1,
            "tid": 1,
            "ts": 0,
            "dur": 5,
            "args": {"correlation": 7},
        }
    ]
    ev += [
        {
            "ph": "X",
            "cat": "kernel",
            "name": f"k{i}",
            "pid": 0,
            "tid": 7,
            "ts": 10 + 2 * i,
            "dur": 1,
            "args": {"correlation": 7, "device": 0, "stream": 7},
        }
        for i in range(50)
    ]
    path = tmp_path / "graph.json"
    path.write_text(json.dumps({"traceEvents": ev}))
    q = rp.queue(flatten(path, tmp_path / "flat").out_dir, queue_full=40).row(0, named=True)
    assert q["max"] == 50 and q["launched"] == 50
    assert q["mean"] == pytest.approx(sum(10 + 2 * i for i in range(50)) / 108)
    assert q["blocked_us"] == pytest.approx(10 + 2 * 10)  # depth >= 40 from 0 to the 11th start (at 30)


def test_memory_peaks_and_ops(tmp_path):
    ev = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::empty", "pid": 1, "tid": 1, "ts": 0, "dur": 10, "args": {}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mul", "pid": 1, "tid": 1, "ts": 20, "dur": 10, "args": {}},
    ]
    mem = [
        (1, 100, 100, 512, 1),
        (21, 300, 400, 512, 1),
        (25, -100, 300, 512, 1),
        (26, 400, 700, 1024, 1),
        (27, 64, 64, 0, 0),
    ]
    for ts, b, total, res, dtype in mem:
        ev.append(synth.memory_event(ts, total, res, device=0 if dtype else -1, nbytes=b))
    path = tmp_path / "mem.json"
    path.write_text(json.dumps({"traceEvents": ev}))
    flat = flatten(path, tmp_path / "flat").out_dir
    m = {r["device"]: r for r in rp.analyze(flat, only=["memory"])["memory"].iter_rows(named=True)}
    assert m[0]["peak_allocated_bytes"] == 700 and m[0]["peak_at_us"] == pytest.approx(26.0)
    assert m[0]["peak_op"] == "aten::mul" and m[0]["peak_reserved_bytes"] == 1024
    assert m[-1]["peak_allocated_bytes"] == 64
    ops = {r["op"]: r for r in rp.analyze(flat, only=["allocations"])["allocations"].iter_rows(named=True)}
    assert ops["aten::mul"]["self_device_allocated_bytes"] == 700 and ops["aten::mul"]["self_device_net_bytes"] == 600
    assert ops["aten::empty"]["self_device_allocated_bytes"] == 100


def test_windows_restrict_every_analysis(tmp_path):
    trace = synth.make_trace(n_steps=5, ops_per_step=3)
    path = synth.write_trace(trace, tmp_path / "t.json")
    flat = flatten(path, tmp_path / "flat").out_dir
    whole = rp.kernel_table(flat)["count"].sum()
    f = rp.Flat(flat, window=Window(steps="2:3"))
    assert rp.kernel_table(f)["count"].sum() == whole * 2 // 5
    assert rp.idle(f)["gaps"].sum() == rp.idle(rp.Flat(flat, window=Window(steps="2")))["gaps"].sum() * 2 + 1
    start = Decimal(5000) * 1 + Decimal("10")  # µs after the first event: inside step 2
    g = rp.Flat(flat, window=Window(start_us=float(start), end_us=float(start + 5000)))
    assert 0 < rp.kernel_table(g)["count"].sum() < whole
    a = rp.Flat(flat, window=Window(annotation="ProfilerStep#4"))
    assert rp.kernel_table(a)["count"].sum() == whole // 5


def test_window_and_option_errors(tmp_path, run_cli):
    path = synth.write_trace(synth.make_trace(n_steps=2), tmp_path / "t.json")
    for args in (
        ["--steps", "x"],
        ["--steps", "5:2"],
        ["--steps", "9"],
        ["--annotation", "nope"],
        ["--start-us", "10", "--end-us", "5"],
        ["--seq-len", "1"],
    ):
        p = run_cli(["analyze", path, "--section", "idle", *args])
        assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, (args, p.stderr)


def test_comm_wait_follows_each_kernels_category_not_its_name_alone(tmp_path):
    """One kernel name, `foo`, launched by a c10d op (communication by its op) and by aten::add
    (not): stream 7's idle gap [10, 100] µs overlaps the first [20, 50] and the second [60, 80];
    only the first is communication, so comm_wait is 30 µs, not 50."""

    def op(name, ts, corr):
        return [
            {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": 4,
             "args": {"External id": corr}},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": ts + 1, "dur": 1,
             "args": {"correlation": corr, "External id": corr}},
        ]  # fmt: skip

    def kernel(name, stream, ts, dur, corr):
        args = {"device": 0, "stream": stream, "correlation": corr, "External id": corr}
        return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur, "args": args}

    ev = [*op("c10d::allreduce_", 15, 1), *op("aten::add", 55, 2)]
    ev += [kernel("foo", 8, 20, 30, 1), kernel("foo", 8, 60, 20, 2)]
    ev += [kernel("A", 7, 0, 10, 3), kernel("B", 7, 100, 10, 4)]
    path = tmp_path / "mixed.json"
    path.write_text(json.dumps({"traceEvents": ev}))
    flat = flatten(path, tmp_path / "flat").out_dir
    ops = pl.read_parquet(flat / "gpu_ops.parquet")
    assert sorted(ops.filter(pl.col("name") == "foo")["cpu_op_name"].to_list()) == ["aten::add", "c10d::allreduce_"]
    got = {r["stream"]: r for r in rp.idle(flat).iter_rows(named=True)}
    assert got[7]["idle_us"] == pytest.approx(90.0)
    assert got[7]["comm_wait_us"] == pytest.approx(30.0)


def test_idle_of_kernels_overlapping_by_the_clock_s_jitter_is_hta_s(tmp_path):
    """Consecutive kernels of a stream that overlap by a few µs (the clock's jitter: 1-13 µs on the
    shared V100 and H100 traces) give a negative gap summed as HTA sums it, not their union."""
    r = rp.idle(_one_stream(tmp_path, [(0, 100), (98, 150), (200, 210)])).row(0, named=True)  # gaps -2, 50
    assert (r["idle_us"], r["kernel_wait_us"], r["other_us"], r["gaps"]) == (48.0, -2.0, 50.0, 2)


def test_a_step_the_trace_lacks_is_told_with_the_steps_it_holds(tmp_path):
    """A profiler schedule's wait and warm-up steps are not recorded (a schedule of wait=1,
    warmup=1, active=3 records ProfilerStep#2 to #4): a `--steps` naming none of those recorded
    says which the trace holds."""
    flat = flatten(synth.write_trace(synth.make_trace(n_steps=3), tmp_path / "t.json"), tmp_path / "flat").out_dir
    with pytest.raises(rp.UsageError, match=r"no such ProfilerStep \(it holds ProfilerStep#1 to #3\)$"):
        rp.kernel_table(rp.Flat(flat, window=Window(steps="7:9")))
    only = synth.make_trace(n_steps=1)
    one = flatten(synth.write_trace(only, tmp_path / "one.json"), tmp_path / "one").out_dir
    with pytest.raises(rp.UsageError, match=r"\(it holds ProfilerStep#1 only\)$"):
        rp.kernel_table(rp.Flat(one, window=Window(steps="3")))
    bare = [e for e in only["traceEvents"] if "ProfilerStep" not in str(e.get("name"))]
    none = flatten(synth.write_trace({**only, "traceEvents": bare}, tmp_path / "n.json"), tmp_path / "n").out_dir
    with pytest.raises(rp.UsageError, match=r"\(it records none: --start-us/--end-us or --annotation"):
        rp.kernel_table(rp.Flat(none, window=Window(steps="1")))
    three = synth.make_trace(n_steps=3)
    holed = [e for e in three["traceEvents"] if e.get("name") != "ProfilerStep#2"]
    gap = flatten(synth.write_trace({**three, "traceEvents": holed}, tmp_path / "g.json"), tmp_path / "g").out_dir
    with pytest.raises(rp.UsageError, match=r"\(it holds ProfilerStep#1 to #3, 1 of them missing\)$"):
        rp.kernel_table(rp.Flat(gap, window=Window(steps="5")))
