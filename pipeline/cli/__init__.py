"""cli: a thin typer layer. Every command calls a library function; errors map to exit codes here.

Exit codes: 0 ok, 1 finished with problems reported (truncated trace, quarantined files),
2 bad input or usage, 3 internal error (a bug: please report it with TRACEPIPE_DEBUG=1 output).

Commands register on `app` when their module is imported (`register`): all of them for help and
for most commands; for `ranks`, `mcp`, `flatten`, `batch`, `compact` and `query` only their own
module, and a clean `ranks` command line is parsed without typer at all (`cli.ranks.fast`), so
that a first look at a run folder pays neither for every report's imports (polars, pyarrow, the
analyses) nor for typer's. Clean command lines of the `FAST` commands are parsed by argparse
from the typer commands' own declarations (`cli.fast`).
"""

from __future__ import annotations

import atexit
import os
import sys
from importlib import import_module

MODULES = (  # in help's order
    "trace_commands",
    "dataset_commands",
    "report_commands",
    "run_commands",
    "compare_commands",
    "mcp_commands",
)
# commands whose module alone is enough to run them (flatten, batch, query: the analyses' registry,
# which the report commands' help lists, took 0.2-0.4 s of every start; of a 2,000-trace batch's
# 3.3 s and of a 0.38 s query; analyze: the other four modules, ~0.07 CPU-s of a 2.5 CPU-s
# analyze of a 209 MB trace)
LIGHT = {
    "ranks": "run_commands",
    "mcp": "mcp_commands",
    "flatten": "trace_commands",
    "analyze": "report_commands",
    **dict.fromkeys(("batch", "compact", "query"), "dataset_commands"),
}
# commands whose clean command lines argparse parses from their typer declaration (`cli.fast`,
# which says what it saves)
FAST = ("flatten", "analyze", "batch", "compact", "query")


def register(argv: list[str] | None = None) -> None:
    """Import the command modules `argv` needs (all, unless it names a LIGHT command)."""
    light = LIGHT.get(argv[0]) if argv else None
    for name in (light,) if light else MODULES:
        import_module(f"pipeline.cli.{name}")


def main():
    """The `tracepipe` command (and `python -m pipeline`): runs the command line, then leaves the
    process at once (`leave`)."""
    # numpy's OpenBLAS starts a thread per core that spins at start-up, and nothing here multiplies
    # matrices large enough to share out: 0.1 of the 0.35 CPU-s of every command's imports
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    # Arrow's C++ code (the Parquet writers, IPC reads) allocates from its default pool, mimalloc,
    # which kept ~40 MB of freed pages through a read (the 209 MB trace: 338-347 -> 296-302 MB at
    # the peak, in the same time). pyarrow's `set_memory_pool` reaches only what Python calls:
    # the choice is this variable's, read when pyarrow first asks for the pool.
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
    argv = sys.argv[1:]
    code = None
    if argv and argv[0] in ("analyze", "flatten"):  # a large trace's reading begins beside the imports
        from pipeline.read.head_start import begin

        begin(argv)
    if argv and argv[0] == "batch":  # its workers' forkserver imports beside this process's imports
        from pipeline.dataset.engines import prestart

        prestart(argv[1:])
    if argv and argv[0] == "ranks":
        from pipeline.cli.ranks import fast

        code = fast(argv)
    if argv and argv[0] in FAST:
        from pipeline.cli import fast as parsed

        code = parsed.run(argv)
    if code is None:
        from pipeline.cli.entry import run

        code = run()
    leave(code)


def leave(code: int) -> None:
    """End the process with `code` once its atexit work is done and its output flushed, without
    the interpreter's teardown: freeing every module and object of polars, pyarrow and the
    analyses took 75-85 ms of every command (209 MB trace, `analyze`: 2.07 -> 1.99 s). Every
    output is closed by then (written to a temporary name and renamed); atexit still runs, so the
    temporary directories that `weakref.finalize` removes at exit, and multiprocessing's
    clean-up, are done. Only for the process's own command line: `entry.run` returns the code
    to a caller in the same process."""
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a reader that went away (`| head`), a stream closed
            code = code or 1
    os._exit(code)


def __getattr__(name: str):
    if name in ("app", "command", "run"):
        from pipeline.cli import entry

        return getattr(entry, name)
    raise AttributeError(f"module 'pipeline.cli' has no attribute {name!r}")


__all__ = ["app", "command", "leave", "main", "register", "run"]
