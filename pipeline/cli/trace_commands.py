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
    formulas: Optional[Path] = formulas_option(),
    keep_secrets: bool = typer.Option(
        False, "--keep-secrets", help="copy tokens and passwords in the metadata as they are (default: redacted)"
    ),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="no progress, no summary"),
):
    """Write the trace again with FLOPs, bytes and roofline figures in each costed kernel's args."""
    from pipeline.progress import FileProgress
    from pipeline.rewrite.augment import augment as run

    user = load_formulas(formulas)
    # flatten's stages (read, link+cost); then `write` lasts while the augmented trace is written
    with FileProgress(trace.name, trace.stat().st_size if trace.is_file() else None, quiet) as shown:
        r = run(
            trace,
            out,
            keep_secrets=keep_secrets,
            device_specs=str(device_specs) if device_specs else None,
            device=device,
            dtype=dtype,
            formulas=user,
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
