"""Whole runs: `ranks` (the ranks of a run together). Light on purpose: it imports what a run
folder's first look needs (numpy, msgspec, the scan) and polars only for xlsx, plots or a dataset."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Optional

import typer

from pipeline.cli.app import EXIT_OK, EXIT_PROBLEMS, RunsFormat, app, columns_option, err, width_option
from pipeline.cli.output import check_output, column_list, fitted_width, write_file, write_report

SHOWN_PROBLEMS = 10  # problem lines on stderr; the problems section holds them all


@app.command()
def ranks(
    source: Path = typer.Argument(
        ...,
        help="a run folder (or archive) of trace files, a batch dataset, or a folder of flattened traces",
    ),
    fmt: RunsFormat = typer.Option("table", "--format", "-f", help="xlsx: one sheet per section (needs -o)"),
    out: Optional[Path] = typer.Option(None, "-o", "--out", help="write the report to this file"),
    width: Optional[int] = width_option(),
    top: int = typer.Option(20, "--top", help="rows of each section in table and md (0: all; csv, json, xlsx: all)"),
    columns: Optional[str] = columns_option(),
    run_by: Optional[str] = typer.Option(
        None,
        "--run-by",
        metavar="REGEX|col:NAME",
        help="what makes a run: a regex on the trace's path (its first group names the run), or col:NAME, "
        "a column of the trace table (default: the directory holding the traces)",
    ),
    align: Literal["median", "none"] = typer.Option(
        "median", "--align", help="clock alignment: median (from the ends of blocking collectives) or none"
    ),
    run: Optional[str] = typer.Option(None, "--run", help="only this run"),
    plot: Optional[Path] = typer.Option(
        None,
        "--plot",
        help="write a rank x step heat map of waits and busbw by message size (PNG + SVG) into this directory",
    ),
    jobs: Optional[int] = typer.Option(
        None, "-j", "--jobs", help="worker processes reading a folder's traces (default: one per core)"
    ),
    no_cache: bool = typer.Option(
        False, "--no-cache", help="read every trace of a run folder again, and keep nothing (see README: the cache)"
    ),
):
    """Whole runs: collectives matched across ranks, clocks aligned, waits, stragglers, bus bandwidth."""
    from pipeline.errors import UsageError
    from pipeline.runs import report as rr

    if align not in ("median", "none"):
        raise UsageError(f"--align must be median or none (got {align!r})")
    check_output(fmt, out)
    res = rr.measure(source, run_by=run_by, align=align == "median", jobs=jobs, use_cache=not no_cache)
    if run is not None:
        res = rr.only_run(res, run)
    if fmt == "xlsx":
        write_file(out, lambda tmp: rr.write_runs_workbook(res, tmp))
    else:
        write_report(rr.format_runs(res, fmt, fitted_width(width), top, column_list(columns)), out)
    if plot:
        from pipeline.runs.plots import write_run_plots

        for p in write_run_plots(rr.RunReport(res), plot):
            err(f"wrote {p}")
    problems = list(res.problems.iter_rows(named=True))
    for p in problems[:SHOWN_PROBLEMS]:
        err(f"{p['file']}: {p['problem']}: {p['detail']}")
    if len(problems) > SHOWN_PROBLEMS:
        err(f"... and {len(problems) - SHOWN_PROBLEMS:,} more problems: see the problems section of the report")
    raise typer.Exit(EXIT_PROBLEMS if problems else EXIT_OK)
