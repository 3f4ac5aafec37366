"""query: SQL (polars `SQLContext`) over a batch dataset or one flattened trace directory.

Tables are registered by name as lazy scans (events, gpu_ops, flows, devices, trace, and the
manifest `traces` for a dataset), only those the query names, so polars reads only the columns
and partitions the query needs. Every table has a `trace_id` column to join on.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import polars as pl

from pipeline import schema, store
from pipeline.dataset.layout import KEY, MANIFEST
from pipeline.dataset.tables import tables
from pipeline.errors import UsageError
from pipeline.render.tables import render

FORMATS = ("table", "csv", "json", "md", "parquet", "xlsx")

# A "run" is the directory holding its traces (one file per rank), so ranks of one job group together.
_RUN = "REGEXP_REPLACE(t.source_path, '/[^/]*$', '')"
EXAMPLES: dict[str, tuple[str, str]] = {
    "top_kernels": (
        "the 20 kernels with the most GPU time, summed over every trace and rank",
        """
        SELECT name, COUNT(*) AS launches, COUNT(DISTINCT trace_id) AS traces,
               SUM(dur_ns) / 1e3 AS total_us, AVG(dur_ns) / 1e3 AS mean_us
        FROM gpu_ops WHERE kind = 'kernel'
        GROUP BY name ORDER BY total_us DESC LIMIT 20""",
    ),
    "slowest_rank_per_step": (
        "for each run and profiler step, the rank that took longest, and the fastest",
        f"""
        WITH steps AS (
            SELECT {_RUN} AS run, e.name AS step, t.rank, t.stem, e.trace_id, e.dur_ns
            FROM events e JOIN trace t ON e.trace_id = t.trace_id
            WHERE e.name LIKE 'ProfilerStep#%' AND lower(e.cat) IN ('user_annotation', 'operator')
                  AND e.dur_ns IS NOT NULL),
        worst AS (
            SELECT run, step, MAX(dur_ns) AS slowest_ns, MIN(dur_ns) AS fastest_ns, COUNT(DISTINCT trace_id) AS ranks
            FROM steps GROUP BY run, step)
        SELECT w.run, w.step, s.rank AS slowest_rank, s.stem AS slowest_trace, w.slowest_ns / 1e3 AS slowest_us,
               w.fastest_ns / 1e3 AS fastest_us, w.ranks
        FROM worst w JOIN steps s ON s.run = w.run AND s.step = w.step AND s.dur_ns = w.slowest_ns
        ORDER BY w.run, LENGTH(w.step), w.step""",
    ),
    "achieved_pct_by_device": (
        "time-weighted achieved % of peak FLOP/s and of peak bandwidth, by device type, over the kernels "
        "that have a model (modelled_*_pct: their share of kernel time; kernels without FLOPs, such as "
        "communication, are not averaged in as 0%)",
        """
        WITH k AS (
            SELECT COALESCE(spec_name, 'unknown') AS device_type, dur_ns,
                   CASE WHEN flops > 0 AND achieved_flops_pct <> CAST('NaN' AS DOUBLE)
                        THEN achieved_flops_pct END AS flops_pct,
                   CASE WHEN bytes > 0 AND achieved_bw_pct <> CAST('NaN' AS DOUBLE) THEN achieved_bw_pct END AS bw_pct
            FROM gpu_ops WHERE kind = 'kernel')
        SELECT device_type, COUNT(*) AS kernels, SUM(dur_ns) / 1e3 AS kernel_us,
               CAST(SUM(CASE WHEN flops_pct IS NOT NULL THEN dur_ns ELSE 0 END) AS DOUBLE) * 100 / SUM(dur_ns)
                   AS modelled_flops_pct,
               SUM(flops_pct * dur_ns) / SUM(CASE WHEN flops_pct IS NOT NULL THEN dur_ns END) AS achieved_flops_pct,
               CAST(SUM(CASE WHEN bw_pct IS NOT NULL THEN dur_ns ELSE 0 END) AS DOUBLE) * 100 / SUM(dur_ns)
                   AS modelled_bw_pct,
               SUM(bw_pct * dur_ns) / SUM(CASE WHEN bw_pct IS NOT NULL THEN dur_ns END) AS achieved_bw_pct
        FROM k GROUP BY device_type ORDER BY kernel_us DESC""",
    ),
    "stragglers": (
        "per run, how often each rank started a collective last and the others' wait it caused "
        "(raw clocks: `tracepipe ranks` aligns them first)",
        f"""
        WITH c AS (
            SELECT {_RUN} AS run, c.rank, c.kind, c.pg_ranks, c.seq, c.ts_ns
            FROM collectives c JOIN trace t ON c.trace_id = t.trace_id),
        k AS (
            SELECT run, pg_ranks, seq, MAX(ts_ns) AS last_ns, COUNT(*) AS ranks
            FROM c GROUP BY run, pg_ranks, seq HAVING COUNT(*) > 1),
        w AS (
            SELECT c.run, c.pg_ranks, c.seq, c.rank, k.last_ns - c.ts_ns AS wait_ns, k.ranks
            FROM c JOIN k ON c.run = k.run AND c.pg_ranks = k.pg_ranks AND c.seq = k.seq),
        caused AS (
            SELECT l.run, l.rank, COUNT(*) AS times_last, SUM(o.wait_ns) / 1e3 AS wait_caused_us
            FROM w l JOIN w o ON l.run = o.run AND l.pg_ranks = o.pg_ranks AND l.seq = o.seq
            WHERE l.wait_ns = 0 AND o.rank <> l.rank GROUP BY l.run, l.rank)
        SELECT run, rank, times_last, wait_caused_us FROM caused ORDER BY run, wait_caused_us DESC""",
    ),
    "collective_bandwidth": (
        "per run, collective kind and message size: count, median duration and the algorithm bandwidth of that median",
        f"""
        SELECT {_RUN} AS run, c.kind, c.bytes, COUNT(*) AS calls, COUNT(DISTINCT c.rank) AS ranks,
               MEDIAN(c.dur_ns) / 1e3 AS median_us, c.bytes / MEDIAN(c.dur_ns) AS algbw_gbps
        FROM collectives c JOIN trace t ON c.trace_id = t.trace_id
        WHERE c.bytes IS NOT NULL GROUP BY run, c.kind, c.bytes ORDER BY run, c.kind, c.bytes""",
    ),
    "exposed_comm_by_rank": (
        "per run and rank: step time, compute, communication and the communication "
        "no compute overlapped, summed over its profiler steps",
        f"""
        SELECT {_RUN} AS run, t.rank, COUNT(DISTINCT s.step) AS steps,
               SUM(s.step_end_ns - s.step_ts_ns) / 1e3 AS step_us, SUM(s.compute_ns) / 1e3 AS compute_us,
               SUM(s.comm_ns) / 1e3 AS comm_us, SUM(s.exposed_comm_ns) / 1e3 AS exposed_comm_us
        FROM steps s JOIN trace t ON s.trace_id = t.trace_id
        GROUP BY run, t.rank ORDER BY run, t.rank""",
    ),
    "time_by_category": (
        "GPU time by kernel category (gemm, attention, triton_*, communication, ...) for each "
        "run (all its ranks), with its share of the run's GPU time",
        f"""
        WITH c AS (
            SELECT {_RUN} AS run, g.category, COUNT(DISTINCT g.trace_id) AS traces, COUNT(*) AS ops,
                   SUM(g.dur_ns) / 1e3 AS total_us
            FROM gpu_ops g JOIN trace t ON g.trace_id = t.trace_id
            GROUP BY run, g.category)
        SELECT run, category, traces, ops, total_us,
               100.0 * total_us / SUM(total_us) OVER (PARTITION BY run) AS pct
        FROM c ORDER BY run, total_us DESC""",
    ),
}


# polars SQL's table functions read any file or URL the user can reach
_TABLE_FUNCTION = re.compile(r"\bread_\w+\s*\(", re.I)
_LITERALS_AND_COMMENTS = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|--[^\n]*|/\*.*?\*/", re.S)


def check_sandboxed(sql: str):
    """Raise UsageError when the SQL calls a table function (read_csv, read_parquet, ...): in the
    sandbox a query sees only the dataset's tables."""
    m = _TABLE_FUNCTION.search(_LITERALS_AND_COMMENTS.sub(" ", sql))
    if m:
        name = m.group().rstrip("( \t\n").lower()
        raise UsageError(
            f"{name}() reads files outside the dataset: not allowed in the sandbox "
            "(only the dataset's tables; --no-sandbox allows it)"
        )


READS = ("select", "with", "show", "explain", "values")  # the statements `run` runs: they read


def check_read_only(sql: str) -> str:
    """The query's first keyword, lower case; UsageError when it is no read (DROP TABLE, CREATE,
    INSERT, ... only changed the query's own view of the tables, and said nothing)."""
    m = re.search(r"[A-Za-z_]+", _LITERALS_AND_COMMENTS.sub(" ", sql))
    if m is None:
        raise UsageError("no SQL given")
    word = m.group().lower()
    if word not in READS:
        raise UsageError(
            f"{word.upper()} is not run: a query reads the dataset, never changes it "
            "(SELECT, WITH ... SELECT, SHOW TABLES, EXPLAIN SELECT)"
        )
    return word


def run(path: str | Path, sql: str, sandbox: bool = False, trace: str | None = None) -> pl.DataFrame:
    """Run one SQL query over the tables of `path` (`trace`: only the rows of the trace it names,
    by trace_id, stem or part of its path); raise UsageError on a bad query or one that does not
    read. With `sandbox` the query may read only the dataset's tables (no
    read_csv('/any/file'), no URLs)."""
    if sandbox:
        check_sandboxed(sql)
    first = check_read_only(sql)
    words = {w.lower() for w in re.findall(r"\w+", sql)}
    found = tables(path, None if first == "show" else words)  # SHOW TABLES lists them all
    if trace is not None:
        from pipeline.dataset.pick import choose

        tid = choose(Path(path), trace)
        found = {n: lf.filter(pl.col(KEY) == tid) for n, lf in found.items()}
    ctx = pl.SQLContext(found, eager=False)
    try:
        return ctx.execute(sql).collect()
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UsageError(f"query failed: {first}{_suggestion(first, [*schema.TABLES, MANIFEST])}") from None


def _suggestion(error: str, tables: list[str]) -> str:
    """' (did you mean ...?)' for the unknown column or table a polars SQL error names, else ''."""
    import json

    from pipeline.errors import did_you_mean

    if m := re.search(r'unable to find column "([^"]+)"; valid columns: (\[.*\])', error):
        try:
            return did_you_mean(m.group(1), json.loads(m.group(2)))
        except ValueError:
            return ""
    if m := re.search(r"relation '([^']+)' was not found", error):
        return did_you_mean(m.group(1), tables) or f" (tables: {', '.join(tables)})"
    return ""


def example(name: str) -> str:
    if name not in EXAMPLES:
        raise UsageError(f"no example {name!r}; examples: {', '.join(EXAMPLES)}")
    return EXAMPLES[name][1]


def check_format(fmt: str, out: str | Path | None = None):
    if fmt not in FORMATS:
        raise UsageError(f"--format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    if fmt in ("parquet", "xlsx") and out is None:
        raise UsageError(f"--format {fmt} writes a file: give -o FILE")


def write(df: pl.DataFrame, fmt: str, out: str | Path | None = None, width: int | None = None):
    """Write a result as a table (fitted to `width`), Markdown, CSV, JSON (a list of row objects)
    or Parquet (needs `out`); a file appears complete or not at all."""
    check_format(fmt, out)
    if out is None:
        sys.stdout.write(as_text(df, fmt, width))
        return
    with store.output_of(out), store.atomic_file(Path(out)) as tmp:
        if fmt == "parquet":
            df.write_parquet(tmp)
        elif fmt == "xlsx":
            from pipeline.render.workbook import write_workbook

            write_workbook(tmp, {"result": df}, {"rows": df.height})
        else:
            tmp.write_text(as_text(df, fmt, width))


def as_text(df: pl.DataFrame, fmt: str, width: int | None = None) -> str:
    """A result as `tracepipe query` prints it: json a list of row objects, else a table, md or csv."""
    if fmt == "json":
        return df.write_json() + "\n"
    return render(df, fmt, width=width)
