"""Device-spec table and device matching (pipeline/devices.py, data/device_specs.csv)."""

from __future__ import annotations

import re

import polars as pl
import pytest

from pipeline.cost import devices as dv
from pipeline.errors import UsageError

# Device names as real traces write them -> the spec row they must match.
NAMES = {
    "Tesla V100-SXM2-16GB": "NVIDIA V100 SXM2 16GB",
    "Tesla V100-SXM2-32GB": "NVIDIA V100 SXM2 32GB",
    "Tesla V100-PCIE-16GB": "NVIDIA V100 PCIe 16GB",
    "Tesla V100-PCIE-32GB": "NVIDIA V100 PCIe 32GB",
    "Tesla V100S-PCIE-32GB": "NVIDIA V100S PCIe 32GB",
    "Tesla T4": "NVIDIA T4",
    "NVIDIA A10": "NVIDIA A10",
    "NVIDIA A10G": "NVIDIA A10G",
    "NVIDIA A100-SXM4-40GB": "NVIDIA A100 SXM4 40GB",
    "NVIDIA A100-SXM4-80GB": "NVIDIA A100 SXM4 80GB",
    "NVIDIA A100-PCIE-40GB": "NVIDIA A100 PCIe 40GB",
    "NVIDIA A100 80GB PCIe": "NVIDIA A100 PCIe 80GB",
    "NVIDIA A100-PG509-200": "NVIDIA A100 SXM4 40GB",
    "NVIDIA L4": "NVIDIA L4",
    "NVIDIA L40": "NVIDIA L40",
    "NVIDIA L40S": "NVIDIA L40S",
    "NVIDIA H100 80GB HBM3": "NVIDIA H100 SXM5 80GB",
    "NVIDIA H100 PCIe": "NVIDIA H100 PCIe 80GB",
    "NVIDIA H100 NVL": "NVIDIA H100 NVL 94GB",
    "NVIDIA H200": "NVIDIA H200 SXM 141GB",
    "NVIDIA H200 NVL": "NVIDIA H200 NVL 141GB",
    "NVIDIA GH200 480GB": "NVIDIA GH200 96GB",
    "NVIDIA B200": "NVIDIA B200",
    "NVIDIA GB200": "NVIDIA GB200",
    "NVIDIA GeForce RTX 4090": "NVIDIA GeForce RTX 4090",
    "AMD Instinct MI100": "AMD Instinct MI100",
    "AMD Instinct MI210": "AMD Instinct MI210",
    "AMD Instinct MI250X / MI250": "AMD Instinct MI250X (single GCD)",
    "AMD Instinct MI250X": "AMD Instinct MI250X (single GCD)",
    "AMD Instinct MI250": "AMD Instinct MI250 (single GCD)",
    "AMD Instinct MI300X": "AMD Instinct MI300X",
    "AMD Instinct MI300X VF": "AMD Instinct MI300X",
    "AMD Instinct MI300A": "AMD Instinct MI300A",
    "AMD Instinct MI325X": "AMD Instinct MI325X",
    "AMD Instinct MI350X": "AMD Instinct MI350X",
    "AMD Instinct MI355X": "AMD Instinct MI355X",
}
MI250_GCD_PROPS = {"numSms": 104, "totalGlobalMem": 68702699520, "computeMajor": 9, "computeMinor": 0}
NO_TENSOR_BF16 = {"sm_70", "sm_75"}  # Volta, Turing: FP16 tensor cores only


@pytest.fixture(scope="module")
def specs() -> pl.DataFrame:
    return dv.load_specs()


def spec(specs, name: str) -> dict:
    return specs.filter(pl.col("spec_name") == name).row(0, named=True)


def device_frame(*rows) -> pl.DataFrame:
    cols = ["device", "name", "total_global_mem", "compute_major", "compute_minor", "num_sms"]
    schema = {c: pl.String if c == "name" else pl.Int64 for c in cols}
    return pl.DataFrame([dict(zip(cols, r)) for r in rows], schema=schema, orient="row")


# ---- matching by name


@pytest.mark.parametrize("name, expected", NAMES.items())
def test_real_names_match(specs, name, expected):
    m = dv.match_device(name, {}, specs)
    assert (m["spec_name"], m["match"]) == (expected, "name")
    assert m["peak_bw_gbps"] == spec(specs, expected)["peak_bw_gbps"]


@pytest.mark.parametrize("name, expected", NAMES.items())
def test_row_order_resolves_overlapping_patterns(specs, name, expected):
    """The first row whose regex matches is the right one, and that row's own regex matches the name."""
    rows = specs.to_dicts()
    first = next(r["spec_name"] for r in rows if re.search(r["name_regex"], name, re.IGNORECASE))
    assert first == expected
    assert re.search(spec(specs, expected)["name_regex"], name, re.IGNORECASE)


def test_h100_pcie_vs_sxm(specs):
    pcie = dv.match_device("NVIDIA H100 PCIe", {}, specs)
    sxm = dv.match_device("NVIDIA H100 80GB HBM3", {}, specs)
    assert pcie["spec_name"] != sxm["spec_name"]
    assert sxm["peak_bf16_tflops"] > pcie["peak_bf16_tflops"]


def test_ambiguous_name_refined_by_properties(specs):
    """ROCm names both MI250 and MI250X "MI250X / MI250": the CU count decides."""
    name = "AMD Instinct MI250X / MI250"
    assert dv.match_device(name, MI250_GCD_PROPS, specs)["spec_name"] == "AMD Instinct MI250 (single GCD)"
    mi250x = {**MI250_GCD_PROPS, "numSms": 110}
    assert dv.match_device(name, mi250x, specs)["spec_name"] == "AMD Instinct MI250X (single GCD)"


def test_a100_memory_variant_refined_by_properties(specs):
    props = {"numSms": 108, "totalGlobalMem": 85_899_345_920, "computeMajor": 8, "computeMinor": 0}
    assert dv.match_device("NVIDIA A100-SXM4", props, specs)["spec_name"] == "NVIDIA A100 SXM4 40GB"  # regex says 40GB
    assert dv.match_device("NVIDIA A100-SXM4-80GB", props, specs)["spec_name"] == "NVIDIA A100 SXM4 80GB"


# ---- matching by properties, unknown, forced


def test_generic_name_matches_by_properties(specs):
    m = dv.match_device("AMD Radeon Graphics", MI250_GCD_PROPS, specs)
    assert (m["spec_name"], m["match"]) == ("AMD Instinct MI250 (single GCD)", "properties")
    assert m["peak_bf16_tflops"] == pytest.approx(181.05)


def test_properties_need_matching_compute_capability(specs):
    assert dv.match_device("AMD Radeon Graphics", {**MI250_GCD_PROPS, "computeMinor": 4}, specs)["match"] == "unknown"
    no_cc = {"numSms": 104, "totalGlobalMem": 68702699520}
    assert dv.match_device(None, no_cc, specs)["spec_name"] == "AMD Instinct MI250 (single GCD)"


def test_properties_memory_tolerance(specs):
    h100 = {"numSms": 132, "totalGlobalMem": 85031714816, "computeMajor": 9, "computeMinor": 0}
    assert dv.match_device("GPU 0", h100, specs)["spec_name"] == "NVIDIA H100 SXM5 80GB"
    far = {**h100, "totalGlobalMem": 60 * 2**30}
    assert dv.match_device("GPU 0", far, specs)["match"] == "unknown"


def test_unknown_device(specs):
    devs = device_frame((0, "Foo GPU 9000", 8 * 2**30, 1, 0, 7))
    out, warnings = dv.match_specs(devs, specs)
    row = out.row(0, named=True)
    assert row["spec_match"] == "unknown" and row["spec_name"] is None
    assert all(row[c] is None for c in dv.PEAK_COLS)
    assert len(warnings) == 1 and "Foo GPU 9000" in warnings[0]


def test_null_device_is_unknown(specs):
    out, warnings = dv.match_specs(device_frame((3, None, None, None, None, None)), specs)
    assert out["spec_match"].to_list() == ["unknown"] and len(warnings) == 1


def test_force_by_spec_name_and_by_pattern(specs):
    m = dv.match_device("NVIDIA H100 80GB HBM3", {}, specs, force="NVIDIA H100 PCIe 80GB")
    assert (m["spec_name"], m["match"]) == ("NVIDIA H100 PCIe 80GB", "forced")
    assert (
        dv.match_device("Foo GPU 9000", {}, specs, force="nvidia h100 pcie 80gb")["spec_name"]
        == "NVIDIA H100 PCIe 80GB"
    )
    assert dv.match_device(None, {}, specs, force="MI300X")["spec_name"] == "AMD Instinct MI300X"


def test_unknown_force_raises(specs):
    with pytest.raises(UsageError):
        dv.match_device("NVIDIA H100 80GB HBM3", {}, specs, force="Foo GPU 9000")
    with pytest.raises(UsageError):
        dv.match_specs(device_frame((0, "NVIDIA B200", None, None, None, None)), specs, force="nope")


def test_match_specs_shape_and_types(specs):
    devs = device_frame(
        (0, "NVIDIA H100 80GB HBM3", 85031714816, 9, 0, 132),
        (1, "AMD Radeon Graphics", 68702699520, 9, 0, 104),
        (2, "Foo GPU 9000", None, None, None, None),
        (7, "NVIDIA B200", None, None, None, None),
    )
    out, warnings = dv.match_specs(devs, specs)
    assert out["device"].to_list() == [0, 1, 2, 7]
    assert out["spec_match"].to_list() == ["name", "properties", "unknown", "name"]
    assert out.columns == [*devs.columns, *dv.OUT_SCHEMA]
    assert all(out.schema[c] == pl.Float64 for c in dv.PEAK_COLS)
    assert out.schema["spec_name"] == out.schema["spec_source"] == pl.String
    assert out["spec_source"][0] and len(warnings) == 1
    again, _ = dv.match_specs(out, specs)  # re-annotating replaces, not duplicates
    assert again.columns == out.columns


# ---- user CSV


def write_user_csv(path, rows: list[dict]) -> str:
    base = {c: "" for c in dv.SPEC_SCHEMA}
    pl.DataFrame([{**base, **r} for r in rows], schema={c: pl.String for c in dv.SPEC_SCHEMA}).write_csv(path)
    return str(path)


def test_user_csv_overrides_and_adds(tmp_path, specs):
    h100 = {k: "" if v is None else str(v) for k, v in spec(specs, "NVIDIA H100 SXM5 80GB").items()}
    extra = write_user_csv(
        tmp_path / "mine.csv",
        [
            {**h100, "peak_bf16_tflops": "900", "source": "measured"},
            {
                "spec_name": "Foo GPU 9000",
                "vendor": "Foo",
                "name_regex": r"Foo GPU \d+",
                "sm_count": "7",
                "memory_gb": "8",
                "peak_bw_gbps": "100",
                "peak_bf16_tflops": "50",
                "source": "vendor sheet",
            },
        ],
    )
    merged = dv.load_specs(extra)
    assert merged.height == specs.height + 1
    assert merged["spec_name"].n_unique() == merged.height
    m = dv.match_device("NVIDIA H100 80GB HBM3", {}, merged)
    assert (m["peak_bf16_tflops"], m["spec_source"]) == (900.0, "measured")
    foo = dv.match_device("Foo GPU 9000", {}, merged)
    assert (foo["spec_name"], foo["peak_bw_gbps"], foo["peak_fp8_tflops"]) == ("Foo GPU 9000", 100.0, None)


@pytest.mark.parametrize(
    "content",
    [
        "spec_name,vendor\nX,Y\n",  # missing columns
        None,  # non-numeric peak
        "",  # empty file
    ],
)
def test_bad_user_csv_raises(tmp_path, content):
    path = tmp_path / "bad.csv"
    if content is None:
        write_user_csv(path, [{"spec_name": "X", "name_regex": "X", "peak_bw_gbps": "fast"}])
    else:
        path.write_text(content)
    with pytest.raises(UsageError):
        dv.load_specs(str(path))


def test_bad_user_regex_and_missing_file_raise(tmp_path):
    with pytest.raises(UsageError):
        dv.load_specs(write_user_csv(tmp_path / "rx.csv", [{"spec_name": "X", "name_regex": "H100(("}]))
    with pytest.raises(UsageError):
        dv.load_specs(str(tmp_path / "absent.csv"))


# ---- the bundled table itself


def test_bundled_rows_are_complete(specs):
    assert specs["spec_name"].n_unique() == specs.height
    for r in specs.iter_rows(named=True):
        assert r["source"] and r["vendor"] in ("NVIDIA", "AMD"), r["spec_name"]
        assert r["peak_bw_gbps"] > 0 and r["sm_count"] > 0 and r["memory_gb"] > 0, r["spec_name"]
        assert r["peak_fp32_tflops"] > 0 and r["peak_fp16_tflops"] > 0, r["spec_name"]
        assert r["compute_major"] is not None and r["compute_minor"] is not None, r["spec_name"]
        if r["arch"] not in NO_TENSOR_BF16:
            assert r["peak_bf16_tflops"] > 0, r["spec_name"]


def test_bundled_peaks_are_consistent(specs):
    """Within a device: fp8 >= bf16 >= tf32 where present, matrix fp16 above fp32, int8 >= fp16 tensor."""
    for r in specs.iter_rows(named=True):
        name = r["spec_name"]
        if r["peak_fp8_tflops"] is not None:
            assert r["peak_fp8_tflops"] >= r["peak_bf16_tflops"], name
        if r["peak_tf32_tflops"] is not None:
            assert r["peak_bf16_tflops"] >= r["peak_tf32_tflops"] >= r["peak_fp32_tflops"], name
        assert r["peak_fp16_tflops"] > r["peak_fp32_tflops"] >= r["peak_fp64_tflops"], name
        if r["peak_int8_tops"] is not None:
            assert r["peak_int8_tops"] >= r["peak_fp16_tflops"], name


def test_sanity_ordering_across_generations(specs):
    h100, a100 = spec(specs, "NVIDIA H100 SXM5 80GB"), spec(specs, "NVIDIA A100 SXM4 80GB")
    v100 = spec(specs, "NVIDIA V100 SXM2 32GB")
    assert h100["peak_bf16_tflops"] > a100["peak_bf16_tflops"] > v100["peak_fp16_tflops"]
    assert spec(specs, "NVIDIA B200")["peak_bf16_tflops"] > h100["peak_bf16_tflops"]
    assert spec(specs, "AMD Instinct MI300X")["peak_bw_gbps"] > h100["peak_bw_gbps"] > a100["peak_bw_gbps"]
    gcd, card = spec(specs, "AMD Instinct MI250X (single GCD)"), spec(specs, "AMD Instinct MI250X (full card)")
    assert all(gcd[c] == pytest.approx(card[c] / 2) for c in dv.PEAK_COLS if card[c] is not None)


def test_every_row_reachable_by_force(specs):
    for name in specs["spec_name"]:
        assert dv.match_device(None, {}, specs, force=name)["spec_name"] == name


# ---- peak_for_dtype, markdown


@pytest.mark.parametrize(
    "dtype, col",
    [
        ("fp8", "peak_fp8_tflops"),
        ("e4m3", "peak_fp8_tflops"),
        ("e5m2", "peak_fp8_tflops"),
        ("bf16", "peak_bf16_tflops"),
        ("fp16", "peak_fp16_tflops"),
        ("half", "peak_fp16_tflops"),
        ("tf32", "peak_tf32_tflops"),
        ("fp32", "peak_fp32_tflops"),
        ("float", "peak_fp32_tflops"),
        ("fp64", "peak_fp64_tflops"),
        ("double", "peak_fp64_tflops"),
        ("int8", "peak_int8_tops"),
        ("complex32", "peak_bf16_tflops"),
        (None, "peak_bf16_tflops"),
    ],
)
def test_peak_for_dtype(specs, dtype, col):
    h100 = spec(specs, "NVIDIA H100 SXM5 80GB")
    assert dv.peak_for_dtype(h100, dtype) == h100[col]


def test_peak_for_dtype_missing_paths(specs):
    v100 = spec(specs, "NVIDIA V100 SXM2 16GB")
    assert dv.peak_for_dtype(v100, "bf16") is None and dv.peak_for_dtype(v100, "fp8") is None
    assert dv.peak_for_dtype(v100, "tf32") == v100["peak_fp32_tflops"]  # no TF32: the GEMM runs in FP32
    assert dv.peak_for_dtype(dv.match_device("x", {}, specs), "bf16") is None  # unknown device


def test_specs_markdown(specs):
    md = dv.specs_markdown(specs)
    lines = md.strip().splitlines()
    assert lines[0].startswith("| device | GB/s | FP32 | TF32 | BF16 |")
    assert len(lines) == specs.height + 2
    assert "| NVIDIA H100 SXM5 80GB | 3350 | 67 | 494.5 | 989.5 | 989.5 | 1979 | 132 | 80 |" in md
