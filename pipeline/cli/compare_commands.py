"""Runs over time: compare (two runs, what changed beyond the noise, a CI gate) and trend (a
metric over every run of a dataset, change points flagged)."""

from __future__ import annotations

import tempfile
import typing
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Optional

import typer

from pipeline.cli.app import EXIT_OK, EXIT_PROBLEMS, RunsFormat, app, columns_option, err, width_option
from pipeline.cli.output import (
    FORMAT_DEFAULT,
    check_output,
    column_list,
    fitted_width,
    output_format,
    write_file,
    write_report,
)


@contextmanager
def opened(path: Path, jobs: Optional[int]) -> Iterator[Path]:
    """A dataset for `path`: itself when it holds tables, else (a folder or archive of trace files)
    a temporary dataset batched from it, removed afterwards."""
    from pipeline.runs.report import is_trace_folder

    if not is_trace_folder(path):
        yield path
        return
    from pipeline.dataset.batch import run_batch

    with tempfile.TemporaryDirectory(prefix="tracepipe-compare-") as tmp:
        run_batch(path, Path(tmp) / "ds", jobs=jobs)
        yield Path(tmp) / "ds"


LEVEL_HELP = "kernel, op, category, collective, step or idle (repeatable; default: all)"
RUN_BY_HELP = (
    "what makes a run: a regex on the trace's path (its first group names the run), or col:NAME, a column "
    "of the trace table (default: the directory holding the traces)"
)


def _levels(level: Optional[list[str]]) -> tuple[str, ...]:
    from pipeline.compare.samples import LEVELS
    from pipeline.errors import UsageError

    chosen = tuple(dict.fromkeys(level or LEVELS))
    unknown = [lv for lv in chosen if lv not in LEVELS]
    if unknown:
        raise UsageError(f"--level {unknown[0]}: levels are {', '.join(LEVELS)}")
    return chosen


def _check_stats(min_effect: float, fdr: float):
    from pipeline.errors import UsageError

    if not 0 < fdr < 1:
        raise UsageError(f"--fdr must be between 0 and 1 (got {fdr:g})")
    if min_effect < 0:
        raise UsageError(f"--min-effect must not be negative (got {min_effect:g})")


@app.command()
def compare(
    source: Path = typer.Argument(
        ...,
        help="a batch dataset (or a folder of flattened traces, or a folder/archive of trace files, batched first) "
        "holding the runs",
    ),
    other: Optional[Path] = typer.Argument(
        None, help="a second one holding the new run (then --base picks in SOURCE, --new in OTHER)"
    ),
    base: Optional[str] = typer.Option(
        None,
        "--base",
        metavar="RUN",
        help="the run compared against (its last path component is enough; default: the run before --new)",
    ),
    new: Optional[str] = typer.Option(None, "--new", metavar="RUN", help="the run looked at (default: the latest)"),
    level: Optional[list[str]] = typer.Option(None, "--level", metavar="LEVEL", help=LEVEL_HELP),
    min_effect: float = typer.Option(
        5.0, "--min-effect", metavar="PCT", help="a change smaller than this (%) is `same`, however certain"
    ),
    fdr: float = typer.Option(0.01, "--fdr", help="false discovery rate held over all names tested (0.01: 1%)"),
    fail_above: Optional[float] = typer.Option(
        None, "--fail-above", metavar="PCT", help="exit 1 when anything regressed by more than PCT %"
    ),
    given_format: Optional[RunsFormat] = typer.Option(
        None, "--format", "-f", help="xlsx: a sheet per level; html: one self-contained page" + FORMAT_DEFAULT
    ),
    out: Optional[Path] = typer.Option(None, "-o", "--out", help="write the comparison to this file"),
    width: Optional[int] = width_option(),
    top: int = typer.Option(
        20, "--top", min=0, help="rows of each level in table and md (0: all; csv, json, xlsx: all)"
    ),
    columns: Optional[str] = columns_option(),
    run_by: Optional[str] = typer.Option(None, "--run-by", metavar="REGEX|col:NAME", help=RUN_BY_HELP),
    jobs: Optional[int] = typer.Option(
        None, "-j", "--jobs", min=1, help="worker processes when a folder of traces is batched first"
    ),
):
    """Compare two runs: kernels, ops, categories, collectives, steps and idle time, each with a
    verdict (regressed, improved, same) from a test over the runs' ranks, false discoveries held
    at --fdr over every name; a CI gate with --fail-above."""
    from pipeline.compare import document, verdicts
    from pipeline.compare.report import compare_in

    levels = _levels(level)
    _check_stats(min_effect, fdr)
    fmt = output_format(given_format, out, typing.get_args(RunsFormat))
    check_output(fmt, out)
    with ExitStack() as stack:
        ds_a = stack.enter_context(opened(source, jobs))
        ds_b = stack.enter_context(opened(other, jobs)) if other is not None else None
        c, problems, said = compare_in(ds_a, ds_b, base, new, levels, fdr, min_effect, run_by, source)
        if said:
            err(said)
        if fmt == "xlsx":
            write_file(out, lambda tmp: document.write_comparison_workbook(c, tmp))
        else:
            write_report(
                document.format_comparison(c, fmt, fitted_width(width), top or None, column_list(columns)), out
            )
    code = EXIT_OK
    for p in problems:
        err(p)
        code = EXIT_PROBLEMS
    if fail_above is not None:
        failed = verdicts.gate(c.rows, fail_above)
        if failed.height:
            worst = ", ".join(
                f"{r['level']} {r['name'][:60]} {r['delta_pct']:+.1f}%" for r in failed.head(3).iter_rows(named=True)
            )
            more = f" and {failed.height - 3} more" if failed.height > 3 else ""
            err(f"--fail-above {fail_above:g}: {failed.height} regressed by more than {fail_above:g}%: {worst}{more}")
            code = EXIT_PROBLEMS
    raise typer.Exit(code)


@app.command()
def trend(
    source: Path = typer.Argument(
        ..., help="a batch dataset (or a folder of flattened traces, or a folder/archive of trace files, batched first)"
    ),
    name: Optional[str] = typer.Option(
        None, "--name", metavar="PATTERN", help="the names to follow: a regex searched in full names (case-insensitive)"
    ),
    level: str = typer.Option(
        "kernel", "--level", metavar="LEVEL", help="kernel, op, category, collective, step or idle"
    ),
    top: int = typer.Option(5, "--top", min=0, help="without --name: follow the N names with the most time (0: all)"),
    min_effect: float = typer.Option(5.0, "--min-effect", metavar="PCT", help="a smaller shift is no change point"),
    fdr: float = typer.Option(0.01, "--fdr", help="false discovery rate of change points over the names followed"),
    given_format: Optional[RunsFormat] = typer.Option(
        None, "--format", "-f", help="xlsx: a workbook; html: one self-contained page" + FORMAT_DEFAULT
    ),
    out: Optional[Path] = typer.Option(None, "-o", "--out", help="write the trend to this file"),
    plot: Optional[Path] = typer.Option(
        None, "--plot", help="write the series with their change points (PNG + SVG) into this directory"
    ),
    width: Optional[int] = width_option(),
    columns: Optional[str] = columns_option(),
    run_by: Optional[str] = typer.Option(None, "--run-by", metavar="REGEX|col:NAME", help=RUN_BY_HELP),
    jobs: Optional[int] = typer.Option(
        None, "-j", "--jobs", min=1, help="worker processes when a folder of traces is batched first"
    ),
):
    """A metric over every run of a dataset in time order (a run's time: its traces' metadata),
    with change points flagged (binary segmentation, two-sample t-test)."""
    from pipeline.compare import document
    from pipeline.compare.measured import measure_runs
    from pipeline.compare.problems import run_problems
    from pipeline.compare.runs import all_runs
    from pipeline.compare.trend import trend as follow
    from pipeline.errors import UsageError

    _levels([level])
    _check_stats(min_effect, fdr)
    fmt = output_format(given_format, out, typing.get_args(RunsFormat))
    check_output(fmt, out)
    if top < 0:
        raise UsageError("--top must not be negative")
    with opened(source, jobs) as ds:
        runs = all_runs(ds, run_by)
        if not runs:
            raise UsageError(f"{source}: holds no trace")
        measure_runs(runs)
        problems = [p for r in runs for p in run_problems(r)]
        t = follow(runs, level, name, top, fdr, min_effect, problems)
        if fmt == "xlsx":
            write_file(out, lambda tmp: document.write_trend_workbook(t, tmp))
        else:
            write_report(document.format_trend(t, fmt, fitted_width(width), column_list(columns)), out)
        if plot:
            from pipeline.render.plots.figure import written
            from pipeline.render.plots.trend import trend_figure

            plot.mkdir(parents=True, exist_ok=True)
            for f in written(lambda: trend_figure(t.rows, t.changes, level), plot, f"trend_{level}"):
                err(f"wrote {f}")
    for line in problems:
        err(line)
    raise typer.Exit(EXIT_PROBLEMS if problems else EXIT_OK)
