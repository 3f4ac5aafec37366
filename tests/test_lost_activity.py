"""A trace whose device activity the profiler lost says so: launches without device ops are a
problem on stderr (one line, the counts), in `trace.problems_json`, exit 1 from flatten and analyze,
and the report does not call the trace CPU-only. Traces that legitimately hold fewer device ops
(sampled, MTIA, CPU-only, graph replays and captures) raise no alarm."""

from __future__ import annotations

import gzip
import json
import random

import polars as pl
import pytest

from conftest import run_cli
from pipeline.flatten import flatten
from pipeline.read.launches import LAUNCHES, MIN_LAUNCHES, WITHOUT, lost_activity

DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset"}


def _without_device_activity(src, dst, keep: float = 0.0, seed: int = 3):
    """The trace with its device events kept with probability `keep` (0: none), as a lost buffer does."""
    with gzip.open(src, "rt") as f:
        doc = json.load(f)
    rng = random.Random(seed)
    doc["traceEvents"] = [
        e for e in doc["traceEvents"] if str(e.get("cat", "")).lower() not in DEVICE_CATS or rng.random() < keep
    ]
    dst.write_text(json.dumps(doc))
    return dst


def test_the_rule():
    assert lost_activity(270, 0, 0) == {LAUNCHES: 270, WITHOUT: 270}
    assert lost_activity(3, 0, 0) == {LAUNCHES: 3, WITHOUT: 3}  # any launch and no device op
    assert lost_activity(1000, 0, 200) == {LAUNCHES: 1000, WITHOUT: 800}
    assert lost_activity(1000, 0, 600) == {}  # a trace cut at its end loses a few: no alarm
    assert lost_activity(MIN_LAUNCHES - 1, 0, 1) == {}
    assert lost_activity(460, 3, 100) == {}  # a capture trace: its captured launches run nothing
    assert lost_activity(0, 0, 0) == {}


def test_launches_counted_per_member_in_one_pass():
    """A group's events table holds several traces: counting each part in one pass gives what
    counting each slice alone gives (launches, graph captures, a part without calls, an empty one)."""
    import pyarrow as pa

    from pipeline.read.launches import launch_counts, launch_counts_of_parts

    rows = [  # (ph, cat, name) of three members, the middle one empty
        ("X", "cuda_runtime", "cudaLaunchKernel"),
        ("X", "cuda_runtime", "cudaLaunchHostFunc"),  # a host function: no device work
        ("X", "cuda_driver", "cuLaunchKernel"),
        ("X", "cpu_op", "aten::mm"),
        ("X", "cuda_runtime", "cudaStreamBeginCapture"),
        ("i", "cuda_runtime", "cudaLaunchKernel"),  # not a call
        ("X", "cuda_runtime", "hipGraphLaunch"),
        ("X", "cpu_op", "aten::add"),
    ]
    events = pa.table({k: [r[i] for r in rows] for i, k in enumerate(("ph", "cat", "name"))})
    starts = [0, 3, 3, 8]
    cats = set(events.column("cat").to_pylist())
    got = launch_counts_of_parts(events, starts, cats)
    alone = [launch_counts(events.slice(a, b - a), cats) for a, b in zip(starts, starts[1:])]
    assert got == alone
    assert [(c["launches"], c["captures"]) for c in got] == [(2, 0), (0, 0), (1, 1)]


@pytest.mark.real
def test_launches_without_device_activity_exit_1_and_say_so(shared_traces, tmp_path):
    lost = _without_device_activity(shared_traces / "hta/mi250_rocm62_minitoy.json.gz", tmp_path / "lost.json")
    p = run_cli(["flatten", lost, "-o", tmp_path / "out"])
    assert p.returncode == 1, p.stderr
    said = [line for line in p.stderr.splitlines() if "launches" in line]
    assert len(said) == 1 and "14 kernel launches but no device activity" in said[0] and "lost.json" in said[0]
    row = pl.read_parquet(tmp_path / "out" / "lost" / "trace.parquet").row(0, named=True)
    problems = json.loads(row["problems_json"])
    assert problems[LAUNCHES] == 14 and problems[WITHOUT] == 14
    a = run_cli(["analyze", lost, "--section", "kernels", "--format", "json"])
    assert a.returncode == 1 and "14 kernel launches but no device activity" in a.stderr
    devices = json.loads(a.stdout)["devices"]
    assert devices and all(d["name"] != "cpu" and "lost" in d["name"] for d in devices)
    again = run_cli(["analyze", tmp_path / "out" / "lost", "--section", "kernels"])  # a flattened trace too
    assert again.returncode == 1 and "no device activity" in again.stderr
    # its CPU ops stand where kernels would be, and the titles say why without calling it CPU-only
    assert "CPU ops by name" in again.stdout and "no device activity in the trace" in again.stdout
    assert "CPU-only" not in again.stdout


@pytest.mark.real
@pytest.mark.parametrize(("keep", "alarm"), [(0.2, True), (0.9, False)])
def test_far_fewer_device_ops_than_launches(shared_traces, tmp_path, keep, alarm):
    path = _without_device_activity(shared_traces / "tracelens/h100_qwen1.5_0.5b.json.gz", tmp_path / "t.json", keep)
    r = flatten(path, tmp_path / "out", link=False)
    assert (WITHOUT in r.problems) == alarm
    if alarm:
        assert r.problems[LAUNCHES] == 1029 and r.problems[WITHOUT] == 1029 - r.n_gpu_ops


@pytest.mark.real
@pytest.mark.parametrize(
    "name",
    [
        "hta/sampled_no_device_props",
        "hta/mtia_inference",
        "hta/cpu_only",
        "tracelens/mi300x_vllm_graph_replay",
        "tracelens/mi300x_vllm_graph_capture",  # 460 launches, 100 device ops: captured launches run nothing
        "hta/triton_example",
    ],
)
def test_no_false_alarm(shared_traces, tmp_path, name):
    r = flatten(shared_traces / f"{name}.json.gz", tmp_path, link=False)
    assert not any(k.startswith("lost:") for k in r.problems), r.problems


@pytest.mark.real
def test_batch_says_it_too(shared_traces, tmp_path):
    from pipeline.dataset.batch import run_batch
    from pipeline.dataset.query import run as query

    src = tmp_path / "src"
    src.mkdir()
    _without_device_activity(shared_traces / "hta/mi250_rocm62_minitoy.json.gz", src / "lost.json")
    (src / "whole.json.gz").write_bytes((shared_traces / "hta/mi250_rocm62_minitoy.json.gz").read_bytes())
    run_batch(src, tmp_path / "ds", jobs=1)
    rows = query(tmp_path / "ds", "select stem, problems_json from trace order by stem").rows()
    assert [json.loads(p).get(WITHOUT) for _, p in rows] == [14, None]


def _empty_profile(path, work: list):
    """A profile of a region: the profiler's own span (category Trace), its metadata and `work`."""
    meta = [
        {"name": "process_name", "ph": "M", "ts": 0, "pid": 7, "tid": 0, "args": {"name": "python"}},
        {"name": "thread_name", "ph": "M", "ts": 0, "pid": 7, "tid": 7, "args": {"name": "thread 7 (python)"}},
    ]
    span = {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "tid": "PyTorch Profiler"}
    start = {"ph": "i", "s": "g", "name": "Iteration Start: PyTorch Profiler", "pid": "Traces", "tid": "T", "ts": 5}
    doc = {"schemaVersion": 1, "traceEvents": [*meta, {**span, "ts": 5, "dur": 197}, start, *work]}
    path.write_text(json.dumps(doc))
    return path


def test_a_profile_of_a_region_that_ran_nothing_says_so(tmp_path):
    """`with profile(): pass` (the torch 2.13 CPU wheel) writes the profiler's span and metadata
    only: the report had no device table, "nothing to fix" and a critical path of zeros, exit 0.
    It now says no work was recorded, exit 1; one op is work, and so is one device task without
    a category (Ascend's)."""
    empty = _empty_profile(tmp_path / "empty.json", [])
    p = run_cli(["analyze", str(empty)])
    assert p.returncode == 1, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tracepipe: empty: no work recorded: no op, kernel or annotation")
    one_op = {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 7, "tid": 7, "ts": 10, "dur": 3}
    task = {"ph": "X", "name": "MatMul", "pid": 9, "tid": 2, "ts": 10, "dur": 3}
    for name, work in (("op", one_op), ("task", task)):
        p = run_cli(["analyze", str(_empty_profile(tmp_path / f"{name}.json", [work]))])
        assert p.returncode == 0 and "no work recorded" not in p.stderr, (name, p.stderr)
    p = run_cli(["diff", str(empty), str(_empty_profile(tmp_path / "b.json", [one_op]))])
    assert p.returncode == 1 and "empty: no work recorded" in p.stderr
