"""torch_npu traces (Ascend NPUs, layout `torch_npu`): device tasks on the `Ascend Hardware` process
as gpu_ops, exact to the ns, with their device, stream and kind; linked to their launch and op
through their flows; counters kept; HCCL collectives matched across ranks. On the real traces and
run in ../shared (truth beside them, reconciled with the job's own CSVs) and, for what Level0 does
not record (HCCL plane tasks), on traces built from msprof's definitions of those events."""

from __future__ import annotations

import csv
import gzip
import json
import re
from decimal import Decimal
from pathlib import Path

import polars as pl
import pytest

from conftest import PEAK_RSS
from pipeline import kineto
from pipeline.flatten import flatten
from pipeline.read.rank import rank_of
from pipeline.runs.report import analyze_runs, runs_json

ASCEND = "ascend/npu_level0_rank0"
OLDER = "ascend/npu_2024_msprof_advisor"


def _ns(ts: str) -> int:
    return int((Decimal(str(ts)) * 1000).to_integral_value())


def _load(path: Path) -> list:
    with gzip.open(path, "rt") as f:
        return json.load(f)


def _flat(path: Path, out: Path) -> dict[str, pl.DataFrame]:
    r = flatten(path, out, workers=1)
    return {
        t: pl.read_parquet(r.out_dir / f"{t}.parquet") for t in ("events", "gpu_ops", "trace", "collectives", "steps")
    }


@pytest.fixture(scope="module")
def level0(shared_traces, tmp_path_factory):
    path = shared_traces / f"{ASCEND}.json.gz"
    if not path.exists():
        pytest.skip(f"{path} not found")
    truth = json.loads((shared_traces / f"{ASCEND}.truth.json").read_text())
    return path, _load(path), truth, _flat(path, tmp_path_factory.mktemp("npu"))


def _processes(ev: list) -> dict:
    return {e["pid"]: e["args"]["name"] for e in ev if e.get("ph") == "M" and e.get("name") == "process_name"}


@pytest.mark.real
def test_device_tasks_are_gpu_ops_exact_to_the_ns(level0):
    _, ev, truth, t = level0
    hw = {p for p, n in _processes(ev).items() if n == "Ascend Hardware"}
    tasks = {i: e for i, e in enumerate(ev) if e.get("ph") == "X" and e.get("pid") in hw}
    g = t["gpu_ops"]
    assert t["trace"]["layout"][0] == "torch_npu"
    assert g.height == len(tasks) == truth["n_device_tasks"]
    assert set(g["event_idx"]) == set(tasks)
    # every start from its decimal text, never through a float (a float64 is 0.125 µs off here)
    assert all(r["ts_ns"] == _ns(tasks[r["event_idx"]]["ts"]) for r in g.iter_rows(named=True))
    assert all(abs(r["dur_ns"] - float(tasks[r["event_idx"]]["dur"]) * 1000) <= 0.5 for r in g.iter_rows(named=True))
    assert abs(g["dur_ns"].sum() / 1e3 - sum(truth["device_task_total_us"].values())) < 0.5
    assert set(g["device"]) == {int(d) for d in truth["device_task_total_us"]}  # pid & 31
    per_stream = dict(g.group_by("stream").len().iter_rows())
    assert per_stream == {int(s): v["n"] for s, v in truth["per_stream"].items()}
    kinds = dict(g.group_by("kind").len().iter_rows())
    by_class = truth["by_class"]
    assert kinds == {
        "memcpy": by_class["memcpy"]["n"],
        "sync": by_class["event_sync"]["n"],
        "kernel": by_class["compute"]["n"] + by_class["hccl"]["n"],
    }
    hccl = g.filter(pl.col("stream") == 4, pl.col("kind") == "kernel")
    assert set(hccl["category"]) == {"communication"} and hccl.height == by_class["hccl"]["n"]


@pytest.mark.real
def test_kernels_equal_the_jobs_own_kernel_details(level0, shared_traces):
    """torch_npu's kernel_details.csv (the job's own export) lists the compute kernels: each is a
    kernel of gpu_ops at the same start to the ns, and the same duration (the CSV keeps 3 decimals)."""
    _, _, _, t = level0
    with open(shared_traces / "ascend/npu_level0_rank0_csv/kernel_details.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["Type"] != "hcom_allReduce_"]
    compute = [r for r in rows if not r["Name"].startswith("hcom_")]
    g = t["gpu_ops"].filter(pl.col("kind") == "kernel", pl.col("category") != "communication")
    got = {(r["name"], r["ts_ns"]): r["dur_ns"] for r in g.iter_rows(named=True)}
    assert len(compute) == len(got) == 187
    for r in compute:
        key = (r["Name"], _ns(r["Start Time(us)"].strip()))
        assert key in got, key
        assert abs(got[key] - float(r["Duration(us)"]) * 1000) <= 1.0, key


@pytest.mark.real
def test_step_compute_time_equals_the_jobs_step_trace_time(level0, shared_traces):
    """step_trace_time.csv's Computing (the union of the step's compute kernels), within a ns per
    kernel (each duration is rounded to the ns)."""
    _, _, _, t = level0
    with open(shared_traces / "ascend/npu_level0_rank0_csv/step_trace_time.csv", newline="") as f:
        step = next(csv.DictReader(f))
    s = t["steps"]
    assert s["step"].to_list() == [f"ProfilerStep#{step['Step']}"]
    assert abs(s["compute_ns"][0] - float(step["Computing"]) * 1000) <= 187


@pytest.mark.real
def test_tasks_are_linked_to_their_launch_and_op_through_their_flows(level0):
    _, ev, _, t = level0
    g = {r["event_idx"]: r for r in t["gpu_ops"].iter_rows(named=True)}
    at = {(e["pid"], e["tid"], e["ts"]): i for i, e in enumerate(ev) if e.get("ph") == "X"}
    starts = {(e["cat"], str(e["id"])): e for e in ev if e.get("ph") == "s"}
    ops = [e for e in ev if e.get("cat") == "cpu_op"]
    is_api = lambda name: any(re.search(p, name) and not (u and re.search(u, name)) for p, u in kineto.API_OPS)
    n_op = n_launch = 0
    for e in ev:
        if e.get("ph") != "f" or e.get("cat") not in ("async_npu", "HostToDevice"):
            continue
        task = g.get(at.get((e["pid"], e["tid"], e["ts"])))
        if task is None:
            continue  # a flow to the HCCL lane: a collective, not a device task
        s = starts[(e["cat"], str(e["id"]))]
        t_s = _ns(s["ts"])
        if e["cat"] == "async_npu":  # the op the flow starts at, or the op around it if that is the API call
            n_op += 1
            assert task["cpu_op_link"] == "op_flow"
            op = ev[task["cpu_op_event_idx"]]
            assert op["cat"] == "cpu_op" and op["tid"] == s["tid"] and not is_api(op["name"])
            assert _ns(op["ts"]) <= t_s <= _ns(op["ts"]) + round(float(op["dur"]) * 1000)
            inner = [o for o in ops if o["tid"] == s["tid"] and o["ts"] == s["ts"]]
            assert op in inner or all(is_api(o["name"]) for o in inner)  # it starts there, else the API call does
        else:  # HostToDevice: starts inside the Dequeue@ call that launched it, on that thread
            n_launch += 1
            call = ev[task["launch_event_idx"]]
            assert call["cat"] == "dequeue" and call["tid"] == s["tid"]
            assert _ns(call["ts"]) <= t_s <= _ns(call["ts"]) + round(float(call["dur"]) * 1000)
    assert n_op == 206 and n_launch == 211
    # the ops carry their shapes: the matmuls are costed
    mm = [r for r in g.values() if r["cpu_op_name"] == "aten::mm"]
    assert mm and all(r["flops"] and r["flops"] > 0 for r in mm)


@pytest.mark.real
def test_counter_tracks_and_every_event_are_kept(level0):
    _, ev, truth, t = level0
    events = t["events"]
    assert events.height == len(ev) == truth["n_events"]
    counters = events.filter(pl.col("ph") == "C")
    assert counters.height == truth["ph_counts"]["C"]
    freq = counters.filter(pl.col("name") == "AI Core Freq")
    assert [json.loads(a)["MHz"] for a in freq["args_json"]] == [1800.0, 1800.0]
    problems = json.loads(t["trace"]["problems_json"][0])
    assert problems["coerced:ts_string_to_number"] == sum(1 for e in ev if isinstance(e.get("ts"), str))
    assert not any(k.startswith("dropped:") for k in problems)


@pytest.mark.real
def test_the_older_layout_and_its_pid_scheme(shared_traces, tmp_path):
    """torch_npu of early 2024 (CANN 7): `Stream Id`, the device in `pid % 100`
    (msprof's host pid * 10000 + sort index * 100 + device): a device 1 written so is device 1."""
    path = shared_traces / f"{OLDER}.json.gz"
    if not path.exists():
        pytest.skip(f"{path} not found")
    ev = _load(path)
    truth = json.loads((shared_traces / f"{OLDER}.truth.json").read_text())
    t = _flat(path, tmp_path / "a")
    g = t["gpu_ops"]
    assert g.height == truth["n_device_tasks"] and set(g["device"]) == {0} and set(g["stream"]) == {3}
    assert g.filter(pl.col("cpu_op_link") == "op_flow").height == truth["flows"]["async_npu"]["n_f"]
    # the same trace with its Ascend Hardware process written for device 1 of host pid 437675: by the
    # CANN 8 scheme its pid would say device 17
    hw = next(p for p, n in _processes(ev).items() if n == "Ascend Hardware")
    moved = 437675 * 10000 + 8 * 100 + 1
    assert moved % 32 == 17 and (moved // 32) % 32 != 8
    for e in ev:
        if e.get("pid") == hw:
            e["pid"] = moved
    p = tmp_path / "moved.json"
    p.write_text(json.dumps(ev))
    g2 = _flat(p, tmp_path / "b")["gpu_ops"]
    assert set(g2["device"]) == {1} and g2.height == g.height
    assert g2.drop("device").equals(g.drop("device").with_columns(pid=pl.lit(moved, pl.Int64)))


@pytest.mark.real
def test_the_2rank_hccl_run(shared_traces, tmp_path):
    """The real 2-rank run: its 4 all-reduces matched on both ranks, with their sizes, and rank 1,
    which started 16.9 ms late, the straggler; the same from the run folder (one streaming pass per
    trace) and from a dataset (the flattened tables)."""
    from pipeline.dataset.batch import run_batch

    run = shared_traces.parent / "runs" / "ascend_level0_2rank"
    if not run.is_dir():
        pytest.skip(f"{run} not found")
    truth = json.loads((run.parent / "ascend_level0_2rank.truth.json").read_text())
    run_batch(run, tmp_path / "ds", jobs=1)
    got = []
    for source in (run, tmp_path / "ds"):
        r = runs_json(analyze_runs(source))["runs"][0]
        assert r["ranks"] == truth["ranks_present"]
        colls = r["collectives"]
        assert len(colls) == truth["n_collectives"] and sorted(c["bytes"] for c in colls) == truth["bytes"]
        assert all(c["ranks_present"] == 2 and c["name"] == "allreduce" and c["last_rank"] == 1 for c in colls[:1])
        assert r["stragglers"][0]["rank"] == truth["straggler_of_largest_skew"]
        skew = max(c["start_skew_us"] for c in colls)
        assert skew == pytest.approx(truth["largest_start_skew_us"], abs=20)  # clocks aligned: offset 8 µs
        got.append(r)
    assert got[0]["collectives"] == got[1]["collectives"]
    flat = _flat(run / "rank0.json.gz", tmp_path / "flat")["collectives"]
    assert sorted(flat["bytes"]) == truth["bytes"]
    assert set(flat["op_name"]) == {"c10d::allreduce_"} and set(flat["pg_name"]) == {"0"}
    want = {c["name"]: c for c in truth["collectives"] if c["rank"] == 0}
    for c in flat.iter_rows(named=True):
        assert abs(c["ts_ns"] / 1e3 - want[c["name"]]["start_us"]) < 1 and c["source"] == "hccl_op"
        assert abs(c["dur_ns"] / 1e3 - want[c["name"]]["dur_us"]) < 0.001


# ------------------------------------------------------------------ Level1: HCCL plane tasks
GROUP = "10.0.0.1%eth0_6000"


def level1_trace(rank: int, world: int, late_us: float = 0.0, wait_us: float = 0.0) -> list:
    """A torch_npu trace_view.json of one rank of a `world`-rank job at Level1, as msprof writes it
    (analysis/csrc/application/timeline/hccl_assembler.cpp, ascend_hardware_assembler.cpp): device
    tasks on `Ascend Hardware`, the HCCL process's `Group <name> Communication` lane with two
    all-reduces (`count`, `data_type`), and on its `Plane 0` / `Plane 1` lanes their tasks: a Memcpy
    to each peer over HCCS (`size(Byte)`), a Notify_Wait (no size). No real Level1 trace is at hand:
    the events follow msprof's definitions of them. The rank starts its first collective `late_us`
    late, or waits `wait_us` in it for a late rank."""
    host = 4000 + rank
    hw, hccl = (host << 10) | (13 << 5) | rank, (host << 10) | (15 << 5) | rank
    t0 = 1_736_405_443_000_000.0
    ts = lambda us: f"{t0 + us:.3f}"
    ev: list = [
        {"ph": "M", "name": "process_name", "pid": host, "tid": 0, "args": {"name": "Python"}},
        {"ph": "M", "name": "process_name", "pid": hw, "tid": 0, "args": {"name": "Ascend Hardware"}},
        {"ph": "M", "name": "process_sort_index", "pid": hw, "tid": 0, "args": {"sort_index": 13}},
        {"ph": "M", "name": "process_name", "pid": hccl, "tid": 0, "args": {"name": "HCCL"}},
        {"ph": "M", "name": "process_sort_index", "pid": hccl, "tid": 0, "args": {"sort_index": 15}},
        {"ph": "M", "name": "thread_name", "pid": hccl, "tid": 0, "args": {"name": f"Group {GROUP} Communication"}},
        {"ph": "M", "name": "thread_name", "pid": hccl, "tid": 1, "args": {"name": "Plane 0"}},
        {"ph": "M", "name": "thread_name", "pid": hccl, "tid": 2, "args": {"name": "Plane 1"}},
        {"ph": "X", "cat": "cpu_op", "name": "ProfilerStep#3", "pid": host, "tid": host, "ts": ts(0), "dur": 6000.0,
         "args": {}},
    ]  # fmt: skip
    task = lambda name, kind, start, dur: {
        "ph": "X", "name": name, "pid": hw, "tid": 4, "ts": ts(start), "dur": dur,
        "args": {"Model Id": 4294967295, "Task Type": kind, "Physic Stream Id": 4, "Task Id": int(start),
                 "Batch Id": 0, "Subtask Id": 4294967295, "connection_id": 1},
    }  # fmt: skip
    for i, count in enumerate((1 << 20, 3 << 20)):
        start = 1000.0 + 2500 * i + (late_us if i == 0 else 0.0)
        dur = 1500.0 + (wait_us if i == 0 else 0.0)
        ev.append(
            {"ph": "X", "name": f"hcom_allReduce__868_{i}_1", "pid": hccl, "tid": 0, "ts": ts(start), "dur": dur,
             "args": {"connection_id": 10 + i, "model id": 4294967295, "data_type": "BFP16", "alg_type": "MESH",
                      "count": count, "relay": "no", "retry": "no"}}
        )  # fmt: skip
        ev.append(task("Notify Wait", "Notify Wait", start, 200.0))
        for j, peer in enumerate(p for p in range(world) if p != rank):
            at = start + 200 + 150 * j
            ev.append(task("SDMA", "SDMA", at, 100.0))
            ev.append(
                {"ph": "X", "name": "Memcpy", "pid": hccl, "tid": 1 + j % 2, "ts": ts(at), "dur": 100.0,
                 "args": {"notify_id": "18446744073709551615", "duration estimated(us)": 90.0, "stream id": 4,
                          "task id": int(at), "context id": 4294967295, "task type": "Memcpy", "src rank": rank,
                          "dst rank": peer, "transport type": "SDMA", "size(Byte)": count * 2 // world,
                          "data type": "BFP16", "link type": "HCCS", "bandwidth(GB/s)": 10.0, "model id": 4294967295}}
            )  # fmt: skip
        ev.append(
            {"ph": "X", "name": "Notify_Wait", "pid": hccl, "tid": 1, "ts": ts(start), "dur": 200.0,
             "args": {"notify_id": "1", "duration estimated(us)": 1.0, "stream id": 4, "task id": 1, "context id": 0,
                      "task type": "Notify_Wait", "src rank": (rank + 1) % world, "dst rank": rank,
                      "transport type": "LOCAL", "size(Byte)": 0, "data type": "INVALID_TYPE",
                      "link type": "INVALID_TYPE", "bandwidth(GB/s)": 0, "model id": 4294967295}}
        )  # fmt: skip
    return ev


def test_level1_plane_tasks_give_link_types_transit_bytes_and_the_world_size(tmp_path):
    """Two ranks of an 8-rank job profiled (world size in no metadata): the planes of each name every
    peer (a mesh), so the communicator's size is known, and each collective's bytes moved on HCCS."""
    run = tmp_path / "run"
    run.mkdir()
    for r in (0, 1):
        (run / f"rank{r}.json").write_text(json.dumps(level1_trace(r, 8, late_us=700.0 * r, wait_us=700.0 * (1 - r))))
    c = _flat(run / "rank1.json", tmp_path / "flat")["collectives"]
    assert c["bytes"].to_list() == [2 << 20, 6 << 20] and set(c["dtype"]) == {"bf16"}
    assert set(c["device"]) == {1} and set(c["pg_size"]) == {8} and set(c["link_type"]) == {"HCCS"}
    assert c["transit_bytes"].to_list() == [7 * ((1 << 21) // 8), 7 * ((3 << 21) // 8)]
    assert c["transit_ns"].to_list() == [700_000, 700_000]
    assert set(c["pg_name"]) == {GROUP}
    r = runs_json(analyze_runs(run))["runs"][0]
    assert r["world_size"] == 8 and r["ranks"] == [0, 1] and r["missing_ranks"] == [2, 3, 4, 5, 6, 7]
    assert r["stragglers"][0]["rank"] == 1 and len(r["collectives"]) == 2
    assert [x["bytes"] for x in r["collectives"]] == [2 << 20, 6 << 20]
    assert all(x["busbw_gbps"] == pytest.approx(x["algbw_gbps"] * 2 * 7 / 8) for x in r["collectives"])


def test_torch_npu_output_folders_give_the_rank_and_the_run(tmp_path):
    """torch_npu writes <run>/<worker>_ascend_pt/ASCEND_PROFILER_OUTPUT/trace_view.json and, beside,
    profiler_info_<rank>.json and JSON files that are no traces: a run folder of them is one run."""
    from pipeline.runs.scan.folder import trace_files

    for r in (0, 1):
        d = tmp_path / "job" / f"node_{1234 + r}_20250101_ascend_pt"
        (d / "ASCEND_PROFILER_OUTPUT").mkdir(parents=True)
        (d / "ASCEND_PROFILER_OUTPUT" / "trace_view.json").write_text(json.dumps(level1_trace(r, 2)))
        (d / "ASCEND_PROFILER_OUTPUT" / "communication.json").write_text("{}")
        (d / f"profiler_info_{r}.json").write_text(json.dumps({"rank_id": r}))
        (d / "PROF_000001" / "mindstudio_profiler_output").mkdir(parents=True)
        (d / "PROF_000001" / "mindstudio_profiler_output" / "msprof_1.json").write_text("[]")
    files = trace_files(str(tmp_path / "job"))
    assert [Path(f).name for f in files] == ["trace_view.json"] * 2
    assert [rank_of(f, {}) for f in files] == [(0, "profiler_info"), (1, "profiler_info")]
    r = runs_json(analyze_runs(tmp_path / "job"))["runs"]
    assert len(r) == 1 and r[0]["ranks"] == [0, 1] and not r[0]["problems"]
    assert kineto.is_trace_path("a/rank0.json") and not kineto.is_trace_path("x_ascend_pt/profiler_info_0.json")
    assert kineto.is_trace_path("x_ascend_pt/ASCEND_PROFILER_OUTPUT/trace_view.json.gz")
    assert rank_of("/nowhere/rank3_ascend_pt/ASCEND_PROFILER_OUTPUT/trace_view.json", {}) == (3, "folder name")


def test_torch_npu_input_texts_and_device_ids():
    assert kineto.canonical_args({"Input Dims": "32,3,224;\r\n64;\r\n;\r\n", "Input type": "float;\r\nNone"}) == {
        "Input Dims": [[32, 3, 224], [64], [], []],
        "Input type": ["float", "None"],
    }
    assert kineto.canonical_args({"Input Dims": [[2]]}) == {"Input Dims": [[2]]}  # Kineto's lists as they are
    bits, decimal = (4000 << 10) | (13 << 5) | 5, 437675 * 10000 + 8 * 100 + 5
    assert kineto.task_device(bits, 13) == 5 and kineto.task_device(decimal, 8) == 5
    assert kineto.task_device(bits, None) == 5  # no sort index: CANN 8's scheme
    assert kineto.task_kind("EVENT_WAIT_SQE", "EVENT_WAIT") == "sync"
    assert kineto.task_kind("Other", "MEMCPY_ASYNC") == "memcpy" and kineto.task_kind("AI_CORE", "Add") == "kernel"


@pytest.mark.real
def test_augment_writes_each_costed_task_back(level0, tmp_path):
    """augment puts the costs on the device tasks themselves (events without a cat), every event's
    time as it was (ts still decimal strings)."""
    from pipeline.rewrite.augment import augment

    path, ev, _, t = level0
    augment(path, tmp_path / "aug.json.gz", workers=1)
    with gzip.open(tmp_path / "aug.json.gz", "rt") as f:
        out = json.load(f)["traceEvents"]
    costed = {r["event_idx"] for r in t["gpu_ops"].iter_rows(named=True) if r["kind"] == "kernel" and r["flops"]}
    got = {i for i, e in enumerate(out) if "kernel_flop" in e.get("args", {})}
    assert costed and costed <= got
    assert all("cat" not in out[i] for i in got)
    assert [e.get("ts") for e in out[: len(ev)]] == [e.get("ts") for e in ev]  # the timeline tracks come after


@pytest.mark.real
def test_hccl_streams_idle_cause_and_device_name(shared_traces, tmp_path):
    """HCCL's tasks overlap on their stream: its idle time is the gaps of their union (never
    negative, span - busy as the streams section has it); they have no launch because HCCL issues
    them itself, not because they were queued before profiling (cause `library_task`, no remedy);
    the device, named nowhere in the trace, is an Ascend NPU, not unknown."""
    from pipeline import report as rp

    path = shared_traces / f"{ASCEND}.json.gz"
    if not path.exists():
        pytest.skip(f"{path} not found")
    flat = flatten(path, tmp_path, workers=1).out_dir
    s = rp.analyze(flat, only=["idle", "streams", "coverage", "devices"])
    streams = {r["stream"]: r for r in s["streams"].iter_rows(named=True)}
    idle = {r["stream"]: r for r in s["idle"].iter_rows(named=True)}
    assert set(idle) == {2, 3, 4}
    for k, r in idle.items():
        assert min(r["idle_us"], r["host_wait_us"], r["kernel_wait_us"], r["other_us"]) >= 0, (k, r)
        assert r["idle_us"] == pytest.approx(streams[k]["span_us"] - streams[k]["busy_us"], abs=1e-3), k
    assert idle[4]["idle_us"] == pytest.approx(64.94, abs=0.01)  # HCCL's stream: 99.9% busy
    g = pl.read_parquet(flat / "gpu_ops.parquet")
    hccl = g.filter((pl.col("stream") == 4) & (pl.col("kind") == "kernel"))
    assert hccl.height == 296 and set(hccl["unmodelled_reason"]) == {"library_task"}
    assert "no_launch" not in set(g["unmodelled_reason"].drop_nulls())
    cov = {r["cause"]: r for r in s["coverage"].iter_rows(named=True)}
    assert cov["library_task"]["remedy"] is None and cov["library_task"]["pct"] == pytest.approx(93.74, abs=0.01)
    assert s["devices"]["name"].to_list() == ["Ascend NPU"]


def test_host_ops_of_many_collectives_in_bounded_memory(tmp_path):
    """The op of each HCCL collective (the innermost non-API CPU op around the start of the flow from
    its host op): right where ops nest, and found by binary search: a join of every flow start
    with every op of its thread took 3 GB for 480 collectives of a 200 MB trace. 2,000 collectives
    on a thread of 100,000 ops here: the join would hold 200 M rows (~10 GB)."""
    import subprocess
    import sys
    import textwrap

    n_ops, n_small = 2_000, 100_000
    code = textwrap.dedent(
        f"""
        import polars as pl
        from pathlib import Path
        from pipeline.runs.collectives import _host_ops
        d = Path({str(tmp_path)!r})
        n, small = {n_ops}, {n_small}
        us = 1_000
        cpu = [(1, 1, "c10d::allreduce_", k * 100 * us, 50 * us) for k in range(n)]
        cpu += [(1, 1, "aten::add", k * 100 * us + 10 * us, 5 * us) for k in range(n)]  # inner, starts first
        cpu += [(1, 1, "HcclAllreduce", k * 100 * us + 12 * us, 1 * us) for k in range(n)]  # an API call
        step = 100 * n * us // small  # small ops, never at a flow start
        cpu += [(1, 1, "aten::mul", 60 * us + k * step + 1, 1) for k in range(small)]
        ev = pl.DataFrame(cpu, schema=["pid", "tid", "name", "ts_ns", "dur_ns"], orient="row")
        ev = ev.with_columns(cat=pl.lit("cpu_op"), event_idx=pl.int_range(pl.len(), dtype=pl.Int64))
        ev.write_parquet(d / "events.parquet")
        t = [k * 100 * us + 12 * us for k in range(n)]
        flows = pl.DataFrame({{
            "cat": ["async_npu"] * (2 * n), "ph": ["s"] * n + ["f"] * n, "id": list(range(n)) * 2,
            "pid": [1] * n + [2] * n, "tid": [1] * n + [7] * n, "ts_ns": t + [x + 30 * us for x in t],
        }})
        flows.write_parquet(d / "flows.parquet")
        ops = pl.DataFrame({{"event_idx": list(range(10**6, 10**6 + n)), "pid": [2] * n, "tid": [7] * n,
                            "ts_ns": [x + 30 * us for x in t]}})
        got = _host_ops(d, ops)
        assert got.height == n and set(got["op_name"]) == {{"aten::add"}}, got
        print(({PEAK_RSS}) >> 20)
        """
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert int(p.stdout.strip()) < 600, f"peak RSS {p.stdout.strip()} MB"
