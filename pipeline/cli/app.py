"""The typer app every command registers on, its exit codes and formats."""

from __future__ import annotations

from typing import Literal

import typer

from pipeline.cli.guard import EXIT_BAD_INPUT, EXIT_INTERNAL, EXIT_OK, EXIT_PROBLEMS  # noqa: F401 - the CLI's codes
from pipeline.cli.guard import say as err  # noqa: F401 - every command's one line

ReportFormat = Literal["table", "csv", "json", "md", "xlsx", "html"]
QueryFormat = Literal["table", "csv", "json", "md", "parquet", "xlsx"]
RunsFormat = Literal["table", "csv", "json", "md", "xlsx", "html"]

app = typer.Typer(
    add_completion=True,
    rich_markup_mode=None,  # help is plain text: "[memory] events" is not markup
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="tracepipe: PyTorch profiler traces -> Parquet tables, links, costs, reports.",
)


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


def width_option():
    """--width/-w, as every command that prints tables takes it (see output.fitted_width)."""
    return typer.Option(
        None, "--width", "-w", min=0, help="fit tables to N columns (default: the terminal's; 0: no limit)"
    )


def columns_option():
    """--columns/-c COL,COL, as analyze and ranks take it (see output.column_list)."""
    return typer.Option(
        None,
        "--columns",
        "-c",
        metavar="COL,COL",
        help="show these columns, comma-separated, in the sections that have them (table/md/csv)",
    )


def formulas_option():
    """--formulas FILE.toml, as every command that costs traces takes it (see `load_formulas`)."""
    return typer.Option(
        None,
        "--formulas",
        metavar="FILE.toml",
        help="cost custom ops by this formula file (op name -> FLOPs and bytes; it wins over built-in formulas)",
    )


def load_formulas(path):
    """The formula file of --formulas, checked (a bad one is a usage error: exit 2), or None."""
    if path is None:
        return None
    from pipeline.cost.formulas.user import load

    return load(path)
