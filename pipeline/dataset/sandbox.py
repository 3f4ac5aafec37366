"""sandbox: SQL from someone untrusted (an MCP client) over a dataset's tables, and nothing else.

The SQL runs in DuckDB, in memory, on a connection that can read the dataset's own Parquet files
and no other file, and whose settings are locked before the first query is seen:

* the tables are views over exactly the files `tables` reads (the manifest's parts, or each
  flattened trace's files), declared columns cast to their declared types; the manifest is a
  table copied into memory;
* `allowed_paths` names those files, `enable_external_access=false` refuses every other file,
  URL, extension install or load, ATTACH and COPY; `lock_configuration` keeps a query from
  undoing it; no temp directory (nothing spills to disk), a memory limit and a thread count;
* a second wall, at parse level: one statement, a SELECT (WITH, FROM-first, DESCRIBE and SUMMARIZE
  are SELECTs), whose tables are the dataset's or its own CTEs, and whose table functions are
  only `range`, `generate_series` and `unnest` (`check`);
* each query runs on its own cursor, interrupted at its time limit from a timer thread, and at
  most `max_rows` rows come back (it says when it cut).

`tracepipe query` runs SQL typed by the user with polars (`pipeline.dataset.query`); its rows for
the same SELECT are the same (tests/test_mcp.py holds both to it).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline import schema
from pipeline.errors import UsageError

__all__ = ["Limits", "Sandbox", "check"]

DUCK_TYPES = {  # schema types (pipeline.schema.ARROW_TYPES) as DuckDB names them
    "int64": "BIGINT",
    "float64": "DOUBLE",
    "string": "VARCHAR",
    "dict": "VARCHAR",
    "bool": "BOOLEAN",
    "timestamp": "TIMESTAMPTZ",
}
SAFE_TABLE_FUNCTIONS = frozenset({"range", "generate_series", "unnest"})  # read no file, write nothing
KEY = "trace_id"


class Refused(UsageError):
    """A statement the sandbox does not run (not a SELECT, a file, a table that is not the dataset's)."""


@dataclass(frozen=True)
class Limits:
    """What one query may use: seconds before it is interrupted, rows returned, the engine's
    memory (MB, over every query at once) and threads."""

    seconds: float = 30.0
    max_rows: int = 100
    memory_mb: int = 2048
    threads: int = 2


def _q(text: str) -> str:
    """A SQL string literal."""
    return "'" + text.replace("'", "''") + "'"


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _files(paths: list[str]) -> str:
    return "[" + ", ".join(_q(p) for p in paths) + "]"


def _columns(name: str) -> list[tuple[str, str]]:
    """(column, DuckDB type) of a table as `tables` gives it: declared columns, trace_id last."""
    cols = [(c.name, DUCK_TYPES[c.type]) for c in schema.table(name).columns if c.name != KEY]
    return [*cols, (KEY, "VARCHAR")]


def _select(conn, name: str, source: str, trace_id: str | None = None) -> str:
    """SELECT of a table's declared columns from `source` (a read_parquet call): each present column
    cast to its type, a missing one NULL (as polars' missing_columns="insert"), extra ones left out."""
    present = {r[0] for r in conn.execute(f"DESCRIBE SELECT * FROM {source}").fetchall()}
    exprs = []
    for col, kind in _columns(name):
        if col == KEY and trace_id is not None:
            exprs.append(f"CAST({_q(trace_id)} AS VARCHAR) AS {KEY}")
        elif col in present:
            exprs.append(f"CAST({_ident(col)} AS {kind}) AS {_ident(col)}")
        else:
            exprs.append(f"CAST(NULL AS {kind}) AS {_ident(col)}")
    return f"SELECT {', '.join(exprs)} FROM {source}"


def _empty(name: str) -> str:
    return "SELECT " + ", ".join(f"CAST(NULL AS {k}) AS {_ident(c)}" for c, k in _columns(name)) + " WHERE false"


class Sandbox:
    """A locked DuckDB connection over the tables of a batch dataset, a flattened trace or a folder
    of flattened traces; `run` runs one checked SELECT within `limits`."""

    def __init__(self, path: str | Path, limits: Limits = Limits()):
        import duckdb

        from pipeline import store
        from pipeline.dataset.layout import MANIFEST_FILE, manifest
        from pipeline.dataset.tables import dataset_files, flat_dirs, flat_trace_id, is_dataset

        self.path, self.limits = Path(path).resolve(), limits
        root = self.path
        conn = duckdb.connect(
            ":memory:",
            config={
                "threads": max(1, limits.threads),
                "memory_limit": f"{max(64, limits.memory_mb)}MB",
                "autoinstall_known_extensions": False,
                "autoload_known_extensions": False,
                "python_enable_replacements": False,  # no Python variable is a table
            },
        )
        allowed: list[str] = []

        def inside(files: list[str]) -> list[str]:
            """Only files under the dataset (a manifest naming `../x` reads nothing outside it)."""
            kept = [str(Path(f).resolve()) for f in files]
            kept = [f for f in kept if Path(f).is_relative_to(root)]
            allowed.extend(kept)
            return kept

        views: dict[str, str] = {}
        if store.is_flat_dir(root) or (not is_dataset(root) and flat_dirs(root)):
            dirs = [root] if store.is_flat_dir(root) else flat_dirs(root)
            ids = {d: flat_trace_id(d) for d in dirs}
            for name in schema.TABLES:
                parts = []
                for d in dirs:
                    f = inside([str(d / f"{name}.parquet")])
                    if f and Path(f[0]).is_file():
                        parts.append(
                            _select(conn, name, f"read_parquet({_files(f)})", ids[d] if name != "trace" else None)
                        )
                views[name] = " UNION ALL ".join(parts) if parts else _empty(name)
        elif is_dataset(root):
            rows = manifest(root)
            for name in schema.TABLES:
                new, old = dataset_files(root, name, rows)
                new, old = inside(new), inside(old)
                parts = []
                if new:
                    parts.append(_select(conn, name, f"read_parquet({_files(new)}, union_by_name=true)"))
                if old:
                    hive = f"hive_partitioning=true, hive_types={{'{KEY}': VARCHAR}}"
                    src = f"read_parquet({_files(old)}, union_by_name=true, {hive})"
                    parts.append(_select(conn, name, src))
                views[name] = " UNION ALL ".join(parts) if parts else _empty(name)
            conn.register("_manifest", rows.drop(MANIFEST_FILE).to_arrow())
            conn.execute(f"CREATE TABLE {schema.MANIFEST} AS SELECT * FROM _manifest")
            conn.unregister("_manifest")
        else:
            raise UsageError(f"{path}: not a batch dataset, a flattened trace or a folder of flattened traces")
        for name, sql in views.items():
            conn.execute(f"CREATE VIEW {_ident(name)} AS {sql}")
        self.tables = (*views, *((schema.MANIFEST,) if is_dataset(root) else ()))
        # lock it down: only these files, no temp files, no way back
        conn.execute(f"SET allowed_paths = {_files(sorted(set(allowed)))}")
        conn.execute("SET temp_directory = ''")
        conn.execute("SET enable_external_access = false")
        conn.execute("SET lock_configuration = true")
        self.conn = conn
        self._lock = threading.Lock()

    def run(self, sql: str, max_rows: int | None = None):
        """The first `max_rows` rows of one SELECT as a polars DataFrame, and whether there were
        more. Refused (a UsageError) when `check` refuses it; stopped at the time limit."""
        import duckdb

        from pipeline import store

        n = self.limits.max_rows if max_rows is None else max_rows
        if n < 1:
            raise UsageError("max_rows must be at least 1")
        body = check(sql, self.tables)
        wrapped = f"SELECT * FROM (\n{body}\n) AS q LIMIT {int(n) + 1}"
        check(wrapped, self.tables)  # the wrapped text is what runs: it passes the same wall
        with self._lock:  # one query at a time: the memory limit is the engine's, not a query's
            cur = self.conn.cursor()
            timer = threading.Timer(self.limits.seconds, cur.interrupt)
            timer.start()
            try:
                rel = cur.sql(wrapped)
                fetch = getattr(rel, "to_arrow_table", None) or rel.fetch_arrow_table  # DuckDB 2 / 1
                df = store.frame_from_arrow(fetch())
            except duckdb.InterruptException:
                raise UsageError(
                    f"query stopped at its time limit of {self.limits.seconds:g} s: "
                    "narrow it (WHERE, a smaller join) or aggregate"
                ) from None
            except duckdb.Error as e:
                raise UsageError(f"query failed: {_first_line(e)}") from None
            finally:
                timer.cancel()
                cur.close()
        return _plain(df.head(n)), df.height > n


def _plain(df):
    """Numbers as polars' SQL gives them: DuckDB's sums of BIGINT (HUGEINT) as Int64 where they fit
    (else Float64), DECIMALs (a literal 1.5) as Float64, so that JSON writes them as numbers."""
    import polars as pl

    fixed = []
    for name, dtype in df.schema.items():
        integral = dtype in (pl.Int128, pl.UInt64) or (isinstance(dtype, pl.Decimal) and not dtype.scale)
        if integral:
            try:
                fixed.append(df[name].cast(pl.Int64, strict=True))
            except pl.exceptions.InvalidOperationError:
                fixed.append(df[name].cast(pl.Float64))
        elif isinstance(dtype, pl.Decimal):
            fixed.append(df[name].cast(pl.Float64))
    return df.with_columns(fixed) if fixed else df


def _first_line(e: BaseException) -> str:
    text = " ".join(str(e).strip().splitlines()[:1]) or type(e).__name__
    return text[:300]


def check(sql: str, tables) -> str:
    """`sql` (without a trailing semicolon) if it is one SELECT over `tables` (and its own CTEs),
    calling no table function but range, generate_series and unnest; Refused otherwise."""
    import duckdb

    text = sql.strip().rstrip(";").strip()
    if not text:
        raise Refused("no SQL given")
    try:
        statements = duckdb.extract_statements(text)
    except duckdb.Error as e:
        raise Refused(f"query failed: {_first_line(e)}") from None
    if len(statements) != 1:
        raise Refused(f"one statement at a time, not {len(statements)}")
    kind = str(statements[0].type).rsplit(".", 1)[-1]
    if kind != "SELECT":
        word = text.split(None, 1)[0].upper() if text.split(None, 1)[0].isalpha() else kind
        raise Refused(f"{word} is refused: read-only, one SELECT (or WITH ... SELECT) over the dataset's tables")
    tree = _tree(text)
    ctes = set(_ctes(tree))
    for node in _nodes(tree):
        t = node.get("type")
        if t == "TABLE_FUNCTION":
            fn = str((node.get("function") or {}).get("function_name", "?")).lower()
            if fn not in SAFE_TABLE_FUNCTIONS:
                raise Refused(f"table function {fn}() is refused: a query reads only the tables ({', '.join(tables)})")
        elif t == "BASE_TABLE":
            name = str(node.get("table_name", ""))
            where = [str(node.get(k) or "") for k in ("catalog_name", "schema_name")]
            if (
                where[0] not in ("", "memory")
                or where[1] not in ("", "main")
                or (name not in tables and name not in ctes)
            ):
                shown = ".".join(x for x in [*where, name] if x)
                raise Refused(f"no table {shown!r}: the tables are {', '.join(tables)}")
    return text


def _tree(text: str) -> dict:
    """The parsed statement as DuckDB serialises it (only a SELECT serialises)."""
    import duckdb

    con = duckdb.connect(":memory:", config={"enable_external_access": False})
    try:
        row = con.execute("SELECT json_serialize_sql(?::VARCHAR)", [text]).fetchall()[0][0]
    finally:
        con.close()
    tree = json.loads(row)
    if tree.get("error"):
        raise Refused(f"not a plain SELECT: {tree.get('error_message', 'unreadable')}")
    return tree


def _nodes(tree: Any):
    stack = [tree]
    while stack:
        n = stack.pop()
        if isinstance(n, dict):
            yield n
            stack.extend(n.values())
        elif isinstance(n, list):
            stack.extend(n)


def _ctes(tree: dict):
    for n in _nodes(tree):
        cte_map = n.get("cte_map")
        if isinstance(cte_map, dict):
            for entry in cte_map.get("map") or []:
                yield str(entry.get("key"))
