"""Whole runs: the typer command `ranks`, made from the option table of `pipeline.cli.ranks`
(which also parses a clean command line without typer, for a quick first look)."""

from __future__ import annotations

import inspect
from typing import Literal, Optional

import typer

from pipeline.cli.app import app
from pipeline.cli.ranks import DOC, OPTIONS, Opt, ranks_main


def _parameter(o: Opt) -> inspect.Parameter:
    if not o.flags:
        default = typer.Argument(..., help=o.help)
        kind: object = o.kind
    else:
        default = typer.Option(o.default, *o.flags, help=o.help, metavar=o.metavar)
        kind = Literal[o.choices] if o.choices else o.kind
        kind = kind if o.default is not None else Optional[kind]
    return inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=kind)


def ranks(**values) -> None:
    raise typer.Exit(ranks_main(**values))


ranks.__signature__ = inspect.Signature([_parameter(o) for o in OPTIONS])  # type: ignore[attr-defined]
ranks.__annotations__ = {p.name: p.annotation for p in ranks.__signature__.parameters.values()}  # type: ignore[attr-defined]
ranks.__doc__ = DOC
app.command("ranks")(ranks)
