"""cli: a thin typer layer. Every command calls a library function; errors map to exit codes here.

Exit codes: 0 ok, 1 finished with problems reported (truncated trace, quarantined files),
2 bad input or usage, 3 internal error (a bug: please report it with TRACEPIPE_DEBUG=1 output).
"""

from importlib import import_module

from pipeline.cli.app import app
from pipeline.cli.entry import command, main, run

for _commands in (
    "trace_commands",
    "dataset_commands",
    "report_commands",
    "compare_commands",
):  # register on app, in help's order
    import_module(f"pipeline.cli.{_commands}")

__all__ = ["app", "command", "main", "run"]
