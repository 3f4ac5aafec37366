"""Reports (pipeline.report, pipeline.plots, `tracepipe analyze` / `diff`).

Synthetic traces are built event by event below so every expected figure can be checked by
hand; the real traces in ../shared/traces are compared with an independent json.load count.
"""

from __future__ import annotations

import gzip
import json
import math
import random
import subprocess
import sys
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest

from pipeline import report as rp
from pipeline import store
from pipeline.analyses import names
from pipeline.analyses.intervals import covered_overlap, nesting
from pipeline.analyses.sweep import interval_union
from pipeline.errors import UsageError
from pipeline.flatten import flatten
from pipeline.kineto import trace_stem

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
PID, TID, GPU_PID = 100, 100, 0


# ------------------------------------------------------------------ tiny trace builder (µs)
def op(name, ts, dur, tid=TID, cat="cpu_op", **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": PID, "tid": tid, "ts": ts, "dur": dur, "args": args}


def launch(ts, dur, corr, tid=TID, name="cudaLaunchKernel"):
    return {
        "ph": "X",
        "cat": "cuda_runtime",
        "name": name,
        "pid": PID,
        "tid": tid,
        "ts": ts,
        "dur": dur,
        "args": {"correlation": corr},
    }


def gpu(name, ts, dur, corr=None, device=0, stream=7, cat="kernel"):
    args = {"device": device, "stream": stream, **({"correlation": corr} if corr is not None else {})}
    return {"ph": "X", "cat": cat, "name": name, "pid": device, "tid": stream, "ts": ts, "dur": dur, "args": args}


def launched(op_name, kernel, t, corr, kdur=10, device=0, stream=7, delay=20):
    """An op [t, t+10] holding a 4 µs launch at t+2 and its kernel `delay` µs after the launch."""
    return [
        op(op_name, t, 10),
        launch(t + 2, 4, corr),
        gpu(kernel, t + 2 + delay, kdur, corr, device=device, stream=stream),
    ]


def flat_of(tmp_path: Path, events: list, name: str = "t", **top) -> rp.Flat:
    src = tmp_path / f"{name}.json"
    src.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events, **top}))
    return rp.Flat(flatten(src, tmp_path / "flat").out_dir)


@pytest.fixture
def busy_trace(tmp_path):
    """device 0: kernels [0,10] [5,15] on stream 7, [20,30] on stream 8, memcpy [40,50] on stream 9;
    device 1: one kernel [100,110]. Busy on device 0: 35 of 50 µs; gaps 15->20 and 30->40."""
    ev = [
        gpu("gemm_a", 0, 10),
        gpu("gemm_a", 5, 10),
        gpu("vectorized_elementwise_kernel", 20, 10, stream=8),
        gpu("Memcpy HtoD (Pinned -> Device)", 40, 10, stream=9, cat="gpu_memcpy"),
        gpu("ncclKernel_AllReduce_RING_LL_Sum_float", 100, 10, device=1),
    ]
    return flat_of(tmp_path, ev)


# ------------------------------------------------------------------ interval algebra
def _brute_union(iv):
    runs = []
    for s, e in sorted(iv):
        if runs and s <= runs[-1][1]:
            runs[-1][1] = max(runs[-1][1], e)
        else:
            runs.append([s, e])
    return [tuple(r) for r in runs]


def test_interval_union_and_overlap_match_brute_force():
    rng = random.Random(7)
    for _ in range(30):
        iv = [(s, s + rng.randint(0, 30)) for s in (rng.randint(0, 200) for _ in range(rng.randint(1, 25)))]
        df = pl.DataFrame({"k": [0] * len(iv), "ts_ns": [s for s, _ in iv], "end_ns": [e for _, e in iv]})
        runs = interval_union(df, ["k"]).collect()
        assert list(zip(runs["start_ns"], runs["end_ns"], strict=False)) == _brute_union(iv)
        q = [(a, a + rng.randint(0, 80)) for a in (rng.randint(-20, 220) for _ in range(10))]
        got = (
            covered_overlap(
                pl.LazyFrame({"k": [0] * 10, "ts_ns": [a for a, _ in q], "end_ns": [b for _, b in q]}),
                runs.lazy(),
                ["k"],
            )
            .collect()["overlap_ns"]
            .to_list()
        )
        want = [sum(max(0, min(b, e) - max(a, s)) for s, e in _brute_union(iv)) for a, b in q]
        assert got == want


def test_nesting_parents_and_identical_intervals():
    iv = pl.LazyFrame(
        {
            "iv_idx": [0, 1, 2, 3, 4, 5],
            "pid": [1] * 6,
            "tid": [1] * 6,
            "ts_ns": [0, 10, 10, 20, 50, 100],
            "end_ns": [100, 40, 40, 30, 50, 120],
        }
    )
    got = {r["iv_idx"]: (r["depth"], r["parent_idx"]) for r in nesting(iv).collect().iter_rows(named=True)}
    # identical intervals 1 and 2 nest in file order; zero-length 4 sits inside 0; 5 starts as 0 ends
    assert got == {0: (1, None), 1: (2, 0), 2: (3, 1), 3: (4, 2), 4: (2, 0), 5: (1, None)}


# ------------------------------------------------------------------ busy, counts, categories
def test_busy_pct_gaps_and_streams(busy_trace):
    b = rp.busy(busy_trace).to_dicts()
    d0, d1 = b
    assert (d0["device"], d0["span_us"], d0["busy_us"], d0["idle_us"]) == (0, 50.0, 35.0, 15.0)
    assert d0["busy_pct"] == pytest.approx(70.0)
    assert (d0["gaps"], d0["largest_gap_us"]) == (2, 10.0)
    assert (d1["device"], d1["busy_pct"], d1["gaps"]) == (1, 100.0, 0)
    s = rp.busy(busy_trace, per_stream=True)
    assert s.filter(pl.col("stream") == 7).row(0, named=True)["busy_us"] == 15.0
    assert s.filter(pl.col("stream") == 7).row(0, named=True)["busy_pct"] == pytest.approx(100.0)


def test_kernel_table_counts_every_launch_and_keeps_copies_apart(busy_trace):
    k = rp.kernel_table(busy_trace)
    assert k.filter(pl.col("device") == 0).select("name", "count", "dur_us").rows() == [
        ("gemm_a", 2, 20.0),
        ("vectorized_elementwise_kernel", 1, 10.0),
    ]
    assert k["count"].sum() == 4 and "Memcpy HtoD (Pinned -> Device)" not in k["name"].to_list()
    t = rp.transfer_table(busy_trace)
    assert t.select("device", "kind", "count", "dur_us").rows() == [(0, "memcpy", 1, 10.0)]
    cats = {(r["device"], r["category"]): r["pct"] for r in rp.categories(busy_trace).iter_rows(named=True)}
    assert cats == {(0, "gemm"): 50.0, (0, "elementwise"): 25.0, (0, "memcpy"): 25.0, (1, "communication"): 100.0}


@pytest.mark.parametrize(
    "kernel, op, kind, want",
    [
        ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", None, "kernel", "communication"),
        ("triton_poi_fused_add_0", "CompiledFunction", "kernel", "triton_pointwise"),
        ("triton_red_fused_sum_1", None, "kernel", "triton_reduction"),
        ("triton_per_fused__softmax_2", None, "kernel", "triton_persistent_reduction"),
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", "aten::mm", "kernel", "gemm"),
        ("Cijk_Alik_Bljk_B_BS_BH_Bias_HA_S_SAV_UserArgs_MT256x128x64", "aten::mm", "kernel", "gemm"),
        ("sm90_xmma_fprop_implicit_gemm_f32f32_tf32f32", "aten::cudnn_convolution", "kernel", "conv"),
        (
            "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64>, cutlass::bfloat16_t>",
            None,
            "kernel",
            "attention",
        ),
        ("attn_fwd", "aten::_flash_attention_forward", "kernel", "attention"),
        ("void cudnn::bn_fw_tr_1C11_kernel_NCHW<float>", None, "kernel", "normalization"),
        ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, MeanOps> >", None, "kernel", "reduction"),
        ("void at::native::vectorized_elementwise_kernel<4, FillFunctor<float> >", "aten::mm", "kernel", "elementwise"),
        ("mystery_kernel", "aten::addmm", "kernel", "gemm"),  # unknown kernel name: its op decides
        ("mystery_kernel", None, "kernel", "other"),
        ("Memset (Device)", "aten::mm", "memset", "memset"),
        ("cpp_fused_add_relu_0", "cpp_fused_add_relu_0", "cpu_op", "inductor_cpp"),
    ],
)
def test_categories_table(kernel, op, kind, want):
    df = pl.DataFrame(
        {"name": [kernel], "op": [op], "kind": [kind]}, schema={"name": pl.String, "op": pl.String, "kind": pl.String}
    )
    assert df.select(rp.category_expr(pl.col("name"), pl.col("op"), pl.col("kind"))).item() == want


# ------------------------------------------------------------------ CPU ops, stacks, launches
@pytest.fixture
def nested_trace(tmp_path):
    """ProfilerStep#1 [0,200] > aten::linear [10,110] > aten::addmm [20,100] with a launch at 30
    (5 µs) whose kernel runs [60,90]; aten::relu [120,150] with a launch at 125 (2 µs) and a 1 µs
    kernel at 200. python frames wrap the linear: model.py(1): forward [5,115]."""
    ev = [
        op("ProfilerStep#1", 0, 200, cat="user_annotation"),
        op("model.py(1): forward", 5, 110, cat="python_function"),
        op("aten::linear", 10, 100, **{"Input Dims": [[16, 32], [64, 32], [64]]}),
        op("aten::addmm", 20, 80, **{"Input Dims": [[64], [16, 32], [32, 64]]}),
        launch(30, 5, 1),
        gpu("sm90_xmma_gemm_bf16", 60, 30, 1),
        op("aten::relu", 120, 30, **{"Input Dims": [[16, 64]]}),
        launch(125, 2, 2),
        gpu("vectorized_elementwise_kernel<relu>", 200, 1, 2),
    ]
    return flat_of(tmp_path, ev)


def test_op_table_self_and_total_times(nested_trace):
    t = {r["name"]: r for r in rp.op_table(nested_trace).iter_rows(named=True)}
    assert (t["aten::linear"]["self_cpu_us"], t["aten::linear"]["cpu_total_us"]) == (20.0, 100.0)
    assert (t["aten::addmm"]["self_cpu_us"], t["aten::addmm"]["self_device_us"]) == (80.0, 30.0)
    assert (t["aten::linear"]["self_device_us"], t["aten::linear"]["device_total_us"]) == (0.0, 30.0)
    assert t["ProfilerStep#1"]["self_cpu_us"] == 200.0 - 100.0 - 30.0
    assert t["ProfilerStep#1"]["device_total_us"] == 31.0 and t["ProfilerStep#1"]["kernels"] == 2
    assert rp.op_table(nested_trace)["name"][0] == "aten::addmm"  # default sort: self device time
    shapes = rp.op_table(nested_trace, group_by="input-shape", sort="self_cpu_us")
    assert shapes.filter(pl.col("name") == "aten::relu")["input_shape"].item() == "[[16,64]]"
    stack = rp.op_table(nested_trace, group_by="stack")
    assert (
        stack.filter(pl.col("name") == "aten::addmm")["stack"].item()
        == "aten::linear <- model.py(1):_forward <- ProfilerStep#1"
    )
    with pytest.raises(UsageError):
        rp.op_table(nested_trace, sort="nope")


def test_collapsed_stacks_like_export_stacks(nested_trace):
    lines = rp.stack_lines(rp.collapsed_stacks(nested_trace)).splitlines()
    assert "ProfilerStep#1;model.py(1):_forward;aten::linear;aten::addmm 80" in lines
    assert "ProfilerStep#1;model.py(1):_forward;aten::linear 20" in lines
    assert "ProfilerStep#1;model.py(1):_forward 10" in lines
    assert "ProfilerStep#1;aten::relu 30" in lines
    dev = rp.stack_lines(rp.collapsed_stacks(nested_trace, "self_device_time_total")).splitlines()
    assert dev == ["ProfilerStep#1;aten::relu 1", "ProfilerStep#1;model.py(1):_forward;aten::linear;aten::addmm 30"]


def test_launch_overhead(nested_trace):
    r = rp.launch_overhead(nested_trace).row(0, named=True)
    assert r["kernels"] == 2 and r["launch_max_us"] == 5.0
    assert r["launch_to_start_max_us"] == 75.0  # relu kernel at 200, launched at 125
    assert r["shorter_than_launch_pct"] == 50.0  # the 1 µs kernel < its 2 µs launch


def test_compile_view_regions_and_breaks(tmp_path):
    ev = [
        op("ProfilerStep#3", 0, 1000, cat="user_annotation"),
        op("Torch-Compiled Region: 0/0", 100, 200),
        op("CompiledFunction", 110, 180),
        op("aten::add", 320, 50),  # eager code between the graphs: a graph break
        op("CompiledFunction", 500, 200),
        op("CompiledFunctionBackward", 800, 100, tid=TID + 1),  # autograd thread
        op("autograd::engine::evaluate_function: CompiledFunctionBackward", 790, 120, tid=TID + 1),
    ]
    f = flat_of(tmp_path, ev)
    r = rp.compile_view(f).row(0, named=True)
    assert (r["step"], r["regions"], r["compiled_us"], r["outside_us"]) == (3, 4, 500.0, 500.0)
    assert (r["breaks"], r["break_us"], r["largest_break_us"]) == (2, 300.0, 200.0)
    names = dict(rp.compiled_regions(f).select("name", "count").rows())
    assert names == {"CompiledFunction": 2, "Torch-Compiled Region: 0/0": 1, "CompiledFunctionBackward": 1}


def test_communication_overlap(tmp_path):
    ev = [
        gpu("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 0, 100, stream=20),
        gpu("ncclDevKernel_AllGather_RING_LL", 50, 100, stream=21),
        gpu("sm90_xmma_gemm_bf16", 40, 20),
        gpu("vectorized_elementwise_kernel", 130, 40),
    ]
    r = rp.communication(flat_of(tmp_path, ev)).row(0, named=True)
    assert (r["comm_kernels"], r["comm_us"], r["comm_busy_us"]) == (2, 200.0, 150.0)
    assert (r["overlapped_us"], r["exposed_us"]) == (40.0, 110.0)


def test_cpu_only_trace_uses_cpu_ops(tmp_path):
    ev = [
        op("ProfilerStep#1", 0, 100, cat="user_annotation"),
        op("CompiledFunction", 10, 80),
        op("cpp_fused_add_relu_0", 20, 30),
        op("cpp_fused_add_relu_0", 60, 10),
        op("aten::empty", 75, 5),
    ]
    f = flat_of(tmp_path, ev)
    k = rp.kernel_table(f)
    assert set(k["device"]) == {rp.CPU_DEVICE}
    row = k.filter(pl.col("name") == "cpp_fused_add_relu_0").row(0, named=True)
    assert (row["count"], row["dur_us"], row["category"]) == (2, 40.0, "inductor_cpp")
    assert k.filter(pl.col("name") == "CompiledFunction")["dur_us"].item() == 80.0 - 45.0  # self time
    doc = rp.analysis_json(rp.analyze(f))
    assert doc["devices"][0]["device"] == rp.CPU_DEVICE and doc["devices"][0]["busy_pct"] == 100.0


def test_a_cpu_only_trace_s_report_says_cpu_ops_not_kernels(tmp_path, busy_trace):
    """Where the CPU's ops stand for kernels, the titles, the shares' meanings and the page's
    overview say so; a trace with a device keeps the device words."""
    f = flat_of(tmp_path, [op("ProfilerStep#1", 0, 100, cat="user_annotation"), op("aten::mm", 10, 80)], "cpu")
    only = ["devices", "kernels", "streams", "categories"]
    text = rp.format_analysis(f, rp.analyze(f, only=only), "table", 60, None, only, 200)
    assert "Kernels per device" not in text and "union of kernels" not in text and "\nStreams\n" not in text
    assert "CPU ops by name" in text and "CPU busy time" in text and "Threads" in text
    assert "pct: % of the CPU ops' self time" in text and "% of the device's kernel time" not in text
    page = rp.format_analysis(f, rp.analyze(f), "html", 60, None, None, None)
    assert "CPU busy and idle" in page and "top CPU op category" in page and "Top 2 CPU ops by self CPU time" in page
    assert "Device busy and idle" not in page and "top kernel category" not in page
    gpu_text = rp.format_analysis(busy_trace, rp.analyze(busy_trace, only=only), "table", 60, None, only, 200)
    assert "Kernels per device" in gpu_text and "CPU ops by name" not in gpu_text
    assert "% of the device's kernel time" in gpu_text


def test_device_sections_alone_sweep_only_the_gpu_ops(tmp_path):
    """devices, kernels, transfers, streams and categories read the GPU sweep alone: asked for
    alone they make no CPU sweep (the op tree, half an analyze of them), and say what they say
    in a whole analyze."""
    ev = launched("aten::mm", "gemm_a", 0, 1) + launched("aten::add", "add_kernel", 30, 2, stream=8)
    ev += [gpu("Memcpy HtoD (Pinned -> Device)", 80, 10, stream=9, cat="gpu_memcpy")]
    only = ["devices", "kernels", "transfers", "streams", "categories"]
    f = flat_of(tmp_path, ev)
    alone = rp.analyze(f, only=only)
    assert not f._cpu, "a CPU sweep was made"
    whole = rp.analyze(rp.Flat(f.path))
    assert all(alone[k].equals(whole[k]) for k in only)
    assert rp.analyze(f, only=["ops"])["ops"].height and f._cpu  # a section of the op tree sweeps it


def test_a_trace_file_s_report_needs_no_run_tables(shared_traces, tmp_path):
    """`analyze TRACE.json` flattens into a scratch directory without the run tables (collectives,
    steps: what whole runs are measured from), its Parquet in LZ4 (written for speed: read once);
    its report, every section, is the one of the trace flattened with them (kept: zstd). On a
    real NCCL trace, whose collectives table has rows."""
    trace = shared_traces / "hta/a100_nccl.json.gz"
    kept = flatten(trace, tmp_path / "flat")
    assert pl.read_parquet(kept.out_dir / "collectives.parquet").height > 0

    def document(f):  # the JSON report but where it was flattened (a scratch directory names none)
        doc = json.loads(rp.format_analysis(f, rp.analyze(f), "json"))
        doc["trace"].pop("flat_dir", None)
        return doc

    def codecs(d):
        return {pq.ParquetFile(p).metadata.row_group(0).column(0).compression for p in d.glob("*.parquet")}

    with rp.opened(trace) as f:
        assert not (f.path / "collectives.parquet").exists() and not (f.path / "steps.parquet").exists()
        assert codecs(f.path) == {"LZ4"}
        scratch = document(f)
    assert codecs(kept.out_dir) == {"ZSTD"}
    assert scratch == document(rp.Flat(kept.out_dir))


# ------------------------------------------------------------------ JSON contract
def _strict_json(text: str):
    def no_nan(c):
        raise AssertionError(f"{c} in JSON output")

    return json.loads(text, parse_constant=no_nan)


def test_analysis_json_contract(nested_trace, busy_trace):
    for f in (nested_trace, busy_trace):
        doc = _strict_json(rp.format_analysis(f, rp.analyze(f), "json"))
        for d in doc["devices"]:
            assert {"device", "name", "busy_pct", "kernels"} <= set(d)
            assert isinstance(d["device"], int) and isinstance(d["name"], str) and isinstance(d["busy_pct"], float)
            for k in d["kernels"]:
                assert {
                    "name",
                    "count",
                    "dur_us",
                    "flops",
                    "bytes",
                    "achieved_flops_pct",
                    "achieved_bw_pct",
                    "category",
                } <= set(k)
        assert {"ops", "launch", "compile", "communication"} <= set(doc)
    doc = _strict_json(rp.format_analysis(busy_trace, rp.analyze(busy_trace), "json"))
    d0 = doc["devices"][0]
    assert sum(k["count"] for k in d0["kernels"]) == 3 and sum(k["dur_us"] for k in d0["kernels"]) == 30.0
    assert [t["kind"] for t in d0["transfers"]] == ["memcpy"]


def test_costs_aggregate_flops_and_duration_weighted(tmp_path):
    """Cost columns as another stage would fill them (synthetic frame): two launches of one kernel."""
    f = flat_of(tmp_path, [gpu("k", 0, 10, 1), gpu("k", 20, 30, 2), gpu("k2", 60, 10, 3)])
    g = (
        pl.read_parquet(f.path / "gpu_ops.parquet")
        .sort("ts_ns")
        .with_columns(
            flops=pl.Series([1e9, 5e9, None]),
            bytes=pl.Series([1e6, 3e6, None]),
            achieved_flops_pct=pl.Series([10.0, 20.0, None]),
            achieved_bw_pct=pl.Series([1.0, 2.0, None]),
            peak_tflops=pl.Series([100.0] * 3),
            peak_bw_gbps=pl.Series([1000.0] * 3),
        )
    )
    store.write_table(g.to_arrow(), f.path / "gpu_ops.parquet", "gpu_ops")
    k = {r["name"]: r for r in rp.kernel_table(rp.Flat(f.path)).iter_rows(named=True)}
    assert (k["k"]["flops"], k["k"]["bytes"]) == (6e9, 4e6)
    assert k["k"]["achieved_tflops"] == pytest.approx(6e9 / 40e-6 / 1e12)
    assert k["k"]["achieved_flops_pct"] == pytest.approx((10 * 10 + 20 * 30) / 40)
    assert k["k"]["arithmetic_intensity"] == 1500.0 and k["k"]["roofline_bound"] == "compute"  # ridge 100
    assert k["k2"]["flops"] is None and k["k2"]["achieved_flops_pct"] is None


# ------------------------------------------------------------------ diff
def test_normalise_ops_and_kernels():
    ops = pl.Series(
        [
            "aten::cudnn_convolution",
            "aten::miopen_convolution",
            "aten::add.Tensor",
            "aten::_flash_attention_forward",
            "aten::_efficient_attention_forward",
            "aten::mm",
        ]
    )
    assert ops.to_frame("n").select(rp.normalize_op(pl.col("n")))["n"].to_list() == [
        "aten::convolution",
        "aten::convolution",
        "aten::add",
        "aten::scaled_dot_product_attention",
        "aten::scaled_dot_product_attention",
        "aten::mm",
    ]
    kernels = pl.Series(
        [
            "void at::native::(anonymous namespace)::CatArrayBatchedCopy<float, 2>(float*, int)",
            "triton_poi_fused_add_cos_sin_0",
            "Memcpy HtoD (Pinned -> Device)",
            "std::enable_if<(((8)>(0)))&&T<c10::BFloat16>::ok, void>::type vllm::rms_norm_kernel<8>(int)",
        ]
    )
    assert kernels.to_frame("n").select(rp.normalize_kernel(pl.col("n")))["n"].to_list() == [
        "at::native::CatArrayBatchedCopy",
        "triton_poi_fused_add_cos_sin",
        "Memcpy HtoD",
        "vllm::rms_norm_kernel",
    ]


# ------------------------------------------------------------------ readable (demangled) names
# A kernel of mi300x_vllm_graph_replay (ck_tile's RMSNorm, as ROCm writes it: mangled).
CK_RMSNORM = (
    "_ZN7ck_tile6kentryILi1ENS_12Rmsnorm2dFwdINS_27Rmsnorm2dFwdPipelineOnePassINS_27Rmsnorm2dFw"
    "dPipelineProblemIDF16bDF16bfDF16bDF16bDF16bffNS_19Generic2dBlockShapeINS_8sequenceIJLi1ELi"
    "3072EEEENS5_IJLi1ELi128EEEENS5_IJLi1ELi8EEEEEENS_18Rmsnorm2dFwdTraitsILb1ELb0ELb0ELb0ELNS_"
    "21Rmsnorm2dFusedAddEnumE0ELNS_23Rmsnorm2dFusedQuantEnumE0ELNS_22Rmsnorm2dSensitiveEnumE0EE"
    "EEENS_33Rmsnorm2dFwdPipelineDefaultPolicyEEENS_17Default2DEpilogueINS_24Default2DEpilogueP"
    "roblemIfDF16bLb0ELb1ELb0EEEvEEEEJNSM_5KargsEEEEvDpT1_"
)


def test_readable_demangles_itanium_names():
    pytest.importorskip("cpp_demangle")
    assert names.readable("_Z3fooi") == "foo(int)"
    out = names.readable(CK_RMSNORM)
    assert out.startswith("void ck_tile::kentry<1, ck_tile::Rmsnorm2dFwd<ck_tile::Rmsnorm2dFwdPipelineOnePass<")
    assert "std::bfloat16_t" in out  # DF16b: newer than libstdc++ 12's __cxa_demangle knows
    for plain in ("aten::mm", "Memcpy HtoD (Pinned -> Device)", "triton_poi_fused_add_0", "Cijk_Alik_Bljk_HHS_BH"):
        assert names.readable(plain) == plain


@pytest.mark.parametrize(
    "hostile",
    [
        "_Zgarbage",
        "_Z",
        "_Z3foo\x00i",
        "_Z" + "N" * 200_000 + "1aE",  # nesting deeper than any recursion limit
        "_Z1fP" + "A1_" * 100_000 + "i",
        "_Z1f" + "P" * 500_000 + "i",
        "_Z" + "\u00e9\u2603" * 1000,
        "_Z" + "3foo" * 20_000,  # longer than MAX_MANGLED
    ],
)
def test_readable_never_raises_on_hostile_names(hostile):
    assert names.readable(hostile) == hostile  # not demangled, not crashed, not hung


def exponential_name(k: int) -> str:
    """f(a, b<a,a>, b<b<a,a>,b<a,a>>, ...): each parameter doubles the last by substitutions, so
    a 300-character name spells 2**k characters."""
    digits = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    params, sub = "1a1bIS_S_E", 2
    for _ in range(k):
        ref = (
            "S" + digits[(sub - 1) % 36] + "_"
            if sub < 37
            else "S" + digits[(sub - 1) // 36] + digits[(sub - 1) % 36] + "_"
        )
        params, sub = params + "S0_I" + ref + ref + "E", sub + 1
    return "_Z1f" + params


@pytest.mark.slow
def test_readable_bounds_an_exponential_expansion(monkeypatch):
    pytest.importorskip("cpp_demangle")
    monkeypatch.setattr(names, "_spent", [0.0])  # its own budget: this test spends seconds of it
    small = names.readable(exponential_name(6))
    assert small.startswith("f(a, b<a, a>, b<b<a, a>, b<a, a> >")
    for k in (17, 30):  # 2**17 chars: over MAX_DEMANGLED; 2**30: over the demangler's own limit
        assert names.readable(exponential_name(k)) == exponential_name(k)


def test_readable_falls_back_without_the_package_or_budget(monkeypatch):
    monkeypatch.setattr(names, "_demangle", None)
    names.readable.cache_clear()
    assert names.readable("_Z3fooi") == "_Z3fooi"
    monkeypatch.undo()
    names.readable.cache_clear()
    monkeypatch.setattr(names, "_spent", [names.DEMANGLE_BUDGET_S])
    assert names.readable("_Z3bari") == "_Z3bari"  # the process's time for demangling is spent
    names.readable.cache_clear()


def test_normalize_kernel_demangles_and_unwraps_launch_wrappers():
    pytest.importorskip("cpp_demangle")
    cutlass = "void cutlass::Kernel2<cutlass_80_tensorop_s16816gemm_f16_64x64_32x6_nn_align8>(Params)"
    kernels = pl.Series([CK_RMSNORM, CK_RMSNORM.replace("Li1ELi3072E", "Li1ELi4096E"), cutlass])
    assert kernels.to_frame("n").select(rp.normalize_kernel(pl.col("n")))["n"].to_list() == [
        "ck_tile::Rmsnorm2dFwd",
        "ck_tile::Rmsnorm2dFwd",  # another block shape: the same kernel across builds
        "cutlass_80_tensorop_s16816gemm_f16_64x64_32x6_nn_align8",
    ]


@pytest.fixture
def diff_pair(tmp_path):
    """A: NVIDIA-like (device 0); B: AMD-like on device 3. Convolution by cudnn vs miopen, add with
    an overload suffix on one side, an op only A has, and one op-less kernel on each side."""
    a = [
        *launched("aten::cudnn_convolution", "implicit_convolve_sgemm", 0, 1, kdur=40),
        *launched("aten::add", "vectorized_elementwise_kernel<add>", 100, 2),
        *launched("aten::add", "vectorized_elementwise_kernel<add>", 200, 3),
        *launched("aten::nonzero", "nonzero_kernel", 300, 4),
        gpu("void foo<int>(int*)", 500, 7),
    ]
    b = [
        *launched("aten::miopen_convolution", "MIOpenConvFwd_v4r1", 0, 1, kdur=25, device=3),
        *launched("aten::add.Tensor", "elementwise_kernel_manual_unroll<add>", 100, 2, device=3),
        gpu("void foo<float>(float*)", 500, 3, device=3),
    ]
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    return flat_of(tmp_path / "a", a, "a"), flat_of(tmp_path / "b", b, "b")


def test_diff_matches_aliases_across_devices(diff_pair):
    d = rp.diff(*diff_pair)
    rows = {r["key"]: r for r in rp.diff_json(d, "nv", "amd")["rows"]}
    conv = rows["aten::convolution"]
    assert conv["kind"] == "op" and (conv["a"]["count"], conv["a"]["dur_us"]) == (1, 40.0)
    assert (conv["b"]["count"], conv["b"]["dur_us"], conv["b"]["devices"]) == (1, 25.0, [3])
    assert conv["delta_us"] == -15.0 and conv["a"]["top_kernels"][0]["name"] == "implicit_convolve_sgemm"
    add = rows["aten::add"]
    assert (add["a"]["count"], add["a"]["calls"], add["a"]["dur_us"], add["b"]["count"]) == (2, 2, 20.0, 1)
    assert rows["aten::nonzero"]["b"] is None and rows["aten::nonzero"]["a"]["count"] == 1
    assert rows["foo"]["kind"] == "kernel" and rows["foo"]["a"]["dur_us"] == 7.0 and rows["foo"]["b"]["dur_us"] == 3.0
    assert list(rows)[0] == "aten::convolution"  # sorted by the larger side's time
    _strict_json(rp.format_diff(d, "json", "nv", "amd"))
    text = rp.format_diff(d, "table", "nv", "amd", name_limit=12)
    assert "nv:dur_us" in text and "amd:dur_us" in text and "aten::convolution" not in text
    assert "aten::c…tion" in text  # 12 characters, cut in the middle (no room for an id)
    long = rp.format_diff(d, "table", "control_a100_run", "test_v100_run", width=80)
    assert long.startswith("a: control_a100_run\nb: test_v100_run\n")  # long labels: a / b, named above
    assert "a:dur_us" in long and "b:dur_us" in long and "delta_us" in long
    assert all(len(line) <= 80 for line in long.splitlines())


# ------------------------------------------------------------------ CLI and plots
def test_cli_analyze_and_diff(tmp_path, run_cli):
    src = tmp_path / "t.json"
    src.write_text(json.dumps({"traceEvents": [*launched("aten::mm", "gemm_kernel", 0, 1)]}))
    p = run_cli(["analyze", src, "--format", "json"])
    assert p.returncode == 0, p.stderr
    assert _strict_json(p.stdout)["devices"][0]["kernels"][0]["name"] == "gemm_kernel"
    out = tmp_path / "k.csv"
    p = run_cli(["analyze", src, "-f", "csv", "-o", out, "--section", "kernels"])
    assert p.returncode == 0 and out.read_text().startswith("device,name,category,count,dur_us")
    p = run_cli(["analyze", src, "--top", "1", "--name-limit", "5", "-f", "md"])
    assert p.returncode == 0 and "| ge…el |" in p.stdout and "gemm_kernel" not in p.stdout
    p = run_cli(["diff", src, src, "--format", "json", "--label-a", "x", "--label-b", "y"])
    assert p.returncode == 0 and _strict_json(p.stdout)["labels"] == {"a": "x", "b": "y"}
    for bad in (
        ["analyze", tmp_path / "missing.json"],
        ["analyze", src, "-f", "xml"],
        ["analyze", src, "--section", "nope"],
        ["analyze", src, "--group-by", "colour"],
    ):
        p = run_cli(bad)
        assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr


def test_plots_png_and_svg(nested_trace, tmp_path):
    pytest.importorskip("matplotlib")
    from pipeline.render.plots import write_plots

    paths = write_plots(nested_trace, rp.analyze(nested_trace), tmp_path / "plots")
    figures = {p.stem.rsplit("_", 1)[1] for p in paths}
    assert figures == {"breakdown", "roofline", "queue"} and len(paths) == 2 * len(figures)  # PNG + SVG each
    assert all(p.stat().st_size > 1000 for p in paths)


# ------------------------------------------------------------------ real traces
REAL = sorted(TRACES.glob("*/*.json.gz")) if TRACES.is_dir() else []
GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset"}


NPU_COPIES, NPU_WAITS = {"PCIE_DMA_SQE", "SDMA_SQE"}, {"EVENT_RECORD_SQE", "EVENT_WAIT_SQE", "PLACE_HOLDER_SQE"}


def _truth(path: Path):
    """Per args.device: kernel count, kernel µs, busy % of all GPU activity, by plain json.load. A
    torch_npu trace (a bare list): the tasks of its `Ascend Hardware` process, the device in their
    pid (`& 31`), copies and a stream's event record/wait tasks not kernels, the waits not busy."""
    with gzip.open(path, "rt") as fh:
        doc = json.load(fh)
    ev = doc["traceEvents"] if isinstance(doc, dict) else doc
    npu = {e["pid"] for e in ev if e.get("ph") == "M" and e.get("args") == {"name": "Ascend Hardware"}}
    by_dev = {}
    for e in ev:
        if e.get("ph") == "X" and str(e.get("cat", "")).lower() in GPU_CATS:
            by_dev.setdefault(int(e["args"]["device"]), []).append(e)
        elif e.get("ph") == "X" and e.get("pid") in npu and e["args"]["Task Type"] not in NPU_WAITS:
            kind = "memcpy" if e["args"]["Task Type"] in NPU_COPIES or e["name"] == "MEMCPY_ASYNC" else "kernel"
            by_dev.setdefault(e["pid"] & 31, []).append({**e, "cat": kind})
    out = {}
    for dev, es in by_dev.items():
        ks = [e for e in es if e["cat"].lower() == "kernel"]
        iv = [(float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))) for e in es]
        runs = _brute_union(iv)
        busy = sum(e - s for s, e in runs)
        span = max(e for _, e in iv) - min(s for s, _ in iv)
        out[dev] = (len(ks), sum(float(e.get("dur", 0)) for e in ks), 100 * busy / span if span else 0.0)
    return out


@pytest.fixture(scope="module")
def real_flat(tmp_path_factory):
    out = tmp_path_factory.mktemp("real")
    return lambda p: (
        rp.Flat(out / trace_stem(p)) if store.is_flat_dir(out / trace_stem(p)) else rp.Flat(flatten(p, out).out_dir)
    )


@pytest.mark.real
@pytest.mark.parametrize("trace", REAL, ids=[f"{p.parent.name}/{trace_stem(p)}" for p in REAL])
def test_real_trace_counts_durations_and_busy(trace, real_flat):
    f = real_flat(trace)
    doc = _strict_json(rp.format_analysis(f, rp.analyze(f), "json"))
    got = {d["device"]: d for d in doc["devices"]}
    for dev, (n, us, busy) in _truth(trace).items():
        d = got[dev]
        assert sum(k["count"] for k in d["kernels"]) == n
        # durations are kept in whole ns: torch_npu's (1.35012757 µs) lose up to half a ns each
        assert math.isclose(sum(k["dur_us"] for k in d["kernels"]), us, rel_tol=1e-6, abs_tol=max(1e-3, 5e-4 * n))
        assert abs(d["busy_pct"] - busy) <= 1.0


@pytest.mark.real
def test_real_cross_vendor_diff_matches_most_launched_time(real_flat):
    a, b = TRACES / "tracelens/h100_qwen1.5_0.5b.json.gz", TRACES / "tracelens/mi300x_qwen1.5_0.5b.json.gz"
    if not (a.is_file() and b.is_file()):
        pytest.skip("h100/mi300x qwen traces not present")
    fa, fb = real_flat(a), real_flat(b)
    rows = rp.diff_json(rp.diff(fa, fb))["rows"]
    ops = [r for r in rows if r["kind"] == "op"]
    for side, f in (("a", fa), ("b", fb)):
        linked_kernels = (pl.col("kind") == "kernel") & pl.col("launch_event_idx").is_not_null()
        linked = f.gpu.filter(linked_kernels)["dur_ns"].sum() / 1e3
        matched = sum(r[side]["dur_us"] for r in ops if r["a"] and r["b"])
        assert matched >= 0.8 * linked
    both = [r for r in ops if r["a"] and r["b"]]
    assert len(both) >= 15 and max(r["a"]["dur_us"] for r in both) < 0.6 * sum(r["a"]["dur_us"] for r in both)


def test_gpu_activity_without_device_id_is_reported_under_minus_one(tmp_path):
    """A kernel whose args carry no device must still be counted (under device -1)."""
    events = [
        {
            "ph": "X",
            "cat": "kernel",
            "name": "k_nodev",
            "pid": 0,
            "tid": 7,
            "ts": 100.0,
            "dur": 5.0,
            "args": {"stream": 7, "correlation": 1},
        },
        {
            "ph": "X",
            "cat": "kernel",
            "name": "k_dev0",
            "pid": 0,
            "tid": 7,
            "ts": 110.0,
            "dur": 5.0,
            "args": {"device": 0, "stream": 7, "correlation": 2},
        },
    ]
    path = tmp_path / "nodev.json"
    path.write_text(json.dumps({"traceEvents": events}))
    p = subprocess.run(
        [sys.executable, "-m", "pipeline", "analyze", str(path), "--format", "json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    devices = {d["device"]: [k["name"] for k in d["kernels"]] for d in json.loads(p.stdout)["devices"]}
    assert devices == {-1: ["k_nodev"], 0: ["k_dev0"]}


def test_kernel_without_correlation_still_links_to_its_launch_by_flow(tmp_path):
    """A GPU op with no correlation id links through its ac2g flow, even when others have one."""
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10.0, "dur": 50.0, "args": {}},
        {
            "ph": "X",
            "cat": "cuda_runtime",
            "name": "cudaLaunchKernel",
            "pid": 1,
            "tid": 1,
            "ts": 20.0,
            "dur": 3.0,
            "args": {"correlation": 5},
        },
        {"ph": "s", "id": 5, "pid": 1, "tid": 1, "ts": 20.0, "cat": "ac2g", "name": "ac2g"},
        {
            "ph": "X",
            "cat": "kernel",
            "name": "k_nocorr",
            "pid": 0,
            "tid": 7,
            "ts": 40.0,
            "dur": 5.0,
            "args": {"device": 0, "stream": 7},
        },
        {"ph": "f", "id": 5, "pid": 0, "tid": 7, "ts": 40.0, "cat": "ac2g", "name": "ac2g", "bp": "e"},
        {
            "ph": "X",
            "cat": "cuda_runtime",
            "name": "cudaLaunchKernel",
            "pid": 1,
            "tid": 1,
            "ts": 30.0,
            "dur": 3.0,
            "args": {"correlation": 6},
        },
        {
            "ph": "X",
            "cat": "kernel",
            "name": "k_corr",
            "pid": 0,
            "tid": 7,
            "ts": 50.0,
            "dur": 5.0,
            "args": {"device": 0, "stream": 7, "correlation": 6},
        },
    ]
    path = tmp_path / "nocorr.json"
    path.write_text(json.dumps({"traceEvents": events}))
    from pipeline import flatten

    r = flatten(path, tmp_path / "out")
    g = pl.read_parquet(r.out_dir / "gpu_ops.parquet").sort("event_idx")
    assert g["launch_event_idx"].to_list() == [1, 5]
    assert g["launch_link"].to_list() == ["flow", "correlation"]
    assert g["cpu_op_name"].to_list() == ["aten::mm", "aten::mm"]


@pytest.mark.real
@pytest.mark.parametrize("trace", ["triosim/h100_vgg13", "tracelens/mi300x_vllm_graph_replay", "hta/a100_nccl"])
def test_every_percentage_says_what_it_is_a_share_of(trace, real_flat, shared_traces):
    """Every `pct` / `*_pct` column of every section has its meaning in the registry (a % of what),
    and the text output says it under the tables that show it."""
    from pipeline.analyses.registry import BY_NAME, pct_meanings

    f = real_flat(shared_traces / f"{trace}.json.gz")
    sections = rp.analyze(f)
    seen = set()
    for name, df in sections.items():
        for view in BY_NAME[name].tables(df).values():
            for column, meaning in pct_meanings(name, view.columns).items():
                assert meaning.startswith("% of "), (name, column, meaning)  # a share (compare's: "% change")
                seen.add(column)
    assert {"pct", "achieved_flops_pct", "achieved_bw_pct", "busy_pct"} <= seen
    text = rp.format_analysis(f, sections, "table", width=200)
    assert "pct: % of the device's kernel time" in text and "achieved_flops_pct: % of the FLOP peak" in text
