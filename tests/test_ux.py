"""The person at the terminal: usage errors in a clean environment, tables that fit a width, the
workbook and the CSV folder that match the JSON, reports of a trace inside a dataset or folder."""

from __future__ import annotations

import json
import os
import re
import subprocess
import venv
from pathlib import Path

import polars as pl
import pytest

import pipeline
from conftest import PROJECT, TESTS
from pipeline import report as rp
from pipeline.analyses.names import readable
from pipeline.render.tables import cell, compact, render, shorten
from pipeline.synthetic import write_demo

GOLDEN = TESTS / "data" / "golden"
UPDATE = os.environ.get("TRACEPIPE_UPDATE_GOLDEN") == "1"  # rewrite the golden files instead of comparing


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Path:
    """A small realistic trace (deterministic: the same bytes every run)."""
    path = tmp_path_factory.mktemp("ux") / "demo.json.gz"
    write_demo(path, 0.4, seed=7)
    return path


@pytest.fixture(scope="module")
def demo_flat(demo, tmp_path_factory) -> Path:
    return pipeline.flatten(demo, tmp_path_factory.mktemp("flat")).out_dir


# ------------------------------------------------------------------ usage errors, clean environment
@pytest.fixture(scope="session")
def clean_venv(tmp_path_factory) -> Path:
    """A new virtual environment with tracepipe installed from this checkout as a user would
    (not editable: packaging mistakes show) and nothing else: the dependencies it declares."""
    where = tmp_path_factory.mktemp("venv") / "v"
    venv.create(where, with_pip=True)
    py = where / "bin" / "python"
    p = subprocess.run([py, "-m", "pip", "install", "-q", str(PROJECT)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-2000:]
    return where / "bin"


USAGE_MISTAKES = {
    "unknown command": (["analyse", "x.json"], "Did you mean 'analyze'?"),
    "missing option": (["flatten", "x.json.gz"], "Missing option '-o'"),
    "unknown option": (["analyze", "x.json", "-q"], "No such option: -q"),
    "bad choice": (["analyze", "x.json", "--format", "xml"], "'xml' is not one of 'table', 'csv'"),
    "bad argument": (["schema", "kernels"], "no table 'kernels'"),
    "missing argument": (["diff"], "Missing argument 'A'"),
}


@pytest.mark.slow
@pytest.mark.parametrize("kind", USAGE_MISTAKES)
def test_usage_mistake_is_one_line_and_exit_2_in_a_clean_venv(clean_venv, kind, tmp_path):
    args, says = USAGE_MISTAKES[kind]
    p = subprocess.run([clean_venv / "tracepipe", *args], capture_output=True, text=True, cwd=tmp_path)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and says in lines[0], p.stderr
    assert "Traceback" not in p.stderr and "--help" in lines[0]


@pytest.mark.slow
def test_clean_venv_runs_a_report_with_its_packaged_data(clean_venv, tmp_path):
    trace = tmp_path / "t.json.gz"
    subprocess.run([clean_venv / "tracepipe", "demo-trace", trace, "--mb", "0.2"], check=True, capture_output=True)
    p = subprocess.run(
        [clean_venv / "tracepipe", "analyze", trace, "--section", "kernels", "-f", "json"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert p.returncode == 0, p.stderr
    kernels = json.loads(p.stdout)["devices"][0]["kernels"]
    assert kernels and any(k["achieved_flops_pct"] for k in kernels)  # device specs came with the package


def test_help_shows_choices_and_no_type_placeholders(run_cli):
    text = run_cli(["analyze", "--help"], env={"COLUMNS": "200"}).stdout
    assert "<table|csv|json|md|xlsx|html>" in text and "<input-shape|stack|overload>" in text
    assert not re.search(r"<(bool|str|int|float)>", text), text
    assert "[memory] events" in text  # help is plain text, not markup


def test_tracepipe_alone_prints_its_help(run_cli):
    p = run_cli([])
    assert p.returncode == 2 and "Usage:" in p.stderr and "analyze" in p.stderr


# ------------------------------------------------------------------ tables
def test_shorten_keeps_names_apart_with_stable_ids():
    a = "void at::native::vectorized_elementwise_kernel<4, at::native::AddFunctor<float>, at::detail::Array<char*, 3> >"
    a += "(int)"
    b = a.replace("AddFunctor", "MulFunctor")
    for limit in (18, 26, 40, 60):
        sa, sb = shorten(a, limit), shorten(b, limit)
        assert len(sa) <= limit and len(sb) <= limit and sa != sb
        assert sa == shorten(a, limit) and re.search(r" #[0-9a-f]{4}$", sa)
    assert shorten("aten::mm", 60) == "aten::mm"  # what fits is left alone
    assert compact(a, 69) == "vectorized_elementwise_kernel<4,AddFunctor<float>,Array<char*,3>>(…)"
    assert compact(a, 40) == "vectorized_elementwise_kernel<…>"
    assert compact("Memcpy DtoD (Device -> Device)", 10) == "Memcpy DtoD (Device -> Device)"  # not C++


def test_mangled_names_are_shown_demangled():
    pytest.importorskip("cpp_demangle")
    ck = "_ZN7ck_tile6kentryILi1ENS_12Rmsnorm2dFwdIfEEJiEEEvDpT1_"  # as ROCm writes ck_tile's kernels
    assert cell(ck, "name") == "void ck_tile::kentry<1, ck_tile::Rmsnorm2dFwd<float>, int>(int)"
    short = shorten(ck, 26)  # a launch wrapper shown as the kernel it launches
    assert short.startswith("Rmsnorm2dFwd #") and short == shorten(readable(ck), 26)
    assert shorten("_Z3fooi", 60) == "foo(int)"  # also when the raw name would fit
    assert cell(["_Z3fooi", "aten::mm"], "kernels") == "foo(int)\n→ aten::mm"  # a kernel sequence
    assert shorten("_Zgarbage", 60) == "_Zgarbage"


@pytest.mark.real
def test_vllm_trace_kernels_readable_at_80_columns(shared_traces, run_cli):
    pytest.importorskip("cpp_demangle")
    trace = shared_traces / "tracelens" / "mi300x_vllm_graph_replay.json.gz"
    p = run_cli(["analyze", trace, "--width", "80", "--section", "kernels", "--section", "devices"])
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert max(map(len, lines)) <= 80 and not any("_ZN" in ln for ln in lines)
    assert sum(ln.startswith("Rmsnorm2dFwd") for ln in lines) == 2  # two ck_tile RMSNorm kernels, apart
    assert "device 2: AMD Instinct MI300X" in lines  # its name is empty: recognised by its properties


def test_one_number_style_per_unit():
    df = pl.DataFrame(
        {"flops": [5.51e12], "bytes": [2.09e9], "dur_us": [1_261_234.5], "busy_pct": [12.345], "count": [1234]}
    )
    row = render(df, "table").splitlines()[2]
    assert row.split() == ["5.51", "T", "2.09", "GB", "1,261,234.50", "12.3", "1,234"]


@pytest.mark.parametrize("width", [80, 200])
def test_analyze_golden_at_width(demo, width, run_cli):
    p = run_cli(["analyze", demo, "--width", str(width)])
    assert p.returncode == 0, p.stderr
    too_wide = [ln for ln in p.stdout.splitlines() if len(ln) > width]
    assert not too_wide, too_wide[:3]
    golden = GOLDEN / f"analyze_{width}.txt"
    if UPDATE:
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(p.stdout)
    assert p.stdout == golden.read_text(), f"analyze at {width} columns changed: TRACEPIPE_UPDATE_GOLDEN=1 to accept"


def test_terminal_width_comes_from_columns(demo_flat, run_cli):
    p = run_cli(["analyze", demo_flat, "--section", "kernels"], env={"COLUMNS": "72"})
    assert max(map(len, p.stdout.splitlines())) <= 72
    assert "more:" in p.stdout  # the columns left out are named
    wide = run_cli(["analyze", demo_flat, "--section", "kernels", "--width", "0"]).stdout
    assert "achieved_gbps" in wide and "more:" not in wide


def test_kernel_table_shows_the_launching_op_and_chosen_columns(demo_flat, run_cli):
    text = run_cli(["analyze", demo_flat, "--section", "kernels", "--width", "120"]).stdout
    assert "cpu_op" in text.splitlines()[4] and "aten::" in text
    chosen = run_cli(["analyze", demo_flat, "--section", "kernels", "-c", "name,dur_us"]).stdout
    assert chosen.splitlines()[4].split() == ["name", "dur_us"]


# ------------------------------------------------------------------ workbook and CSV folder
def test_xlsx_has_a_sheet_per_section_matching_the_json(demo, tmp_path, run_cli):
    openpyxl = pytest.importorskip("openpyxl")
    doc = json.loads(run_cli(["analyze", demo, "-f", "json"]).stdout)
    p = run_cli(["analyze", demo, "-f", "xlsx", "-o", tmp_path / "r.xlsx"])
    assert p.returncode == 0, p.stderr
    wb = openpyxl.load_workbook(tmp_path / "r.xlsx", read_only=True)

    def rows(name):
        values = [r for r in wb[name].iter_rows(values_only=True) if any(v is not None for v in r)]
        return [dict(zip(values[0], r)) for r in values[1:]]

    assert wb.sheetnames[0] == "about" and {"devices", "kernels", "ops", "idle", "critical-path"} <= set(wb.sheetnames)
    kernels = [k for d in doc["devices"] for k in d["kernels"]]
    sheet = rows("kernels")
    assert len(sheet) == len(kernels)
    for want, got in zip(kernels, sheet):
        assert (got["name"], got["count"]) == (want["name"], want["count"])
        assert got["dur_us"] == pytest.approx(want["dur_us"])
    assert [r["name"] for r in rows("ops")] == [o["name"] for o in doc["ops"]]
    assert [(r["device"], r["stream"]) for r in rows("idle")] == [(r["device"], r["stream"]) for r in doc["idle"]]
    total = next(r for r in rows("critical-path") if r["category"] == "total")
    assert total["us"] == pytest.approx(doc["critical_path"]["length_us"])


def test_csv_into_a_folder_writes_one_file_per_section(demo_flat, tmp_path, run_cli):
    p = run_cli(["analyze", demo_flat, "-f", "csv", "-o", tmp_path / "csv", "--section", "kernels", "--section", "ops"])
    assert p.returncode == 0, p.stderr
    assert sorted(f.name for f in (tmp_path / "csv").iterdir()) == ["kernels.csv", "ops.csv"]
    kernels = pl.read_csv(tmp_path / "csv" / "kernels.csv")
    assert kernels.height == rp.kernel_table(demo_flat).height and "cpu_op" in kernels.columns
    p = run_cli(["analyze", demo_flat, "-f", "csv", "--section", "kernels", "--section", "ops"])
    assert p.returncode == 2 and "-o DIR" in p.stderr


# ------------------------------------------------------------------ a trace inside a dataset or folder
@pytest.fixture(scope="module")
def two_trace_dataset(demo, tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("src")
    (src / "a.json.gz").write_bytes(demo.read_bytes())
    write_demo(src / "b.json.gz", 0.2, seed=3)
    out = tmp_path_factory.mktemp("ds") / "ds"
    pipeline.run_batch(src, out)
    return out


def test_analyze_a_trace_of_a_dataset_as_its_file(demo, two_trace_dataset, run_cli):
    alone = json.loads(run_cli(["analyze", demo, "-f", "json", "--section", "devices"]).stdout)
    inside = json.loads(run_cli(["analyze", two_trace_dataset, "-t", "a", "-f", "json", "--section", "devices"]).stdout)
    assert inside["devices"] == alone["devices"] and inside["trace"]["dataset"] == str(two_trace_dataset)
    p = run_cli(["analyze", two_trace_dataset])
    assert p.returncode == 2 and "holds 2 traces" in p.stderr and "(a)" in p.stderr and "(b)" in p.stderr
    p = run_cli(["analyze", two_trace_dataset, "-t", "nope"])
    assert p.returncode == 2 and "no trace matches 'nope'" in p.stderr


def test_folder_of_flattened_traces(demo, tmp_path, run_cli):
    other = tmp_path / "other.json.gz"
    write_demo(other, 0.2, seed=5)
    pipeline.flatten(demo, tmp_path / "flat")
    pipeline.flatten(other, tmp_path / "flat")
    p = run_cli(["analyze", tmp_path / "flat", "-t", "other", "--section", "devices", "-f", "json"])
    assert p.returncode == 0 and json.loads(p.stdout)["trace"]["stem"] == "other", p.stderr
    p = run_cli(["analyze", tmp_path / "flat", "--section", "devices"])
    assert p.returncode == 2 and "holds 2 traces" in p.stderr


def test_diff_two_traces_of_one_dataset(two_trace_dataset, run_cli):
    p = run_cli(["diff", two_trace_dataset, "-t", "a", "-t", "b", "-f", "json"])
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["labels"] == {"a": "a", "b": "b"}


def test_scan_and_report_functions_take_datasets_and_files(demo, demo_flat, two_trace_dataset):
    assert pipeline.scan(two_trace_dataset, "gpu_ops").select("trace_id").unique().collect().height == 2
    assert pipeline.scan(two_trace_dataset, "gpu_ops", trace="a").collect()["trace_id"].n_unique() == 1
    from_file = rp.kernel_table(demo)  # a trace file, flattened for the call
    assert from_file.equals(rp.kernel_table(demo_flat))
    with rp.opened(two_trace_dataset, trace="a") as f:
        assert rp.kernel_table(f).equals(from_file)


def test_query_one_trace_of_a_dataset(two_trace_dataset, run_cli):
    sql = "select count(distinct trace_id) as n from gpu_ops"
    assert json.loads(run_cli(["query", two_trace_dataset, sql, "-f", "json"]).stdout) == [{"n": 2}]
    assert json.loads(run_cli(["query", two_trace_dataset, sql, "-f", "json", "-t", "b"]).stdout) == [{"n": 1}]


def test_python_example_of_the_package_docstring_runs(tmp_path, monkeypatch):
    import doctest

    monkeypatch.chdir(tmp_path)
    for module in (pipeline, rp):
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        assert result.attempted and not result.failed, module.__name__


def test_a_sequence_names_each_kernel_as_the_other_tables_do():
    """Each kernel of a sequence is shortened from its whole name: two kernels that differ only in
    their template arguments stay apart, and one kernel has one id wherever it stands."""
    kernel = "void at::native::vectorized_elementwise_kernel<4, at::native::"
    mul = kernel + "BinaryFunctor<c10::BFloat16, MulFunctor<float> > >(int)"
    silu = kernel + "(anonymous namespace)::silu_kernel<c10::BFloat16> >(int)"
    gemm = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_kernel__5x_cublas"
    df = pl.DataFrame({"count": [2, 1], "kernels": [[gemm, mul, gemm], [gemm, silu, gemm]]})
    lines = render(df, "table", 60, 40).splitlines()[2:]
    first, second = lines[:3], lines[3:]
    assert first[1] != second[1]  # Mul and SiLU apart
    ids = {re.search(r"#[0-9a-f]{4}", x).group() for x in (first[0], first[2], second[0], second[2])}
    assert len(ids) == 1 and first[2].strip().startswith("→ ")
    assert shorten(gemm, 30).endswith(ids.pop())  # the id of the name itself
