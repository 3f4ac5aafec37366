"""What a kernel does for its op (`kernel_roles`) and the precision its math ran at (`math_modes`):
the data tables on real kernel names from the shared traces and the vendors' naming schemes, and
how costing uses them (FLOPs to math kernels only, peaks by math mode, the cache bound) on
hand-made traces."""

# ruff: noqa: E501  (whole kernel names, as the traces hold them)

from __future__ import annotations

import gzip
import json
from pathlib import Path

import polars as pl
import pytest

from pipeline.cost import kernel_roles, math_modes, peaks
from pipeline.flatten import flatten

# ------------------------------------------------------------------ the tables, on real names


def role(name: str) -> str:
    return pl.select(kernel_roles.role_expr(pl.lit(name))).item()


def mode(name: str) -> str | None:
    return pl.select(math_modes.named_mode_expr(pl.lit(name))).item()


def test_every_rule_gives_its_own_example_its_role():
    """The rules are tried in order: a rule that an earlier one shadows is caught by its example."""
    for r in kernel_roles.table()[1]:
        assert role(r.example) == r.role, (r.pattern, r.example)


def test_every_mode_row_gives_its_own_example_its_mode():
    for f in math_modes.families():
        for m in f.modes:
            assert mode(m.example) == m.mode, (f.id, m.token, m.example)


# kernel names as the shared traces hold them (../shared/traces: which one in the comment)
REAL_ROLES = [
    # triosim/h100_vgg13: cuDNN's layout conversions and workspace fill around TF32 convolutions
    (
        "void cudnn::ops::nchwToNhwcKernel<float, float, float, false, true, (cudnnKernelDataType_t)0>(cudnn::ops::nchw2nhwc_params_t<float>, float const*, float*)",
        "layout",
    ),
    (
        "void cudnn::ops::nhwcToNchwKernel<float, float, float, true, false, (cudnnKernelDataType_t)0>(cudnn::ops::nhwc2nchw_params_t<float>, float const*, float*)",
        "layout",
    ),
    (
        "void cask_plugin_cudnn_infer::xmma_cudnn_infer::init_device_workspace_kernel<xmma_cudnn_infer::implicit_gemm::fprop::Warp_specialized_params_non_template<xmma_cudnn_infer::Grid_constant_params> >(xmma_cudnn_infer::implicit_gemm::fprop::Warp_specialized_params_non_template<xmma_cudnn_infer::Grid_constant_params>)",
        "fill",
    ),
    (
        "sm90_xmma_fprop_implicit_gemm_f32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize128x256x32_cgasize2x1x1_warpgroupsize2x1x1_g1_execute_segment_k_off_kernel_cudnn_infer",
        "math",
    ),
    # hta/diff_control_a100, hta/a100_nccl: split-K GEMMs, the bias epilogue, copies under aten::addmm
    (
        "void splitKreduce_kernel<float, float, float, float, true, true, false>(cublasSplitKParams<float>, float const*, float const*, float*, float const*, float const*, float const*, float const*, float*, void*, long, float*, int*)",
        "reduce",
    ),
    (
        "void cublasLt::splitKreduce_kernel<32, 16, int, float, float, float, float, true, false, false>(cublasLt::cublasSplitKParams<float>, float const*, float const*, float*, float const*, float const*, float const*, float const*, float*, void*, long, float*, int*)",
        "reduce",
    ),
    (
        "void epilogue::impl::globalKernel<float, float, float, true, true>(int, int, long, float*, cublasLtEpilogue_t, int, float*, long, void*, long, long, long, float*, float const*, float const*, float const*)",
        "epilogue",
    ),
    (
        "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_256x128_32x3_tn_align4>(cutlass_80_tensorop_s1688gemm_256x128_32x3_tn_align4::Params)",
        "math",
    ),
    (
        "void at::native::unrolled_elementwise_kernel<at::native::(anonymous namespace)::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1}, at::detail::Array<char*, 2>, TrivialOffsetCalculator<1, unsigned int>, TrivialOffsetCalculator<1, unsigned int>, at::native::memory::LoadWithCast<1>, at::native::memory::StoreWithCast<1> >(int, at::native::(anonymous namespace)::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1}, at::detail::Array<char*, 2>, TrivialOffsetCalculator<1, unsigned int>, TrivialOffsetCalculator<1, unsigned int>, at::native::memory::LoadWithCast<1>, at::native::memory::StoreWithCast<1>)",
        "copy",
    ),
    (
        "void cutlass_cudnn_train::Kernel<cutlass_cudnn_train::reduction::kernel::ReduceSplitK<cutlass_cudnn_train::MatrixShape<4, 128>, cutlass_cudnn_train::epilogue::thread::LinearCombination<float, 4, float, float, (cutlass_cudnn_train::epilogue::thread::ScaleType::Kind)0, (cutlass_cudnn_train::FloatRoundStyle)2>, cutlass_cudnn_train::reduction::thread::ReduceAdd<float, float, 4>, 4> >(cutlass_cudnn_train::reduction::kernel::ReduceSplitK<...>::Params)",
        "reduce",
    ),
    # hta/sampled_no_device_props: cuBLAS's beta scaling, masked fills
    (
        "void scal_kernel<float, float, 1, false, 6, 5, 5, 3>(cublasTransposeParams<float>, float const*, float*, float const*)",
        "epilogue",
    ),
    (
        "void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::masked_fill_kernel(at::TensorIterator&, c10::Scalar const&)::{lambda()#1}::operator()() const::{lambda()#7}::operator()() const::{lambda(float, bool)#1}, at::detail::Array<char*, 3> >(int, ...)",
        "fill",
    ),
    (
        "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, at::detail::Array<char*, 1> >(int, at::native::FillFunctor<float>, at::detail::Array<char*, 1>)",
        "fill",
    ),
    # tracelens/h100_qwen1.5_0.5b: RoPE's concatenation, bf16 casts, flash attention, elementwise math
    (
        "void at::native::(anonymous namespace)::CatArrayBatchedCopy<at::native::(anonymous namespace)::OpaqueType<2u>, unsigned int, 4, 64, 64>(...)",
        "copy",
    ),
    (
        "void at::native::vectorized_elementwise_kernel<4, at::native::bfloat16_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda(c10::BFloat16)#1}, std::array<char*, 2ul> >(int, ...)",
        "copy",
    ),
    (
        "void pytorch_flash::flash_fwd_kernel<pytorch_flash::Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, cutlass::bfloat16_t, pytorch_flash::Flash_kernel_traits<64, 128, 128, 4, cutlass::bfloat16_t> >, false, true, false, false, false, true, false, false>(pytorch_flash::Flash_fwd_params)",
        "math",
    ),
    (
        "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char*, 3ul>)",
        "math",
    ),
    # param/rtx2080_resnet, kineto/v100_tbplugin_resnet50: cuDNN's offsets, Winograd transforms, im2col
    ("void cask_cudnn::computeOffsetsKernel<false, false>(cask_cudnn::ComputeOffsetsParams)", "setup"),
    (
        "void cudnn::winograd_nonfused::winogradForwardData4x4<float, float>(cudnn::winograd_nonfused::WinogradDataParams<float, float>)",
        "transform",
    ),
    (
        "void cudnn::cnn::im2col4d_kernel<float, long>(cudnn::cnn::im2col4d_params, cudnnConvolutionStruct, cudnnTensor4dStruct, float const*, float*)",
        "layout",
    ),
    ("cudnn_volta_scudnn_winograd_128x128_ldg1_ldg4_relu_tile148t_nt_v1", "math"),
    # Inductor: a Triton kernel is its launch record's own op (its estimate is its own)
    ("triton_poi_fused__to_copy_0", "math"),
    # vLLM (tracelens/b200_eager, mi300x_vllm_graph_replay): the paged KV cache write
    (
        "void vllm::reshape_and_cache_flash_kernel<__nv_bfloat16, unsigned char, (vllm::Fp8KVCacheDataType)1>(__nv_bfloat16 const*, __nv_bfloat16 const*, unsigned char*, unsigned char*, long const*, long, long, long, long, int, int, int, float const*, float const*)",
        "copy",
    ),
    ("_combined_routing_memset", "fill"),
    # a name holding "mma" inside another word is no matrix kernel; "prefill" no fill
    (
        "void at::native::(anonymous namespace)::GammaBetaBackwardCUDAKernel<float, float>(long, long, float const*, float const*, float const*, float const*, float*, float*)",
        "math",
    ),
    ("_fwd_prefill_attention_kernel", "math"),
]


@pytest.mark.parametrize("name, want", REAL_ROLES, ids=[f"{w}:{n[:40]}" for n, w in REAL_ROLES])
def test_roles_of_real_kernel_names(name, want):
    assert role(name) == want


REAL_MODES = [
    # NVIDIA: cuBLAS / cuDNN / CUTLASS / xmma naming, from the shared traces
    (
        "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_32x6_tn_align4>(cutlass_80_tensorop_s1688gemm_64x64_32x6_tn_align4::Params)",
        "tf32",
    ),  # diff_control_a100
    (
        "sm90_xmma_wgrad_indexed_implicit_gemm_f32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize128x128x32_warpgroupsize1x1x1_g1_execute_segment_k_on_kernel_cudnn_train",
        "tf32",
    ),  # h100_vgg13
    (
        "sm80_xmma_fprop_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x128x16_stage4_warpsize2x2x1_g1_tensor16x8x8_execute_kernel_cudnn_infer",
        "tf32",
    ),  # a100_nccl
    (
        "void cutlass_cudnn_infer::Kernel<cutlass_tensorop_s1688dgrad_optimized_tf32_64x128_32x3_nhwc_align4>(cutlass_tensorop_s1688dgrad_optimized_tf32_64x128_32x3_nhwc_align4::Params)",
        "tf32",
    ),  # a100_nccl
    (
        "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8_stage3_warpsize2x2x1_ffma_aligna4_alignc4_execute_kernel__5x_cublas",
        "fp32",
    ),  # h100_vgg13: FP32 SIMT (ffma)
    (
        "void cutlass::Kernel<cutlass_80_simt_sgemm_256x128_8x4_nt_align1>(cutlass_80_simt_sgemm_256x128_8x4_nt_align1::Params)",
        "fp32",
    ),  # h100_vgg13
    ("volta_sgemm_128x64_nt", "fp32"),  # diff_test_v100
    ("ampere_sgemm_128x64_nn", "fp32"),  # a100_old_format_rank0
    ("cudnn_volta_scudnn_128x64_relu_xregs_large_nn_v1", "fp32"),  # rtx2080_resnet
    (
        "void cudnn::detail::dgrad_engine<float, 128, 6, 7, 3, 3, 5, false>(int, int, int, float const*, int, float const*, int, float*, kernel_grad_params, unsigned long long, int, unsigned long long, int, float, int, int, int)",
        "fp32",
    ),  # rtx2080_resnet
    (
        "void gemv2T_kernel_val<int, int, float, float, float, float, 128, 16, 4, 4, false, false, cublasGemvParams<cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float>, float> >(...)",
        "fp32",
    ),  # diff_test_v100
    (
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas",
        "bf16",
    ),  # h100_qwen
    ("nvjet_tst_144x128_64x6_2x1_v_bz_bias_TNN", "bf16"),  # b200_eager
    ("fmhaSm100aKernel_QkvE4m3OBfloat16H64PagedKvCausalP16VarSeqQ128Kv128PersistentContext", "fp8"),  # b200_eager
    (
        "bmm_Bfloat16_MxE2m1MxE4m3_Fp32_t128x16x256u2_s3_et128x16_m128x16x32_cga1x1x1_16dp256b_rM_TN_transOut_schedP2x1x2x3_biasM_bN_tmaOpt_clmp_dynBatch_sm100",
        "fp8",
    ),  # b200_eager: FP4 x FP8 at the FP8 rate
    (
        "void cutlass::Kernel<cutlass_70_wmma_tensorop_f16_s161616gemm_f16_32x32_64x2_tn_align8>(cutlass_70_wmma_tensorop_f16_s161616gemm_f16_32x32_64x2_tn_align8::Params)",
        "fp16",
    ),  # old_capitalized_cats
    (
        "_ZN19cutlass_cudnn_train6KernelINS_4conv6kernel23ImplicitGemmConvolutionINS1_11threadblock22ImplicitGemmMultistageINS_4gemm9GemmShapeILi128ELi128ELi32EEENS_9tfloat32_tEE",
        "tf32",
    ),  # a100_nccl (mangled)
    # AMD: Tensile / hipBLASLt, Triton matmuls
    (
        "Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT256x48x64_MI16x16x1_SN_LDSB1_AFC1_AFEM1_AFEM1_ASEM1_CLR1_CADS0_DTVA0_DTVB0_EPS0_FDSI0_GRPM1_GRVWA8_GRVWB8",
        "bf16",
    ),  # mi300x_vllm_graph_replay
    ("Cijk_Alik_Bljk_B_BS_BH_Bias_HA_S_SAV_UserArgs_MT128x224x64_MI16x16x1_SN_LDSB1_AFC1", "bf16"),  # mi300x_qwen
    (
        "Cijk_Ailk_Bjlk_SB_Bias_AS_SAV_UserArgs_MT64x16x16_MI16x16x1_SN_LDSB0_AFC1_AFEM1_AFEM1_ASEM1_CLR1_CADS0_EPS0",
        "fp32",
    ),  # mi250_rocm62_minitoy
    ("Cijk_Ailk_Bljk_S_B_Bias_HA_S_SAV_UserArgs_MT16x16x128_MI16x16x1_SN_LDSB1", "fp32"),  # mi300x_qwen
    ("_matmul_ogs_NNT_bf16xbf16xmxfp4_128x128x128x1_swiglu", "bf16"),  # mi300x_vllm: FP4 weights upcast on MI300X
    # the naming schemes beyond the shared traces (cuBLAS, Tensile, nvjet)
    ("volta_h884gemm_64x64_ldg8_nn", "fp16"),
    ("volta_fp16_s884gemm_fp16_128x128_ldg8_f2f_nn", "fp16"),
    ("turing_fp16_s1688gemm_fp16_256x128_ldg8_f2f_tn", "fp16"),
    ("void cutlass::Kernel<cutlass_75_tensorop_f16_s1688gemm_f16_256x128_32x2_tn_align8>(...)", "fp16"),
    ("ampere_tf32_s1688gemm_tf32_256x128_16x3_nn", "tf32"),
    ("ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_tn", "bf16"),
    ("turing_i8816gemm_int8_128x128_ldg16_nt", "int8"),
    ("sm80_xmma_gemm_f64f64_f64f64_f64_nn_n_tilesize64x64x16_stage4_warpsize2x2x1_dmma", "fp64"),
    ("Cijk_Ailk_Bljk_HHS_BH_MT128x128x32_MI32x32x8x1_SN", "fp16"),
    ("Cijk_Ailk_Bljk_S_MX_B_Bias_HA_S_SAV_UserArgs_MT128x128x32_MI32x32x4", "tf32"),
    ("Cijk_Alik_Bljk_F8NS_BH_Bias_HA_S_SAV_UserArgs_MT256x256x128", "fp8"),
    ("Cijk_Ailk_Bljk_DB_MT64x64x16_SN", "fp64"),
    ("Cijk_Ailk_Bljk_I8II_BH_MT128x128x64", "int8"),
    ("nvjet_hsh_256x128_64x4_2x1_v_bz_TNN", "fp16"),
    ("nvjet_qqtst_128x256_128x6_2x1_2cta_v_bz_TNT", "fp8"),
    ("nvjet_sss_tf32_128x256_TNT", "tf32"),
    # names that say nothing: the op's dtype decides
    ("attn_fwd", None),
    ("nvjet_sss_128x256_TNT", None),
    (
        "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)",
        None,
    ),
    (
        "void fbgemm_gpu::permute_2D_data_kernel<true, int, int, float>(int, int, int, int const*, float const*, int const*, int const*, int const*, int*, float*)",
        None,
    ),
]


@pytest.mark.parametrize("name, want", REAL_MODES, ids=[f"{w}:{n[:40]}" for n, w in REAL_MODES])
def test_math_modes_of_kernel_names(name, want):
    assert mode(name) == want


def test_every_mode_has_a_peak_column_and_a_dtype_maps_to_a_mode():
    assert set(peaks.MATH_MODES.values()) <= set(peaks.PEAK_COLS)
    assert set(peaks.DTYPE_MODE.values()) <= set(peaks.MATH_MODES)
    h100 = {"peak_fp32_tflops": 67.0, "peak_tf32_tflops": 494.5, "peak_bf16_tflops": 989.5, "peak_fp8_tflops": 1979.0}
    assert peaks.peak_for_mode(h100, "tf32") == 494.5 and peaks.peak_for_mode(h100, None) == 989.5
    v100 = {"peak_fp32_tflops": 15.7, "peak_fp16_tflops": 125.0}
    assert peaks.peak_for_mode(v100, "tf32") == 15.7  # no TF32 tensor cores: cuBLAS runs FP32
    assert peaks.peak_for_mode(v100, "fp8") is None  # no FP8 path: no peak, no %


# ------------------------------------------------------------------ costing with them, hand-made traces

H100 = [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85e9, "computeMajor": 9, "numSms": 132}]
LAYOUT = "void cudnn::ops::nchwToNhwcKernel<float, float, float, false, true, (cudnnKernelDataType_t)0>(...)"
CONV_TF32 = "sm90_xmma_fprop_implicit_gemm_f32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize128x256x32_kernel_cudnn_infer"
SPLITK = "void splitKreduce_kernel<float, float, float, float, true, false, false>(cublasSplitKParams<float>, ...)"
COPY = "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)>(...)"
SIMT = "void some_library::mystery_gemm_kernel<128>(...)"  # a GEMM whose name says nothing of its precision


class Trace:
    """Ops on thread 1, each launching named kernels (name, µs) on stream 7 of an H100."""

    def __init__(self):
        self.events: list[dict] = []
        self.corr, self.t = 0, 100

    def op(self, name: str, kernels: list[tuple[str, int]], **args):
        start = self.t
        for kernel, dur in kernels:
            self.corr += 1
            x = {"ph": "X", "pid": 1, "tid": 1, "ts": self.t + 1, "dur": 2, "cat": "cuda_runtime"}
            self.events.append({**x, "name": "cudaLaunchKernel", "args": {"correlation": self.corr}})
            on = {"correlation": self.corr, "device": 0, "stream": 7}
            self.events.append(
                {**x, "tid": 7, "ts": self.t + 5, "dur": dur, "cat": "kernel", "name": kernel, "args": on}
            )
            self.t += dur + 10
        self.events.append(
            {
                "ph": "X",
                "pid": 1,
                "tid": 1,
                "ts": start,
                "dur": self.t - start,
                "cat": "cpu_op",
                "name": name,
                "args": args,
            }
        )
        self.t += 10
        return self

    def kernels(self, tmp_path: Path) -> pl.DataFrame:
        path = tmp_path / "t.json.gz"
        with gzip.open(path, "wt") as f:
            json.dump({"traceEvents": self.events, "deviceProperties": H100}, f)
        g = pl.read_parquet(flatten(path, tmp_path / "out").out_dir / "gpu_ops.parquet")
        return g.filter(pl.col("kind") == "kernel").sort("correlation")


CONV = {  # as triosim/h100_vgg13 records it: input, weight, padding, stride, dilation, groups, benchmark, ...
    "Input Dims": [[64, 64, 56, 56], [64, 64, 3, 3], [], [], [], [], [], [], []],
    "Input type": ["float", "float", "ScalarList", "ScalarList", "ScalarList", "Scalar", "Scalar", "Scalar", "Scalar"],
    "Concrete Inputs": ["", "", "[1, 1]", "[1, 1]", "[1, 1]", "1", "False", "False", "True"],
}
CONV_FLOPS = 2 * 64 * 64 * 56 * 56 * 64 * 3 * 3
MM = {"Input Dims": [[4096, 4096], [4096, 4096]], "Input type": ["float", "float"]}
MM_FLOPS = 2 * 4096**3


def test_a_convolutions_flops_go_to_its_math_kernel_not_its_layout_conversions(tmp_path):
    """triosim/h100_vgg13's pattern: NCHW -> NHWC, the TF32 convolution, NHWC -> NCHW. The layout
    kernels take most of the time, do none of the math: all FLOPs and bytes are the convolution
    kernel's, held to the TF32 peak."""
    t = Trace().op("aten::cudnn_convolution", [(LAYOUT, 300), (CONV_TF32, 100), (LAYOUT, 300)], **CONV)
    g = t.kernels(tmp_path)
    assert g["kernel_role"].to_list() == ["layout", "math", "layout"]
    assert g["flops"].to_list() == [0.0, CONV_FLOPS, 0.0]
    assert g["bytes"][0] is None and g["bytes"][1] > 0 and g["bytes"][2] is None
    assert g["math_mode"].to_list() == [None, "tf32", None]
    assert g["peak_tflops"][1] == 494.5  # the H100's TF32 peak, not its FP32 67
    assert g["achieved_flops_pct"][1] == pytest.approx(100 * CONV_FLOPS / 100e-6 / 1e12 / 494.5)
    assert g["achieved_flops_pct"][0] == 0.0 and g["cost_source"].to_list() == ["formula"] * 3


def test_a_split_k_gemm_shares_its_flops_among_its_math_kernels_only(tmp_path):
    gemm = "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_32x6_tn_align4>(...)"
    g = Trace().op("aten::mm", [(gemm, 3000), (gemm, 1000), (SPLITK, 50)], **MM).kernels(tmp_path)
    assert g["kernel_role"].to_list() == ["math", "math", "reduce"]
    assert g["flops"].to_list() == pytest.approx([0.75 * MM_FLOPS, 0.25 * MM_FLOPS, 0.0])  # by duration
    assert g["flops"].sum() == pytest.approx(MM_FLOPS)  # nothing counted twice, nothing lost


def test_an_op_without_math_kernels_gives_its_bytes_to_all_its_kernels(tmp_path):
    """A copy op's copy kernels are its work: they move its bytes (and do no FLOPs)."""
    args = {"Input Dims": [[1024, 1024], [1024, 1024], []], "Input type": ["float", "float", "Scalar"]}
    g = Trace().op("aten::copy_", [(COPY, 10), (COPY, 30)], **args).kernels(tmp_path)
    assert g["kernel_role"].to_list() == ["copy", "copy"]
    assert g["flops"].to_list() == [0.0, 0.0]
    total = 2 * 1024 * 1024 * 4
    assert g["bytes"].to_list() == pytest.approx([0.25 * total, 0.75 * total])


def test_fp32_above_the_fp32_peak_ran_on_tf32_tensor_cores(tmp_path):
    """A GEMM whose name says nothing takes its op's dtype (fp32); at a rate only tensor cores reach
    it cannot have run in FP32: TF32 (allow_tf32, cuDNN's default)."""
    fast = MM_FLOPS / 200e12 * 1e6  # µs at 200 TFLOP/s: above the H100's FP32 67, below TF32 494.5
    slow = MM_FLOPS / 20e12 * 1e6
    g = (
        Trace()
        .op("aten::mm", [(SIMT, round(fast))], **MM)
        .op("aten::mm", [(SIMT, round(slow))], **MM)
        .kernels(tmp_path)
    )
    assert g["math_mode"].to_list() == ["tf32", "fp32"]
    assert g["peak_tflops"].to_list() == [494.5, 67.0]
    assert all(p <= 100 for p in g["achieved_flops_pct"])


def test_a_kernel_above_the_dram_roof_is_cache_bound(tmp_path):
    """Its op's bytes in its time exceed the H100's 3350 GB/s: the data came from the cache."""
    args = {"Input Dims": [[4096, 4096], [4096, 4096]], "Input type": ["float", "float"]}
    add = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, ...>(...)"
    # 3 x 64 MiB moved: ~60 µs at 3350 GB/s; in 20 µs it is ~10 TB/s
    g = Trace().op("aten::add", [(add, 20)], **args).op("aten::add", [(add, 200)], **args).kernels(tmp_path)
    assert g["achieved_bw_pct"][0] > 100 and g["roofline_bound"][0] == "cache"
    assert g["achieved_bw_pct"][1] < 100 and g["roofline_bound"][1] == "memory"
