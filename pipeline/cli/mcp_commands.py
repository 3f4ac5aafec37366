"""`tracepipe mcp`: a dataset served to agents over the Model Context Protocol (stdio)."""

from __future__ import annotations

from pathlib import Path

import typer

from pipeline.cli.app import EXIT_OK, app


@app.command()
def mcp(
    dataset: Path = typer.Argument(..., help="a batch dataset, a flattened trace or a folder of flattened traces"),
    time_limit: float = typer.Option(30.0, "--time-limit", metavar="S", help="a query is stopped after S seconds"),
    max_rows: int = typer.Option(100, "--max-rows", help="rows a query returns unless it asks for fewer or more"),
    max_chars: int = typer.Option(
        100_000, "--max-chars", help="characters of any answer: longer ones have their longest lists cut, and say so"
    ),
    memory_mb: int = typer.Option(2048, "--memory-mb", help="memory of the SQL engine, over all queries (MB)"),
    threads: int = typer.Option(2, "--threads", help="threads of the SQL engine"),
):
    """Serve a dataset to agents over MCP (stdio): list_traces, schema, query (read-only SQL),
    analyze, findings, compare, ranks; each answer is what the command gives, as JSON.

    For an MCP client's configuration: command `tracepipe`, args ["mcp", "/path/to/dataset"]
    (docs/guides/mcp.md). The client is untrusted: SQL reads only the dataset's tables, within
    --time-limit, and no answer is longer than --max-chars.
    """
    import importlib.util

    from pipeline.errors import UsageError
    from pipeline.integrations.mcp import Settings, serve, source_kind

    if importlib.util.find_spec("mcp") is None:
        raise UsageError("tracepipe mcp needs the MCP SDK: pip install 'kineto-tracepipe[mcp]' (or: pip install mcp)")
    if source_kind(dataset) is None:
        raise UsageError(
            f"{dataset}: not a batch dataset, a flattened trace or a folder of flattened traces "
            "(tracepipe batch TRACES -o DATASET makes one)"
        )
    if time_limit <= 0 or max_rows < 1 or max_chars < 1000 or memory_mb < 64 or threads < 1:
        raise UsageError(
            "--time-limit must be positive, --max-rows at least 1, --max-chars at least 1000, "
            "--memory-mb at least 64, --threads at least 1"
        )
    serve(dataset, Settings(time_limit, max_rows, memory_mb, threads, max_chars))
    raise typer.Exit(EXIT_OK)
