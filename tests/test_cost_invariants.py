"""Numbers a reader can trust, on every shared trace: no kernel above the FLOP peak of its math mode,
FLOPs only on the kernels that do an op's math, every kernel above the DRAM roof labelled cache."""

from __future__ import annotations

import polars as pl
import pytest

from pipeline.cost.kernel_roles import ROLES
from pipeline.cost.peaks import MATH_MODES
from pipeline.flatten import flatten

# kernels that rearrange, copy or fill data, by the words their libraries name them with (read
# independently of data/kernel_roles.toml): none may carry an op's FLOPs
NO_MATH = r"(?i)nchwToNhwc|nhwcToNchw|splitKreduce|init_device_workspace|CatArrayBatchedCopy|direct_copy|FillFunctor"


@pytest.fixture(scope="module")
def costed(shared_traces, tmp_path_factory) -> dict[str, pl.DataFrame]:
    out = tmp_path_factory.mktemp("invariants")
    paths = sorted(shared_traces.glob("*/*.json.gz"))
    return {
        p.parent.name + "/" + p.name.removesuffix(".json.gz"): pl.read_parquet(
            flatten(p, out / p.parent.name).out_dir / "gpu_ops.parquet"
        )
        for p in paths
    }


@pytest.mark.real
@pytest.mark.slow
def test_no_kernel_above_the_flop_peak_of_its_math_mode(costed):
    over = {t: g.filter(pl.col("achieved_flops_pct") > 100).height for t, g in costed.items()}
    assert not any(over.values()), over
    # and the peaks are those of the kernels' precision: TF32 convolutions against the TF32 peak
    vgg = costed["triosim/h100_vgg13"].filter(pl.col("name").str.contains("xmma_fprop.*tf32"))
    assert vgg.height and (vgg["math_mode"] == "tf32").all() and (vgg["peak_tflops"] == 494.5).all()


@pytest.mark.real
@pytest.mark.slow
def test_only_the_kernels_doing_an_ops_math_carry_its_flops(costed):
    for t, g in costed.items():
        if "kernel_role" not in g.columns:
            continue  # a trace without GPU kernels
        with_flops = g.filter(pl.col("flops") > 0)
        assert (with_flops["kernel_role"] == "math").all(), t
        assert with_flops.filter(pl.col("name").str.contains(NO_MATH)).is_empty(), t
        assert set(g["kernel_role"].drop_nulls()) <= set(ROLES), t
        assert set(g["math_mode"].drop_nulls()) <= set(MATH_MODES), t
    # the layout conversions of h100_vgg13 (20% of its GPU time) are costed, with none of the FLOPs
    layout = costed["triosim/h100_vgg13"].filter(pl.col("name").str.contains("nchwToNhwc|nhwcToNchw"))
    assert layout.height and (layout["flops"] == 0).all() and (layout["kernel_role"] == "layout").all()


@pytest.mark.real
@pytest.mark.slow
def test_above_the_dram_roof_is_labelled_cache(costed):
    cached = 0
    for t, g in costed.items():
        if "roofline_bound" not in g.columns:
            continue
        above = pl.col("achieved_bw_pct") > 100
        assert g.filter(above & (pl.col("roofline_bound") != "cache")).is_empty(), t
        assert g.filter(~above & (pl.col("roofline_bound") == "cache")).is_empty(), t
        cached += g.filter(above).height
    assert cached  # memsets into the L2 (param/rtx2080_resnet), small elementwise kernels (a100_old_format)


def test_op_kernel_counts_of_a_range_are_those_of_every_batch():
    """An op's kernel counts sum its kernels of every link batch (`OpKernels.of` reads only the
    batches whose ops overlap the asked range): an op split over two batches, graph replays'
    negative instances, and ranges inside, across and outside the batches."""
    from pipeline.cost.enrich import OP_INSTANCE, OpKernels

    batches = [
        pl.DataFrame({OP_INSTANCE: [10, 10, 11, 12, -5, None], "dur_ns": [1, 2, 3, 4, 5, 6]}),
        pl.DataFrame({OP_INSTANCE: [12, 13, 20, -7, -5], "dur_ns": [10, 20, 30, 40, 50]}),
        pl.DataFrame({OP_INSTANCE: [30, 31], "dur_ns": [100, 200]}),
    ]
    counts = OpKernels()
    for b in batches:
        counts.add(b.with_columns(kind=pl.lit("kernel"), kernel_role=pl.lit("math")))
    every = pl.concat(batches).drop_nulls(OP_INSTANCE)
    for asked in ([12], [11, 13], [-5], [-7, 20], [14, 19], [31, 99], [-100, 100], [40]):
        ops = pl.Series(asked, dtype=pl.Int64)
        got = counts.of(ops).sort(OP_INSTANCE)
        # negative instances (graph replays) and the others are ranges of their own
        ranges = [
            (min(side), max(side)) for side in ([a for a in asked if a < 0], [a for a in asked if a >= 0]) if side
        ]
        want = pl.concat(
            [
                every.filter(pl.col(OP_INSTANCE).is_between(lo, hi) & ((pl.col(OP_INSTANCE) < 0) == (lo < 0)))
                for lo, hi in ranges
            ]
        )
        want = want.group_by(OP_INSTANCE).agg(op_kernels=pl.len(), op_dur_ns=pl.col("dur_ns").sum()).sort(OP_INSTANCE)
        assert got.select(OP_INSTANCE, "op_kernels", "op_dur_ns").cast(want.schema).equals(want), asked
