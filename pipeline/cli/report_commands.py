"""Reports: analyze and diff (one trace or two); `ranks` is in run_commands."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Optional

import typer

from pipeline.cli.app import (
    EXIT_OK,
    EXIT_PROBLEMS,
    ReportFormat,
    app,
    columns_option,
    err,
    formulas_option,
    load_formulas,
    width_option,
)
from pipeline.cli.output import (
    FORMAT_DEFAULT,
    check_output,
    column_list,
    fitted_width,
    output_format,
    write_csv_folder,
    write_file,
    write_report,
)


def diff_picks(a: Path, b: Path, picks: list[str]) -> tuple[Optional[str], Optional[str]]:
    """The --trace values of A and B: in order, to each of them that is a folder or dataset."""
    from pipeline.errors import UsageError

    chosen: list[Optional[str]] = []
    for side in (a, b):
        chosen.append(picks.pop(0) if side.is_dir() and picks else None)
    if picks:
        raise UsageError("more --trace values than datasets or folders among A and B")
    return chosen[0], chosen[1]


NO_WORK = (
    "no work recorded: no op, kernel or annotation ran while the profiler recorded, only its own span; "
    "profile a region that runs the model (a profiler schedule records its active steps only)"
)


def flatten_problems(*flats) -> int:
    """Report traces that recorded no work, were truncated or lost their device activity (when
    flattened for a report, or as a dataset or a folder keeps them; EXIT_PROBLEMS if any), and
    graph replays left without their capture (`link.graphs.graph_hint`)."""
    import json

    from pipeline.link.graphs import graph_hint
    from pipeline.read.launches import lost_activity_line

    code = EXIT_OK
    for f in flats:
        if not f.holds_work:
            err(f"{f.stem}: {NO_WORK}")
            code = EXIT_PROBLEMS
        r = f.flatten_result
        if r is not None and (hint := graph_hint(r.problems)):
            err(f"{r.out_dir.name}: {hint}")
        if r is not None and (lost := lost_activity_line(r.problems, r.n_gpu_ops)):
            err(f"{r.out_dir.name}: {lost}")
            code = EXIT_PROBLEMS
        if r is not None and r.truncated:
            err(f"{r.out_dir.name}: truncated ({r.truncation_reason}); analysed its {r.n_events} complete events")
            code = EXIT_PROBLEMS
        elif r is None and (f.path / "trace.parquet").is_file():
            import polars as pl

            columns = ["stem", "truncated", "n_events", "n_gpu_ops", "problems_json"]
            row = pl.read_parquet(f.path / "trace.parquet", columns=columns).row(0, named=True)
            if lost := lost_activity_line(json.loads(row["problems_json"] or "{}"), row["n_gpu_ops"]):
                err(f"{row['stem']}: {lost}")
                code = EXIT_PROBLEMS
            if row["truncated"]:
                err(f"{row['stem']}: truncated; analysed its {row['n_events']:,} complete events")
                code = EXIT_PROBLEMS
    return code


def dataset_problems(source: Path) -> int:
    """One line for a batch dataset whose manifest holds quarantined or truncated inputs (the
    trace analysed may be fine: the dataset is not whole); EXIT_PROBLEMS if so."""
    from pipeline.dataset.pick import dataset_problems as problems

    said = problems(source) if source.is_dir() else None
    if said:
        err(said)
        return EXIT_PROBLEMS
    return EXIT_OK


PLOTTED = ("kernels", "categories", "ops", "queue", "memory")  # the sections --plot draws


def _sections_help() -> str:
    from pipeline.analyses.registry import section_help
    from pipeline.render.documents import DEFAULT_CSV_SECTION

    return f"only this section (repeatable; csv: one, default {DEFAULT_CSV_SECTION}): {section_help()}"


@app.command()
def analyze(
    trace: Path = typer.Argument(
        ..., help="a trace file, a flattened trace, a folder of them or a batch dataset (see --trace)"
    ),
    given_format: Optional[ReportFormat] = typer.Option(
        None,
        "--format",
        "-f",
        help="xlsx: one sheet per section; csv -o DIR: one file per section; html: one self-contained page"
        + FORMAT_DEFAULT,
    ),
    out: Optional[Path] = typer.Option(None, "-o", "--out", help="write the report to this file (csv: or folder)"),
    pick: Optional[str] = typer.Option(
        None,
        "--trace",
        "-t",
        metavar="ID",
        help="in a dataset or folder: the trace (its trace_id, stem or part of its path)",
    ),
    width: Optional[int] = width_option(),
    columns: Optional[str] = columns_option(),
    name_limit: int = typer.Option(
        60, "--name-limit", min=0, help="cut kernel/op names to N characters in table/md, middle out (0: never)"
    ),
    top: Optional[int] = typer.Option(
        None, "--top", min=0, help="rows per device and section (default: 20 in table/md, all in json/csv/xlsx/html)"
    ),
    section: Optional[list[str]] = typer.Option(None, "--section", metavar="NAME", help=_sections_help()),
    group_by: Optional[Literal["input-shape", "stack", "overload"]] = typer.Option(
        None, "--group-by", help="ops section: also group by input-shape, stack or overload"
    ),
    sort: Optional[str] = typer.Option(
        None,
        "--sort",
        metavar="COLUMN",
        help="ops section: sort column (default self_device_us, CPU-only: self_cpu_us)",
    ),
    plot: Optional[Path] = typer.Option(
        None, "--plot", help="write roofline and time-breakdown figures (PNG + SVG) into this directory"
    ),
    stacks: Optional[Path] = typer.Option(
        None, "--stacks", help="write flame-graph collapsed stacks (export_stacks format) to this file"
    ),
    stacks_metric: Literal["self_cpu_time_total", "self_device_time_total"] = typer.Option(
        "self_cpu_time_total", "--stacks-metric", help="self_cpu_time_total or self_device_time_total"
    ),
    kernel_wait_us: float = typer.Option(30.0, "--kernel-wait-us", help="idle: a shorter gap is kernel wait"),
    queue_full: int = typer.Option(1024, "--queue-full", help="queue: the depth where the CPU blocks"),
    seq_len: int = typer.Option(3, "--seq-len", help="sequences: kernels per window (windows merge into chains)"),
    steps: Optional[str] = typer.Option(
        None, "--steps", metavar="A:B", help="only ProfilerSteps A to B (A:B, A:, :B or N)"
    ),
    start_us: Optional[float] = typer.Option(None, "--start-us", help="only from this µs after the trace starts"),
    end_us: Optional[float] = typer.Option(None, "--end-us", help="only up to this µs after the trace starts"),
    annotation: Optional[str] = typer.Option(None, "--annotation", help="only inside the user_annotations so named"),
    graph_capture: Optional[list[Path]] = typer.Option(
        None,
        "--graph-capture",
        help="a trace file's CUDA/HIP graph capture trace (repeatable; see flatten --graph-capture)",
    ),
    formulas: Optional[Path] = formulas_option(),
):
    """Per-device kernel table and summaries: busy/idle, categories, CPU ops, launch overhead,
    torch.compile, CUDA/HIP graphs, communication, idle breakdown, launch queue, kernel sequences,
    memory, critical path."""
    from pipeline import report as rp
    from pipeline.analyses.window import Window, parse_steps

    fmt = output_format(given_format, out, rp.FORMATS)
    rp.check_options(fmt, section, group_by)
    csv_dir = check_output(fmt, out, section)
    if stacks and stacks_metric not in rp.STACK_METRICS:
        raise rp.UsageError(f"--stacks-metric must be one of {', '.join(rp.STACK_METRICS)}")
    if steps is not None:
        parse_steps(steps)  # a usage error before any work
    if seq_len < 2 or queue_full < 1 or kernel_wait_us < 0:
        raise rp.UsageError("--seq-len must be at least 2, --queue-full at least 1, --kernel-wait-us not negative")
    options = rp.Options(kernel_wait_us=kernel_wait_us, queue_full=queue_full, seq_len=seq_len)
    window = Window(steps=steps, start_us=start_us, end_us=end_us, annotation=annotation)
    if formulas is not None and trace.is_dir():
        raise rp.UsageError(
            f"{trace} is already costed: --formulas applies where costs are computed "
            "(analyze the trace file, or flatten or batch it again with --formulas)"
        )
    user = load_formulas(formulas)
    flatten_options = {
        **({"formulas": user} if user else {}),
        **({"graph_captures": graph_capture} if graph_capture else {}),
    }
    with rp.opened(trace, window=window, trace=pick, **flatten_options) as f:
        needed = None if not section else [*section, *(PLOTTED if plot else ())]
        sections = rp.analyze(f, group_by=group_by, sort=sort, only=needed, options=options)
        shown = {k: v for k, v in sections.items() if not section or k in section}
        if fmt == "xlsx":
            write_file(out, lambda tmp: rp.write_analysis_workbook(f, shown, tmp, top))
        elif csv_dir:
            write_csv_folder(out, rp.analysis_sheets(shown, top), column_list(columns))
        else:
            text = rp.format_analysis(
                f, sections, fmt, name_limit, top, section, fitted_width(width), column_list(columns)
            )
            write_report(text, out)
        if stacks:
            write_report(rp.stack_lines(rp.collapsed_stacks(f, stacks_metric)), stacks)
        if plot:
            from pipeline.render.plots import write_plots

            for p in write_plots(f, sections, plot, queue_full=queue_full):
                err(f"wrote {p}")
        code = max(flatten_problems(f), dataset_problems(trace))
    raise typer.Exit(code)


def diff_labels(fa, fb, label_a: str | None, label_b: str | None) -> tuple[str, str]:
    """The names of A and B in a diff: as given, else their stems; where those are the same
    (before/rank0.json against after/rank0.json) the folders that tell them apart, else the stems
    marked (a) and (b). Two columns of one name made polars fail the table."""
    from pipeline.errors import UsageError

    if label_a is not None and label_a == label_b:
        raise UsageError(f"--label-a and --label-b are both {label_a!r}: name A and B apart")
    la, lb = label_a or fa.stem, label_b or fb.stem
    if la != lb:
        return la, lb
    pa, pb = (Path(f.source or f.path).parent.parts for f in (fa, fb))
    k = next((k for k in range(1, min(len(pa), len(pb)) + 1) if pa[-k] != pb[-k]), 0)
    if k:
        la, lb = label_a or "/".join((*pa[-k:], la)), label_b or "/".join((*pb[-k:], lb))
    return (la, lb) if la != lb else (f"{la} (a)", f"{lb} (b)")


@app.command("diff")
def diff_cmd(
    a: Path = typer.Argument(..., help="first trace: a file, a flattened trace, a folder of them or a dataset"),
    b: Optional[Path] = typer.Argument(None, help="second trace (default: A again, with a second --trace)"),
    given_format: Optional[ReportFormat] = typer.Option(
        None, "--format", "-f", help="xlsx: a workbook; html: one self-contained page" + FORMAT_DEFAULT
    ),
    out: Optional[Path] = typer.Option(None, "-o", "--out", help="write the comparison to this file"),
    pick: Optional[list[str]] = typer.Option(
        None,
        "--trace",
        "-t",
        metavar="ID",
        help="in a dataset or folder: the trace of A, then of B (trace_id, stem or part of path)",
    ),
    width: Optional[int] = width_option(),
    name_limit: int = typer.Option(
        60, "--name-limit", min=0, help="cut keys and kernel names to N characters in table/md (0: never)"
    ),
    top: Optional[int] = typer.Option(None, "--top", min=0, help="only the N rows with the most time"),
    label_a: Optional[str] = typer.Option(
        None, "--label-a", help="name of A in the output (default: its file stem; with B's the same, its folder too)"
    ),
    label_b: Optional[str] = typer.Option(
        None, "--label-b", help="name of B in the output (default: its file stem; with A's the same, its folder too)"
    ),
    formulas: Optional[Path] = formulas_option(),
):
    """Compare two traces side by side, matched by CPU op (names normalised across vendors), else by kernel name."""
    from pipeline import report as rp
    from pipeline.analyses.diff import diff_summary, different_work

    fmt = output_format(given_format, out, rp.FORMATS)
    rp.check_options(fmt)
    check_output(fmt, out)
    b = a if b is None else b
    picks = diff_picks(a, b, list(pick or []))
    if formulas is not None and (a.is_dir() or b.is_dir()):
        raise rp.UsageError(
            "--formulas applies where costs are computed: diff two trace files, or flatten them with it"
        )
    cost = {"formulas": load_formulas(formulas)} if formulas else {}
    with rp.opened(a, trace=picks[0], **cost) as fa, rp.opened(b, trace=picks[1], **cost) as fb:
        d = rp.diff(fa, fb)
        la, lb = diff_labels(fa, fb, label_a, label_b)
        if said := different_work(diff_summary(d)):
            err(f"{la} vs {lb}: {said}")
        if fmt == "xlsx":
            write_file(out, lambda tmp: rp.write_diff_workbook(d, tmp, la, lb, top))
        else:
            write_report(rp.format_diff(d, fmt, la, lb, name_limit, top, fitted_width(width)), out)
        code = flatten_problems(fa, fb)
    raise typer.Exit(code)
