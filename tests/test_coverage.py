"""Cost coverage: where each kernel's cost came from (`cost_source`), why the others have none (the
causes of `pipeline.cost.coverage`), Inductor's own estimates, our augmented output read back, and
the `coverage` section of analyze, on hand-made traces and on the real ones."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import polars as pl
import pytest

from pipeline import report as rp
from pipeline.cost import coverage
from pipeline.flatten import flatten
from pipeline.rewrite.augment import augment

H100 = [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85e9, "computeMajor": 9, "numSms": 132}]
MM_ARGS = {"Input Dims": [[8, 16], [16, 32]], "Input type": ["float", "float"]}
MM_FLOPS = 2 * 8 * 16 * 32


def _x(name, cat, ts, dur, tid=1, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": args}


class Trace:
    """A hand-made trace: ops on thread 1, each launching kernels on stream 7 (one per launch)."""

    def __init__(self):
        self.events: list[dict] = []
        self.corr = 0
        self.t = 100

    def op(self, name: str, launches: int = 1, dur: int = 10, cat: str = "cpu_op", launch="cudaLaunchKernel", **args):
        """An op (None: no op) around `launches` launches, each of a kernel of `dur` us."""
        start = self.t
        for _ in range(launches):
            self.corr += 1
            self.events.append(_x(launch, "cuda_runtime", self.t + 1, 2, correlation=self.corr))
            kernel = _x(f"k{self.corr}", "kernel", self.t + 5, dur, tid=7, correlation=self.corr, device=0, stream=7)
            self.events.append(kernel)
            self.t += dur + 10
        if name is not None:
            self.events.append(_x(name, cat, start, self.t - start, **args))
        self.t += 10
        return self

    def kernel_alone(self, dur: int = 10):
        """A kernel whose launch is not in the trace."""
        self.corr += 1
        self.events.append(_x(f"k{self.corr}", "kernel", self.t, dur, tid=7, correlation=self.corr, device=0, stream=7))
        self.t += dur + 10
        return self

    def write(self, path: Path) -> Path:
        with gzip.open(path, "wt") as f:
            json.dump({"traceEvents": self.events, "deviceProperties": H100}, f)
        return path


def kernels(path: Path, out: Path, **kw) -> pl.DataFrame:
    r = flatten(path, out, **kw)
    g = pl.read_parquet(r.out_dir / "gpu_ops.parquet")
    return g.filter(pl.col("kind") == "kernel").sort("correlation")


# ------------------------------------------------------------------ Inductor's estimates
INDUCTOR = {"kernel_backend": "triton", "kernel_hash": "abc", "Input Dims": [[10, 10]], "Input type": ["float"]}


def test_inductor_estimates_on_the_launch_record_cost_its_kernel(tmp_path):
    t = Trace()
    t.op("triton_poi_fused_add_0", **INDUCTOR, kernel_flop=0, kernel_num_gb=0.0008)  # pointwise: 0 FLOPs
    t.op("triton_tem_fused_mm_1", **INDUCTOR, kernel_flop=MM_FLOPS, kernel_num_gb=1.5e-6)
    t.op("triton_red_fused_sum_2", **INDUCTOR, kernel_num_gb=4e-7)  # profile_bandwidth: bytes alone
    t.op("triton_per_fused_3", **INDUCTOR)  # no estimates recorded
    t.op("triton_poi_fused_4", **INDUCTOR, kernel_flop=-5, kernel_num_gb="x")  # not numbers: not estimates
    g = kernels(t.write(tmp_path / "t.json.gz"), tmp_path / "out")
    assert g["cost_source"].to_list() == ["inductor", "inductor", "inductor", None, None]
    assert g["flops"].to_list()[:3] == [0.0, MM_FLOPS, None]
    assert g["bytes"].to_list()[:3] == pytest.approx([0.8e6, 1.5e3, 400.0])
    assert g["unmodelled_reason"].to_list() == [None, None, None, "inductor_no_estimate", "inductor_no_estimate"]
    assert g["cost_family"][1] == "inductor" and g["cost_dtype"][1] == "fp32"
    assert g["achieved_tflops"][1] == pytest.approx(MM_FLOPS / 10e-6 / 1e12)


def test_formulas_win_over_estimates_and_estimates_are_read_only_from_inductor(tmp_path):
    t = Trace()
    # torch's profile_analysis --augment_trace writes kernel_flop on aten ops: a formula wins there
    t.op("aten::mm", **MM_ARGS, kernel_flop=123, kernel_num_gb=1.0)
    # ... and on ops without a formula it is not Inductor's estimate: not read
    t.op("my::op", kernel_flop=123, kernel_num_gb=1.0)
    g = kernels(t.write(tmp_path / "t.json.gz"), tmp_path / "out")
    assert g["flops"].to_list() == [MM_FLOPS, None]
    assert g["cost_source"].to_list() == ["formula", None]
    assert g["unmodelled_reason"].to_list() == [None, "no_formula"]


def test_an_estimate_is_split_over_the_kernels_of_its_launch_record(tmp_path):
    t = Trace().op("triton_tem_fused_mm_0", launches=2, dur=10, **INDUCTOR, kernel_flop=1000, kernel_num_gb=1e-6)
    g = kernels(t.write(tmp_path / "t.json.gz"), tmp_path / "out")
    assert g["flops"].to_list() == [500.0, 500.0] and g["bytes"].sum() == pytest.approx(1000.0)


def test_our_augmented_trace_read_back_gives_the_same_costs(tmp_path):
    """augment writes kernel_flop / kernel_num_gb into kernels' args (and kernel_cost_source): reading
    that trace again must neither add them to the op's cost nor take them for Inductor's."""
    t = Trace()
    t.op("aten::mm", launches=2, **MM_ARGS)
    t.op("triton_tem_fused_mm_1", **INDUCTOR, kernel_flop=MM_FLOPS, kernel_num_gb=1.5e-6)
    t.op("my::op")
    src = t.write(tmp_path / "t.json.gz")
    augment(src, tmp_path / "aug.json")
    doc = json.loads((tmp_path / "aug.json").read_text())
    sources = [e["args"].get("kernel_cost_source") for e in doc["traceEvents"] if e.get("cat") == "kernel"]
    assert sources == ["formula", "formula", "inductor", None]
    cols = ["flops", "bytes", "cost_source", "unmodelled_reason", "cost_family"]
    first = kernels(src, tmp_path / "a").select(cols)
    again = kernels(tmp_path / "aug.json", tmp_path / "b").select(cols)
    assert first.equals(again)
    assert again["flops"][:2].sum() == MM_FLOPS  # split once, not counted again


# ------------------------------------------------------------------ causes
def test_each_cause_on_a_hand_made_trace(tmp_path):
    t = Trace()
    t.op("aten::mm", **MM_ARGS)  # costed
    t.kernel_alone()  # no_launch
    t.op(None, launch="hipGraphLaunch")  # graph_replay
    t.op(None)  # no_cpu_op
    t.op("CompiledFunctionBackward")  # compiled_region
    t.op("my::custom", **MM_ARGS)  # no_formula
    t.op("aten::add")  # no_shapes: this op recorded none, others did
    t.op("aten::mm", **{"Input Dims": [[8, 16], [3, 32]], "Input type": ["float", "float"]})  # shapes_not_modelled
    g = kernels(t.write(tmp_path / "t.json.gz"), tmp_path / "out")
    assert g["unmodelled_reason"].to_list() == [
        None,
        "no_launch",
        "graph_replay",
        "no_cpu_op",
        "compiled_region",
        "no_formula",
        "no_shapes",
        "shapes_not_modelled",
    ]
    problems = json.loads(pl.read_parquet(tmp_path / "out" / "t" / "trace.parquet")["problems_json"][0])
    assert problems["unmodelled:graph_replay"] == 1 and problems["unmodelled:compiled_region"] == 1


def test_a_trace_without_shapes_or_launches_says_so(tmp_path):
    t = Trace().op("aten::mm").op("aten::add")
    g = kernels(t.write(tmp_path / "t.json.gz"), tmp_path / "a")
    assert g["unmodelled_reason"].to_list() == ["record_shapes_off"] * 2
    alone = Trace()
    alone.kernel_alone().kernel_alone()
    g = kernels(alone.write(tmp_path / "u.json.gz"), tmp_path / "b")
    assert g["unmodelled_reason"].to_list() == ["no_cpu_activity"] * 2


def test_every_cause_is_documented_and_every_remedy_fits_a_table():
    names = [c.name for c in coverage.CAUSES]
    assert len(set(names)) == len(names)
    assert all(c.summary and c.taught_by for c in coverage.CAUSES)
    assert all(len(c.remedy or "") <= 21 for c in coverage.CAUSES)  # the table's remedy column at 80
    page = (Path(__file__).resolve().parents[1] / "docs" / "explanation" / "cost-model.md").read_text()
    assert "<!-- gen:causes -->" in page  # the table of causes, generated into the cost model page
    table = coverage.causes_markdown()
    assert all(f"`{n}`" in table for n in names)


# ------------------------------------------------------------------ the coverage section
def test_coverage_section_in_every_format(tmp_path, run_cli):
    t = Trace()
    t.op("aten::mm", **MM_ARGS, dur=30)
    t.op("my::custom", dur=10)
    t.kernel_alone(dur=10)
    path = t.write(tmp_path / "t.json.gz")
    with rp.opened(path) as f:
        df = rp.analyze(f, only=["coverage"])["coverage"]
    assert df.select("cause", "pct", "kernels").rows() == [
        ("costed:formula", 60.0, 1),
        ("no_formula", 20.0, 1),
        ("no_launch", 20.0, 1),
    ]
    assert df["top"].to_list() == [["aten::mm"], ["my::custom"], ["k3"]]
    assert df["remedy"].to_list() == [None, "--formulas FILE.toml", "sync before profiling"]
    doc = json.loads(run_cli(["analyze", path, "--format", "json"]).stdout)
    assert [r["cause"] for r in doc["devices"][0]["coverage"]] == ["costed:formula", "no_formula", "no_launch"]
    p = run_cli(["analyze", path, "--section", "coverage", "--width", "80"])
    assert p.returncode == 0 and max(map(len, p.stdout.splitlines())) <= 80
    assert "no_formula" in p.stdout and "--formulas FILE.toml" in p.stdout
    assert "| no_formula |" in run_cli(["analyze", path, "--section", "coverage", "--format", "md"]).stdout
    csv = run_cli(["analyze", path, "--section", "coverage", "--format", "csv"]).stdout
    assert csv.splitlines()[0].startswith("device,cause,pct,kernels,dur_us,top,remedy")
    assert run_cli(["analyze", path, "--format", "xlsx", "-o", tmp_path / "r.xlsx"]).returncode == 0
    import openpyxl

    assert "coverage" in openpyxl.load_workbook(tmp_path / "r.xlsx", read_only=True).sheetnames


def test_coverage_of_a_trace_flattened_without_costs(tmp_path):
    path = Trace().op("aten::mm", **MM_ARGS).write(tmp_path / "t.json.gz")
    r = flatten(path, tmp_path / "out", link=False)
    df = rp.analyze(r.out_dir, only=["coverage"])["coverage"]
    assert df.select("cause", "pct").rows() == [("not_costed", 100.0)]
    assert df["remedy"][0] == "flatten it again"


# ------------------------------------------------------------------ real traces
# the causes each shared trace shows (share of its kernel time, %, at least): what was measured
REAL = {
    "tracelens/h100_qwen1.5_0.5b": {"costed:formula": 69, "no_launch": 29},
    "tracelens/mi300x_vllm_graph_replay": {"graph_replay": 95},
    "tracelens/b200_eager": {"no_formula": 87, "inductor_no_estimate": 0.01},
    "hta/triton_example": {"inductor_no_estimate": 100},
    "hta/diff_test_v100": {"compiled_region": 33, "no_shapes": 28, "no_formula": 18},
    "hta/a100_nccl": {"record_shapes_off": 69},
    "param/rtx2080_resnet": {"record_shapes_off": 96},
    "hta/mtia_inference": {"no_cpu_op": 70},
    "ascend/npu_level0_rank0": {"library_task": 93},  # HCCL's own tasks, not queued before profiling
}


@pytest.mark.real
@pytest.mark.parametrize("name", sorted(REAL))
def test_causes_on_the_real_traces(shared_traces, tmp_path, name):
    with rp.opened(shared_traces / f"{name}.json.gz") as f:
        df = rp.analyze(f, only=["coverage"])["coverage"]
    share = df.group_by("cause").agg(pl.col("pct").sum())
    got = dict(share.rows())
    for cause, at_least in REAL[name].items():
        assert got.get(cause, 0) >= at_least, (cause, got)
    per_device = df.group_by("device").agg(pl.col("pct").sum())["pct"]
    assert all(abs(p - 100) < 1e-6 for p in per_device)  # every kernel in one row
