"""mcp: `tracepipe mcp DATASET`, a Model Context Protocol server over stdio, so that an agent can ask
tracepipe about a dataset (docs/guides/mcp.md).

Each tool answers with the code its command runs (`Answers`, which imports no MCP SDK): the trace
list (`pipeline.dataset.listing`), the declared schemas (`pipeline.schema`), a section or the
findings of one trace as `tracepipe analyze -f json` prints them (`pipeline.report`), two runs as
`tracepipe compare -f json` does (`pipeline.compare.report.compare_in`), whole runs as `tracepipe
ranks -f json` does (`pipeline.runs.report.measured_runs`). SQL runs in the sandbox
(`pipeline.dataset.sandbox`): a client is untrusted, so it reads the dataset's tables and nothing
else, within a time limit, and at most so many rows come back.

Every answer is JSON text of at most `max_chars` characters: a longer one has its longest lists cut
and says so under "cut". A failure is a tool error of one line (the message the command would
print), never a traceback; the server goes on serving. The MCP SDK (the `mcp` extra) and the
analyses are imported when first needed, so that the server answers `initialize` quickly.
"""

import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.errors import TracepipeError, UsageError

__all__ = ["Answers", "Settings", "serve", "bounded"]

MAX_ROWS_CAP = 10_000  # a query's max_rows may not exceed this
MAX_CELL = 2_000  # characters of one text cell of a query's rows (args_json can be long)
LIST_LIMIT = 100  # traces list_traces returns unless asked for more


@dataclass(frozen=True)
class Settings:
    """The server's bounds: query seconds, rows and engine memory (MB) and threads, and the
    characters of any answer."""

    seconds: float = 30.0
    max_rows: int = 100
    memory_mb: int = 2048
    threads: int = 2
    max_chars: int = 100_000


def source_kind(path: Path) -> str | None:
    """'dataset', 'flat' or 'flats' for what `tracepipe mcp` serves, else None (a folder of trace
    files is flattened by the commands that read it: batch it first)."""
    from pipeline.files import is_flat_dir

    if not path.is_dir():
        return None
    if is_flat_dir(path):
        return "flat"
    if (path / "traces").is_dir() or (path / "trace").is_dir():
        return "dataset"
    if any(is_flat_dir(d) for d in path.iterdir() if d.is_dir()):
        return "flats"
    return None


class Answers:
    """The tools' answers over one dataset, each a JSON-ready value or the JSON text its command prints."""

    def __init__(self, path: str | Path, settings: Settings = Settings()):
        self.path = Path(path)
        self.settings = settings
        self._sandbox: Any = None
        self._sandbox_key: Any = None
        self._making = threading.Lock()

    # ---------------------------------------------------------------- list_traces
    def list_traces(
        self,
        name: str | None = None,
        run: str | None = None,
        rank: int | None = None,
        device: str | None = None,
        limit: int = LIST_LIMIT,
    ) -> dict:
        from pipeline.dataset.listing import not_read, trace_list
        from pipeline.render.tables import records

        if limit < 1:
            raise UsageError("limit must be at least 1")
        rows = trace_list(self.path, name, run, rank, device)
        shown = records(rows.head(limit))
        for r in shown:
            r["problems"] = json.loads(r.pop("problems_json") or "{}")
        out: dict = {"traces": shown, "count": rows.height}
        if rows.height > limit:
            out["truncated"] = (
                f"the first {limit} of {rows.height} traces: filter (name, run, rank, device) or raise limit"
            )
        missing = not_read(self.path)
        if missing.height:
            out["not_read"] = records(missing)
        return out

    # ---------------------------------------------------------------- schema
    def schema(self, table: str | None = None) -> dict:
        from pipeline import schema
        from pipeline.dataset.sandbox import DUCK_TYPES

        names = list(schema.DOCUMENTED)
        if table:
            if table not in names:
                raise UsageError(f"no table {table!r}; tables: {', '.join(names)}")
            names = [table]
        tables = []
        for n in names:
            t = schema.table(n)
            cols = [
                {"name": c.name, "type": DUCK_TYPES[c.type], "unit": c.unit or None, "meaning": c.meaning}
                for c in t.columns
            ]
            if not any(c["name"] == "trace_id" for c in cols):
                cols.append({"name": "trace_id", "type": "VARCHAR", "unit": None, "meaning": "the trace's id"})
            tables.append({"name": t.name, "description": t.description, "columns": cols})
        return {
            "sql": "DuckDB SQL, read-only: one SELECT (or WITH ... SELECT) over these tables; join on trace_id",
            "tables": tables,
        }

    # ---------------------------------------------------------------- query
    def sandbox(self):
        """The sandbox, made on the first query and again when the dataset's manifest changed."""
        from pipeline.dataset.sandbox import Limits, Sandbox

        key = _manifest_key(self.path)
        with self._making:  # two first queries at once make one sandbox
            if self._sandbox is None or key != self._sandbox_key:
                s = self.settings
                limits = Limits(s.seconds, s.max_rows, s.memory_mb, s.threads)
                self._sandbox, self._sandbox_key = Sandbox(self.path, limits), key
            return self._sandbox

    def query(self, sql: str, max_rows: int | None = None) -> dict:
        from pipeline.dataset.query import as_text

        n = self.settings.max_rows if max_rows is None else max_rows
        if not 1 <= n <= MAX_ROWS_CAP:
            raise UsageError(f"max_rows must be between 1 and {MAX_ROWS_CAP:,}")
        df, more = self.sandbox().run(sql, n)
        rows = json.loads(as_text(df, "json"))
        cells = 0
        for r in rows:
            for k, v in r.items():
                if isinstance(v, str) and len(v) > MAX_CELL:
                    r[k], cells = v[:MAX_CELL] + f"…[{len(v) - MAX_CELL:,} more characters]", cells + 1
        out: dict = {"rows": rows, "row_count": len(rows), "truncated": more}
        out["columns"] = [{"name": c, "type": str(t)} for c, t in df.schema.items()]
        notes = []
        if more:
            notes.append(f"the first {len(rows)} rows only: the result has more (aggregate, filter, or LIMIT/OFFSET)")
        if cells:
            notes.append(f"{cells} long text cells cut to {MAX_CELL:,} characters (select a substring to read more)")
        if notes:
            out["note"] = "; ".join(notes)
        return out

    # ---------------------------------------------------------------- analyze, findings
    def sections(self) -> dict:
        from pipeline.analyses.registry import REGISTRY

        return {"sections": [{"name": s.name, "title": s.title, "help": s.help} for s in REGISTRY]}

    def analyze(self, trace: str | None, section: str, top: int | None = None) -> str:
        """What `tracepipe analyze PATH -t TRACE --section SECTION -f json [--top N]` prints."""
        from pipeline import report as rp

        if top is not None and top < 1:
            raise UsageError("top must be at least 1")
        rp.check_options("json", [section])
        with rp.opened(self.path, trace=trace) as f:
            sections = rp.analyze(f, only=[section], options=rp.Options())
            return rp.format_analysis(f, sections, "json", top=top, only=[section])

    def findings(self, trace: str | None = None, run: str | None = None) -> Any:
        """The findings of a trace, as `analyze -t TRACE --section findings -f json` gives them, or
        of a run across its ranks, as `ranks --run RUN -f json` gives them (its runs' `findings`)."""
        if (trace is None) == (run is None):
            raise UsageError("give one of trace (a trace_id from list_traces) or run (a run's name from list_traces)")
        if trace is not None:
            return self.analyze(trace, "findings")
        (r,) = json.loads(self.ranks(run))["runs"]
        return {"run": r["run"], "findings": r["findings"]}

    # ---------------------------------------------------------------- compare, ranks
    def compare(self, base: str | None = None, new: str | None = None, level: list[str] | None = None) -> str:
        """What `tracepipe compare PATH --base BASE --new NEW [--level L]... -f json` prints."""
        from pipeline.compare import document
        from pipeline.compare.report import compare_in
        from pipeline.compare.samples import LEVELS

        levels = tuple(dict.fromkeys(level or LEVELS))
        unknown = [lv for lv in levels if lv not in LEVELS]
        if unknown:
            raise UsageError(f"level {unknown[0]}: levels are {', '.join(LEVELS)}")
        c, _problems, _said = compare_in(self.path, None, base, new, levels, source=self.path)
        return document.format_comparison(c, "json")

    def ranks(self, run: str | None = None) -> str:
        """What `tracepipe ranks PATH [--run RUN] -f json` prints."""
        from pipeline.runs import report as rr

        res = rr.measured_runs(self.path, run=run)
        doc = rr.format_runs(res, "json")
        return doc if isinstance(doc, str) else b"".join(doc).decode()


def _manifest_key(path: Path) -> tuple:
    """What changes when a batch commits into the dataset (its manifest files), or () for a folder."""
    d = path / "traces"
    if not d.is_dir():
        return ()
    return tuple(sorted((p.name, p.stat().st_mtime_ns) for p in d.iterdir()))


# ---------------------------------------------------------------- bounded answers
def bounded(answer: Any, max_chars: int) -> str:
    """`answer` (a JSON-ready value, or JSON text) as JSON text of at most `max_chars` characters:
    when longer, its longest lists are shortened (their last items go) until it fits, and "cut"
    (first) says which lists were cut and from how many items."""
    text = answer if isinstance(answer, str) else json.dumps(answer, ensure_ascii=False, default=str)
    if len(text) <= max_chars:
        return text
    doc = json.loads(text)  # a copy: the answer itself stays whole
    if not isinstance(doc, dict):
        doc = {"answer": doc}
    totals: dict[str, int] = {}
    size = lambda v: len(json.dumps(v, ensure_ascii=False, default=str))
    for _ in range(100):
        lists = list(_lists(doc, "$"))
        if not lists:
            break
        where, items = max(lists, key=lambda x: size(x[1]))
        totals.setdefault(where, len(items))
        excess, own = len(text) - max_chars + 300 + 60 * len(totals), size(items)
        keep = int(len(items) * (own - excess) / own) if own > excess else 0
        keep = max(keep, len(items) // 2) if len(lists) > 1 else keep  # the others give their share too
        del items[max(0, min(keep, len(items) - 1)) :]
        note = {
            "note": f"this answer was longer than {max_chars:,} characters: lists were cut to fit; ask for less "
            "(a section, top, a filter, or an aggregating query)",
            "lists": {w: f"{_count(doc, w)} of {n}" for w, n in totals.items()},
        }
        text = json.dumps({"cut": note, **doc}, ensure_ascii=False, default=str)
        if len(text) <= max_chars:
            return text
    raise UsageError(f"the answer is longer than {max_chars:,} characters even cut: ask for less")


def _lists(node: Any, where: str):
    """(path, list) of every non-empty list in a JSON value."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _lists(v, f"{where}.{k}")
    elif isinstance(node, list):
        if node:
            yield where, node
        for i, v in enumerate(node[:50]):
            yield from _lists(v, f"{where}[{i}]")


def _count(doc: Any, where: str) -> int:
    for w, items in _lists(doc, "$"):
        if w == where:
            return len(items)
    return 0


# ---------------------------------------------------------------- the server
INSTRUCTIONS = """tracepipe answers questions about PyTorch profiler traces held in one dataset.
Start with list_traces (the trace ids, runs, ranks, devices and problems), then ask analyze for a
section of one trace (no section: the list of sections), findings for what to fix, compare for
what changed between two runs, ranks for a run's ranks together, and query for anything else
(read-only DuckDB SQL; schema lists the tables and columns). Times are nanoseconds in tables
(_ns) and microseconds in reports (_us). Every answer is JSON."""

TOOL_DOCS = {
    "list_traces": (
        "List the traces of the dataset: trace_id (pass it as `trace` to analyze and findings), stem "
        "(the file name), run (the folder holding the trace: what compare and ranks call a run), rank, "
        "world_size, devices (name as the trace gives it [the device spec matched]), source_bytes, "
        "n_events, n_gpu_ops, n_kernels, layout, truncated, and problems (what flattening counted, "
        "by reason: unlinked:*, unmodelled:*, dropped:*, coerced:*; link:* count links made). "
        "not_read lists inputs the batch could not read, with the reason. Filters: name (part of the "
        "id, stem or path), run (part of the run's name), rank, device (part of a device name, any case)."
    ),
    "schema": (
        "The tables query can read, each column with its DuckDB type, unit and meaning: events (every "
        "trace event), gpu_ops (kernels, copies, sets, linked to their launch and CPU op, with FLOPs, "
        "bytes, achieved % of peak), flows, devices, trace (one row per trace), collectives, steps, "
        "and traces (the dataset's manifest). Give table for one."
    ),
    "query": (
        "Run one read-only SQL query (DuckDB dialect) over the dataset's tables (see schema) and get "
        "its rows as JSON. Only SELECT / WITH ... SELECT (DESCRIBE and SUMMARIZE too) over the "
        "tables; no files, table functions (but range, generate_series, unnest), writes or settings. "
        "At most max_rows rows come back (default {max_rows}, at most {cap:,}); `truncated` says when "
        "the result had more. A query is stopped after {seconds:g} s. Aggregate in SQL instead of "
        "reading rows: e.g. SELECT name, count(*) AS n, sum(dur_ns)/1e3 AS us FROM gpu_ops WHERE "
        "kind = 'kernel' GROUP BY name ORDER BY us DESC LIMIT 20. Times are int64 ns; join on trace_id."
    ),
    "analyze": (
        "One report section of one trace, as `tracepipe analyze DATASET -t TRACE --section SECTION "
        "-f json` prints it: e.g. devices (busy and idle time), kernels (per device: time, FLOPs, "
        "achieved % of peak, roofline), categories, ops, launch, idle, queue, memory, communication, "
        "critical-path, findings. "
        "Call it with section empty to list every section with what it shows. trace: a trace_id (or "
        "a stem or part of the path naming one trace) from list_traces. top: only the N first rows "
        "of each table."
    ),
    "findings": (
        "What to fix: the findings of one trace (trace: its trace_id), each with its evidence, an "
        "estimated saving and a remedy, as `tracepipe analyze DATASET -t TRACE --section findings "
        "-f json` gives them; or of one run across its ranks (run: its whole name from list_traces), as "
        "`tracepipe ranks DATASET --run RUN -f json` gives them."
    ),
    "compare": (
        "Compare two runs (folders of traces, see list_traces' run) as `tracepipe compare DATASET "
        "--base BASE --new NEW -f json` does: for each level (kernel, op, category, collective, step, "
        "idle; `level` picks some) every name's time in both runs, delta_pct and a verdict "
        "(regressed, improved, same) from a test over the runs' ranks with the false discovery rate "
        "held at 1%. base and new: a run's whole name or its last folder name; left out: the latest "
        "run against the one before it."
    ),
    "ranks": (
        "The ranks of each run together, as `tracepipe ranks DATASET -f json` gives them: collectives "
        "matched across ranks, clocks aligned, waits, stragglers, bus bandwidth, and the run's "
        "problems (missing ranks, traces without device activity). run: only this run."
    ),
}


def one_line(e: BaseException) -> str:
    """An error as one line: a tracepipe error's own message, else its type and first line."""
    if isinstance(e, TracepipeError):
        text = str(e)
    elif isinstance(e, OSError):
        text = f"{getattr(e, 'filename', None) or 'I/O error'}: {os.strerror(e.errno) if e.errno else e}"
    else:
        text = f"internal error: {type(e).__name__}: {e}"
    return " ".join(text.split())[:1000] or type(e).__name__


def serve(path: str | Path, settings: Settings = Settings()) -> None:
    """Serve MCP over stdin/stdout until the client closes them."""
    from typing import Annotated

    import anyio.to_thread
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError
    from mcp.types import ToolAnnotations
    from pydantic import Field

    from pipeline.version import __version__

    answers = Answers(path, settings)
    server = MCPServer("tracepipe", version=__version__, instructions=INSTRUCTIONS, log_level="WARNING")
    read_only = ToolAnnotations(
        read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False
    )

    async def answer(call) -> str:
        try:
            return bounded(await anyio.to_thread.run_sync(call), settings.max_chars)
        except Exception as e:  # one line back to the client, the server goes on
            raise ToolError(one_line(e)) from None

    def tool(name: str):
        doc = TOOL_DOCS[name].format(max_rows=settings.max_rows, cap=MAX_ROWS_CAP, seconds=settings.seconds)
        return server.tool(name=name, description=doc, annotations=read_only, structured_output=False)

    @tool("list_traces")
    async def list_traces(
        name: Annotated[str | None, Field(description="part of the trace_id, stem or source path")] = None,
        run: Annotated[str | None, Field(description="part of the run's name")] = None,
        rank: Annotated[int | None, Field(description="the rank")] = None,
        device: Annotated[str | None, Field(description="part of a device's name, any case (e.g. H100)")] = None,
        limit: Annotated[int, Field(description="at most this many traces")] = LIST_LIMIT,
    ) -> str:
        return await answer(lambda: answers.list_traces(name, run, rank, device, limit))

    @tool("schema")
    async def schema(table: Annotated[str | None, Field(description="one table (default: all)")] = None) -> str:
        return await answer(lambda: answers.schema(table))

    @tool("query")
    async def query(
        sql: Annotated[str, Field(description="one SELECT over the dataset's tables")],
        max_rows: Annotated[int | None, Field(description=f"rows back (default {settings.max_rows})")] = None,
    ) -> str:
        return await answer(lambda: answers.query(sql, max_rows))

    @tool("analyze")
    async def analyze(
        trace: Annotated[str, Field(description="a trace_id from list_traces")] = "",
        section: Annotated[str, Field(description="a section name; empty: the list of sections")] = "",
        top: Annotated[int | None, Field(description="only the first N rows of each table")] = None,
    ) -> str:
        if not section:
            return await answer(answers.sections)
        return await answer(lambda: answers.analyze(trace or None, section, top))

    @tool("findings")
    async def findings(
        trace: Annotated[str | None, Field(description="a trace_id from list_traces")] = None,
        run: Annotated[str | None, Field(description="a run's name from list_traces (instead of trace)")] = None,
    ) -> str:
        return await answer(lambda: answers.findings(trace, run))

    @tool("compare")
    async def compare(
        base: Annotated[str | None, Field(description="the run compared against")] = None,
        new: Annotated[str | None, Field(description="the run looked at")] = None,
        level: Annotated[list[str] | None, Field(description="kernel, op, category, collective, step, idle")] = None,
    ) -> str:
        return await answer(lambda: answers.compare(base, new, level))

    @tool("ranks")
    async def ranks(run: Annotated[str | None, Field(description="only this run")] = None) -> str:
        return await answer(lambda: answers.ranks(run))

    server.run("stdio")
