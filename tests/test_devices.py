"""Device-spec table and device matching (pipeline/devices.py, data/device_specs.csv)."""

from __future__ import annotations

import re

import polars as pl
import pytest

from pipeline.cost import devices as dv
from pipeline.errors import UsageError

# Device names as real traces write them (CUDA / HIP / SYCL device names) -> the spec row they must match.
NAMES = {
    "Tesla V100-SXM2-16GB": "NVIDIA V100 SXM2 16GB",
    "Tesla V100-SXM2-32GB": "NVIDIA V100 SXM2 32GB",
    "Tesla V100-PCIE-16GB": "NVIDIA V100 PCIe 16GB",
    "Tesla V100-PCIE-32GB": "NVIDIA V100 PCIe 32GB",
    "Tesla V100S-PCIE-32GB": "NVIDIA V100S PCIe 32GB",
    "Tesla T4": "NVIDIA T4",
    "NVIDIA A10": "NVIDIA A10",
    "NVIDIA A10G": "NVIDIA A10G",
    "NVIDIA A30": "NVIDIA A30",
    "NVIDIA A40": "NVIDIA A40",
    "NVIDIA A100-SXM4-40GB": "NVIDIA A100 SXM4 40GB",
    "NVIDIA A100-SXM4-80GB": "NVIDIA A100 SXM4 80GB",
    "NVIDIA A100-PCIE-40GB": "NVIDIA A100 PCIe 40GB",
    "NVIDIA A100 80GB PCIe": "NVIDIA A100 PCIe 80GB",
    "NVIDIA A100-PG509-200": "NVIDIA A100 SXM4 40GB",
    "NVIDIA A800-SXM4-80GB": "NVIDIA A800 SXM4 80GB",
    "NVIDIA A800 80GB PCIe": "NVIDIA A800 PCIe 80GB",
    "NVIDIA L4": "NVIDIA L4",
    "NVIDIA L40": "NVIDIA L40",
    "NVIDIA L40S": "NVIDIA L40S",
    "NVIDIA H100 80GB HBM3": "NVIDIA H100 SXM5 80GB",
    "NVIDIA H100 PCIe": "NVIDIA H100 PCIe 80GB",
    "NVIDIA H100 NVL": "NVIDIA H100 NVL 94GB",
    "NVIDIA H800": "NVIDIA H800 SXM5 80GB",
    "NVIDIA H800 PCIe": "NVIDIA H800 PCIe 80GB",
    "NVIDIA H20": "NVIDIA H20",
    "NVIDIA H200": "NVIDIA H200 SXM 141GB",
    "NVIDIA H200 NVL": "NVIDIA H200 NVL 141GB",
    "NVIDIA GH200 480GB": "NVIDIA GH200 96GB",
    "NVIDIA B200": "NVIDIA B200",
    "NVIDIA GB200": "NVIDIA GB200",
    "NVIDIA B300 SXM6 AC": "NVIDIA B300",
    "GeForce RTX 2080 Ti": "NVIDIA GeForce RTX 2080 Ti",
    "NVIDIA GeForce RTX 2080 Ti": "NVIDIA GeForce RTX 2080 Ti",
    "NVIDIA GeForce RTX 2080 SUPER": "NVIDIA GeForce RTX 2080 SUPER",
    "NVIDIA GeForce RTX 2080": "NVIDIA GeForce RTX 2080",
    "NVIDIA GeForce RTX 2070 SUPER": "NVIDIA GeForce RTX 2070 SUPER",
    "NVIDIA GeForce RTX 2060": "NVIDIA GeForce RTX 2060",
    "NVIDIA TITAN RTX": "NVIDIA TITAN RTX",
    "Quadro RTX 6000": "NVIDIA Quadro RTX 6000",
    "Quadro RTX 8000": "NVIDIA Quadro RTX 8000",
    "NVIDIA GeForce RTX 3060": "NVIDIA GeForce RTX 3060",
    "NVIDIA GeForce RTX 3060 Ti": "NVIDIA GeForce RTX 3060 Ti",
    "NVIDIA GeForce RTX 3070 Ti": "NVIDIA GeForce RTX 3070 Ti",
    "NVIDIA GeForce RTX 3080": "NVIDIA GeForce RTX 3080",
    "NVIDIA GeForce RTX 3080 Ti": "NVIDIA GeForce RTX 3080 Ti",
    "NVIDIA GeForce RTX 3090": "NVIDIA GeForce RTX 3090",
    "NVIDIA GeForce RTX 3090 Ti": "NVIDIA GeForce RTX 3090 Ti",
    "NVIDIA RTX A4000": "NVIDIA RTX A4000",
    "NVIDIA RTX A5000": "NVIDIA RTX A5000",
    "NVIDIA RTX A6000": "NVIDIA RTX A6000",
    "NVIDIA GeForce RTX 4060 Ti": "NVIDIA GeForce RTX 4060 Ti 8GB",
    "NVIDIA GeForce RTX 4070": "NVIDIA GeForce RTX 4070",
    "NVIDIA GeForce RTX 4070 SUPER": "NVIDIA GeForce RTX 4070 SUPER",
    "NVIDIA GeForce RTX 4070 Ti": "NVIDIA GeForce RTX 4070 Ti",
    "NVIDIA GeForce RTX 4070 Ti SUPER": "NVIDIA GeForce RTX 4070 Ti SUPER",
    "NVIDIA GeForce RTX 4080": "NVIDIA GeForce RTX 4080",
    "NVIDIA GeForce RTX 4080 SUPER": "NVIDIA GeForce RTX 4080 SUPER",
    "NVIDIA GeForce RTX 4090": "NVIDIA GeForce RTX 4090",
    "NVIDIA GeForce RTX 4090 D": "NVIDIA GeForce RTX 4090 D",
    "NVIDIA RTX 4000 Ada Generation": "NVIDIA RTX 4000 Ada Generation",
    "NVIDIA RTX 6000 Ada Generation": "NVIDIA RTX 6000 Ada Generation",
    "NVIDIA GeForce RTX 5060 Ti": "NVIDIA GeForce RTX 5060 Ti 8GB",
    "NVIDIA GeForce RTX 5070": "NVIDIA GeForce RTX 5070",
    "NVIDIA GeForce RTX 5070 Ti": "NVIDIA GeForce RTX 5070 Ti",
    "NVIDIA GeForce RTX 5080": "NVIDIA GeForce RTX 5080",
    "NVIDIA GeForce RTX 5090": "NVIDIA GeForce RTX 5090",
    "NVIDIA RTX PRO 6000 Blackwell Workstation Edition": "NVIDIA RTX PRO 6000 Blackwell Workstation Edition",
    "NVIDIA RTX PRO 6000 Blackwell Server Edition": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
    "NVIDIA GB10": "NVIDIA GB10",  # DGX Spark
    "NVIDIA GB300": "NVIDIA GB300",
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
    "Radeon RX 7900 XTX": "AMD Radeon RX 7900 XTX",
    "AMD Radeon RX 7900 XT": "AMD Radeon RX 7900 XT",
    "AMD Radeon RX 7900 GRE": "AMD Radeon RX 7900 GRE",
    "AMD Radeon PRO W7900": "AMD Radeon PRO W7900",
    "Intel(R) Data Center GPU Max 1550": "Intel Data Center GPU Max 1550 (one stack)",
    "Intel(R) Data Center GPU Max 1100": "Intel Data Center GPU Max 1100",
    "Intel(R) Arc(TM) Pro B60 Graphics": "Intel Arc Pro B60",
    "Intel(R) Arc(TM) Pro B50 Graphics": "Intel Arc Pro B50",
}
# Names no row may claim: other products whose names contain a known one.
NOT_MATCHED = [
    "NVIDIA GeForce RTX 4090 Laptop GPU",
    "NVIDIA GeForce RTX 3080 Ti Laptop GPU",
    "NVIDIA GeForce RTX 2080 with Max-Q Design",
    "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition",
    "NVIDIA A800 40GB Active",
    "NVIDIA GB100",
    "NVIDIA GB102",
    "NVIDIA GeForce RTX 4050",
    "AMD Radeon Graphics",
    "GPU 0",
]
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


# ---- the devices of the real traces


REAL_DEVICES = {  # trace -> (spec of its devices, how it is matched)
    "param/rtx2080_resnet": ("NVIDIA GeForce RTX 2080 Ti", "name"),
    "tracelens/mi300x_vllm_graph_replay": ("AMD Instinct MI300X", "properties"),  # name ""
    "tracelens/mi300x_vllm_graph_capture": ("AMD Instinct MI300X", "properties"),
    "tracelens/mi300x_qwen1.5_0.5b": ("AMD Instinct MI300X", "name"),  # "AMD Instinct MI300X VF"
    "hta/mi250_rocm62_minitoy": ("AMD Instinct MI250 (single GCD)", "properties"),  # "AMD Radeon Graphics"
    "hta/a100_nccl": ("NVIDIA A100 SXM4 40GB", "name"),  # "NVIDIA A100-PG509-200"
    "tracelens/b200_eager": ("NVIDIA B200", "name"),
    "triosim/h100_vgg13": ("NVIDIA H100 SXM5 80GB", "name"),
}


@pytest.mark.real
@pytest.mark.parametrize("trace", REAL_DEVICES)
def test_real_trace_devices(specs, shared_traces, trace):
    import gzip
    import json

    with gzip.open(shared_traces / f"{trace}.json.gz") as f:
        props = json.load(f)["deviceProperties"]
    assert props
    for p in props:
        m = dv.match_device(p.get("name"), p, specs)
        assert (m["spec_name"], m["match"]) == REAL_DEVICES[trace], p.get("name")


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
    mi300x = {"numSms": 304, "totalGlobalMem": 192 * 10**9, "computeMajor": 9, "computeMinor": 4}  # 178.8 GiB
    assert dv.match_device("GPU 0", mi300x, specs)["spec_name"] == "AMD Instinct MI300X"
    far = {**mi300x, "totalGlobalMem": 150 * 2**30}
    assert dv.match_device("GPU 0", far, specs)["match"] == "unknown"


# The MI300X of the vLLM traces (tracelens/mi300x_vllm_graph_*): name "", compute 9.4, 304 CUs, 192 GB.
VLLM_MI300X = {"numSms": 304, "totalGlobalMem": 206_141_652_992, "computeMajor": 9, "computeMinor": 4}


@pytest.mark.parametrize("name", ["", None, "AMD Radeon Graphics", "gfx942", "gfx942:sramecc+:xnack-"])
def test_empty_or_generic_name_recognised_by_properties(specs, name):
    m = dv.match_device(name, VLLM_MI300X, specs)
    assert (m["spec_name"], m["match"]) == ("AMD Instinct MI300X", "properties")
    mi325x = {**VLLM_MI300X, "totalGlobalMem": 256 * 2**30}
    assert dv.match_device(name, mi325x, specs)["spec_name"] == "AMD Instinct MI325X"


def test_arch_in_the_name_narrows_the_rows(specs):
    """A gfx arch as the name only admits that arch's rows: MI300X properties named gfx90a fit none."""
    assert dv.match_device("gfx90a", VLLM_MI300X, specs)["match"] == "unknown"
    assert dv.match_device("gfx942", {}, specs)["match"] == "unknown"  # an arch alone is several devices


def test_properties_of_several_devices_choose_none(specs):
    """An RTX A6000 and an A40 (84 SMs, 48 GB, 8.6), an H100 and an H800 SXM (132 SMs, 80 GB, 9.0)
    are told apart by name only: without one, no peaks are guessed, and the warning says why."""
    a6000 = {"numSms": 84, "totalGlobalMem": 51_041_271_808, "computeMajor": 8, "computeMinor": 6}
    m = dv.match_device("", a6000, specs)
    assert (m["spec_name"], m["match"], sorted(m["ambiguous"])) == (None, "unknown", ["NVIDIA A40", "NVIDIA RTX A6000"])
    h100 = {"numSms": 132, "totalGlobalMem": 85_031_714_816, "computeMajor": 9, "computeMinor": 0}
    assert dv.match_device("GPU 0", h100, specs)["match"] == "unknown"
    assert dv.match_device("NVIDIA H100 80GB HBM3", h100, specs)["spec_name"] == "NVIDIA H100 SXM5 80GB"
    _, warnings = dv.match_specs(device_frame((0, "", 51_041_271_808, 8, 6, 84)), specs)
    assert len(warnings) == 1 and "fit NVIDIA A40 and NVIDIA RTX A6000" in warnings[0]


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


def test_a_user_csv_written_before_the_fp4_column_still_loads(tmp_path):
    """peak_fp4_tflops came later (dv.OPTIONAL_COLS): a spec file without it has none, blank."""
    path = tmp_path / "old.csv"
    pl.DataFrame(
        [{c: "" for c in dv.SPEC_SCHEMA if c not in dv.OPTIONAL_COLS} | {"spec_name": "Old", "name_regex": "Old"}],
        schema={c: pl.String for c in dv.SPEC_SCHEMA if c not in dv.OPTIONAL_COLS},
    ).write_csv(path)
    old = dv.load_specs(str(path)).filter(pl.col("spec_name") == "Old")
    assert old.height == 1 and old["peak_fp4_tflops"][0] is None


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


def own_props(row: dict) -> dict:
    """The deviceProperties a device of this row reports (memory in bytes, as CUDA/HIP give it)."""
    props = {"numSms": row["sm_count"], "computeMajor": row["compute_major"], "computeMinor": row["compute_minor"]}
    return {**props, "totalGlobalMem": int(row["memory_gb"] * 2**30)}


def test_bundled_rows_are_complete(specs):
    assert specs["spec_name"].n_unique() == specs.height
    for r in specs.iter_rows(named=True):
        name = r["spec_name"]
        assert r["vendor"] in ("NVIDIA", "AMD", "Intel") and r["arch"], name
        assert r["source"] and len(r["source"]) > 20, name
        if r["source"].startswith("Derived"):  # a derivation says how: counts x clock x rate
            assert " x " in r["source"] and ("MHz" in r["source"] or "GHz" in r["source"]), name
        assert r["peak_bw_gbps"] > 0 and r["memory_gb"] > 0, name
        assert r["peak_fp32_tflops"] > 0 and r["peak_fp16_tflops"] > 0, name
        if r["sm_count"] is None:  # only where no datasheet gives it, and then the source says so
            assert "SM count" in r["source"] and "not published" in r["source"], name
        if r["vendor"] != "Intel":  # SYCL devices report no compute capability
            assert r["compute_major"] is not None and r["compute_minor"] is not None, name
        if r["arch"] not in NO_TENSOR_BF16:
            assert r["peak_bf16_tflops"] > 0, name


def test_bundled_rows_are_plausible(specs):
    """Every row within the range of real devices: bandwidth 100 GB/s - 10 TB/s, memory 4 - 300 GB,
    FP32 1 - 200 TFLOP/s, the matrix (tensor-core) peak above the vector one, FP64 at most FP32,
    and per SM and clock rates an SM can have (FP32 64 - 512 FLOP, FP16 matrix 256 - 16384)."""
    for r in specs.iter_rows(named=True):
        name = r["spec_name"]
        assert 100 <= r["peak_bw_gbps"] <= 10_000, name
        assert 4 <= r["memory_gb"] <= 300, name
        assert 1 <= r["peak_fp32_tflops"] <= 200, name
        assert r["peak_fp16_tflops"] > r["peak_fp32_tflops"] >= r["peak_fp64_tflops"] > 0, name
        assert r["peak_fp16_tflops"] <= 6_000, name
        if r["sm_count"] is not None and r["vendor"] == "NVIDIA":
            ghz = r["peak_fp32_tflops"] * 1e12 / (r["sm_count"] * 256e9)  # clock if 256 FP32 FLOP/clk/SM
            assert 0.5 <= ghz <= 6, name  # Turing/Volta/A100 (128 FLOP/clk) land at twice their clock
            assert 256 <= r["peak_fp16_tflops"] * 1e12 / (r["sm_count"] * ghz * 1e9) <= 16_384, name


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


def test_every_pattern_matches_its_own_name_and_properties(specs):
    """A row's regex recognises its own spec name, and that name with the row's own properties is
    matched to the row (the properties tell apart rows one name matches, e.g. the A100s)."""
    for r in specs.iter_rows(named=True):
        assert re.search(r["name_regex"], r["spec_name"], re.IGNORECASE), r["spec_name"]
        assert dv.match_device(r["spec_name"], own_props(r), specs)["spec_name"] == r["spec_name"]


@pytest.mark.parametrize("name", [*NAMES, *pl.read_csv(dv.SPECS_CSV)["spec_name"]])
def test_no_name_matched_ambiguously(specs, name):
    """When several rows' regexes match one name, each of them is what that name with the row's
    properties becomes: no two rows one name matches have the same SM count, memory and compute
    capability (where they would, the regexes exclude each other: H200 SXM / NVL, A100 PCIe / SXM)."""
    rows = [r for r in specs.iter_rows(named=True) if re.search(r["name_regex"], name, re.IGNORECASE)]
    for r in rows:
        if r["sm_count"] is not None:
            assert dv.match_device(name, own_props(r), specs)["spec_name"] == r["spec_name"], (name, r["spec_name"])


@pytest.mark.parametrize("name", NOT_MATCHED)
def test_other_products_not_matched_by_name(specs, name):
    assert dv.match_device(name, {}, specs)["match"] == "unknown"


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
    assert "| NVIDIA H100 SXM5 80GB | 3350 | 67 | 494.5 | 989.5 | 989.5 | 1979 |  | 132 | 80 |" in md
    assert "| NVIDIA B200 | 7700 | 75 | 1100 | 2250 | 2250 | 4500 | 9000 | 148 | 180 |" in md
