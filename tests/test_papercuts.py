"""The obvious things (issue 37): the format follows -o, HTML and xlsx stay off terminals, batch takes
several inputs, input errors name their file, mistakes get "did you mean", diff says how much it
matched, kernel names keep what tells them apart, no row has an empty name without saying why."""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

import pipeline
from pipeline.analyses.diff import MATCHED_WARN_PCT, diff_summary, different_work
from pipeline.analyses.registry import BY_NAME, NO_OP_ALLOCATOR
from pipeline.render.html.diff import ONE_SIDE, diff_html
from pipeline.render.tables import shorten, template_hint
from pipeline.synthetic import write_demo


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("papercuts") / "demo.json.gz"
    write_demo(path, 0.3, seed=11)
    return path


@pytest.fixture(scope="module")
def demo_flat(demo, tmp_path_factory) -> Path:
    return pipeline.flatten(demo, tmp_path_factory.mktemp("flat")).out_dir


def on_terminal(args: list) -> tuple[int, str, str]:
    """Run the CLI with stdout on a pseudo-terminal: (exit code, what it printed there, stderr)."""
    main, sub = pty.openpty()
    p = subprocess.Popen(
        [sys.executable, "-m", "pipeline", *map(str, args)],
        stdout=sub,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    os.close(sub)
    chunks = []
    while True:
        try:
            b = os.read(main, 65536)
        except OSError:
            break
        if not b:
            break
        chunks.append(b)
    rc = p.wait(timeout=300)
    os.close(main)
    assert p.stderr is not None
    return rc, b"".join(chunks).decode(errors="replace"), p.stderr.read().decode()


# ------------------------------------------------------------------ -o decides the format
CONTENT = {
    "html": lambda b: b.lstrip().lower().startswith(b"<!doctype html"),
    "xlsx": lambda b: b[:2] == b"PK",
    "json": lambda b: "trace" in json.loads(b),
    "md": lambda b: b.startswith(b"# ") and b"|" in b,
    "csv": lambda b: b.split(b"\n", 1)[0].startswith(b"device,name,"),
}


@pytest.mark.parametrize("ext", sorted(CONTENT))
def test_the_format_follows_the_extension_of_o(demo_flat, tmp_path, run_cli, ext):
    out = tmp_path / f"report.{ext}"
    p = run_cli(["analyze", demo_flat, "-o", out])
    assert p.returncode == 0, p.stderr
    assert CONTENT[ext](out.read_bytes())


def test_an_unknown_extension_is_a_table_and_format_still_wins_there(demo_flat, tmp_path, run_cli):
    assert run_cli(["analyze", demo_flat, "-o", tmp_path / "r.txt"]).returncode == 0
    assert (tmp_path / "r.txt").read_text().startswith(demo_flat.name)
    assert run_cli(["analyze", demo_flat, "-f", "json", "-o", tmp_path / "r.out"]).returncode == 0
    assert "trace" in json.loads((tmp_path / "r.out").read_text())


@pytest.mark.parametrize("cmd", ["analyze", "diff"])
def test_a_format_the_extension_contradicts_is_one_usage_line(demo_flat, tmp_path, run_cli, cmd):
    p = run_cli([cmd, demo_flat, "-f", "csv", "-o", tmp_path / "r.html"])
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "--format csv" in p.stderr and "r.html" in p.stderr
    assert not (tmp_path / "r.html").exists()


def test_diff_takes_its_format_from_o_too(demo_flat, tmp_path, run_cli):
    p = run_cli(["diff", demo_flat, demo_flat, "-o", tmp_path / "d.json"])
    assert p.returncode == 0, p.stderr
    assert json.loads((tmp_path / "d.json").read_text())["summary"]["matched_pct"] == 100


@pytest.mark.parametrize("fmt", ["html", "xlsx"])
def test_html_and_xlsx_never_go_to_a_terminal(demo_flat, fmt):
    rc, shown, err = on_terminal(["analyze", demo_flat, "-f", fmt])
    assert rc == 2 and not shown.strip(), shown[:200]
    assert f"give -o FILE.{fmt}" in err and len(err.strip().splitlines()) == 1


def test_html_and_xlsx_go_down_a_pipe(demo_flat):
    for fmt, ok in (("html", CONTENT["html"]), ("xlsx", CONTENT["xlsx"])):
        p = subprocess.run(
            [sys.executable, "-m", "pipeline", "analyze", str(demo_flat), "-f", fmt], capture_output=True, timeout=300
        )
        assert p.returncode == 0 and ok(p.stdout), p.stderr


# ------------------------------------------------------------------ batch A B DIR
def test_batch_takes_several_files_and_folders(demo, tmp_path, run_cli):
    folder = tmp_path / "more"
    folder.mkdir()
    write_demo(folder / "c.json.gz", 0.1, seed=5)
    write_demo(tmp_path / "b.json.gz", 0.1, seed=4)
    p = run_cli(["batch", demo, tmp_path / "b.json.gz", folder, "-o", tmp_path / "ds", "-q", "-j", "1"])
    assert p.returncode == 0, p.stderr
    stems = pl.read_parquet(tmp_path / "ds" / "traces" / "*.parquet")["source_path"].to_list()
    assert sorted(Path(s).name for s in stems) == ["b.json.gz", "c.json.gz", "demo.json.gz"]
    p = run_cli(["batch", demo, tmp_path / "nosuch.json.gz", "-o", tmp_path / "ds2", "-q"])
    assert p.returncode == 2 and "nosuch.json.gz" in p.stderr and len(p.stderr.strip().splitlines()) == 1


# ------------------------------------------------------------------ input errors name the file
@pytest.mark.parametrize("cmd", ["analyze", "flatten", "diff-a", "diff-b"])
def test_a_file_that_is_no_trace_is_named(demo_flat, tmp_path, run_cli, cmd):
    bad = tmp_path / "notatrace.json"
    bad.write_text('{"hello": 1}')
    args = {
        "analyze": ["analyze", bad],
        "flatten": ["flatten", bad, "-o", tmp_path / "x"],
        "diff-a": ["diff", bad, demo_flat],
        "diff-b": ["diff", demo_flat, bad],
    }[cmd]
    p = run_cli(args)
    assert p.returncode == 2 and "notatrace.json: valid JSON but not a trace" in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


# ------------------------------------------------------------------ did you mean
@pytest.mark.parametrize(
    "args, said",
    [
        (["--section", "kernel"], "did you mean 'kernels'"),
        (["--section", "ops", "--sort", "self_cpu"], "did you mean 'self_cpu_us'"),
        (["-c", "name,dur"], "did you mean 'dur_us'"),
    ],
)
def test_a_mistyped_name_gets_did_you_mean(demo_flat, run_cli, args, said):
    p = run_cli(["analyze", demo_flat, *args])
    assert p.returncode == 2 and said in p.stderr, p.stderr


@pytest.mark.parametrize(
    "sql, said",
    [("select nme from events", "did you mean 'name'"), ("select * from event", "did you mean 'events'")],
)
def test_a_mistyped_column_or_table_in_sql_gets_did_you_mean(demo_flat, run_cli, sql, said):
    p = run_cli(["query", demo_flat, sql])
    assert p.returncode == 2 and said in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_ranks_columns_get_did_you_mean(run_cli):
    p = run_cli(["ranks", Path(__file__).parent / "data" / "runs" / "gloo4", "-c", "rnk"])
    assert p.returncode == 2 and "did you mean 'rank'" in p.stderr, p.stderr


def test_a_mistyped_command_gets_did_you_mean(run_cli):
    p = run_cli(["analyz", "x"])
    assert p.returncode == 2 and "Did you mean 'analyze'" in p.stderr


# ------------------------------------------------------------------ diff: totals, matched share
def _diff_rows(rows: list[tuple[str, float | None, float | None]]) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "key": [r[0] for r in rows],
            "a_dur_us": [r[1] for r in rows],
            "b_dur_us": [r[2] for r in rows],
            "a_count": [None if r[1] is None else 1 for r in rows],
            "b_count": [None if r[2] is None else 1 for r in rows],
        },
        schema_overrides={"a_dur_us": pl.Float64, "b_dur_us": pl.Float64, "a_count": pl.UInt32, "b_count": pl.UInt32},
    )


def test_diff_summary_counts_the_matched_share_of_both_sides():
    d = _diff_rows([("mm", 60.0, 30.0), ("mul", 20.0, None), ("moe", None, 90.0)])
    s = diff_summary(d)
    assert (s["total_a_us"], s["total_b_us"], s["delta_us"]) == (80.0, 120.0, 40.0)
    assert s["matched_pct"] == 45.0  # (60 + 30) of 200
    assert (s["matched_a_pct"], s["matched_b_pct"]) == (75.0, 25.0)
    assert (s["rows_matched"], s["rows_only_a"], s["rows_only_b"]) == (1, 1, 1)
    assert s["matched_pct"] < MATCHED_WARN_PCT and "45% of the time matched" in (different_work(s) or "")
    assert different_work(diff_summary(_diff_rows([("mm", 60.0, 30.0), ("mul", 20.0, None)]))) is None


def test_diff_of_a_trace_with_itself_matches_all_and_prints_totals_first(demo_flat, run_cli):
    p = run_cli(["diff", demo_flat, demo_flat, "--label-a", "x", "--label-b", "y"])
    assert p.returncode == 0 and not p.stderr, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].startswith("total: x ") and lines[1].startswith("matched: 100% of the time")


def test_diff_of_two_traces_of_one_name_names_them_by_their_folders(demo, tmp_path, run_cli):
    """before/demo.json.gz against after/demo.json.gz (the same file name from two runs) failed
    with polars' DuplicateError: both sides were labelled by their stem. The folders that tell
    them apart now name them; the same file twice is (a) and (b); equal labels given, one line."""
    for side in ("before", "after"):
        (tmp_path / side).mkdir()
        (tmp_path / side / "demo.json.gz").write_bytes(demo.read_bytes())
    a, b = tmp_path / "before" / "demo.json.gz", tmp_path / "after" / "demo.json.gz"
    p = run_cli(["diff", a, b, "--width", "0"])
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    assert p.stdout.startswith("a: before/demo\nb: after/demo\n"), p.stdout[:200]  # long labels: a legend
    labels = json.loads(run_cli(["diff", a, a, "--format", "json"]).stdout)["labels"]
    assert labels == {"a": "demo (a)", "b": "demo (b)"}, labels
    p = run_cli(["diff", a, b, "--label-a", "x", "--label-b", "x"])
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "--label-a and --label-b" in p.stderr


def test_diff_of_two_different_models_warns_and_one_model_on_two_devices_does_not(shared_traces, run_cli):
    t = shared_traces / "tracelens"
    h100, mi300, b200 = (t / f"{n}.json.gz" for n in ("h100_qwen1.5_0.5b", "mi300x_qwen1.5_0.5b", "b200_eager"))
    for other, differ in ((mi300, False), (b200, True)):
        p = run_cli(["diff", h100, other, "-f", "json"])
        s = json.loads(p.stdout)["summary"]
        assert (s["matched_pct"] < MATCHED_WARN_PCT) == differ, s
        assert ("different workloads?" in p.stderr) == differ, p.stderr
    assert s["total_a_us"] == pytest.approx(45647.3, abs=0.1)  # the H100's GPU time, as `analyze` sums it


def test_diff_page_shows_rows_on_one_side_neither_faster_nor_slower():
    d = _diff_rows([("mm", 60.0, 30.0), ("mul", 20.0, None)]).with_columns(
        kind=pl.lit("op"),
        delta_us=pl.col("b_dur_us").fill_null(0) - pl.col("a_dur_us").fill_null(0),
        ratio=pl.col("b_dur_us") / pl.col("a_dur_us"),
    )
    page = diff_html(d, "a", "b")
    assert '(only in A)","tip":["mul (op)"' in page
    assert re.search(r'"mm \(op\)"[^}]*"color":"#55a868"', page)  # faster in B: green
    assert re.search(rf'"mul \(op\)"[^}}]*"color":"{ONE_SIDE}"', page)  # only in A: grey, not green


# ------------------------------------------------------------------ names
ELEMENTWISE_MUL = (
    "void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::BinaryFunctor<"
    "c10::BFloat16, c10::BFloat16, c10::BFloat16, at::native::binary_internal::MulFunctor<float> > >("
    "at::TensorIteratorBase&, at::native::BinaryFunctor<c10::BFloat16, c10::BFloat16, c10::BFloat16, "
    "at::native::binary_internal::MulFunctor<float> > const&)::{lambda(int)#1}>(int, "
    "at::native::gpu_kernel_impl_nocast<at::native::BinaryFunctor<c10::BFloat16, c10::BFloat16, c10::BFloat16, "
    "at::native::binary_internal::MulFunctor<float> > >(at::TensorIteratorBase&, at::native::BinaryFunctor<"
    "c10::BFloat16, c10::BFloat16, c10::BFloat16, at::native::binary_internal::MulFunctor<float> > const&)"
    "::{lambda(int)#1})"
)
ELEMENTWISE_COPY = (
    "void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<"
    "at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::"
    "{lambda()#12}::operator()() const::{lambda(c10::BFloat16)#1}>(at::TensorIteratorBase&, "
    "at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::"
    "{lambda()#12}::operator()() const::{lambda(c10::BFloat16)#1} const&)::{lambda(int)#1}>(int, int)"
)
REDUCE_MEAN = (
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float, float, "
    "float>, unsigned int, float, 4> >(at::native::ReduceOp<float, at::native::MeanOps<float, float, float, float>, "
    "unsigned int, float, 4>)"
)
THRESHOLD = (
    "void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<float, float, float, "
    "at::native::(anonymous namespace)::threshold_kernel_impl<float>(at::TensorIteratorBase&, float, float)::"
    "{lambda(float, float)#1}>, at::detail::Array<char*, 3> >(int, at::native::BinaryFunctor<float, float, float, "
    "at::native::(anonymous namespace)::threshold_kernel_impl<float>(at::TensorIteratorBase&, float, float)::"
    "{lambda(float, float)#1}>, at::detail::Array<char*, 3>)"
)
FLASH = (
    "void pytorch_flash::flash_fwd_kernel<pytorch_flash::Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, "
    "cutlass::bfloat16_t, pytorch_flash::Flash_kernel_traits<64, 128, 128, 4, cutlass::bfloat16_t> >, false, true, "
    "false, false, false, true, false>(pytorch_flash::Flash_fwd_params)"
)


@pytest.mark.parametrize(
    "name, shown",
    [
        (ELEMENTWISE_MUL, "elementwise_kernel<…MulFunctor…> #"),
        (ELEMENTWISE_COPY, "elementwise_kernel<…direct_copy…> #"),
        (REDUCE_MEAN, "reduce_kernel<…MeanOps…> #"),
        (THRESHOLD, "vectorized_elementwise_kernel<…threshold…> #"),
        (FLASH, "flash_fwd_kernel<…> #"),
    ],
)
def test_a_short_kernel_name_keeps_what_tells_it_apart(name, shown):
    short = shorten(name, 60)
    assert short.startswith(shown) and len(short) <= 60, short


def test_template_hint_prefers_the_innermost_functor_then_a_function_then_ops():
    assert template_hint("BinaryFunctor<float, MulFunctor<float>>") == "MulFunctor"
    assert template_hint("4, CUDAFunctor_add<BFloat16>, std::array<char*, 3ul>") == "CUDAFunctor_add"
    assert (
        template_hint("ReduceOp<bool, func_wrapper_t<bool, and_kernel_cuda(TensorIterator&)::{lambda()#1}>>") == "and"
    )
    assert template_hint("ReduceOp<float, MeanOps<float, float>, unsigned int>") == "MeanOps"
    assert template_hint("OpaqueType<2u>, unsigned int, 4, 64, 64") is None


def test_an_empty_name_says_what_it_is():
    rows = pl.DataFrame({"op": ["aten::mul", None], "allocations": [3, 51]})
    shown = BY_NAME["allocations"].tables(rows)["allocations"]
    assert shown["op"].to_list() == ["aten::mul", NO_OP_ALLOCATOR]
    seq = pl.DataFrame({"launched_by": [None, ""], "count": [1, 2]})
    assert BY_NAME["sequences"].tables(seq)["sequences"]["launched_by"].to_list() == ["(no op)", "(no op)"]


def test_identifiers_have_no_thousands_separators_and_counts_do(shared_traces, run_cli):
    """A thread, stream or device id is a name, not a quantity: 3553, not 3,553 (the CPU-only
    trace's streams are its threads), in the terminal table and on the page alike."""
    from pipeline.render.html.cells import cell
    from pipeline.render.tables import number

    assert [number(3553, c) for c in ("tid", "stream", "event_idx", "kineto_graph_id", "count")] == [
        "3553",
        "3553",
        "3553",
        "3553",
        "3,553",
    ]
    assert cell(3553, "tid").text == "3553" and cell(3553, "count").text == "3,553"
    assert number(1074798.66, "us") == "1,074,798.66"  # a column named for its unit alone is a time too
    out = run_cli(["analyze", shared_traces / "hta" / "cpu_only.json.gz", "--section", "streams"]).stdout
    assert re.search(r"^ *3553 ", out, re.M) and "3,553" not in out, out


def test_a_cpu_only_ops_table_does_not_say_each_name_twice():
    """A CPU-only trace's ops stand for its kernels, so each row's cpu_op is its name: at 80
    columns that column took 27 of them and pushed mean_us out. A text column repeating an earlier
    one in every row is left out of table/md (not of JSON or CSV, nor when --columns names it);
    a GPU trace's kernels keep their ops."""
    from pipeline.render.documents import shown_columns

    cpu = pl.DataFrame({"name": ["aten::mm", "aten::add"], "cpu_op": ["aten::mm", "aten::add"], "count": [3, 4]})
    assert shown_columns(cpu, ("name", "cpu_op", "count"), None) == ["name", "count"]
    assert shown_columns(cpu, ("name", "cpu_op", "count"), ["name", "cpu_op"]) == ["name", "cpu_op"]
    gpu = cpu.with_columns(cpu_op=pl.Series(["aten::mm", "aten::mul"]))
    assert shown_columns(gpu, ("name", "cpu_op", "count"), None) == ["name", "cpu_op", "count"]
    unknown = cpu.with_columns(cpu_op=pl.lit(None, pl.String), other=pl.lit(None, pl.String))
    assert shown_columns(unknown, ("name", "cpu_op", "other"), None) == ["name", "cpu_op", "other"]


@pytest.mark.real
def test_a_cpu_only_trace_shows_mean_us_at_80_columns(shared_traces, run_cli):
    trace = shared_traces / "pairs" / "optimizer_loop.json.gz"
    p = run_cli(["analyze", trace, "--section", "kernels", "--width", "80"])
    assert p.returncode == 0, p.stderr
    header = next(ln for ln in p.stdout.splitlines() if ln.startswith("name "))
    assert header.split() == ["name", "count", "dur_us", "pct", "mean_us"]


def test_a_trace_without_device_activity_leaves_its_zero_device_columns_out():
    """torch's key_averages shows no device columns on a CPU-only run; the ops table showed
    self_device_us 0.00 and a blank self_device_pct in every row, and their legend. They are left
    out of table/md where the trace has no device activity and they say nothing (zero, blank or
    NaN in every row); a device id, a device number that is not zero, --columns keep theirs."""
    from pipeline.render.documents import shown_columns

    ops = pl.DataFrame(
        {
            "name": ["aten::mm", "aten::add"],
            "self_device_us": [0.0, 0.0],
            "self_device_pct": [float("nan"), None],
            "device_total_us": [None, None],
            "self_cpu_us": [5.0, 1.0],
        }
    )
    every = tuple(ops.columns)
    assert shown_columns(ops, every, None, without_device=True) == ["name", "self_cpu_us"]
    assert shown_columns(ops, every, None) == list(every)  # a trace with device activity: all of them
    assert shown_columns(ops, every, ["self_device_us", "name"], without_device=True) == ["self_device_us", "name"]
    kept = ops.with_columns(device=pl.lit(-1), self_device_us=pl.Series([0.0, 2.0]))
    shown = shown_columns(kept, ("device", *every), None, without_device=True)
    assert shown == ["device", "name", "self_device_us", "self_cpu_us"]


@pytest.mark.real
def test_a_cpu_only_ops_table_shows_cpu_time_at_80_columns(shared_traces, run_cli):
    p = run_cli(["analyze", shared_traces / "hta" / "cpu_only.json.gz", "--section", "ops", "--width", "80"])
    assert p.returncode == 0, p.stderr
    assert "self_device" not in p.stdout and "self_cpu_pct: % of all ops' self CPU time" in p.stdout
