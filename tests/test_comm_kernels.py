"""Communication kernels of every library (`comm_kernels.LIBRARIES`): category `communication`,
counted in exposed communication (per device and per step), and only the process groups'
collectives (NCCL, RCCL) matched across ranks. Kernel names as real traces and the libraries'
sources write them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import polars as pl
import pytest

from pipeline import report as rp
from pipeline.cost.comm_kernels import COLLECTIVE_KERNEL, COMM_KERNEL, LIBRARIES, library_of
from pipeline.flatten import flatten

# (kernel name as a trace writes it, library)
COMM = [
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", "NCCL"),
    ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "NCCL"),
    ("ncclDevKernel_Generic_1", "NCCL"),
    ("mscclKernel_Sum_hip_bfloat16_Simple_false", "RCCL"),
    ("void dpsk::ep::internode::dispatch<false, 4, false, 4>(int4*, float*, long*)", "DeepEP"),
    ("void dpsk::ep::internode::notify_dispatch<false, 4>(int const*, long*, int)", "DeepEP"),
    ("void dpsk::ep::internode::cached_notify<false>(int, int, int, int, int*)", "DeepEP"),
    ("void dpsk::ep::internode::combine<false, 4, __nv_bfloat16, 4, 4, 16, 24>(int4*, float*)", "DeepEP"),
    ("void dpsk::ep::internode::dispatch_ll<true, 3, 10, 7168>(void*, float*, int*)", "DeepEP"),
    ("void dpsk::ep::internode::combine_ll<3, 10, 7168, 9>(void*, void*, int*)", "DeepEP"),
    ("void deep_ep::intranode::dispatch<8, 768, 8192>(int4*, float*)", "DeepEP"),
    ("void deep_ep::internode_ll::clean_low_latency_buffer<32>(int*, int, int*, int)", "DeepEP"),
    ("void deep_ep::legacy::intranode::cached_notify_combine<8>(void**, int*, int, int)", "DeepEP"),
    ("void deep_ep::elastic::hybrid_dispatch_impl<true, 2, 8>(void*, void*, ncclDevComm_t const)", "DeepEP"),
    ("void barrier_on_stream_kernel_threadgroup<(threadgroup_t)2>(int, int)", "NVSHMEM"),
    ("void alltoall_on_stream_kernel<float>(int, float*, float const*, unsigned long)", "NVSHMEM"),
    ("void mscclpp::allreduceFullmesh<__nv_bfloat16>(__nv_bfloat16*, __nv_bfloat16*)", "MSCCL++"),
    ("void mscclpp::executionKernel<__nv_bfloat16, false>(int, __nv_bfloat16*)", "MSCCL++"),
    ("void sglang::allreduce_1shotLL_1node<__nv_bfloat16>(mscclpp::MemoryChannelDeviceHandle*)", "MSCCL++"),
    ("void vllm::cross_device_reduce_1stage<__nv_bfloat16, 8>(vllm::RankData*, vllm::RankSignals)", "custom"),
    ("void vllm::cross_device_reduce_2stage<c10::Half, 4>(vllm::RankData*, vllm::RankSignals)", "custom"),
    ("aiter::cross_device_reduce_2stage<bf16,8,false>", "custom"),
    ("_ZN4vllm26cross_device_reduce_1stageI13__nv_bfloat16Li8EEEvPNS_8RankDataENS_11RankSignalsE", "custom"),
    ("void sglang::cross_device_reduce_1stage<__nv_bfloat16, 8>(sglang::RankData*)", "custom"),
    ("void quickreduce::allreduce_prototype_twoshot<quickreduce::AllReduceTwoshot<__hip_bfloat16>>", "quick"),
    ("void tensorrt_llm::kernels::oneShotAllReduceKernel<__nv_bfloat16, 8, true>(AllReduceParams)", "TensorRT"),
    ("void flashinfer::trtllm_allreduce_fusion::allreduce_fusion_kernel_oneshot_lamport<1, float, 8>", "TensorRT"),
    ("void (anonymous namespace)::multimem_all_reduce_kernel<c10::BFloat16, 16>(c10::BFloat16*)", "PyTorch"),
    ("void (anonymous namespace)::two_shot_all_reduce_kernel_inplace<float, 16, 8>(float**)", "PyTorch"),
    ("allreduce6(int*, int*, int, int)", "other"),
]
NOT_COMM = [
    "void dpsk::ep::cuda::get_dispatch_layout<256, 32, 8>(long const*, int*, int*, int*, bool*)",
    "void deep_ep::internode::get_dispatch_layout<256, 32, 8>(long const*, int*, int*)",
    "cdpsk::ep::CUB_201_NS::DeviceScanKernel<int>",  # profile-data's CUB scans, a substring trap
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, MeanOps> >",
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n",
    "void at::native::vectorized_gather_kernel<16, long>",
]


@pytest.mark.parametrize("name, lib", COMM)
def test_every_librarys_kernels_are_communication(name, lib):
    assert (library_of(name) or "").startswith(lib)
    df = pl.DataFrame(
        {"n": [name], "op": [None], "k": ["kernel"]}, schema={"n": pl.String, "op": pl.String, "k": pl.String}
    )
    assert df.select(rp.category_expr(pl.col("n"), pl.col("op"), pl.col("k"))).item() == "communication"
    matched = lib in ("NCCL", "RCCL")
    assert bool(re.search(COLLECTIVE_KERNEL, name)) is matched  # only process groups' collectives are matched


@pytest.mark.parametrize("name", NOT_COMM)
def test_look_alikes_are_not_communication(name):
    assert library_of(name) is None and not re.search(COMM_KERNEL, name)


def test_the_table_says_where_each_library_was_found():
    names = [lib.name for lib in LIBRARIES]
    assert len(set(names)) == len(names)
    assert all(lib.source and re.compile(lib.kernel) for lib in LIBRARIES)
    assert {lib.name for lib in LIBRARIES if lib.matched} == {"NCCL", "RCCL"}


def _trace(tmp_path: Path, events: list) -> Path:
    step = {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 1000}
    src = tmp_path / "t.json"
    top = {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 8}}
    src.write_text(json.dumps({**top, "traceEvents": [step, *events]}))
    return flatten(src, tmp_path / "flat").out_dir


def k(name, ts, dur, stream):
    return {
        "ph": "X",
        "cat": "kernel",
        "name": name,
        "pid": 0,
        "tid": stream,
        "ts": ts,
        "dur": dur,
        "args": {"device": 0, "stream": stream},
    }


def test_exposed_communication_counts_every_library(tmp_path):
    """A DeepEP dispatch [100, 300] half under a GEMM [200, 400], a vLLM all-reduce [500, 600]
    alone: 300 µs of communication, 100 overlapped, 200 exposed; per step the same; and neither
    is a collective of the `collectives` table (no process group's sequence)."""
    flat = _trace(
        tmp_path,
        [
            k(COMM[4][0], 100, 200, 20),
            k("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", 200, 200, 7),
            k(COMM[19][0], 500, 100, 7),
        ],
    )
    r = rp.communication(rp.Flat(flat)).row(0, named=True)
    assert (r["comm_kernels"], r["comm_busy_us"], r["overlapped_us"], r["exposed_us"]) == (2, 300.0, 100.0, 200.0)
    step = pl.read_parquet(flat / "steps.parquet").row(0, named=True)
    assert (step["comm_ns"], step["exposed_comm_ns"], step["compute_ns"]) == (300_000, 200_000, 200_000)
    assert pl.read_parquet(flat / "collectives.parquet").height == 0


@pytest.mark.real
def test_a_vllm_trace_with_symmetric_memory_all_reduce(shared_traces, tmp_path):
    """tracelens/b200_eager: 73 `multimem_all_reduce_kernel` launches (torch symmetric memory, under
    vllm::all_reduce) and one NCCL all-gather: all communication, only the NCCL kernel a collective."""
    flat = flatten(shared_traces / "tracelens/b200_eager.json.gz", tmp_path).out_dir
    comm = pl.read_parquet(flat / "gpu_ops.parquet").filter(pl.col("category") == "communication")
    names = comm["name"].map_elements(library_of, return_dtype=pl.String).value_counts(sort=True).rows()
    assert names == [("PyTorch symmetric memory", 73), ("NCCL", 1)]
    assert pl.read_parquet(flat / "collectives.parquet")["name"].to_list() == [
        "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
    ]
