"""augment and combine: streamed JSON output (pipeline.jsonout, pipeline.augment, pipeline.combine)."""

from __future__ import annotations

import gzip
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from pipeline.errors import DatasetError, UsageError
from pipeline.flatten import flatten
from pipeline.redact import redact
from pipeline.rewrite.augment import COST_ARGS, augment, with_costs
from pipeline.rewrite.combine import combine
from pipeline.rewrite.jsonout import TraceWriter

SHARED_TRACES = Path(__file__).resolve().parents[2].joinpath("shared/traces")
real = pytest.mark.skipif(not SHARED_TRACES.is_dir(), reason="no ../shared/traces beside the project")
BIG_TS = "4458676388068.751"  # a float64 cannot keep these digits through ns arithmetic: parsed exactly


# ------------------------------------------------------------------ synthetic traces
def events(pid=4242, corr=77, ext=5, t0=1000):
    """A cpu_op aten::mm launching one kernel: runtime call, ac2g flow s/f, kernel, process names."""
    return [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": "python3"}},
        {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "python3"}},
        {"ph": "M", "name": "process_labels", "pid": 0, "tid": 0, "args": {"labels": "GPU 0"}},
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": "aten::mm",
            "pid": pid,
            "tid": pid,
            "ts": t0,
            "dur": 50,
            "args": {
                "External id": ext,
                "Input Dims": [[64, 128], [128, 256]],
                "Input type": ["float", "float"],
                "Input Strides": [[128, 1], [256, 1]],
                "Concrete Inputs": ["", ""],
            },
        },
        {
            "ph": "X",
            "cat": "cuda_runtime",
            "name": "cudaLaunchKernel",
            "pid": pid,
            "tid": pid,
            "ts": t0 + 10,
            "dur": 5,
            "args": {"External id": ext, "correlation": corr, "cbid": 211},
        },
        {"ph": "s", "cat": "ac2g", "name": "ac2g", "id": corr, "pid": pid, "tid": pid, "ts": t0 + 10},
        {"ph": "f", "cat": "ac2g", "name": "ac2g", "id": corr, "pid": 0, "tid": 7, "ts": t0 + 100, "bp": "e"},
        {
            "ph": "X",
            "cat": "kernel",
            "name": "ampere_sgemm_64x64_nn",
            "pid": 0,
            "tid": 7,
            "ts": t0 + 100,
            "dur": 20.5,
            "args": {
                "External id": ext,
                "correlation": corr,
                "device": 0,
                "stream": 7,
                "grid": [64, 1, 1],
                "block": [128, 1, 1],
            },
        },
        {"ph": "i", "cat": "cpu_instant_event", "name": "marker", "pid": "Spans", "tid": 1, "ts": t0 + 1, "s": "t"},
    ]


DEVICE = {
    "id": 0,
    "name": "NVIDIA A100-SXM4-80GB",
    "totalGlobalMem": 85899345920,
    "computeMajor": 8,
    "computeMinor": 0,
    "numSms": 108,
    "warpSize": 32,
    "maxThreadsPerBlock": 1024,
    "sharedMemPerBlock": 49152,
}


def write_trace(path: Path, evs: list, rank=0, big_float=True) -> Path:
    """A trace with metadata both before and after traceEvents (as Kineto writes it)."""
    before = {"schemaVersion": 1, "deviceProperties": [DEVICE]}
    after = {
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 2},
        "traceName": str(path),
        "baseTimeNanoseconds": 1700000000000000000,
    }
    body = ",\n".join(json.dumps(e) for e in evs)
    if big_float:  # an exact-decimal timestamp, kept as text
        big = {"ph": "X", "cat": "user_annotation", "name": "big", "pid": 1, "tid": 1, "ts": "@", "dur": 1}
        body += ",\n" + json.dumps(big).replace('"@"', BIG_TS)
    text = "{" + json.dumps(before)[1:-1] + ', "traceEvents": [\n' + body + "\n], " + json.dumps(after)[1:-1] + "}"
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "wt") as f:
        f.write(text)
    return path


def load(path: Path) -> dict:
    """A trace as a document: a bare list of events (torch_npu's) as {"traceEvents": [...]}, as we write it."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        d = json.load(f)
    return d if isinstance(d, dict) else {"traceEvents": d}


def metadata(d: dict) -> dict:
    return {k: v for k, v in d.items() if k != "traceEvents"}


def fake_costs(trace: Path, tmp: Path) -> tuple[Path, dict]:
    """Flatten without cost, then give every kernel synthetic cost columns (tests the join alone)."""
    flat = flatten(trace, tmp / "flat", link=False).out_dir
    g = pl.read_parquet(flat / "gpu_ops.parquet").with_columns(
        flops=pl.when(pl.col("kind") == "kernel").then((pl.col("event_idx") + 1) * 1e6),
        bytes=pl.lit(3e6),
        achieved_flops_pct=pl.lit(41.5),
        achieved_bw_pct=pl.lit(12.25),
        arithmetic_intensity=pl.lit(0.5),
        roofline_bound=pl.lit("memory"),
        cost_source=pl.lit("formula"),
    )
    g.write_parquet(flat / "gpu_ops.parquet")
    costed = g.filter(pl.col("kind") == "kernel")
    return flat, {i: f for i, f in zip(costed["event_idx"], costed["flops"])}


def assert_augmented(src: dict, out: dict, flops_by_idx: dict, keep_secrets: bool = True):
    """Same events and metadata (redacted unless keep_secrets); kernels named in flops_by_idx
    gained exactly the cost fields."""
    assert metadata(out) == (metadata(src) if keep_secrets else redact(metadata(src)))
    assert len(out["traceEvents"]) == len(src["traceEvents"])
    for i, (a, b) in enumerate(zip(out["traceEvents"], src["traceEvents"])):
        if a.get("tid") != b.get("tid"):  # a slice Perfetto cannot nest, moved to a lane of its thread
            assert "· overlapping slices" in a["tid"]
            a = {**a, "tid": b.get("tid")}
        if i not in flops_by_idx:
            assert a == b
            continue
        gained = {k: v for k, v in a["args"].items() if k not in b.get("args", {})}
        assert set(gained) == set(COST_ARGS)
        assert gained["kernel_flop"] == flops_by_idx[i]
        assert gained["kernel_num_gb"] == pytest.approx(3e6 / 1e9)
        assert gained["kernel_roofline_bound"] == "memory" and gained["kernel_cost_source"] == "formula"
        assert {**a, "args": b.get("args", {})} == {**b, "args": b.get("args", {})}
        assert {k: a["args"][k] for k in b.get("args", {})} == b.get("args", {})


def tp(*args):
    return subprocess.run([sys.executable, "-m", "pipeline", *map(str, args)], capture_output=True, text=True)


def assert_one_line_error(p, out: Path):
    assert p.returncode == 2, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr, p.stderr
    assert not out.exists()
    assert not [x for x in out.parent.iterdir() if x.name.startswith(f".{out.name}.tmp")]


# ------------------------------------------------------------------ writer
def test_writer_metadata_before_and_after(tmp_path):
    out = tmp_path / "w.json"
    with TraceWriter(out, {"schemaVersion": 1}) as w:
        w.write([{"ph": "X", "ts": 1}])
        w.write([])
        w.write([{"ph": "X", "ts": 2}, {"ph": "X", "ts": 3}])
        w.tail = {"distributedInfo": {"rank": 0}}
    assert load(out) == {
        "schemaVersion": 1,
        "traceEvents": [{"ph": "X", "ts": i} for i in (1, 2, 3)],
        "distributedInfo": {"rank": 0},
    }
    assert len(out.read_text().splitlines()) >= 5  # one event per line


def test_writer_leaves_nothing_on_error(tmp_path):
    out = tmp_path / "w.json.gz"
    with pytest.raises(RuntimeError):
        with TraceWriter(out) as w:
            w.write([{"ph": "X"}])
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------ augment
def test_with_costs_across_batches():
    batches = [
        [{"cat": "cpu_op"}, {"cat": "kernel", "args": {"a": 1}}],
        [{"cat": "kernel"}, {"cat": "x"}, {"cat": "kernel", "args": {}}],
    ]
    out = list(with_costs(batches, [(1, {"kernel_flop": 1.0}), (2, {"kernel_flop": 2.0}), (4, {"kernel_flop": 4.0})]))
    assert out[0][1]["args"] == {"a": 1, "kernel_flop": 1.0}
    assert out[1][0]["args"] == {"kernel_flop": 2.0}
    assert out[1][2]["args"] == {"kernel_flop": 4.0}
    assert out[0][0] == {"cat": "cpu_op"} and out[1][1] == {"cat": "x"}


@pytest.mark.parametrize("costs", [[(0, {"kernel_flop": 1.0})], [(9, {"kernel_flop": 1.0})]])
def test_with_costs_stale_tables(costs):
    with pytest.raises(DatasetError):
        list(with_costs([[{"cat": "cpu_op"}, {"cat": "kernel"}]], costs))


@pytest.mark.parametrize("suffix", [".json", ".json.gz"])
def test_augment_round_trip(tmp_path, suffix):
    trace = write_trace(tmp_path / "t.json", events())
    flat, flops = fake_costs(trace, tmp_path)
    out = tmp_path / f"aug{suffix}"
    r = augment(trace, out, flat_dir=flat, tracks=False)
    assert r.n_costed == 1 and r.n_events == len(events()) + 1 and not r.truncated
    assert_augmented(load(trace), load(out), flops)
    raw = gzip.open(out).read() if suffix.endswith(".gz") else out.read_bytes()
    assert BIG_TS.encode() in raw  # the decimal text of an exact timestamp survives


def test_augment_bare_list(tmp_path):
    trace = tmp_path / "bare.json"
    trace.write_text(json.dumps(events()))
    flat, flops = fake_costs(trace, tmp_path)
    augment(trace, tmp_path / "aug.json", flat_dir=flat, tracks=False)
    assert_augmented({"traceEvents": events()}, load(tmp_path / "aug.json"), flops)


def test_augment_of_tables_flattened_before_cost_source(tmp_path):
    trace = write_trace(tmp_path / "t.json", events())
    flat, flops = fake_costs(trace, tmp_path)
    pl.read_parquet(flat / "gpu_ops.parquet").drop("cost_source").write_parquet(flat / "gpu_ops.parquet")
    augment(trace, tmp_path / "aug.json", flat_dir=flat, tracks=False)
    kernels = [e for e in load(tmp_path / "aug.json")["traceEvents"] if e.get("cat") == "kernel"]
    assert kernels and all("kernel_flop" in e["args"] and "kernel_cost_source" not in e["args"] for e in kernels)


def test_augment_rejects_another_traces_tables(tmp_path):
    flat, _ = fake_costs(write_trace(tmp_path / "a.json", events()), tmp_path)
    other = write_trace(tmp_path / "b.json", events(pid=7))
    with pytest.raises(UsageError):
        augment(other, tmp_path / "aug.json", flat_dir=flat)
    assert not (tmp_path / "aug.json").exists()


def test_augment_costs_the_mm_kernel(tmp_path):
    """End to end: flatten + link + cost, then the mm kernel carries 2*M*N*K FLOPs."""
    trace = write_trace(tmp_path / "t.json", events())
    p = tp("augment", trace, "-o", tmp_path / "aug.json")
    assert p.returncode == 0, p.stderr
    kernels = [e for e in load(tmp_path / "aug.json")["traceEvents"] if e.get("cat") == "kernel"]
    assert kernels[0]["args"]["kernel_flop"] == pytest.approx(2 * 64 * 128 * 256)
    assert kernels[0]["args"]["kernel_num_gb"] > 0


# ------------------------------------------------------------------ combine
def pids(evs):
    return {e["pid"] for e in evs if e.get("ph") != "M" and isinstance(e.get("pid"), int)}


def flows(evs):
    return {(e.get("cat"), e.get("id"), e.get("ph")) for e in evs if e.get("ph") in ("s", "f")}


def three_traces(tmp_path):
    a = write_trace(tmp_path / "rank0.json", events(), rank=0)
    b = write_trace(tmp_path / "rank1.json.gz", events(corr=78, t0=50_000), rank=1, big_float=False)
    return [a, b, a]


def test_combine_keeps_inputs_apart(tmp_path):
    paths = three_traces(tmp_path)
    srcs = [load(p) for p in paths]
    r = combine(paths, tmp_path / "c.json")
    c = load(tmp_path / "c.json")
    ce = c["traceEvents"]
    assert r.n_events == len(ce) == sum(len(s["traceEvents"]) for s in srcs)
    assert len(pids(ce)) == sum(len(pids(s["traceEvents"])) for s in srcs)
    assert len(flows(ce)) == sum(len(flows(s["traceEvents"])) for s in srcs)
    assert [i.label for i in r.inputs] == ["rank0", "rank1", "rank0#2"]
    names = sorted(e["args"]["name"] for e in ce if e.get("name") == "process_name")
    assert names == sorted(f"python3 [{lab}]" for lab in ("rank0", "rank1", "rank0#2") for _ in range(2))
    assert {e["pid"] for e in ce if e.get("cat") == "kernel"} == {0, 1, 2}  # GPU pids stay small


def test_combine_links_stay_within_each_input(tmp_path):
    combine(three_traces(tmp_path), tmp_path / "c.json")
    ce = load(tmp_path / "c.json")["traceEvents"]
    launches = [e for e in ce if e.get("name") == "cudaLaunchKernel"]
    kernels = [e for e in ce if e.get("cat") == "kernel"]
    ops = [e for e in ce if e.get("name") == "aten::mm"]
    starts = [e for e in ce if e.get("ph") == "s"]
    assert len({e["args"]["correlation"] for e in kernels}) == 3
    for launch, kernel, op, s in zip(launches, kernels, ops, starts):
        assert launch["args"]["correlation"] == kernel["args"]["correlation"] == s["id"]
        assert op["args"]["External id"] == launch["args"]["External id"] == kernel["args"]["External id"]
        assert kernel["pid"] == kernel["args"]["device"]  # device ids renumbered like GPU pids
    spans = sorted(e["pid"] for e in ce if str(e.get("pid")).startswith("Spans"))
    assert len(set(spans)) == 3 and all(p.startswith("Spans [") for p in spans)  # each input's own: no shared track


def test_combine_metadata(tmp_path):
    paths = three_traces(tmp_path)
    combine(paths, tmp_path / "c.json", labels=["x", "y", "z"])
    c = load(tmp_path / "c.json")
    assert c["schemaVersion"] == 1 and "distributedInfo" not in c
    assert [(s["label"], s["path"], s["distributedInfo"]["rank"]) for s in c["combinedFrom"]] == [
        ("x", str(paths[0]), 0),
        ("y", str(paths[1]), 1),
        ("z", str(paths[2]), 0),
    ]
    assert [(d["source"], d["id"]) for d in c["deviceProperties"]] == [("x", 0), ("y", 1), ("z", 2)]
    assert all(
        {k: v for k, v in d.items() if k not in ("source", "id")} == {k: v for k, v in DEVICE.items() if k != "id"}
        for d in c["deviceProperties"]
    )


def test_combine_string_flow_ids(tmp_path):
    evs = [
        {"ph": "s", "cat": "c", "name": "f", "id": "0x1f", "pid": 1, "tid": 1, "ts": 1},
        {"ph": "f", "cat": "c", "name": "f", "id": "0x1f", "pid": 1, "tid": 1, "ts": 2, "bp": "e"},
    ]
    a = write_trace(tmp_path / "a.json", evs)
    combine([a, a], tmp_path / "c.json")
    ce = load(tmp_path / "c.json")["traceEvents"]
    assert len(flows(ce)) == 4
    assert {int(e["id"], 16) for e in ce if e.get("ph") in "sf"} == {0x1F0, 0x1F1}  # still hex, per input


def test_combine_align_start(tmp_path):
    paths = three_traces(tmp_path)[:2]
    combine(paths, tmp_path / "c.json", align="start")
    c = load(tmp_path / "c.json")
    firsts = {}
    for e in c["traceEvents"]:
        if e.get("ph") != "M" and isinstance(e.get("pid"), int) and e["name"] != "big":
            k = e["pid"] % 10
            firsts[k] = min(firsts.get(k, e["ts"]), e["ts"])
    assert firsts[0] == firsts[1] == 1000
    assert [s["ts_shift_us"] for s in c["combinedFrom"]] == [0, -49_000]


def test_combine_truncated_input_keeps_complete_events(tmp_path):
    a = write_trace(tmp_path / "a.json", events())
    cut = tmp_path / "cut.json"
    text = a.read_text()
    cut.write_text(text[: text.index('"cat": "kernel"')])
    p = tp("combine", a, cut, "-o", tmp_path / "c.json")
    assert p.returncode == 1 and "truncated" in p.stderr
    assert len(load(tmp_path / "c.json")["traceEvents"]) == 2 * len(events()) + 1 - 2


# ------------------------------------------------------------------ CLI
def test_cli_combine_gz_with_labels(tmp_path):
    a, b, _ = three_traces(tmp_path)
    out = tmp_path / "sub" / "c.json.gz"
    p = tp("combine", a, b, "-o", out, "--label", "ctl", "--label", "test", "--align", "start")
    assert p.returncode == 0, p.stderr
    assert [s["label"] for s in load(out)["combinedFrom"]] == ["ctl", "test"]


@pytest.mark.parametrize("content", ['{"a": 1}', "not json", ""])
@pytest.mark.parametrize("command", ["augment", "combine"])
def test_cli_bad_input(tmp_path, content, command):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    out = tmp_path / "o.json"
    assert_one_line_error(tp(command, bad, "-o", out), out)


@pytest.mark.parametrize("args", [["--align", "sideways"], ["--label", "only-one"]])
def test_cli_combine_usage(tmp_path, args):
    a = write_trace(tmp_path / "a.json", events())
    out = tmp_path / "o.json"
    assert_one_line_error(tp("combine", a, a, "-o", out, *args), out)


def test_cli_missing_file(tmp_path):
    out = tmp_path / "o.json"
    assert_one_line_error(tp("augment", tmp_path / "nope.json", "-o", out), out)
    assert_one_line_error(tp("combine", tmp_path / "nope.json", "-o", out), out)


# ------------------------------------------------------------------ real traces
REAL = sorted(SHARED_TRACES.glob("*/*.json.gz")) if SHARED_TRACES.is_dir() else []


@real
@pytest.mark.real
@pytest.mark.slow
@pytest.mark.parametrize("trace", REAL, ids=lambda p: p.name.split(".")[0])
def test_real_augment_round_trip(tmp_path, trace):
    flat, flops = fake_costs(trace, tmp_path)
    augment(trace, tmp_path / "aug.json.gz", flat_dir=flat, keep_secrets=True, tracks=False)
    assert_augmented(load(trace), load(tmp_path / "aug.json.gz"), flops)


@real
@pytest.mark.real
def test_real_augment_costs(tmp_path):
    trace = SHARED_TRACES / "tracelens/h100_qwen1.5_0.5b.json.gz"
    r = augment(trace, tmp_path / "aug.json")
    a, d = load(tmp_path / "aug.json"), load(trace)
    assert metadata(a) == redact(metadata(d)) and len(a["traceEvents"]) > len(d["traceEvents"])  # + timeline tracks
    token = re.compile(r'"hf_[A-Za-z0-9]{20,}"')  # the profiled machine's access token, redacted
    assert token.search(json.dumps(metadata(d))) and not token.search(json.dumps(metadata(a)))
    assert r.n_costed > 0
    assert any(e.get("cat") == "kernel" and e["args"].get("kernel_flop", 0) > 0 for e in a["traceEvents"])


@real
@pytest.mark.real
@pytest.mark.slow
def test_real_combine(tmp_path):
    x, y = SHARED_TRACES / "hta/diff_control_a100.json.gz", SHARED_TRACES / "hta/diff_test_v100.json.gz"
    x2 = tmp_path / "copy_of_diff_control.json.gz"
    shutil.copy(x, x2)
    p = tp("combine", x, y, x2, "-o", tmp_path / "comb.json")
    assert p.returncode == 0, p.stderr
    ce, dx, dy = (load(f)["traceEvents"] for f in (tmp_path / "comb.json", x, y))
    assert len(ce) == 2 * len(dx) + len(dy)
    assert len(pids(ce)) >= 2 * len(pids(dx)) + len(pids(dy))
    assert len(flows(ce)) == 2 * len(flows(dx)) + len(flows(dy))
