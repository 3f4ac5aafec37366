"""cli: a thin typer layer. Every command calls a library function; errors map to exit codes here.

Exit codes: 0 ok, 1 finished with problems reported (truncated trace, quarantined files),
2 bad input or usage, 3 internal error (a bug: please report it with TRACEPIPE_DEBUG=1 output).
"""

from __future__ import annotations

import os
import sys
import typing
from pathlib import Path
from typing import Literal, Optional

import typer

from pipeline.errors import TracepipeError

ReportFormat = Literal["table", "csv", "json", "md", "xlsx"]
QueryFormat = Literal["table", "csv", "json", "md", "parquet", "xlsx"]
RunsFormat = Literal["table", "csv", "json", "md", "xlsx"]

app = typer.Typer(
    add_completion=True,
    rich_markup_mode=None,  # help is plain text: "[memory] events" is not markup
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="tracepipe: PyTorch profiler traces -> Parquet tables, links, costs, reports.",
)

EXIT_OK, EXIT_PROBLEMS, EXIT_BAD_INPUT, EXIT_INTERNAL = 0, 1, 2, 3


def err(msg: str):
    typer.echo(f"tracepipe: {msg}", err=True)


def _version(value: bool):
    if value:
        from pipeline.version import __version__

        typer.echo(f"tracepipe {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="print the version and exit"
    ),
):
    """tracepipe: PyTorch profiler traces -> Parquet tables, links, costs, reports."""


# ------------------------------------------------------------------ flatten
@app.command()
def flatten(
    traces: list[Path] = typer.Argument(..., help="trace files (.json, .json.gz, .json.zst)"),
    out: Path = typer.Option(..., "-o", "--out", help="output directory; one sub-directory per trace"),
    workers: Optional[int] = typer.Option(
        None, "-j", "--workers", help="parser processes (default: all cores for large files)"
    ),
    no_link: bool = typer.Option(False, "--no-link", help="skip linking and cost (raw tables only)"),
    device_specs: Optional[Path] = typer.Option(None, "--device-specs", help="CSV of extra/overriding device specs"),
    device: Optional[str] = typer.Option(None, "--device", help="force this device spec for every GPU"),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="dtype for ops whose trace records none (e.g. bf16)"),
    max_inflate: Optional[float] = typer.Option(
        None,
        "--max-inflate",
        help="a compressed trace may inflate to this many times its size, at least 1 GiB (default 200; 0: no limit)",
    ),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="no progress, no summary"),
):
    """Flatten traces into OUT/<stem>/{events,gpu_ops,flows,devices,trace}.parquet."""
    from pipeline.flatten import flatten as run
    from pipeline.progress import FileProgress

    code = EXIT_OK
    for t in traces:
        try:
            # % of the file's own bytes (compressed ones for .gz/.zst), then link+cost and write
            with FileProgress(t.name, t.stat().st_size if t.is_file() else None, quiet) as shown:
                r = run(
                    t,
                    out,
                    workers=workers,
                    link=not no_link,
                    progress=shown.advance_to if shown.on else None,
                    stage=shown.stage,
                    max_inflate=max_inflate,
                    device_specs=str(device_specs) if device_specs else None,
                    device=device,
                    dtype=dtype,
                )
        except TracepipeError as e:
            err(str(e) if str(t) in str(e) else f"{t}: {e}")
            code = max(code, e.exit_code)
            continue
        for w in r.warnings:
            err(f"{t.name}: {w}")
        if r.truncated:
            err(f"{t}: truncated ({r.truncation_reason}); kept the {r.n_events} complete events")
            code = max(code, EXIT_PROBLEMS)
        if not quiet:
            took = ", ".join(f"{stage.replace('_', '+')} {s:.1f} s" for stage, s in r.seconds.items())
            typer.echo(
                f"{t.name}: {r.n_events} events, {r.n_gpu_ops} gpu ops, {r.n_flows} flow endpoints, "
                f"{r.n_devices} devices -> {r.out_dir} ({took})"
            )
    raise typer.Exit(code)


# ------------------------------------------------------------------ augment
@app.command()
def augment(
    trace: Path = typer.Argument(..., help="trace file (.json, .json.gz, .json.zst)"),
    out: Path = typer.Option(..., "-o", "--out", help="output trace (.json, or .json.gz to compress)"),
    device_specs: Optional[Path] = typer.Option(None, "--device-specs", help="CSV of extra/overriding device specs"),
    device: Optional[str] = typer.Option(None, "--device", help="force this device spec for every GPU"),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="dtype for ops whose trace records none (e.g. bf16)"),
    keep_secrets: bool = typer.Option(
        False, "--keep-secrets", help="copy tokens and passwords in the metadata as they are (default: redacted)"
    ),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="no progress, no summary"),
):
    """Write the trace again with FLOPs, bytes and roofline figures in each costed kernel's args."""
    from pipeline.progress import FileProgress
    from pipeline.rewrite.augment import augment as run

    # flatten's stages (read, link+cost); then `write` lasts while the augmented trace is written
    with FileProgress(trace.name, trace.stat().st_size if trace.is_file() else None, quiet) as shown:
        r = run(
            trace,
            out,
            keep_secrets=keep_secrets,
            device_specs=str(device_specs) if device_specs else None,
            device=device,
            dtype=dtype,
            progress=shown.advance_to if shown.on else None,
            stage=shown.stage,
        )
    for w in r.warnings:
        err(f"{trace.name}: {w}")
    if not quiet:
        typer.echo(f"{trace.name}: {r.n_events} events, {r.n_costed} kernels costed -> {r.out_path}")
    if r.truncated:
        err(f"{trace}: truncated ({r.truncation_reason}); wrote the {r.n_events} complete events")
    raise typer.Exit(EXIT_PROBLEMS if r.truncated else EXIT_OK)


# ------------------------------------------------------------------ combine
@app.command()
def combine(
    traces: list[Path] = typer.Argument(..., help="trace files to put into one"),
    out: Path = typer.Option(..., "-o", "--out", help="output trace (.json, or .json.gz to compress)"),
    align: Literal["none", "start"] = typer.Option(
        "none", "--align", help="none: keep timestamps; start: shift each trace to start together"
    ),
    label: Optional[list[str]] = typer.Option(None, "--label", help="label per trace, in order (default: file stems)"),
    keep_secrets: bool = typer.Option(
        False, "--keep-secrets", help="copy tokens and passwords in the metadata as they are (default: redacted)"
    ),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="no summary"),
):
    """Combine traces into one: pids, flow ids and link ids renumbered apart, process names labelled."""
    from pipeline.rewrite.combine import combine as run

    r = run(traces, out, align=align, labels=label or None, keep_secrets=keep_secrets)
    for i in r.truncated_inputs:
        err(f"{i.path}: truncated ({i.truncation_reason}); wrote its {i.n_events} complete events")
    if not quiet:
        parts = ", ".join(f"{i.label} {i.n_events}" for i in r.inputs)
        typer.echo(f"{len(r.inputs)} traces ({parts}): {r.n_events} events -> {r.out_path}")
    raise typer.Exit(EXIT_PROBLEMS if r.truncated_inputs else EXIT_OK)


@app.command()
def schema(table: Optional[str] = typer.Argument(None, help="one table (default: all)")):
    """Print the declared table schemas (from schemas/*.toml) as Markdown."""
    from pipeline import schema as sch

    names = [table] if table else list(sch.DOCUMENTED)
    for n in names:
        if n not in sch.DOCUMENTED:
            raise typer.BadParameter(f"no table {n!r}; tables: {', '.join(sch.DOCUMENTED)}")
    typer.echo("\n\n".join(sch.markdown(n) for n in names))


@app.command("demo-trace")
def demo_trace(
    out: Path = typer.Argument(..., help="where to write the example trace (.json or .json.gz)"),
    mb: float = typer.Option(2.0, "--mb", help="approximate size in MB (uncompressed)"),
):
    """Write a realistic synthetic example trace (used by `make demo` and `make bench`)."""
    from pipeline.synthetic import write_demo

    write_demo(out, mb)
    typer.echo(f"wrote {out}")


@app.command("demo-run")
def demo_run(
    out: Path = typer.Argument(..., help="folder for the rank traces (rank-R.json.gz)"),
    world: int = typer.Option(8, "--world", help="ranks"),
    collectives: int = typer.Option(96, "--collectives", help="collectives per rank"),
    straggler: int = typer.Option(3, "--straggler", help="the rank that starts one collective late"),
    delay_us: float = typer.Option(2500.0, "--delay-us", help="how late (µs)"),
    delayed: int = typer.Option(21, "--delayed", help="which collective (0-based)"),
    skew_us: float = typer.Option(2000.0, "--skew-us", help="ranks' clocks disagree by up to this much (µs)"),
):
    """Write a synthetic NCCL run with one late rank and skewed clocks (the truth is known exactly)."""
    from pipeline.errors import UsageError
    from pipeline.synthetic import write_run

    if world < 1 or not 0 <= straggler < world or not 0 <= delayed < collectives:
        raise UsageError("need world >= 1, 0 <= straggler < world and 0 <= delayed < collectives")
    offsets = [round(skew_us * (((r * 7919) % 1000) / 500 - 1), 3) for r in range(world)]
    write_run(out, world, collectives, straggler, delay_us, delayed, offsets)
    typer.echo(
        f"wrote {world} ranks to {out}: rank {straggler} starts collective {delayed} {delay_us:g} µs late; "
        f"clock offsets (µs) {offsets}"
    )


# ------------------------------------------------------------------ batch + query
@app.command()
def batch(
    src: Path = typer.Argument(
        ..., help="a directory (recursive), a .tar/.tar.gz/.tgz/.zip archive, or a text file of paths"
    ),
    out: Path = typer.Option(..., "-o", "--out", help="the dataset directory (created or extended)"),
    jobs: Optional[int] = typer.Option(None, "-j", "--jobs", help="worker processes (default: all cores)"),
    engine: Literal["local", "ray", "dask"] = typer.Option(
        "local", "--engine", help="local: processes on this machine"
    ),
    max_inflate: Optional[float] = typer.Option(
        None,
        "--max-inflate",
        help="a compressed trace or archive member may inflate to this many times its size, at least 1 GiB "
        "(default 200; 0: no limit)",
    ),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="no progress, no summary"),
):
    """Flatten many traces into one dataset: OUT/<table>/part-<commit>.parquet, trace_id a column.

    Small traces are flattened many to a task and written together; each task's traces are
    committed at once (OUT/traces, the manifest, names their part), and small parts are merged
    at the end (see `tracepipe compact`). Incremental (content already in OUT is skipped) and
    safe to interrupt: re-run to resume. Bad files are quarantined (listed in OUT/traces with
    their reason) and the exit code is 1.
    """
    from pipeline.dataset.batch import run_batch
    from pipeline.progress import BatchProgress

    with BatchProgress(quiet) as shown:  # done/total, traces/s, quarantined so far, ETA

        def report(kind: str, source: str, msg: str):
            if kind in ("quarantined", "truncated", "failed"):  # above the progress line, as `err` writes it
                shown.echo(f"tracepipe: {source}: {kind}" + (f": {msg}" if msg else ""))
            shown.finished(kind)

        r = run_batch(src, out, jobs=jobs, engine=engine, report=report, max_inflate=max_inflate, started=shown.start)
    if not quiet:
        typer.echo(
            f"batch: {r.added} traces added ({r.truncated} truncated), {r.quarantined} quarantined, "
            f"{r.skipped} already present, {r.duplicates} duplicates, {r.failed} failed -> {out}"
        )
    raise typer.Exit(r.exit_code)


@app.command()
def compact(
    dataset: Path = typer.Argument(..., help="a batch dataset"),
    target_mb: int = typer.Option(256, "--target-mb", help="size of a merged part, about (MB, all its tables)"),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="no summary"),
):
    """Merge a dataset's small part files into few large ones (batch does it at the end of a run).

    Atomic: the merged parts take over in one rename of the manifest, and readers never see both
    the old and the new files or neither; what they replace is removed afterwards.
    """
    from pipeline.dataset.compact import compact as compact_dataset

    mb = max(1, target_mb)
    r = compact_dataset(dataset, target_bytes=mb << 20, small_bytes=max(1, mb // 4) << 20)
    if not quiet:
        typer.echo(f"compact: {r.summary()} -> {dataset}")
    raise typer.Exit(EXIT_OK)


@app.command()
def query(
    dataset: Optional[Path] = typer.Argument(None, help="a batch dataset, or one flattened trace directory"),
    sql: Optional[str] = typer.Argument(None, help="polars SQL over events, gpu_ops, flows, devices, trace, traces"),
    fmt: QueryFormat = typer.Option("table", "--format", "-f", help="json: a list of rows; parquet and xlsx need -o"),
    out: Optional[Path] = typer.Option(None, "-o", "--out", help="write the result to this file"),
    pick: Optional[str] = typer.Option(
        None, "--trace", "-t", metavar="ID", help="only this trace's rows (its trace_id, stem or part of its path)"
    ),
    width: Optional[int] = typer.Option(
        None, "--width", "-w", help="fit the table to N columns (default: the terminal's; 0: no limit)"
    ),
    example: Optional[str] = typer.Option(None, "--example", "-e", help="run a named example query instead of SQL"),
    sql_file: Optional[Path] = typer.Option(
        None, "--sql-file", "-F", help="read the SQL from this file (- for stdin); sandboxed unless --no-sandbox"
    ),
    sandbox: Optional[bool] = typer.Option(
        None,
        "--sandbox/--no-sandbox",
        help="only the dataset's tables: no read_csv/read_parquet/... of other files or URLs "
        "(default: on for --sql-file, off for SQL on the command line)",
    ),
    list_examples: bool = typer.Option(False, "--list-examples", help="list the example queries and exit"),
):
    """Run SQL over a dataset's tables (lazily: only what the query needs is read).

    SQL typed on the command line may also read other files with polars' table functions
    (read_csv('f.csv'), read_parquet(...)), as the user could anyway; SQL from a file (or a
    service passing it on) runs in the sandbox, which allows only the dataset's tables.
    """
    from pipeline.dataset import query as q
    from pipeline.errors import UsageError

    if list_examples:
        for name, (what, text) in q.EXAMPLES.items():
            typer.echo(f"{name}: {what}\n  " + " ".join(text.split()) + "\n")
        raise typer.Exit(EXIT_OK)
    if dataset is None:
        raise UsageError("query needs DATASET and SQL (or --example NAME, or --sql-file FILE)")
    if sum(x is not None for x in (sql, example, sql_file)) != 1:
        raise UsageError("give one of SQL, --example NAME (see --list-examples) or --sql-file FILE")
    if sql_file is not None:
        sql = _read_sql(sql_file)
        sandbox = True if sandbox is None else sandbox
    q.check_format(fmt, out)
    query_text = q.example(example) if example else sql
    assert query_text is not None, "one of SQL, --example and --sql-file was given"
    df = q.run(dataset, query_text, sandbox=bool(sandbox), trace=pick)
    q.write(df, fmt, out, _width(width))
    raise typer.Exit(EXIT_OK)


def _read_sql(path: Path) -> str:
    from pipeline.errors import UsageError

    try:
        return sys.stdin.read() if str(path) == "-" else path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"{path}: cannot read the SQL: {getattr(e, 'strerror', None) or e}") from None


# ------------------------------------------------------------------ whole runs
@app.command()
def ranks(
    source: Path = typer.Argument(
        ...,
        help="a batch dataset, a folder of flattened traces, or a folder/archive of trace files "
        "(batched into a temporary dataset first)",
    ),
    fmt: RunsFormat = typer.Option("table", "--format", "-f", help="xlsx: one sheet per section (needs -o)"),
    out: Optional[Path] = typer.Option(None, "-o", "--out", help="write the report to this file"),
    width: Optional[int] = typer.Option(
        None, "--width", "-w", help="fit tables to N columns (default: the terminal's; 0: no limit)"
    ),
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
        None, "-j", "--jobs", help="worker processes when a folder of traces is batched first"
    ),
):
    """Whole runs: collectives matched across ranks, clocks aligned, waits, stragglers, bus bandwidth."""
    from pipeline.errors import UsageError
    from pipeline.runs import report as rr

    if align not in ("median", "none"):
        raise UsageError(f"--align must be median or none (got {align!r})")
    _check_output(fmt, out)
    with rr.opened(source, jobs) as ds:
        rep = rr.analyze_runs(ds, run_by=run_by, align=align == "median")
        if run is not None:
            rep = rr.only_run(rep, run)
        if fmt == "xlsx":
            _write_file(out, lambda tmp: rr.write_runs_workbook(rep, tmp))
        else:
            _write_report(rr.format_runs(rep, fmt, _width(width)), out)
        if plot:
            from pipeline.runs.plots import write_run_plots

            for p in write_run_plots(rep, plot):
                err(f"wrote {p}")
    raise typer.Exit(EXIT_OK)


# ------------------------------------------------------------------ analyze + diff
def _write_report(text, out: Optional[Path]):
    """Print or write (atomically) a report: text, or bytes chunks (a large JSON document, streamed)."""
    chunks = [text.encode()] if isinstance(text, str) else text
    if out is None:
        for chunk in chunks:
            sys.stdout.buffer.write(chunk)
        sys.stdout.flush()
        return
    from pipeline.store import atomic_file, output_of

    with output_of(out), atomic_file(out) as tmp, open(tmp, "wb") as f:
        for chunk in chunks:
            f.write(chunk)


def _write_file(out: Optional[Path], write):
    """Write a binary report (xlsx) to `out` atomically: `write(tmp_path)` makes it."""
    from pipeline.store import atomic_file, output_of

    assert out is not None, "checked by _check_output"
    with output_of(out), atomic_file(out) as tmp:
        write(tmp)


def _write_csv_folder(folder: Optional[Path], sheets, columns: Optional[list[str]]):
    """csv -o DIR: one file per section, DIR/<section>.csv, each written atomically."""
    from pipeline.render.tables import render
    from pipeline.store import atomic_file, output_of

    assert folder is not None
    with output_of(folder):
        folder.mkdir(parents=True, exist_ok=True)
        for name, df in sheets.items():
            with atomic_file(folder / f"{name}.csv") as tmp:
                tmp.write_text(render(df, "csv", columns=columns))
    err(f"wrote {len(sheets)} sections to {folder}/ ({', '.join(f'{n}.csv' for n in sheets)})")


def _check_output(fmt: str, out: Optional[Path], section: Optional[list[str]] = None) -> bool:
    """Usage errors of -o for a format, before any work; True for csv into a folder (-o DIR)."""
    from pipeline.errors import UsageError

    if fmt == "xlsx" and out is None:
        raise UsageError("--format xlsx writes a file: give -o REPORT.xlsx")
    csv_dir = fmt == "csv" and out is not None and out.suffix.lower() != ".csv"
    if fmt == "csv" and not csv_dir and section and len(section) > 1:
        raise UsageError("--format csv writes one section to a file: give one --section, or -o DIR for one file each")
    return csv_dir


def _width(width: Optional[int]) -> Optional[int]:
    """--width: N columns, 0 no limit, default the terminal's (none when not printing to one)."""
    from pipeline.render.tables import terminal_width

    return terminal_width() if width is None else width or None


def _columns(columns: Optional[str]) -> Optional[list[str]]:
    return [c.strip() for c in columns.split(",") if c.strip()] if columns else None


def _diff_picks(a: Path, b: Path, picks: list[str]) -> tuple[Optional[str], Optional[str]]:
    """The --trace values of A and B: in order, to each of them that is a folder or dataset."""
    from pipeline.errors import UsageError

    chosen: list[Optional[str]] = []
    for side in (a, b):
        chosen.append(picks.pop(0) if side.is_dir() and picks else None)
    if picks:
        raise UsageError("more --trace values than datasets or folders among A and B")
    return chosen[0], chosen[1]


def _flatten_problems(*flats) -> int:
    """Report traces that were truncated when flattened for a report; EXIT_PROBLEMS if any."""
    code = EXIT_OK
    for f in flats:
        r = f.flatten_result
        if r is not None and r.truncated:
            err(f"{r.out_dir.name}: truncated ({r.truncation_reason}); analysed its {r.n_events} complete events")
            code = EXIT_PROBLEMS
    return code


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
    fmt: ReportFormat = typer.Option(
        "table", "--format", "-f", help="xlsx: one sheet per section (needs -o); csv -o DIR: one file per section"
    ),
    out: Optional[Path] = typer.Option(None, "-o", "--out", help="write the report to this file (csv: or folder)"),
    pick: Optional[str] = typer.Option(
        None,
        "--trace",
        "-t",
        metavar="ID",
        help="in a dataset or folder: the trace (its trace_id, stem or part of its path)",
    ),
    width: Optional[int] = typer.Option(
        None, "--width", "-w", help="fit tables to N columns (default: the terminal's; 0: no limit)"
    ),
    columns: Optional[str] = typer.Option(
        None,
        "--columns",
        "-c",
        metavar="COL,COL",
        help="show these columns, comma-separated (table/md/csv; default: each section's own)",
    ),
    name_limit: int = typer.Option(
        60, "--name-limit", help="cut kernel/op names to N characters in table/md, middle out (0: never)"
    ),
    top: Optional[int] = typer.Option(
        None, "--top", help="rows per device and section (default: 20 in table/md, all in json/csv)"
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
    seq_len: int = typer.Option(3, "--seq-len", help="sequences: kernels per sequence"),
    steps: Optional[str] = typer.Option(
        None, "--steps", metavar="A:B", help="only ProfilerSteps A to B (A:B, A:, :B or N)"
    ),
    start_us: Optional[float] = typer.Option(None, "--start-us", help="only from this µs after the trace starts"),
    end_us: Optional[float] = typer.Option(None, "--end-us", help="only up to this µs after the trace starts"),
    annotation: Optional[str] = typer.Option(None, "--annotation", help="only inside the user_annotations so named"),
):
    """Per-device kernel table and summaries: busy/idle, categories, CPU ops, launch overhead,
    torch.compile, communication, idle breakdown, launch queue, kernel sequences, memory, critical path."""
    from pipeline import report as rp
    from pipeline.analyses.window import Window, parse_steps

    rp.check_options(fmt, section, group_by)
    csv_dir = _check_output(fmt, out, section)
    if stacks and stacks_metric not in rp.STACK_METRICS:
        raise rp.UsageError(f"--stacks-metric must be one of {', '.join(rp.STACK_METRICS)}")
    if steps is not None:
        parse_steps(steps)  # a usage error before any work
    if seq_len < 2 or queue_full < 1 or kernel_wait_us < 0:
        raise rp.UsageError("--seq-len must be at least 2, --queue-full at least 1, --kernel-wait-us not negative")
    options = rp.Options(kernel_wait_us=kernel_wait_us, queue_full=queue_full, seq_len=seq_len)
    window = Window(steps=steps, start_us=start_us, end_us=end_us, annotation=annotation)
    with rp.opened(trace, window=window, trace=pick) as f:
        needed = None if not section else [*section, *(PLOTTED if plot else ())]
        sections = rp.analyze(f, group_by=group_by, sort=sort, only=needed, options=options)
        shown = {k: v for k, v in sections.items() if not section or k in section}
        if fmt == "xlsx":
            _write_file(out, lambda tmp: rp.write_analysis_workbook(f, shown, tmp, top))
        elif csv_dir:
            _write_csv_folder(out, rp.analysis_sheets(shown, top), _columns(columns))
        else:
            text = rp.format_analysis(f, sections, fmt, name_limit, top, section, _width(width), _columns(columns))
            _write_report(text, out)
        if stacks:
            _write_report(rp.stack_lines(rp.collapsed_stacks(f, stacks_metric)), stacks)
        if plot:
            from pipeline.render.plots import write_plots

            for p in write_plots(f, sections, plot, queue_full=queue_full):
                err(f"wrote {p}")
        code = _flatten_problems(f)
    raise typer.Exit(code)


@app.command("diff")
def diff_cmd(
    a: Path = typer.Argument(..., help="first trace: a file, a flattened trace, a folder of them or a dataset"),
    b: Optional[Path] = typer.Argument(None, help="second trace (default: A again, with a second --trace)"),
    fmt: ReportFormat = typer.Option("table", "--format", "-f", help="xlsx needs -o"),
    out: Optional[Path] = typer.Option(None, "-o", "--out", help="write the comparison to this file"),
    pick: Optional[list[str]] = typer.Option(
        None,
        "--trace",
        "-t",
        metavar="ID",
        help="in a dataset or folder: the trace of A, then of B (trace_id, stem or part of path)",
    ),
    width: Optional[int] = typer.Option(
        None, "--width", "-w", help="fit the table to N columns (default: the terminal's; 0: no limit)"
    ),
    name_limit: int = typer.Option(
        60, "--name-limit", help="cut keys and kernel names to N characters in table/md (0: never)"
    ),
    top: Optional[int] = typer.Option(None, "--top", help="only the N rows with the most time"),
    label_a: Optional[str] = typer.Option(None, "--label-a", help="name of A in the output (default: its file stem)"),
    label_b: Optional[str] = typer.Option(None, "--label-b", help="name of B in the output (default: its file stem)"),
):
    """Compare two traces side by side, matched by CPU op (names normalised across vendors), else by kernel name."""
    from pipeline import report as rp

    rp.check_options(fmt)
    _check_output(fmt, out)
    b = a if b is None else b
    picks = _diff_picks(a, b, list(pick or []))
    with rp.opened(a, trace=picks[0]) as fa, rp.opened(b, trace=picks[1]) as fb:
        d = rp.diff(fa, fb)
        la, lb = label_a or fa.stem, label_b or fb.stem
        if fmt == "xlsx":
            _write_file(out, lambda tmp: rp.write_diff_workbook(d, tmp, la, lb, top))
        else:
            _write_report(rp.format_diff(d, fmt, la, lb, name_limit, top, _width(width)), out)
        code = _flatten_problems(fa, fb)
    raise typer.Exit(code)


# ------------------------------------------------------------------ entry point
def _click():
    """The click that typer runs on: vendored as `typer._click` since typer 0.29 (which no longer
    installs click), the click package before."""
    try:
        from typer import _click as click
    except ImportError:  # typer < 0.29
        import click
    return click


METAVARS = {int: "N", float: "NUM", Path: "PATH", str: "TEXT"}  # what --help shows for a value of each type


def command():
    """The click command of `app`, its help tidied: flags show no `<bool>`, values a name for
    their kind (N, PATH, TEXT) unless they declare one, choices their choices."""
    cmd = typer.main.get_command(app)
    for c in [cmd, *getattr(cmd, "commands", {}).values()]:
        for p in c.params:
            if isinstance(p, typer.core.TyperArgument):
                p.metavar = p.metavar or (p.name or "").upper()
                continue
            if getattr(p, "is_flag", False):
                p.metavar = ""
            elif p.metavar is None and not getattr(p.type_descriptor, "is_choice", False):
                kind = getattr(p.type_descriptor, "annotation", None)
                kind = typing.get_args(kind)[0] if typing.get_origin(kind) is list else kind
                p.metavar = METAVARS.get(kind)
    return cmd


def usage_line(e) -> str:
    """A click usage error as one line naming the command and where its help is."""
    ctx = getattr(e, "ctx", None)
    where = ctx.command_path if ctx is not None else "tracepipe"
    said = " ".join(e.format_message().replace("Value error, ", "").split()) or type(e).__name__
    return f"{where}: {said} (see '{where} --help')"


def run(argv: list[str] | None = None) -> int:
    """Run the command line `argv` (default: sys.argv[1:]) and return its exit code; every error
    is one line on stderr (`TRACEPIPE_DEBUG=1`: internal errors raise)."""
    debug = os.environ.get("TRACEPIPE_DEBUG")
    click = _click()
    try:
        rc = command()(args=argv, standalone_mode=False, prog_name="tracepipe")
    except typer.Exit as e:
        return e.exit_code
    except TracepipeError as e:
        err(str(e))
        return e.exit_code
    except KeyboardInterrupt:
        err("interrupted")
        return 130
    except click.exceptions.NoArgsIsHelpError as e:  # `tracepipe` alone: its help
        typer.echo(e.ctx.get_help() if getattr(e, "ctx", None) else "see 'tracepipe --help'", err=True)
        return EXIT_BAD_INPUT
    except click.exceptions.ClickException as e:  # usage: missing or unknown option, bad value, no such command
        typer.echo(usage_line(e), err=True)
        return EXIT_BAD_INPUT
    except getattr(click.exceptions, "Abort", ()):  # click's Ctrl-C
        return 130
    except OSError as e:  # the environment, not a bug: a disk that filled, a permission
        why = os.strerror(e.errno) if e.errno else " ".join(str(e).split())
        err(f"{getattr(e, 'filename', None) or 'I/O error'}: {why}")
        return EXIT_BAD_INPUT
    except Exception as e:  # a bug
        if debug:
            raise
        first = " ".join(str(e).split())[:300]
        err(f"internal error: {type(e).__name__}: {first} (set TRACEPIPE_DEBUG=1 for details)")
        return EXIT_INTERNAL
    return rc if isinstance(rc, int) else EXIT_OK


def main():
    sys.exit(run())
