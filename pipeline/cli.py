"""cli: a thin typer layer. Every command calls a library function; errors map to exit codes here.

Exit codes: 0 ok, 1 finished with problems reported (truncated trace, quarantined files),
2 bad input or usage, 3 internal error (a bug: please report it with TRACEPIPE_DEBUG=1 output).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Optional

import typer

from pipeline.errors import TracepipeError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="tracepipe: PyTorch profiler traces -> Parquet tables, links, costs, reports.",
)

EXIT_OK, EXIT_PROBLEMS, EXIT_BAD_INPUT, EXIT_INTERNAL = 0, 1, 2, 3


def err(msg: str):
    typer.echo(f"tracepipe: {msg}", err=True)


class Progress:
    """A one-line progress display on stderr, only when stderr is a terminal."""

    def __init__(self, label: str, total: int | None, quiet: bool):
        self.label, self.total = label, total
        self.on = not quiet and sys.stderr.isatty()
        self.last = 0.0

    def __call__(self, done: int):
        now = time.monotonic()
        if not self.on or now - self.last < 0.2:
            return
        self.last = now
        mb = done / 1e6
        if self.total:
            pct = min(100.0, 100.0 * done / self.total)
            sys.stderr.write(f"\r{self.label}: {pct:5.1f}% ({mb:,.0f} MB)")
        else:
            sys.stderr.write(f"\r{self.label}: {mb:,.0f} MB")
        sys.stderr.flush()

    def done(self):
        if self.on:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()


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

    code = EXIT_OK
    for t in traces:
        size = t.stat().st_size if t.is_file() else None
        prog = Progress(t.name, size if not str(t).endswith((".gz", ".zst")) else None, quiet)
        try:
            r = run(
                t,
                out,
                workers=workers,
                link=not no_link,
                progress=prog,
                max_inflate=max_inflate,
                device_specs=str(device_specs) if device_specs else None,
                device=device,
                dtype=dtype,
            )
        except TracepipeError as e:
            prog.done()
            err(str(e) if str(t) in str(e) else f"{t}: {e}")
            code = max(code, e.exit_code)
            continue
        prog.done()
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
    quiet: bool = typer.Option(False, "-q", "--quiet", help="no summary"),
):
    """Write the trace again with FLOPs, bytes and roofline figures in each costed kernel's args."""
    from pipeline.rewrite.augment import augment as run

    r = run(
        trace,
        out,
        keep_secrets=keep_secrets,
        device_specs=str(device_specs) if device_specs else None,
        device=device,
        dtype=dtype,
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
    align: str = typer.Option(
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
    engine: str = typer.Option("local", "--engine", help="local (processes), ray or dask"),
    max_inflate: Optional[float] = typer.Option(
        None,
        "--max-inflate",
        help="a compressed trace or archive member may inflate to this many times its size, at least 1 GiB "
        "(default 200; 0: no limit)",
    ),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="no progress, no summary"),
):
    """Flatten many traces into one hive-partitioned dataset: OUT/<table>/trace_id=<id>/part-0.parquet.

    Incremental (content already in OUT is skipped) and safe to interrupt: re-run to resume.
    Bad files are quarantined (listed in OUT/traces with their reason) and the exit code is 1.
    """
    from pipeline.dataset.batch import run_batch

    tty = not quiet and sys.stderr.isatty()
    counts = {"done": 0}

    def report(kind: str, source: str, msg: str):
        counts["done"] += 1
        if tty:
            sys.stderr.write("\r\x1b[K")
        if kind in ("quarantined", "truncated", "failed"):
            err(f"{source}: {kind}" + (f": {msg}" if msg else ""))
        if tty:
            sys.stderr.write(f"batch: {counts['done']} inputs done (last: {os.path.basename(source)})")
            sys.stderr.flush()

    r = run_batch(src, out, jobs=jobs, engine=engine, report=report, max_inflate=max_inflate)
    if tty:
        sys.stderr.write("\r\x1b[K")
    if not quiet:
        typer.echo(
            f"batch: {r.added} traces added ({r.truncated} truncated), {r.quarantined} quarantined, "
            f"{r.skipped} already present, {r.duplicates} duplicates, {r.failed} failed -> {out}"
        )
    raise typer.Exit(r.exit_code)


@app.command()
def query(
    dataset: Optional[Path] = typer.Argument(None, help="a batch dataset, or one flattened trace directory"),
    sql: Optional[str] = typer.Argument(None, help="polars SQL over events, gpu_ops, flows, devices, trace, traces"),
    fmt: str = typer.Option("table", "--format", "-f", help="table, csv, json (list of rows) or parquet"),
    out: Optional[Path] = typer.Option(None, "-o", "--out", help="write the result to this file"),
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
    df = q.run(dataset, q.example(example) if example else sql, sandbox=bool(sandbox))
    q.write(df, fmt, out)
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
    fmt: str = typer.Option("table", "--format", "-f", help="table, md, csv or json"),
    out: Optional[Path] = typer.Option(None, "-o", "--out", help="write the report to this file"),
    run_by: Optional[str] = typer.Option(
        None,
        "--run-by",
        help="what makes a run: a regex on the trace's path (its first group names the run), or col:NAME, "
        "a column of the trace table (default: the directory holding the traces)",
    ),
    align: str = typer.Option(
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
    with rr.opened(source, jobs) as ds:
        rep = rr.analyze_runs(ds, run_by=run_by, align=align == "median")
        if run is not None:
            rep = rr.only_run(rep, run)
        _write_report(rr.format_runs(rep, fmt), out)
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


def _flatten_problems(*flats) -> int:
    """Report traces that were truncated when flattened for a report; EXIT_PROBLEMS if any."""
    code = EXIT_OK
    for f in flats:
        r = f.flatten_result
        if r is not None and r.truncated:
            err(f"{r.out_dir.name}: truncated ({r.truncation_reason}); analysed its {r.n_events} complete events")
            code = EXIT_PROBLEMS
    return code


def _sections_help() -> str:
    from pipeline.analyses.registry import section_help
    from pipeline.render.documents import DEFAULT_CSV_SECTION

    return f"only this section (repeatable; csv: one, default {DEFAULT_CSV_SECTION}): {section_help()}"


@app.command()
def analyze(
    trace: Path = typer.Argument(..., help="a trace file, or a directory made by `tracepipe flatten`"),
    fmt: str = typer.Option("table", "--format", "-f", help="table, csv, json or md"),
    out: Optional[Path] = typer.Option(None, "-o", "--out", help="write the report to this file"),
    name_limit: int = typer.Option(
        60, "--name-limit", help="cut kernel/op names to N characters in table/md (0: never)"
    ),
    top: Optional[int] = typer.Option(
        None, "--top", help="rows per device and section (default: 20 in table/md, all in json/csv)"
    ),
    section: Optional[list[str]] = typer.Option(None, "--section", help=_sections_help()),
    group_by: Optional[str] = typer.Option(
        None, "--group-by", help="ops section: also group by input-shape, stack or overload"
    ),
    sort: Optional[str] = typer.Option(
        None, "--sort", help="ops section: sort column (default self_device_us, CPU-only: self_cpu_us)"
    ),
    plot: Optional[Path] = typer.Option(
        None, "--plot", help="write roofline and time-breakdown figures (PNG + SVG) into this directory"
    ),
    stacks: Optional[Path] = typer.Option(
        None, "--stacks", help="write flame-graph collapsed stacks (export_stacks format) to this file"
    ),
    stacks_metric: str = typer.Option(
        "self_cpu_time_total", "--stacks-metric", help="self_cpu_time_total or self_device_time_total"
    ),
):
    """Per-device kernel table and summaries: busy/idle, categories, CPU ops, launch overhead,
    torch.compile, communication."""
    from pipeline import report as rp

    rp.check_options(fmt, section, group_by)
    if stacks and stacks_metric not in rp.STACK_METRICS:
        raise rp.UsageError(f"--stacks-metric must be one of {', '.join(rp.STACK_METRICS)}")
    with rp.opened(trace) as f:
        sections = rp.analyze(f, group_by=group_by, sort=sort)
        _write_report(rp.format_analysis(f, sections, fmt, name_limit, top, section), out)
        if stacks:
            _write_report(rp.stack_lines(rp.collapsed_stacks(f, stacks_metric)), stacks)
        if plot:
            from pipeline.render.plots import write_plots

            for p in write_plots(f, sections, plot):
                err(f"wrote {p}")
        code = _flatten_problems(f)
    raise typer.Exit(code)


@app.command("diff")
def diff_cmd(
    a: Path = typer.Argument(..., help="first trace file or flattened directory"),
    b: Path = typer.Argument(..., help="second trace file or flattened directory"),
    fmt: str = typer.Option("table", "--format", "-f", help="table, csv, json or md"),
    out: Optional[Path] = typer.Option(None, "-o", "--out", help="write the comparison to this file"),
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
    with rp.opened(a) as fa, rp.opened(b) as fb:
        d = rp.diff(fa, fb)
        _write_report(rp.format_diff(d, fmt, label_a or fa.stem, label_b or fb.stem, name_limit, top), out)
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


def usage_line(e) -> str:
    """A click usage error as one line naming the command and where its help is."""
    ctx = getattr(e, "ctx", None)
    where = ctx.command_path if ctx is not None else "tracepipe"
    said = " ".join(e.format_message().split()) or type(e).__name__
    return f"{where}: {said} (see '{where} --help')"


def run(argv: list[str] | None = None) -> int:
    """Run the command line `argv` (default: sys.argv[1:]) and return its exit code; every error
    is one line on stderr (`TRACEPIPE_DEBUG=1`: internal errors raise)."""
    debug = os.environ.get("TRACEPIPE_DEBUG")
    click = _click()
    try:
        rc = app(args=argv, standalone_mode=False, prog_name="tracepipe")
    except typer.Exit as e:
        return e.exit_code
    except TracepipeError as e:
        err(str(e))
        return e.exit_code
    except KeyboardInterrupt:
        err("interrupted")
        return 130
    except click.exceptions.NoArgsIsHelpError:
        return EXIT_BAD_INPUT  # the help was shown
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
