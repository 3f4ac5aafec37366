"""ranks: `tracepipe ranks`, its options as one table (`OPTIONS`) that both the typer command
(`run_commands`, for help and errors) and a plain argparse parser (`fast`) are made from.

A first look at a run folder is meant to be quick: typer's parameter handling alone costs about
0.2 s of start-up (it imports pydantic), as much as reading eight small traces. So `tracepipe
ranks ...` is parsed by argparse when it parses cleanly; anything else (`--help`, a mistake) goes
to the typer command, which says it as every other command does. Nothing here imports typer.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pipeline.cli.fast import CONVERT, Parser, Refused, parsed
from pipeline.cli.guard import EXIT_OK, EXIT_PROBLEMS, guarded, say
from pipeline.cli.output import FORMAT_DEFAULT

SHOWN_PROBLEMS = 10  # problem lines on stderr; the problems section holds them all
FORMATS = ("table", "csv", "json", "md", "xlsx", "html")


@dataclass(frozen=True)
class Opt:
    """One parameter: its name, flags (none: the argument), type, default, help, and the values
    it may take (`choices`) or the name --help shows (`metavar`)."""

    name: str
    flags: tuple[str, ...]
    kind: type
    default: object
    help: str
    choices: tuple[str, ...] | None = None
    metavar: str | None = None


OPTIONS = (
    Opt(
        "source",
        (),
        Path,
        ...,
        "a run folder (or archive) of trace files, a batch dataset, or a folder of flattened traces",
    ),
    Opt(
        "fmt",
        ("--format", "-f"),
        str,
        None,
        "xlsx: one sheet per section; html: one self-contained page" + FORMAT_DEFAULT,
        FORMATS,
    ),
    Opt("out", ("-o", "--out"), Path, None, "write the report to this file"),
    Opt("width", ("--width", "-w"), int, None, "fit tables to N columns (default: the terminal's; 0: no limit)"),
    Opt("top", ("--top",), int, 20, "rows of each section in table and md (0: all; csv, json, xlsx, html: all)"),
    Opt(
        "columns",
        ("--columns", "-c"),
        str,
        None,
        "show these columns, comma-separated, in the sections that have them (table/md/csv)",
        metavar="COL,COL",
    ),
    Opt(
        "run_by",
        ("--run-by",),
        str,
        None,
        "what makes a run: a regex on the trace's path (its first group names the run), or col:NAME, "
        "a column of the trace table (default: the directory holding the traces)",
        metavar="REGEX|col:NAME",
    ),
    Opt(
        "align",
        ("--align",),
        str,
        "median",
        "clock alignment: median (from the ends of blocking collectives) or none",
        ("median", "none"),
    ),
    Opt("run", ("--run",), str, None, "only this run"),
    Opt(
        "plot",
        ("--plot",),
        Path,
        None,
        "write a rank x step heat map of waits and busbw by message size (PNG + SVG) into this directory",
    ),
    Opt("jobs", ("-j", "--jobs"), int, None, "worker processes reading a folder's traces (default: one per core)"),
    Opt(
        "no_cache",
        ("--no-cache",),
        bool,
        False,
        "read every trace of a run folder again, and keep nothing (docs: Whole runs, the cache)",
    ),
)
DOC = "Whole runs: collectives matched across ranks, clocks aligned, waits, stragglers, bus bandwidth."


def ranks_main(
    source: Path,
    fmt: str | None = None,
    out: Path | None = None,
    width: int | None = None,
    top: int = 20,
    columns: str | None = None,
    run_by: str | None = None,
    align: str = "median",
    run: str | None = None,
    plot: Path | None = None,
    jobs: int | None = None,
    no_cache: bool = False,
) -> int:
    """Run `tracepipe ranks`; its exit code (1: the runs have problems, each said on stderr)."""
    from pipeline.cli.output import check_output, column_list, fitted_width, output_format, write_file, write_report
    from pipeline.errors import UsageError
    from pipeline.runs import report as rr

    if align not in ("median", "none"):
        raise UsageError(f"--align must be median or none (got {align!r})")
    for name, n, least in (("--top", top, 0), ("--width", width, 0), ("--jobs", jobs, 1)):
        if n is not None and n < least:
            raise UsageError(f"{name} {n}: must be {least} or more")
    fmt = output_format(fmt, out, FORMATS)
    check_output(fmt, out)
    res = rr.measured_runs(source, run_by, align == "median", jobs, not no_cache, run)
    if fmt == "xlsx":
        write_file(out, lambda tmp: rr.write_runs_workbook(res, tmp))
    else:
        write_report(rr.format_runs(res, fmt, fitted_width(width), top, column_list(columns)), out)
    if plot:
        from pipeline.runs.plots import write_run_plots

        for p in write_run_plots(rr.RunReport.of(res), plot):
            say(f"wrote {p}")
    problems = list(res.problems.iter_rows(named=True))
    for p in problems[:SHOWN_PROBLEMS]:
        say(f"{p['file']}: {p['problem']}: {p['detail']}")
    if len(problems) > SHOWN_PROBLEMS:
        say(f"... and {len(problems) - SHOWN_PROBLEMS:,} more problems: see the problems section of the report")
    return EXIT_PROBLEMS if problems else EXIT_OK


def _parser() -> Parser:
    p = Parser(prog="tracepipe ranks", add_help=False, allow_abbrev=False)
    for o in OPTIONS:
        if not o.flags:
            p.add_argument(o.name, type=CONVERT[o.kind])
        elif o.kind is bool:
            p.add_argument(*o.flags, dest=o.name, action="store_true", default=o.default)
        else:
            p.add_argument(*o.flags, dest=o.name, type=CONVERT[o.kind], default=o.default, choices=o.choices)
    return p


def values(argv: list[str]) -> dict:
    """The parameters of `ranks_main` for argv (the command's name first), as typer would pass
    them; Refused where argparse and click may read it apart (`cli.fast.parsed`)."""
    return parsed(_parser(), argv[1:])


def fast(argv: list[str]) -> int | None:
    """Run `ranks` from argv parsed by argparse; None when it does not parse cleanly (typer then
    runs the command, and says what is wrong)."""
    try:
        given = values(argv)
    except Refused:
        return None
    return guarded(lambda: ranks_main(**given))
