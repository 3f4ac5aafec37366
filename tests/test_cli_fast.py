"""`flatten` and `analyze` command lines parsed by argparse (`pipeline.cli.fast`) give the command
exactly what typer gives it, or go to typer."""

from __future__ import annotations

import functools
import subprocess
import sys
from pathlib import Path
from typing import Literal, Optional

import pytest
import typer

from conftest import run_cli
from pipeline.cli import FAST, entry, fast, register
from pipeline.cli.app import app
from pipeline.synthetic import write_trace

CLEAN = [
    ["analyze", "t.json"],
    ["analyze", "t.json", "--section", "devices", "--section", "kernels", "--format", "json", "-o", "x.json"],
    ["analyze", "t.json", "-f", "html", "--top", "5", "-w", "0", "--start-us", "1e3", "--end-us", "2.5"],
    ["analyze", "t.json", "--steps", "2:4", "--annotation", "fwd", "--sort", "count", "--plot", "figs"],
    ["analyze", "t.json", "--group-by", "stack", "--stacks", "s.txt", "--stacks-metric", "self_device_time_total"],
    ["analyze", "t.json", "--graph-capture", "a.json", "--graph-capture", "b.json", "--formulas", "f.toml"],
    ["analyze", "t.json", "--kernel-wait-us", "5", "--queue-full=7", "--seq-len", "4", "-t", "abc", "-c", "a,b"],
    ["analyze", "--name-limit", "0", "--top", "0", "t.json", "--end-us", ".5", "--start-us", "+2E-3"],
    ["flatten", "a.json", "-o", "out"],
    ["flatten", "a.json", "b.json", "-o", "out", "-j", "2", "--no-link", "-q", "--max-inflate", "0"],
    ["flatten", "a.json", "--out=out", "-j2", "--device", "H100", "--dtype", "bf16", "--graph-capture", "c.json"],
    ["flatten", "-q", "a.json", "-o", "out", "--device-specs", "d.csv", "--max-inflate", "12.5"],
    ["batch", "runs", "-o", "ds"],
    ["batch", "a", "b", "-o", "ds", "-j", "3", "--engine", "ray", "--capture-dir", "caps", "-q", "--max-inflate", "1"],
    ["compact", "ds", "--target-mb", "64", "-q"],
    ["query", "ds", "select 1"],
    ["query", "ds", "select 1", "-f", "parquet", "-o", "x.parquet", "-t", "r0", "-w", "80"],
    ["query", "ds", "-e", "kernels", "--no-sandbox"],
    ["query", "--sandbox", "ds", "-F", "q.sql"],
    ["query", "--list-examples"],
    ["query"],
]
# what typer reads otherwise, refuses, or says: typer runs these
NOT_CLEAN = [
    ["analyze", "t.json", "--help"],
    ["analyze", "-h"],
    ["analyze", "t.json", "--top", "x"],
    ["analyze", "t.json", "--top", "1_000"],
    ["analyze", "t.json", "--top", "٣"],  # Arabic-Indic digit: Python's int reads it
    ["analyze", "t.json", "--top", "-1"],  # below its min=0: typer says so (it was the rows but the last)
    ["analyze", "t.json", "-w", "-5"],
    ["flatten", "a.json", "-o", "out", "-j", "0"],
    ["batch", "runs", "-o", "ds", "-j", "-2"],
    ["analyze", "t.json", "--kernel-wait-us", "nan"],
    ["analyze", "t.json", "--kernel-wait-us", "inf"],
    ["analyze", "t.json", "--format", "yaml"],
    ["analyze", "t.json", "--sectoin", "devices"],
    ["analyze", "t.json", "--sect", "devices"],  # no abbreviations: click takes none either
    ["analyze", "t.json", "-o", ""],
    ["analyze"],
    ["analyze", "a.json", "b.json"],
    ["flatten", "a.json"],
    ["flatten", "-o", "out"],
    ["flatten", "a.json", "-o", "out", "--no-link=yes"],
    ["batch", "runs", "-o", "ds", "--engine", "spark"],
    ["compact", "ds", "--target-mb", "1.5"],
    ["query", "ds", "select 1", "extra"],
    ["query", "ds", "--sandbox=no"],
    ["query", "ds", "-- the busiest\nselect 1"],  # argparse: the SQL; click: an unknown option
    ["query", "ds", "-1"],
    ["analyze", "t.json", "-o=x.json"],  # argparse: x.json; click: =x.json
    ["flatten", "a.json", "-qo", "out"],
    ["flatten", "a.json", "-o", "out", "--", "-b.json"],
]


def typer_call(argv: list[str]) -> tuple[int, dict]:
    """The exit code of typer's run of `argv` and the parameters it passed the command."""
    register(argv)
    got: dict = {}
    command = next(c for c in app.registered_commands if (c.name or c.callback.__name__) == argv[0])
    real = command.callback

    @functools.wraps(real)
    def capture(**values):
        got.update(values)
        return 0

    command.callback = capture
    try:
        return entry.run(argv), got
    finally:
        command.callback = real


def typed(values: dict) -> dict:
    return {k: (type(v), v) for k, v in values.items()}


@pytest.mark.parametrize("argv", CLEAN, ids=" ".join)
def test_a_clean_command_line_gets_what_typer_gives(argv):
    rc, by_typer = typer_call(argv)
    assert rc == 0 and by_typer
    by_argparse = fast.values(fast.command_function(argv[0]), argv[1:], f"tracepipe {argv[0]}")
    assert typed(by_argparse) == typed(by_typer)


@pytest.mark.parametrize("argv", NOT_CLEAN, ids=" ".join)
def test_anything_else_goes_to_typer(argv):
    register(argv)
    with pytest.raises(fast.Refused):
        fast.values(fast.command_function(argv[0]), argv[1:], f"tracepipe {argv[0]}")


RANKS_CLEAN = [
    ["ranks", "run"],
    ["ranks", "run", "-f", "json", "-o", "r.json", "-w", "100", "--top", "0", "-c", "rank,wait_us"],
    ["ranks", "--run-by", "col:job", "run", "--align", "none", "--run", "a", "--plot", "p", "-j", "2", "--no-cache"],
]
RANKS_NOT_CLEAN = [
    ["ranks", "run", "-o=r.json"],
    ["ranks", "run", "--top", "1_0"],
    ["ranks", "run", "--align", "mean"],
    ["ranks", "-1"],
    ["ranks", "run", "--help"],
]


@pytest.mark.parametrize(
    "args",
    [["analyze", "t.json", "--top", "-3"], ["diff", "a.json", "b.json", "--top", "-1"], ["ranks", "r", "--top", "-2"]],
    ids=" ".join,
)
def test_a_count_below_its_least_is_one_line(args, tmp_path):
    """--top -3 showed every row but the last three, silently; -j 0 flattened with one worker."""
    p = run_cli(args, cwd=tmp_path)
    assert p.returncode == 2 and p.stdout == "" and len(p.stderr.splitlines()) == 1, p.stderr
    assert "--top" in p.stderr and ("greater than or equal to 0" in p.stderr or "must be 0 or more" in p.stderr)


@pytest.mark.parametrize("argv", RANKS_CLEAN, ids=" ".join)
def test_ranks_parses_as_typer_does(argv):
    """`ranks` has its own option table and parser (`cli.ranks`), read the same way."""
    from pipeline.cli import ranks

    rc, by_typer = typer_call(argv)
    assert rc == 0 and by_typer
    assert typed(ranks.values(argv)) == typed(by_typer)


@pytest.mark.parametrize("argv", RANKS_NOT_CLEAN, ids=" ".join)
def test_ranks_leaves_the_rest_to_typer(argv):
    from pipeline.cli import ranks

    with pytest.raises(fast.Refused):
        ranks.values(argv)
    assert ranks.fast(argv) is None


@pytest.mark.parametrize("name", FAST)
def test_the_fast_commands_parse_without_typer(name):
    """A parameter of a kind argparse does not know would send every command line to typer:
    slower, silently. Every parameter of the fast commands is one it knows."""
    register([name])
    assert fast.parser(fast.command_function(name), name).parse_args
    assert fast.run(["no-such-command"]) is None


def _option(**kw):
    return typer.Option(None, "--x", **kw)


@pytest.mark.parametrize(
    "declare",
    [
        lambda: (dict, _option()),
        lambda: (Optional[int], _option(min=0, clamp=True)),  # typer moves a value into the range
        lambda: (Optional[str], _option(min=0)),  # a bound on text
        lambda: (Optional[Path], _option(exists=True)),
        lambda: (Optional[str], _option(envvar="X")),
        lambda: (Optional[str], _option(callback=print)),
        lambda: (bool, typer.Option(True, "--x")),  # typer adds --no-x
        lambda: (bool, typer.Option(False, "--x/no-x")),
        lambda: (Optional[str], typer.Option(None, "--x/--no-x")),
        lambda: (Optional[str], typer.Option(None)),  # the name typer derives
        lambda: (Literal[1, 2], _option()),
        lambda: (Optional[list[bool]], _option()),
        lambda: (int, 3),  # not a typer parameter
    ],
)
def test_a_parameter_of_another_kind_sends_the_command_to_typer(declare):
    kind, default = declare()

    def command(x=default):
        pass

    command.__annotations__ = {"x": kind}
    with pytest.raises(fast.Refused):
        fast.parser(command, "tracepipe command")


def test_a_clean_command_line_runs_without_pydantic(tmp_path):
    """The point of it: a clean flatten or analyze never imports pydantic (typer's validators);
    a mistake still gets typer's one line and exit code 2."""
    event = {"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 1, "dur": 2}
    trace = write_trace({"traceEvents": [event]}, tmp_path / "t.json")
    for argv in (["flatten", trace, "-o", tmp_path / "out", "-q"], ["analyze", trace, "--section", "devices"]):
        p = subprocess.run(
            [sys.executable, "-X", "importtime", "-m", "pipeline", *map(str, argv)],
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )
        assert p.returncode == 0, p.stderr[-2000:]
        lines = p.stderr.splitlines()
        imported = {line.rsplit("|", 1)[-1].strip() for line in lines if line.startswith("import time:")}
        assert "pipeline.cli.fast" in imported and "pydantic" not in imported, argv
    r = run_cli(["analyze", trace, "--sectoin", "devices"])
    assert r.returncode == 2
    assert r.stderr.strip() == (
        "tracepipe analyze: No such option: --sectoin (Possible options: --section) (see 'tracepipe analyze --help')"
    )
