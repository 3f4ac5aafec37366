"""Commands on trace files: flatten, augment, combine, schema, demo-trace, demo-run."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Optional

import typer

from pipeline.cli.app import (
    EXIT_OK,
    EXIT_PROBLEMS,
    app,
    err,
    formulas_option,
    load_formulas,
)
from pipeline.errors import TracepipeError


def moved_line(n: int) -> str:
    """What augment, slice and combine say of the slices they moved so that Perfetto draws them."""
    if n == 1:
        return "1 slice partially overlapped another on its track (Perfetto cannot nest them): moved to a sibling track"
    return (
        f"{n:,} slices partially overlapped another on their track (Perfetto cannot nest them): moved to sibling tracks"
    )


@app.command()
def flatten(
    traces: list[Path] = typer.Argument(..., help="trace files (.json, .json.gz, .json.zst)"),
    out: Path = typer.Option(..., "-o", "--out", help="output directory; one sub-directory per trace"),
    workers: Optional[int] = typer.Option(
        None, "-j", "--workers", min=1, help="parser processes (default: all cores for large files)"
    ),
    no_link: bool = typer.Option(False, "--no-link", help="skip linking and cost (raw tables only)"),
    device_specs: Optional[Path] = typer.Option(None, "--device-specs", help="CSV of extra/overriding device specs"),
    device: Optional[str] = typer.Option(None, "--device", help="force this device spec for every GPU"),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="dtype for ops whose trace records none (e.g. bf16)"),
    formulas: Optional[Path] = formulas_option(),
    max_inflate: Optional[float] = typer.Option(
        None,
        "--max-inflate",
        help="a compressed trace may inflate to this many times its size, at least 1 GiB (default 200; 0: no limit)",
    ),
    graph_capture: Optional[list[Path]] = typer.Option(
        None,
        "--graph-capture",
        help="a trace of the capture of the CUDA/HIP graphs the traces replay (repeatable): "
        "their replayed kernels get the ops that captured them",
    ),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="no progress, no summary"),
):
    """Flatten traces into Parquet tables, linked and costed: OUT/<stem>/<table>.parquet."""
    from pipeline.flatten import flatten as run
    from pipeline.link.graphs import graph_hint
    from pipeline.progress import FileProgress
    from pipeline.read.launches import lost_activity_line

    user = load_formulas(formulas)
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
                    graph_captures=graph_capture or (),
                    formulas=user,
                )
        except TracepipeError as e:
            err(str(e) if str(t) in str(e) else f"{t}: {e}")
            code = max(code, e.exit_code)
            continue
        for w in r.warnings:
            err(f"{t.name}: {w}")
        if not quiet and (hint := graph_hint(r.problems)):
            err(f"{t.name}: {hint}")
        if lost := lost_activity_line(r.problems, r.n_gpu_ops):
            err(f"{t}: {lost}")
            code = max(code, EXIT_PROBLEMS)
        if r.truncated:
            err(f"{t}: truncated ({r.truncation_reason}); kept the {r.n_events} complete events")
            code = max(code, EXIT_PROBLEMS)
        if not quiet:
            took = ", ".join(f"{stage.replace('_', '+')} {s:.1f} s" for stage, s in r.seconds.items())
            typer.echo(
                f"{t.name}: {r.n_events:,} events, {r.n_gpu_ops:,} gpu ops, {r.n_flows:,} flow endpoints, "
                f"{r.n_devices} device{'' if r.n_devices == 1 else 's'} -> {r.out_dir} ({took})"
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
    formulas: Optional[Path] = formulas_option(),
    keep_secrets: bool = typer.Option(
        False, "--keep-secrets", help="copy tokens and passwords in the metadata as they are (default: redacted)"
    ),
    tracks: bool = typer.Option(
        True, "--tracks/--no-tracks", help="add the counter tracks and the critical path (default: yes)"
    ),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="no progress, no summary"),
):
    """Write the trace again with FLOPs, bytes and roofline figures in each costed kernel's args, counter
    tracks (launch queue per stream, memory per device), the critical path as a track of its own, and
    slices Perfetto cannot nest moved to sibling tracks."""
    from pipeline.progress import FileProgress
    from pipeline.rewrite.augment import augment as run

    user = load_formulas(formulas)
    # flatten's stages (read, link+cost); then `write` lasts while the augmented trace is written
    with FileProgress(trace.name, trace.stat().st_size if trace.is_file() else None, quiet) as shown:
        r = run(
            trace,
            out,
            keep_secrets=keep_secrets,
            tracks=tracks,
            device_specs=str(device_specs) if device_specs else None,
            device=device,
            dtype=dtype,
            formulas=user,
            progress=shown.advance_to if shown.on else None,
            stage=shown.stage,
        )
    for w in r.warnings:
        err(f"{trace.name}: {w}")
    if r.n_moved:
        err(f"{trace.name}: {moved_line(r.n_moved)}")
    if not quiet:
        added = ", ".join(f"{n:,} {what}" for what, n in r.added.items() if n)
        typer.echo(
            f"{trace.name}: {r.n_events:,} events, {r.n_costed:,} kernels costed"
            + (f", added {added}" if added else "")
            + f" -> {r.out_path}"
        )
    if r.truncated:
        err(f"{trace}: truncated ({r.truncation_reason}); wrote the {r.n_events:,} complete events")
    raise typer.Exit(EXIT_PROBLEMS if r.truncated else EXIT_OK)


# ------------------------------------------------------------------ slice
@app.command("slice")
def slice_command(
    trace: Path = typer.Argument(..., help="a trace file, or a run folder of rank traces (with --ranks)"),
    out: Path = typer.Option(
        ..., "-o", "--out", help="output trace (.json, or .json.gz to compress); a folder for a run"
    ),
    steps: Optional[str] = typer.Option(None, "--steps", metavar="A:B", help="ProfilerSteps A to B (A:B, A:, :B or N)"),
    start_us: Optional[float] = typer.Option(None, "--start-us", help="from this µs after the trace starts"),
    end_us: Optional[float] = typer.Option(None, "--end-us", help="up to this µs after the trace starts"),
    annotation: Optional[str] = typer.Option(None, "--annotation", help="inside the user_annotations so named"),
    ranks: Optional[str] = typer.Option(
        None,
        "--ranks",
        metavar="all|R,R-R",
        help="TRACE is a run folder: slice these ranks (each to OUT/<its file name>); "
        "--start-us/--end-us count from the run's first event, on its aligned clock",
    ),
    keep_secrets: bool = typer.Option(
        False, "--keep-secrets", help="copy tokens and passwords in the metadata as they are (default: redacted)"
    ),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="no progress, no summary"),
):
    """Write a window of a trace as a trace of its own: every event that overlaps it, the launches and
    kernels that keep its links, whole flows, all metadata; streamed, for a trace too large to open."""
    from pipeline.analyses.window import Window, parse_steps
    from pipeline.errors import UsageError

    if steps is not None:
        parse_steps(steps)  # a usage error before any work
    window = Window(steps=steps, start_us=start_us, end_us=end_us, annotation=annotation)
    if ranks is not None or trace.is_dir():
        from pipeline.rewrite.run_slice import slice_run

        results = slice_run(trace, out, window, ranks or "all", keep_secrets=keep_secrets)
    else:
        if ranks is not None:
            raise UsageError("--ranks needs a run folder")
        from pipeline.progress import FileProgress
        from pipeline.rewrite.slice import slice_trace

        with FileProgress(trace.name, trace.stat().st_size if trace.is_file() else None, quiet) as shown:
            results = [
                slice_trace(
                    trace,
                    out,
                    window,
                    keep_secrets=keep_secrets,
                    progress=shown.advance_to if shown.on else None,
                    stage=shown.stage,
                )
            ]
    code = EXIT_OK
    for r in results:
        for w in r.warnings:
            err(f"{r.out_path.name}: {w}")
        if r.n_moved:
            err(f"{r.out_path}: {moved_line(r.n_moved)}")
        if r.truncated:
            err(f"{r.out_path}: the trace was truncated ({r.truncation_reason}); sliced its complete events")
            code = EXIT_PROBLEMS
        if not quiet:
            span = ", ".join(f"{a / 1e3:.3f}-{b / 1e3:.3f}" for a, b in r.window[:3])
            typer.echo(
                f"{r.out_path}: {r.n_events:,} events ({r.n_in_window:,} in the window [{span}] µs, "
                f"{r.n_linked:,} linked to them, {r.n_flow_events:,} flow endpoints)"
            )
    raise typer.Exit(code)


# ------------------------------------------------------------------ combine
@app.command()
def combine(
    traces: list[Path] = typer.Argument(
        ..., help="trace files to put into one, or a run folder (or archive) of a run's rank traces"
    ),
    out: Path = typer.Option(..., "-o", "--out", help="output trace (.json, or .json.gz to compress)"),
    align: Literal["none", "start", "clocks"] = typer.Option(
        "none",
        "--align",
        help="none: keep timestamps; start: shift each trace to start together; "
        "clocks: shift each rank of a run by the clock offset `tracepipe ranks` estimates",
    ),
    label: Optional[list[str]] = typer.Option(None, "--label", help="label per trace, in order (default: file stems)"),
    run_by: Optional[str] = typer.Option(
        None, "--run-by", metavar="REGEX|col:NAME", help="what makes a run (as for `tracepipe ranks`)"
    ),
    run: Optional[str] = typer.Option(None, "--run", help="the run to combine, when the folder holds several"),
    keep_secrets: bool = typer.Option(
        False, "--keep-secrets", help="copy tokens and passwords in the metadata as they are (default: redacted)"
    ),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="no summary"),
):
    """Combine traces into one: pids, flow ids and link ids renumbered apart, process names labelled. A
    run's ranks: named `rank N`, on one clock (--align clocks), each collective linked across ranks by
    flows, waits and stragglers marked."""
    from pipeline.rewrite.combine import combine as run_combine

    r = run_combine(traces, out, align=align, labels=label or None, keep_secrets=keep_secrets, run_by=run_by, run=run)
    for i in r.truncated_inputs:
        err(f"{i.path}: truncated ({i.truncation_reason}); wrote its {i.n_events} complete events")
    unaligned = [i for i in r.inputs if i.rank is not None and i.offset_ns is None and align == "clocks"]
    for i in unaligned:
        err(f"{i.path}: rank {i.rank} shares no blocking collective with another rank: its clock is not aligned")
    left_out = r.run.left_out if r.run is not None else []
    for line in left_out:  # traces of the run folder that are not combined, and why
        err(line)
    if r.n_moved:
        err(moved_line(r.n_moved))
    if not quiet:
        parts = ", ".join(f"{i.label} {i.n_events:,}" for i in r.inputs[:8]) + (", ..." if len(r.inputs) > 8 else "")
        linked = ""
        if r.run is not None:
            shifts = ", ".join(f"{i.label} {-i.shift_ns / 1e3:+.1f}" for i in r.inputs[:8] if i.shift_ns)
            linked = f"; {r.run.n_collectives:,} collectives linked across ranks" + (
                f"; clocks shifted (µs): {shifts}" if shifts else ""
            )
        typer.echo(f"{len(r.inputs)} traces ({parts}): {r.n_events:,} events -> {r.out_path}{linked}")
    raise typer.Exit(EXIT_PROBLEMS if r.truncated_inputs or unaligned or left_out else EXIT_OK)


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
