"""Formula files (`--formulas FILE.toml`): the expression grammar, the checks made when a file is
loaded (one clear line: file, line, entry, what), hostile files, and costs of a hand-made trace."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import polars as pl
import pytest

from pipeline.cost.formulas import OpInputs
from pipeline.cost.formulas.expression import MAX_DEPTH, MAX_TEXT, FormulaError, Tensor, parse
from pipeline.cost.formulas.user import MAX_FILE, UserFormulas, load
from pipeline.errors import UsageError
from pipeline.flatten import flatten

ROOT = Path(__file__).resolve().parents[1]


def value(text: str, **env):
    return parse(text)(env)


# ------------------------------------------------------------------ the grammar
@pytest.mark.parametrize(
    "text, want",
    [
        ("1 + 2 * 3", 7),
        ("(1 + 2) * 3", 9),
        ("2 ** 3 ** 2", 512),  # right-associative, as in Python
        ("-2 ** 2", -4),
        ("7 // 2 + 7 % 2", 4),
        ("7 / 2", 3.5),
        ("1e3 + .5", 1000.5),
        ("min(3, 1, 2) + max(4, 5)", 6),
        ("ceil(2.1) + floor(2.9)", 5),
        ("- - 3", 3),
        ("+4", 4),
    ],
)
def test_arithmetic(text, want):
    assert value(text) == want


def test_tensors_lists_and_concrete_values():
    t = Tensor((8, 16, 32), 2.0)
    tl = (Tensor((4, 4), 4.0), Tensor((2,), 4.0))
    assert value("x[0] * x[-1]", x=t) == 8 * 32
    assert value("numel(x) + ndim(x) + elsize(x)", x=t) == 8 * 16 * 32 + 3 + 2
    assert value("bytes(x)", x=t) == 8 * 16 * 32 * 2
    assert value("numel(l) + bytes(l) + l[1][0]", l=tl) == 18 + 72 + 2
    assert value("c[1] * 2", c=(3, 5)) == 10
    assert value("flag * 10", flag=True) == 10  # a bool counts as 0 or 1
    assert parse("2 * in0[0] * in1[1] * topk").names == {"in0", "in1", "topk"}


@pytest.mark.parametrize(
    "text, why",
    [
        ("", "empty"),
        ("1 +", "end"),
        ("(1", "expected ')'"),
        ("in0[", "end"),
        ("a b", "unexpected 'b' at column 3"),
        ("3 $ 4", "character '$' at column 3"),
        ("foo(1)", "unknown function 'foo'"),
        ("__import__(os)", "unknown function '__import__'"),  # nothing is ever evaluated as Python
        ("__import__('os').system('ls')", 'character "\'"'),
        ("x.attr", "character '.'"),
        ("x if y else z", "unexpected 'if' at column 3"),
        ("lambda: 1", "character ':'"),
        ("[1, 2]", "unexpected '['"),
        ("1e400", "beyond 1e30"),
        ("9" * 40, "beyond 1e30"),
        ("(" * 100 + "1" + ")" * 100, "nested deeper"),
        ("-" * 100 + "1", "nested deeper"),
        ("x[" * 100 + "0" + "]" * 100, "nested deeper"),
        ("1+" * (MAX_TEXT // 2) + "1", "longer than"),
        ("+".join(["1"] * 300), "tokens"),
    ],
)
def test_bad_formulas_are_refused_with_the_reason(text, why):
    with pytest.raises(FormulaError, match=re.escape(why)):
        parse(text)


@pytest.mark.parametrize(
    "text, env, why",
    [
        ("2 ** 1000", {}, "beyond 1e30"),
        ("2 ** 10 ** 10", {}, "beyond 1e30"),  # refused before it is computed
        ("10.0 ** 31", {}, "beyond 1e30"),
        ("x * x * x * x", {"x": 10**10}, "beyond 1e30"),
        ("1 / 0", {}, "division by zero"),
        ("1 // (x - x)", {"x": 3}, "division by zero"),
        ("5 % 0", {}, "division by zero"),
        ("0 ** -1", {}, "division by zero"),
        ("(-8) ** 0.5", {}, "fractional power"),
        ("y", {}, "'y' is not defined"),
        ("x[3]", {"x": Tensor((1, 2), 2.0)}, "index 3 out of range"),
        ("x[0.5]", {"x": Tensor((1, 2), 2.0)}, "whole number"),
        ("x + 1", {"x": Tensor((1, 2), 2.0)}, "a tensor of shape [1, 2]"),
        ("numel(3)", {}, "takes a tensor"),
        ("bytes(x)", {"x": Tensor((2,), None)}, "element size"),
        ("ceil(1, 2)", {}, "takes 1 argument"),
    ],
)
def test_evaluation_errors_are_formula_errors(text, env, why):
    with pytest.raises(FormulaError, match=re.escape(why)):
        value(text, **env)


def test_depth_limit_is_within_what_the_interpreter_can_walk():
    nested = "(" * (MAX_DEPTH - 1) + "1" + ")" * (MAX_DEPTH - 1)
    assert value(nested) == 1
    assert value("+".join(["1"] * 199)) == 199  # a long flat chain is fine


# ------------------------------------------------------------------ formula files
MOE = """
# a fused MoE op with its weights as inputs
[[op]]
name = "my::fused_moe"
family = "moe"
let = { tokens = "in0[0]", topk = "in3[1]" }
flops = "2 * tokens * topk * (in1[1] * in1[2] + in2[1] * in2[2])"
bytes = "bytes(in0) + bytes(in1) + bytes(in2)"

[[op]]
name = "my::*_norm"
flops = "5 * numel(in0)"
bytes = "input_bytes"
dtype = "fp32"
"""


def write(tmp_path: Path, text: str | bytes, name: str = "f.toml") -> Path:
    p = tmp_path / name
    p.write_bytes(text if isinstance(text, bytes) else text.encode())
    return p


MOE_ARGS = {
    "Input Dims": [[8, 64], [4, 256, 64], [4, 64, 128], [8, 2]],
    "Input type": ["c10::BFloat16", "c10::BFloat16", "c10::BFloat16", "float"],
}


def test_a_file_costs_its_ops(tmp_path):
    f = load(write(tmp_path, MOE))
    moe = f.find("my::fused_moe")
    assert moe is not None and f.find("my::rms_norm") is f.patterns[0] and f.find("my::other") is None
    c = moe.cost(OpInputs.from_args(MOE_ARGS))
    assert c.flops == 2 * 8 * 2 * (256 * 64 + 64 * 128)
    assert c.bytes == (8 * 64 + 4 * 256 * 64 + 4 * 64 * 128) * 2
    assert (c.dtype, c.family) == ("bf16", "moe")
    norm = f.find("my::layer_norm").cost(OpInputs.from_args({"Input Dims": [[4, 8]], "Input type": ["float"]}))
    assert (norm.flops, norm.bytes, norm.dtype, norm.family) == (160, 128, "fp32", "user")


def test_entries_that_fail_on_an_op_say_why(tmp_path):
    moe = load(write(tmp_path, MOE)).find("my::fused_moe")
    with pytest.raises(FormulaError, match="in3: the op has 3 inputs"):
        moe.cost(OpInputs.from_args({"Input Dims": MOE_ARGS["Input Dims"][:3]}))
    with pytest.raises(FormulaError, match="in1: input 1 is not a tensor"):
        moe.cost(OpInputs.from_args({"Input Dims": [[8, 64], [], [4, 64, 128], [8, 2]]}))


def test_exact_names_win_over_patterns_and_the_first_pattern_wins(tmp_path):
    text = """
[[op]]
name = "a::*"
flops = "1"
bytes = "0"
[[op]]
name = "a::b"
flops = "2"
bytes = "0"
[[op]]
name = "a::?"
flops = "3"
bytes = "0"
"""
    f = load(write(tmp_path, text))
    cost = lambda name: f.find(name).cost(OpInputs.from_args({})).flops
    assert (cost("a::b"), cost("a::c"), cost("a::long")) == (2, 1, 1)
    assert cost("a::b 0->1") == 2  # an event name with a suffix is looked up by its first word too


def test_patterns_are_the_same_regex_in_python_and_polars(tmp_path):
    f = load(write(tmp_path, '[[op]]\nname = "x::a.b+c (d)-*é"\nflops = "1"\nbytes = "1"\n'))
    names = ["x::a.b+c (d)-ok é", "x::aXb+c (d)-é", "x::a.b+c (d)-é"]
    in_python = [f.find(n) is not None for n in names]
    in_polars = pl.Series(names).str.contains(f.pattern_regex).to_list()
    assert in_python == in_polars == [True, False, True]


@pytest.mark.parametrize(
    "text, want",
    [
        ('[[op]]\nname = "a"\nflops = "1 +"\nbytes = "0"\n', r"f\.toml:3: \[\[op\]\] #1 'a': flops: unexpected end"),
        (
            '[[op]]\nname = "a"\nflops = "1"\nbytes = "0"\n\n[[op]]\nname = "b"\nflops = "tokns * 2"\nbytes = "0"\n',
            r"f\.toml:8: \[\[op\]\] #2 'b': flops: unknown name 'tokns'",
        ),
        ('[[op]]\nname = "a"\nflops = "1"\n', r"f\.toml:1: \[\[op\]\] #1 'a': no 'bytes'"),
        ('[[op]]\nname = "a"\nflop = "1"\nflops = "1"\nbytes = "1"\n', "unknown key 'flop' (keys: name, flops"),
        ('[[op]]\nname = "a"\nflops = 2\nbytes = "1"\n', "a formula is a string in quotes, not int"),
        ('[[op]]\nname = "a"\nflops = "1 / 0"\nbytes = "1"\n', "flops: division by zero"),  # found at load
        ('[[op]]\nname = "a"\nflops = "2 ** 200"\nbytes = "1"\n', "flops: a value beyond 1e30"),
        ('[[op]]\nname = "a"\nflops = "1"\nbytes = "1"\ndtype = "float128"\n', "dtype: 'float128' is not a dtype"),
        ('[[op]]\nname = ""\nflops = "1"\nbytes = "1"\n', "name: an op name or pattern"),
        ('[[op]]\nname = "a"\nlet = { in0 = "1" }\nflops = "1"\nbytes = "1"\n', "let: 'in0' cannot be a name"),
        ('[[op]]\nname = "a"\nlet = { x = "y", y = "1" }\nflops = "x"\nbytes = "1"\n', "let: x: unknown name 'y'"),
        ('[[op]]\nname = "a"\nflops = "1"\nbytes = "1"\n[[op]]\nname = "a"\nflops = "1"\nbytes = "1"\n', "same name"),
        ("[[op]]\nname = 'a'\nflops = '1'\nbytes = '1'\n[x]\n", "unknown top-level key 'x'"),
        ("title = 1\n", "unknown top-level key 'title'"),
        ("", "holds no [[op]] tables"),
        ("op = 3\n", "holds no [[op]] tables"),
        ("[[op]\nname = 1", "not valid TOML"),
        ("[[op]]\nname = 'a'\nflops = '" + "(" * 60 + "1" + ")" * 60 + "'\nbytes = '1'\n", "nested deeper"),
    ],
)
def test_bad_files_are_one_clear_line(tmp_path, text, want):
    with pytest.raises(UsageError, match=want if "\\" in want else re.escape(want)) as e:  # a regex, or text
        load(write(tmp_path, text))
    assert "\n" not in str(e.value) and str(tmp_path / "f.toml") in str(e.value)


def test_hostile_files(tmp_path):
    with pytest.raises(UsageError, match="larger than 1 MiB"):
        load(write(tmp_path, b"#" * (10 << 20)))  # 10 MB: refused, read no further than the limit
    with pytest.raises(UsageError, match="not UTF-8"):
        load(write(tmp_path, b"\xff\xfe[[op]]"))
    with pytest.raises(UsageError, match="nested deeper than 64 levels"):
        load(write(tmp_path, "x = " + "[" * 100_000 + "]" * 100_000))
    with pytest.raises(UsageError, match="nested deeper than 64 levels"):
        load(write(tmp_path, "x = " + "{a = " * 1000 + "1" + "}" * 1000))
    with pytest.raises(UsageError, match="at most 1000"):
        load(write(tmp_path, '[[op]]\nname = "a"\nflops = "1"\nbytes = "1"\n' * 1001))
    with pytest.raises(UsageError, match="no such formula file"):
        load(tmp_path / "missing.toml")
    with pytest.raises(UsageError, match="not a regular file"):
        load(tmp_path)
    assert MAX_FILE == 1 << 20


def test_a_loaded_file_travels_to_worker_processes(tmp_path):
    import pickle

    f = load(write(tmp_path, MOE))
    again = pickle.loads(pickle.dumps(f))
    assert isinstance(again, UserFormulas)
    assert again.find("my::fused_moe").cost(OpInputs.from_args(MOE_ARGS)) == f.find("my::fused_moe").cost(
        OpInputs.from_args(MOE_ARGS)
    )


# ------------------------------------------------------------------ a trace costed by a file
def _x(name, cat, ts, dur, tid=1, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": args}


def custom_op_trace() -> dict:
    """Three ops, each launching kernels: a custom MoE (two kernels, 30 and 10 us), an aten::mm, and
    a custom op no formula names."""
    ev = [
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "python"}},
        _x("my::fused_moe", "cpu_op", 100, 50, **MOE_ARGS),
        _x("cudaLaunchKernel", "cuda_runtime", 110, 5, correlation=1),
        _x("cudaLaunchKernel", "cuda_runtime", 120, 5, correlation=2),
        _x("aten::mm", "cpu_op", 200, 20, **{"Input Dims": [[8, 16], [16, 32]], "Input type": ["float", "float"]}),
        _x("cudaLaunchKernel", "cuda_runtime", 205, 5, correlation=3),
        _x("my::other", "cpu_op", 300, 20, **{"Input Dims": [[8]], "Input type": ["float"]}),
        _x("cudaLaunchKernel", "cuda_runtime", 305, 5, correlation=4),
    ]
    for corr, (ts, dur) in enumerate([(150, 30), (181, 10), (230, 4), (330, 6)], 1):
        ev.append(_x(f"kernel_{corr}", "kernel", ts, dur, tid=7, correlation=corr, device=0, stream=7))
    props = [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85e9, "computeMajor": 9, "numSms": 132}]
    return {"traceEvents": ev, "deviceProperties": props}


def write_trace(path: Path, trace: dict) -> Path:
    with gzip.open(path, "wt") as f:
        json.dump(trace, f)
    return path


def kernels(out_dir: Path) -> pl.DataFrame:
    return pl.read_parquet(out_dir / "gpu_ops.parquet").sort("event_idx")


def test_a_formula_file_costs_custom_ops_and_overrides_builtins(tmp_path):
    trace = write_trace(tmp_path / "t.json.gz", custom_op_trace())
    plain = kernels(flatten(trace, tmp_path / "plain").out_dir)
    assert plain["unmodelled_reason"].to_list() == ["no_formula", "no_formula", None, "no_formula"]
    assert plain["cost_source"].to_list() == [None, None, "formula", None]
    assert plain["flops"][2] == 2 * 8 * 16 * 32
    override = MOE + '\n[[op]]\nname = "aten::mm"\nflops = "7"\nbytes = "0"\n'
    r = flatten(trace, tmp_path / "user", formulas=load(write(tmp_path, override)))
    g = kernels(r.out_dir)
    moe = 2 * 8 * 2 * (256 * 64 + 64 * 128)
    assert g["flops"][:2].to_list() == pytest.approx([moe * 30 / 40, moe * 10 / 40])  # split by duration
    assert g["cost_source"].to_list() == ["user_formula", "user_formula", "user_formula", None]
    assert g["flops"][2] == 7  # the file's entry wins over the built-in formula
    assert g["cost_family"][0] == "moe" and g["cost_dtype"][0] == "bf16"
    assert g["unmodelled_reason"].to_list() == [None, None, None, "no_formula"]
    trace_row = pl.read_parquet(r.out_dir / "trace.parquet").row(0, named=True)
    assert trace_row["n_costed"] == 3 and trace_row["gpu_time_modelled_pct"] == pytest.approx(100 * 44 / 50)


def test_an_entry_that_fails_leaves_its_ops_unmodelled_with_a_warning(tmp_path):
    trace = write_trace(tmp_path / "t.json.gz", custom_op_trace())
    bad = '[[op]]\nname = "my::fused_moe"\nflops = "in0[5]"\nbytes = "0"\n'
    r = flatten(trace, tmp_path / "out", formulas=load(write(tmp_path, bad)))
    g = kernels(r.out_dir)
    assert g["unmodelled_reason"][:2].to_list() == ["user_formula_error"] * 2
    assert any("f.toml:1 [[op]] #1 'my::fused_moe'" in w and "index 5 out of range" in w for w in r.warnings)


def test_cli_formulas_errors_are_one_line_and_exit_2(tmp_path, run_cli):
    trace = write_trace(tmp_path / "t.json.gz", custom_op_trace())
    bad = write(tmp_path, '[[op]]\nname = "my::fused_moe"\nflops = "2 * tokns"\nbytes = "0"\n')
    for cmd in (
        ["flatten", trace, "-o", tmp_path / "out"],
        ["analyze", trace],
        ["augment", trace, "-o", tmp_path / "a.json"],
    ):
        p = run_cli([*cmd, "--formulas", bad])
        assert p.returncode == 2, p.stderr
        assert p.stderr.strip().count("\n") == 0 and "f.toml:3" in p.stderr and "unknown name 'tokns'" in p.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "a.json").exists()
    p = run_cli(["batch", tmp_path, "-o", tmp_path / "ds", "--formulas", tmp_path / "nope.toml"])
    assert p.returncode == 2 and "no such formula file" in p.stderr and not (tmp_path / "ds").exists()
    good = write(tmp_path, MOE, "good.toml")
    assert run_cli(["flatten", trace, "-o", tmp_path / "flat", "-q"]).returncode == 0
    p = run_cli(["analyze", tmp_path / "flat" / "t", "--formulas", good])
    assert p.returncode == 2 and "already costed" in p.stderr


def test_analyze_and_batch_cost_with_the_file(tmp_path, run_cli):
    src = tmp_path / "src"
    src.mkdir()
    trace = write_trace(src / "t.json.gz", custom_op_trace())
    good = write(tmp_path, MOE, "good.toml")
    p = run_cli(["analyze", trace, "--formulas", good, "--section", "coverage", "--format", "json"])
    rows = json.loads(p.stdout)["devices"][0]["coverage"]
    assert {r["cause"]: round(r["pct"], 1) for r in rows} == {
        "costed:user_formula": 80.0,
        "costed:formula": 8.0,
        "no_formula": 12.0,
    }
    other = custom_op_trace()  # a second trace: small traces are read, linked and costed as a group
    for e in other["traceEvents"]:
        e["ts"] = e.get("ts", 0) + 1000
    write_trace(src / "u.json.gz", other)
    assert run_cli(["batch", src, "-o", tmp_path / "ds", "-q", "--formulas", good]).returncode == 0
    g = pl.read_parquet(tmp_path / "ds" / "gpu_ops" / "**" / "*.parquet").sort("trace_id", "event_idx")
    assert g["cost_source"].to_list() == ["user_formula", "user_formula", "formula", None] * 2
    assert g["unmodelled_reason"].to_list() == [None, None, None, "no_formula"] * 2


# ------------------------------------------------------------------ the documentation's example
def readme_formula_file() -> str:
    text = (ROOT / "docs" / "guides" / "formula-files.md").read_text()
    m = re.search(r"<!-- formula-file:begin -->\s*```toml\n(.*?)```", text, re.S)
    assert m, "docs/guides/formula-files.md has no formula file example"
    return m.group(1)


def test_the_readme_formula_file_loads(tmp_path):
    f = load(write(tmp_path, readme_formula_file()))
    assert f.find("vllm::moe_forward") is not None


@pytest.mark.real
def test_the_readme_formula_file_costs_the_vllm_moe(shared_traces, tmp_path):
    trace = shared_traces / "tracelens" / "b200_eager.json.gz"
    f = load(write(tmp_path, readme_formula_file()))
    r = flatten(trace, tmp_path / "out", formulas=f)
    assert not [w for w in r.warnings if "formula" in w]
    g = pl.read_parquet(r.out_dir / "gpu_ops.parquet").filter(pl.col("kind") == "kernel")
    moe = g.filter(pl.col("cpu_op_name") == "vllm::moe_forward")
    assert moe.height and (moe["cost_source"] == "user_formula").all()
    assert 0 < moe["bytes"].sum() / (moe["dur_ns"].sum() / 1e9) < 7.7e12  # below the B200's bandwidth
    costed = g.filter(pl.col("cost_source").is_not_null())["dur_ns"].sum() / g["dur_ns"].sum()
    assert costed > 0.75  # 12% without the file
