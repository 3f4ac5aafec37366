"""The entry point: run a command line; every error is one line with its exit code."""

from __future__ import annotations

import sys
import typing
from pathlib import Path

import typer

from pipeline.cli.app import EXIT_BAD_INPUT, app
from pipeline.cli.guard import guarded


def _click():
    """The click that typer runs on: vendored as `typer._click` since typer 0.29 (which no longer
    installs click), the click package before."""
    try:
        from typer import _click as click
    except ImportError:  # typer < 0.29
        import click
    return click


# what --help shows for a value of each type
METAVARS: dict[typing.Any, str] = {int: "N", float: "NUM", Path: "PATH", str: "TEXT"}


def command(argv: list[str] | None = None):
    """The click command of `app` (with the commands `argv` needs registered: all by default), its
    help tidied: flags show no `<bool>`, values a name for their kind (N, PATH, TEXT) unless they
    declare one, choices their choices."""
    from pipeline.cli import register

    register(argv)
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
    is one line on stderr (`guard.guarded`; click's usage errors here)."""
    click = _click()
    args = sys.argv[1:] if argv is None else argv

    def call():
        try:
            return command(args)(args=args, standalone_mode=False, prog_name="tracepipe")
        except typer.Exit as e:
            return e.exit_code
        except click.exceptions.NoArgsIsHelpError as e:  # `tracepipe` alone: its help
            typer.echo(e.ctx.get_help() if getattr(e, "ctx", None) else "see 'tracepipe --help'", err=True)
            return EXIT_BAD_INPUT
        except click.exceptions.ClickException as e:  # usage: missing or unknown option, bad value, no such command
            typer.echo(usage_line(e), err=True)
            return EXIT_BAD_INPUT
        except getattr(click.exceptions, "Abort", ()):  # click's Ctrl-C
            return 130

    return guarded(call)
