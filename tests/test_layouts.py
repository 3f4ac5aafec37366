"""Every Kineto layout since torch 1.8 (data/kineto_layouts.toml) on the real traces that taught it:
recognised as that layout, every kernel linked to its launch and its op as an independent reading
of the JSON says, steps found, shapes read; and the string thread ids of the 2021 layout."""

from __future__ import annotations

import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline import kineto
from pipeline.flatten import flatten
from pipeline.read.tables import numbered_tids

LISTED = [(layout.id, t) for layout in kineto.LAYOUTS for t in layout.traces]


def _truth(path):
    """Kernels whose correlation id a launch carries (event index -> launch index), the launches'
    enclosing ProfilerStep numbers, from a plain json.load."""
    with gzip.open(path, "rt") as f:
        doc = json.load(f)
    ev = doc["traceEvents"] if isinstance(doc, dict) else doc
    launch_cats = set(kineto.LAUNCH_CATS)
    launches = {}
    for i, e in enumerate(ev):
        if str(e.get("cat", "")).lower() in launch_cats and "correlation" in e.get("args", {}):
            launches.setdefault(e["args"]["correlation"], i)
    kernels = {
        i: launches[e["args"]["correlation"]]
        for i, e in enumerate(ev)
        if str(e.get("cat", "")).lower() == "kernel" and e.get("args", {}).get("correlation") in launches
    }
    steps = [  # (pid, tid, start, end, N); tids as written (the 2021 layout writes them as strings)
        (
            e.get("pid"),
            str(e.get("tid")),
            float(e["ts"]),
            float(e["ts"]) + float(e.get("dur", 0)),
            int(e["name"].split("#")[1]),
        )
        for e in ev
        if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")
    ]
    return ev, kernels, steps


def _step(e) -> int:
    return int(e["name"].split("#")[1])


def _read(out_dir) -> dict:
    return {n: pq.read_table(out_dir / f"{n}.parquet") for n in ("trace", "gpu_ops", "events", "steps")}


@pytest.fixture(scope="module")
def flattened(shared_traces, tmp_path_factory):
    out = tmp_path_factory.mktemp("layouts")
    done = {}

    def get(name):
        if name not in done:
            path = shared_traces / f"{name}.json.gz"
            if not path.exists():
                pytest.skip(f"{path} not found")
            r = flatten(path, out, workers=1)
            done[name] = (
                path,
                {
                    n: pq.read_table(f)
                    for n in ("trace", "gpu_ops", "events", "steps")
                    for f in [r.out_dir / f"{n}.parquet"]
                },
            )
        return done[name]

    return get


@pytest.mark.real
@pytest.mark.parametrize(("layout", "name"), LISTED, ids=[f"{a}:{b}" for a, b in LISTED])
def test_each_layout_is_recognised_and_linked(flattened, layout, name):
    path, t = flattened(name)
    trace = t["trace"].to_pylist()[0]
    assert trace["layout"] == layout
    ev, kernels, steps = _truth(path)
    g = {r["event_idx"]: r for r in t["gpu_ops"].to_pylist()}
    # every kernel whose correlation id a launch carries is linked to a launch with that id
    wrong = [
        i
        for i, j in kernels.items()
        if ev[g[i]["launch_event_idx"] or 0]["args"].get("correlation") != ev[j]["args"]["correlation"]
    ]
    assert not wrong, f"{len(wrong)} of {len(kernels)} kernels not on their launch"
    # a launch inside a ProfilerStep on its thread carries that step, and only such launches do
    for i, j in kernels.items():
        launch = ev[j]
        ts, thread = float(launch["ts"]), (launch.get("pid"), str(launch.get("tid")))
        inside = [n for p, tid, a, b, n in steps if (p, tid) == thread and a <= ts <= b]
        assert g[i]["step"] == (inside[0] if inside else None), (i, inside, g[i]["step"])


@pytest.mark.real
def test_the_2021_layout_links_costs_and_finds_its_steps(flattened):
    """torch 1.8: string thread ids, `async`/`launch` flows, `Input dims`, ProfilerStep as Operator."""
    _, t = flattened("kineto/v100_tbplugin_resnet50")
    g = t["gpu_ops"].to_pylist()
    kernels = [r for r in g if r["kind"] == "kernel"]
    by_flow = sum(r["launch_link"] == "flow" for r in g)
    assert by_flow == 9282  # every flow pair of the trace binds a launch to its GPU op
    linked = [r for r in kernels if r["launch_event_idx"] is not None]
    assert len(linked) == 8856 and all(r["cpu_op_event_idx"] is not None or r["external_id"] == 0 for r in linked)
    assert {r["step"] for r in linked} - {None} == {5, 6, 7, 8, 9, 10}
    norms = [r for r in kernels if r["cpu_op_name"] == "aten::cudnn_batch_norm"]
    assert norms and all(r["flops"] for r in norms)  # shapes from `Input dims` (no dtypes: torch 1.8 wrote none)
    assert t["steps"].num_rows == 6
    ev = t["events"]
    cpu = ev.filter(pa.compute.equal(ev.column("cat"), "Runtime")).to_pylist()
    assert all(isinstance(r["tid"], int) and r["tid_str"] == str(r["tid"]) for r in cpu)


def test_every_layout_names_a_real_trace_and_layouts_are_told_apart():
    # a vendor backend not seen in a real trace yet names its sources and the test that builds one
    assert all(x.traces or (x.source and x.built_by) for x in kineto.LAYOUTS)
    assert kineto.layout_of(["cpu_op", "xpu_runtime", "kernel", "ac2g"]) == "xpu"
    assert kineto.layout_of(["cpu_op", "privateuse1_driver", "kernel", "ac2g"]) == "privateuse1"
    assert kineto.layout_of(["cpu_op", "hpu_op"]) == "hpu"
    assert kineto.layout_of(["Operator", "Runtime", "Kernel", "async"]) == "2021-operator"
    assert kineto.layout_of(["Kernel", "Runtime", "async_gpu"]) == "2021-async-gpu"
    assert kineto.layout_of(["cpu_op", "kernel", "async_cpu_to_gpu"]) == "2022-async-cpu-to-gpu"
    assert kineto.layout_of(["cpu_op", "kernel", "ac2g", "fwdbwd"]) == "2023-ac2g"
    assert kineto.layout_of(["cpu_op", "kernel", "cuda_runtime"]) == "no launch flows"
    assert kineto.layout_of(["cpu_op", "user_annotation", None]) == "cpu only"


def test_string_thread_ids_naming_a_number_become_tids():
    text = pa.array(["1890023232", "stream 7", "PyTorch Profiler", None, "9" * 19, "stream 12 user", ""])
    tid = pa.array([None, None, None, 5, None, None, None], pa.int64())
    got = numbered_tids({"tid": tid, "tid_str": text}).to_pylist()
    # digits beyond int64 and other names stay null; an integer tid is kept as it is
    assert got == [1890023232, 7, None, 5, None, None, None]


def test_thread_names_repeated_over_a_chunk_become_each_rows_tid():
    """Each distinct name is matched once and its number given back to every row naming it, in
    the rows' order (first seen is not sorted order here)."""
    text = pa.array(["stream 7", "12", "stream 7", None, "12", "main", "stream 7", "12"])
    tid = pa.array([None, None, 3, 5, None, None, None, 4], pa.int64())
    got = numbered_tids({"tid": tid, "tid_str": pa.chunked_array([text[:3], text[3:]])}).to_pylist()
    assert got == [7, 12, 3, 5, 12, None, 7, 4]


def test_older_arg_names_are_read_as_todays():
    assert kineto.canonical_args({"Input dims": [[2, 3]], "x": 1}) == {"Input Dims": [[2, 3]], "x": 1}
    both = {"Input dims": [[1]], "Input Dims": [[2]]}
    assert kineto.canonical_args(both) == both  # today's key wins where both are written
