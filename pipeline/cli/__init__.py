"""cli: a thin typer layer. Every command calls a library function; errors map to exit codes here.

Exit codes: 0 ok, 1 finished with problems reported (truncated trace, quarantined files),
2 bad input or usage, 3 internal error (a bug: please report it with TRACEPIPE_DEBUG=1 output).

Commands register on `app` when their module is imported (`register`): all of them for help and
for most commands; for `ranks` only its own module, so that a first look at a run folder does
not pay for importing every report (polars, pyarrow, the analyses).
"""

from importlib import import_module

from pipeline.cli.app import app

MODULES = ("trace_commands", "dataset_commands", "report_commands", "run_commands")  # in help's order
LIGHT = {"ranks": "run_commands"}  # commands whose module alone is enough to run them


def register(argv: list[str] | None = None) -> None:
    """Import the command modules `argv` needs (all, unless it names a LIGHT command)."""
    light = LIGHT.get(argv[0]) if argv else None
    for name in (light,) if light else MODULES:
        import_module(f"pipeline.cli.{name}")


from pipeline.cli.entry import command, main, run  # noqa: E402 - entry uses register

__all__ = ["app", "command", "main", "register", "run"]
