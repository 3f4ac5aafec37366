"""Commands on a dataset: batch, compact, query."""

from __future__ import annotations

import sys
import typing
from pathlib import Path
from typing import Literal, Optional

import typer

from pipeline.cli.app import (
    EXIT_OK,
    QueryFormat,
    app,
    formulas_option,
    load_formulas,
    width_option,
)
from pipeline.cli.output import FORMAT_DEFAULT, fitted_width, output_format


@app.command()
def batch(
    src: list[Path] = typer.Argument(
        ...,
        help="trace files, directories (recursive), .tar/.tar.gz/.tgz/.zip archives or text files of paths, "
        "as many as you like",
    ),
    out: Path = typer.Option(..., "-o", "--out", help="the dataset directory (created or extended)"),
    jobs: Optional[int] = typer.Option(None, "-j", "--jobs", min=1, help="worker processes (default: all cores)"),
    engine: Literal["local", "ray", "dask"] = typer.Option(
        "local", "--engine", help="local: processes on this machine"
    ),
    max_inflate: Optional[float] = typer.Option(
        None,
        "--max-inflate",
        help="a compressed trace or archive member may inflate to this many times its size, at least 1 GiB "
        "(default 200; 0: no limit)",
    ),
    capture_dir: str = typer.Option(
        "capture_traces",
        "--capture-dir",
        help="the folder beside a run's traces holding the captures of the CUDA/HIP graphs they replay "
        "(vLLM, SGLang: capture_traces); '' pairs none",
    ),
    formulas: Optional[Path] = formulas_option(),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="no progress, no summary"),
):
    """Flatten many traces into one dataset of few, large Parquet files: `batch a.json.gz b.json.gz
    runs/ -o ds`.

    OUT/<table>/part-<commit>.parquet, trace_id a column of every table.

    Small traces are flattened many to a task and written together; each task's traces are
    committed at once (OUT/traces, the manifest, names their part), and small parts are merged
    at the end (see `tracepipe compact`). Incremental (content already in OUT is skipped) and
    safe to interrupt: re-run to resume. Bad files are quarantined (listed in OUT/traces with
    their reason) and the exit code is 1.
    """
    from pipeline.dataset.batch import run_batch
    from pipeline.progress import BatchProgress

    user = load_formulas(formulas)
    with BatchProgress(quiet) as shown:  # done/total, traces/s, bytes/s, quarantined so far, ETA

        def report(kind: str, source: str, msg: str, nbytes: int):
            if kind in ("quarantined", "truncated", "failed"):  # above the progress line, as `err` writes it
                shown.echo(f"tracepipe: {source}: {kind}" + (f": {msg}" if msg else ""))
            shown.finished(kind, nbytes)

        r = run_batch(
            src,
            out,
            jobs=jobs,
            engine=engine,
            report=report,
            max_inflate=max_inflate,
            started=shown.start,
            capture_dir=capture_dir or None,
            formulas=user,
        )
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
    given_format: Optional[QueryFormat] = typer.Option(
        None, "--format", "-f", help="json: a list of rows; parquet and xlsx need -o" + FORMAT_DEFAULT
    ),
    out: Optional[Path] = typer.Option(None, "-o", "--out", help="write the result to this file"),
    pick: Optional[str] = typer.Option(
        None, "--trace", "-t", metavar="ID", help="only this trace's rows (its trace_id, stem or part of its path)"
    ),
    width: Optional[int] = width_option(),
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
    fmt = output_format(given_format, out, typing.get_args(QueryFormat))
    q.check_format(fmt, out)
    query_text = q.example(example) if example else sql
    assert query_text is not None, "one of SQL, --example and --sql-file was given"
    df = q.run(dataset, query_text, sandbox=bool(sandbox), trace=pick)
    q.write(df, fmt, out, fitted_width(width))
    raise typer.Exit(EXIT_OK)


def _read_sql(path: Path) -> str:
    from pipeline.errors import UsageError

    try:
        return sys.stdin.read() if str(path) == "-" else path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"{path}: cannot read the SQL: {getattr(e, 'strerror', None) or e}") from None
