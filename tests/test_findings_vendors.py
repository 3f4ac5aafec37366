"""Findings' remedies fit the vendor the trace ran on: the vendor told from real traces (Ascend,
AMD, NVIDIA, CPU-only), no CUDA-only mechanism in an Ascend or AMD trace's findings or an Ascend
run's, and the per-vendor texts of data/findings.toml complete and free of another vendor's words."""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path

import pytest

from pipeline import report as rp
from pipeline.findings.limits import table
from pipeline.findings.vendor import VENDORS, trace_vendor, worded

# words that name a mechanism only CUDA (NVIDIA) has; on ROCm torch keeps the torch.cuda names
# (torch.cuda.graph captures HIP graphs there), so those are CUDA-only on Ascend and CPU alone
CUDA_ONLY = (
    "CUDA graph",
    "TF32",
    "tensor cores",
    "cudaStreamSynchronize",
    "cuDNN",
    "cuBLAS",
    "Transformer Engine",
    "DALI",
    "PYTORCH_CUDA_ALLOC_CONF",
    "NCCL",
)
NOT_ON_ASCEND = (*CUDA_ONLY, "CUDA", "torch.cuda", "'cuda'", "HIP", "ROCm", "Triton")
NOT_ON_AMD = (*CUDA_ONLY, "torch_npu", "NPU")
NOT_ON_CPU = (*NOT_ON_ASCEND, "torch_npu", "NPU", "GPU")
TRACES = {  # stem -> (folder, vendor)
    "npu_level0_rank0": ("ascend", "ascend"),
    "npu_2024_msprof_advisor": ("ascend", "ascend"),
    "mi250_rocm62_minitoy": ("hta", "amd"),
    "mi300x_qwen1.5_0.5b": ("tracelens", "amd"),
    "h100_qwen1.5_0.5b": ("tracelens", "nvidia"),
    "sampled_no_device_props": ("hta", "nvidia"),  # no device name: its cudaLaunchKernel calls say
    "cpu_only": ("hta", "cpu"),
}
FORBIDDEN = {"ascend": NOT_ON_ASCEND, "amd": NOT_ON_AMD, "cpu": NOT_ON_CPU}


def _said(text: str, words: tuple[str, ...]) -> list[str]:
    return [w for w in words if re.search(rf"(?<![\w.]){re.escape(w)}", text)]


@pytest.fixture(scope="module")
def flat(shared_traces, tmp_path_factory):
    from pipeline.flatten import flatten

    out = tmp_path_factory.mktemp("vendors")

    @cache
    def one(stem: str) -> Path:
        folder = TRACES[stem][0]
        return flatten(shared_traces / folder / f"{stem}.json.gz", out / folder).out_dir

    return one


@pytest.mark.parametrize("stem", sorted(TRACES))
def test_the_vendor_of_real_traces(flat, stem):
    assert trace_vendor(rp.Flat(flat(stem))) == TRACES[stem][1]


@pytest.mark.parametrize("stem", [s for s, (_, v) in TRACES.items() if v in ("ascend", "amd")])
def test_no_cuda_only_mechanism_in_ascend_and_amd_findings(flat, stem):
    vendor = TRACES[stem][1]
    found = rp.analyze(rp.Flat(flat(stem)), only=["findings"])["findings"].to_dicts()
    assert found, f"{stem}: no finding to check"  # each of these traces has findings
    for f in found:
        bad = _said(f["remedy"] + " " + f["title"], FORBIDDEN[vendor])
        assert not bad, f"{stem} {f['id']}: {bad} in {f['remedy']!r}"
    remedies = " ".join(f["remedy"] for f in found)
    if vendor == "ascend":  # and what it says instead is the NPU's own
        assert "torch_npu" in remedies or "torch.npu" in remedies


@pytest.mark.parametrize("source", ["traces", "dataset"])
def test_an_ascend_run_gets_the_npu_s_remedies(shared_traces, run_cli, tmp_path, source):
    run = shared_traces.parent / "runs" / "ascend_level0_2rank"
    if not run.is_dir():
        pytest.skip("no ../shared/runs/ascend_level0_2rank")
    if source == "dataset":  # the ranks of a batch dataset: the vendor from its trace table's layout
        assert run_cli(["batch", run, "-o", tmp_path / "ds"]).returncode == 0
        run = tmp_path / "ds"
    whole = json.loads(run_cli(["ranks", run, "-f", "json", "--no-cache"]).stdout)["runs"][0]
    found = whole["findings"]
    # one run picked with --run keeps its vendor's wording (and its findings) too
    one = json.loads(run_cli(["ranks", run, "--run", whole["run"], "-f", "json"]).stdout)["runs"]
    assert [r["findings"] for r in one] == [found]
    host = next(f for f in found if f["id"] == "host_bound")
    assert "torch.npu.graph" in host["remedy"]
    for f in found:
        assert not _said(f["remedy"], NOT_ON_ASCEND), f"{f['id']}: {f['remedy']!r}"


def _vendor_tables() -> list[tuple[str, str, dict]]:
    """(rule, key, {vendor: text}) of every text data/findings.toml words per vendor."""
    return [
        (rule, key, v)
        for rule, t in table().items()
        if isinstance(t, dict)
        for key, v in t.items()
        if isinstance(v, dict) and "default" in v
    ]


def test_every_vendor_text_has_a_default_and_names_no_other_vendor_s_mechanism():
    tables = _vendor_tables()
    # the rules whose remedies name a vendor's mechanism all word it per vendor
    assert {r for r, _, _ in tables} >= {
        "host_bound",
        "small_kernels",
        "fusion",
        "layout",
        "precision",
        "optimizer",
        "copies",
        "sync",
        "dataloader",
    }
    for rule, key, texts in tables:
        assert set(texts) <= {"default", *VENDORS}, f"[{rule}.{key}]: unknown vendor"
        for vendor in VENDORS:
            text = worded(rule, key, vendor, cls="torch.optim.AdamW", names="cudaFree")
            # a vendor without its own text gets the default, which names no vendor's mechanism
            words = FORBIDDEN.get(vendor, CUDA_ONLY) if vendor != "nvidia" else ()
            if vendor in ("other",) or vendor not in texts:
                words = (*CUDA_ONLY, "CUDA", "HIP", "torch_npu")
            said = _said(text.replace("cudaFree", ""), words)
            assert not said, f"[{rule}.{key}] for {vendor}: {said}"


def test_nvidia_keeps_the_cuda_wording():
    assert "CUDA graphs" in worded("host_bound", "remedy", "nvidia")
    assert "TF32" in table()["precision"]["remedy_tf32"] and table()["precision"]["tf32_vendors"] == ["nvidia"]
    # an unknown vendor key falls back to the default
    assert worded("host_bound", "remedy", "nvidia") != worded("host_bound", "remedy", "other")
    assert worded("host_bound", "remedy", "no-such") == worded("host_bound", "remedy", "other")


def test_ascend_synchronising_calls_are_sync_marks(flat):
    """torch_npu records CANN's synchronising runtime calls as "AscendCL@aclrtSynchronize...":
    the sync rule sees them, and the blocking aclrtMemcpy, as it sees cudaStreamSynchronize (the
    2024 trace has 8 and 6 of them), and no other of the trace's AscendCL calls."""
    from pipeline.findings.facts import Facts
    from pipeline.findings.limits import marks

    facts = Facts(rp.Flat(flat("npu_2024_msprof_advisor")), lambda name: None)
    names = sorted(facts.marks["sync"]["name"].to_list())
    assert (
        names
        == ["AscendCL@aclrtMemcpy"] * 6
        + ["AscendCL@aclrtSynchronizeDevice"] * 2
        + ["AscendCL@aclrtSynchronizeStream"] * 4
        + ["AscendCL@aclrtSynchronizeStreamWithTimeout"] * 2
    )
    sync = re.compile(marks()["sync"])
    for name in ("aclrtSynchronizeEvent", "AscendCL@aclrtMemcpy", "AscendCL@aclrtFree", "cudaStreamSynchronize"):
        assert sync.search(name), name
    for name in ("AscendCL@aclrtMemcpyAsync", "AscendCL@aclrtMalloc", "AscendCL@aclrtSetDevice"):
        assert not sync.search(name), name


def test_a_count_of_one_is_singular_in_titles(flat):
    """The 2024 Ascend trace profiles one optimizer step: its title says "in 1 step", not "1 steps"."""
    from pipeline.findings.finding import counted

    assert [counted(n, "step") for n in (0, 1, 2, 2048)] == ["0 steps", "1 step", "2 steps", "2,048 steps"]
    found = rp.analyze(rp.Flat(flat("npu_level0_rank0")), only=["findings"])["findings"]
    title = found.filter(found["id"] == "optimizer")["title"].item()
    assert " in 1 step;" in title, title
