"""from_tables: the Extracts of a batch dataset's (or a folder of flattened traces') runs, from
its `trace`, `collectives` and `steps` tables (and the manifest's quarantined inputs), so that a
dataset is measured by the same code as a run folder (`runs.analysis`).

The tables are read as streams of batches (a trace's rows are contiguous: parts hold whole
traces); a trace's Extract is kept in memory, or, past a size, in a file of a temporary folder
read a slice at a time, so that memory does not follow the dataset's size.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import polars as pl

from pipeline.dataset.tables import tables
from pipeline.findings.vendor import by_layout, by_names
from pipeline.runs.calls import CALL_COLUMNS, KIND_CODE, UNKNOWN, Extract, calls_of_rows, pg_keys, steps_of_rows
from pipeline.runs.scan import cache

IN_MEMORY_CALLS = 200_000  # a trace's Extract of more calls goes to a file
ROWS_BY_ROW = 2_000  # a trace of at most these many calls is coded row by row
BATCH_ROWS = 1 << 18
CALLS = [
    "trace_id",
    "pg_name",
    "pg_ranks",
    "pg_desc",
    "seq",
    "kind",
    "bytes",
    "dtype",
    "pg_size",
    "ts_ns",
    "dur_ns",
    "step",
]
STEPS = [
    "trace_id",
    "step",
    "step_ts_ns",
    "step_end_ns",
    "device",
    "kernel_ns",
    "compute_ns",
    "comm_ns",
    "exposed_comm_ns",
]
TRACE = [
    "trace_id",
    "source_path",
    "stem",
    "rank",
    "rank_from",
    "world_size",
    "backend",
    "trace_name",
    "base_time_ns",
    "source_bytes",
    "truncated",
    "n_collectives",
    "layout",
]


def _per_trace(lf: pl.LazyFrame, columns: list[str]) -> Iterator[tuple[str, pl.DataFrame]]:
    """(trace_id, its rows), a trace at a time, reading the table in batches."""
    pending: list[pl.DataFrame] = []
    current: str = ""
    for batch in lf.select(columns).collect_batches(chunk_size=BATCH_ROWS):
        ids = batch["trace_id"]
        cuts = np.flatnonzero(np.r_[True, (ids[1:] != ids[:-1]).to_numpy()]) if batch.height else np.zeros(0, int)
        for k, a in enumerate(cuts):
            b = cuts[k + 1] if k + 1 < len(cuts) else batch.height
            tid = ids[int(a)]
            part = batch.slice(int(a), int(b - a))
            if tid != current:
                if pending:
                    yield current, pl.concat(pending)
                pending, current = [], tid
            pending.append(part)
    if pending:
        yield current, pl.concat(pending)


def extracts_of_tables(path: str | Path, scratch: Path, trace_ids: set[str] | None = None) -> list:
    """Every trace of a dataset (or folder of flattened traces) as an Extract (only those of
    `trace_ids` when given); inputs the manifest quarantined as Extracts of status `quarantined`."""
    t = tables(path, {"trace", "collectives", "steps", "traces", "devices"})
    if trace_ids is not None:  # a predicate the Parquet reader applies row group by row group
        wanted = pl.Series(sorted(trace_ids), dtype=pl.String).implode()
        t = {n: lf.filter(pl.col("trace_id").is_in(wanted)) if n != "traces" else lf for n, lf in t.items()}
    device_names = _device_names(t.get("devices"))
    have = t["trace"].collect_schema().names()
    rows = t["trace"].select([c for c in TRACE if c in have]).collect()
    reasons: dict[str, str] = {}
    out_quarantined = []
    if "traces" in t:
        m = t["traces"].select("trace_id", "path", "status", "error").collect()
        for r in m.iter_rows(named=True):
            if r["status"] == "quarantined":
                out_quarantined.append(
                    Extract.empty(
                        {"source": r["path"], "stem": _stem(r["path"]), "status": "quarantined", "reason": r["error"]}
                    )
                )
            elif r["status"] == "truncated":
                reasons[r["trace_id"]] = r["error"]
    infos: dict[str, dict] = {}
    for r in rows.iter_rows(named=True):
        infos[r["trace_id"]] = {
            "source": r.get("source_path"),
            "stem": r.get("stem"),
            "size": r.get("source_bytes"),
            "status": "truncated" if r.get("truncated") else "ok",
            "reason": reasons.get(r["trace_id"], "the file ends before its events do") if r.get("truncated") else None,
            "rank": r.get("rank"),
            "rank_from": r.get("rank_from"),
            "world_size": r.get("world_size"),
            "backend": r.get("backend"),
            "trace_name": r.get("trace_name"),
            "base_time_ns": r.get("base_time_ns"),
            "n_collectives": r.get("n_collectives") or 0,
            "vendor": by_layout(r.get("layout")) or by_names(device_names.get(r["trace_id"], [])),
            "problems": {},
        }
    step_rows = _steps(t["steps"]) if "steps" in t else {}
    out = {}
    for tid, df in _per_trace(t["collectives"], CALLS):
        if tid in infos:
            out[tid] = _extract(infos[tid], df, step_rows.pop(tid, []), scratch)
    for tid, info in infos.items():
        if tid not in out:
            out[tid] = _extract(
                info, pl.DataFrame(schema={c: pl.String for c in CALLS}), step_rows.pop(tid, []), scratch
            )
    return [out[tid] for tid in infos] + out_quarantined


def _device_names(lf: pl.LazyFrame | None) -> dict[str, list[str]]:
    """trace_id -> its devices' names and the specs matched to them (what tells their vendor)."""
    if lf is None:
        return {}
    cols = [c for c in ("trace_id", "name", "spec_name") if c in lf.collect_schema().names()]
    if "trace_id" not in cols or len(cols) < 2:
        return {}
    out: dict[str, list[str]] = {}
    for r in lf.select(cols).unique().collect().iter_rows(named=True):
        out.setdefault(r["trace_id"], []).extend(r[c] for c in cols[1:] if r[c])
    return out


def _stem(path: str | None) -> str:
    from pipeline.kineto import trace_stem

    return trace_stem(str(path or "?").rsplit("!", 1)[-1])


def _steps(lf: pl.LazyFrame) -> dict[str, list[tuple]]:
    out: dict[str, list[tuple]] = {}
    for tid, df in _per_trace(lf, STEPS):
        out[tid] = list(df.drop("trace_id").iter_rows())
    return out


def _extract(info: dict, df: pl.DataFrame, step_rows: list[tuple], scratch: Path):
    """One trace's Extract from its collectives rows (and steps rows). A trace of few calls is
    coded by the run folder's own code (`calls.calls_of_rows`, one pass over its rows: a dataset
    of many small traces pays no per-trace query overhead), a larger one by column."""
    if df.height <= ROWS_BY_ROW:
        rows = df.with_row_index("order").with_columns(pl.col("dur_ns").fill_null(0)).to_dicts()
        calls, pgs, dtypes, steps = calls_of_rows(rows)
        step_cols, names = steps_of_rows(step_rows, steps)
        return Extract(
            {**info, "pgs": pgs, "dtypes": dtypes, "steps": names, "n_collectives": df.height}, calls, step_cols
        )
    info = dict(info)
    pairs = df.select("pg_name", "pg_ranks").unique(maintain_order=True).rows() if df.height else []
    keys = pg_keys(pairs)
    order = sorted(range(len(keys)), key=lambda i: keys[i])
    local = {pairs[i]: n for n, i in enumerate(order)}
    dtypes = sorted(x for x in df["dtype"].unique().to_list() if x is not None) if df.height else []
    steps = sorted(x for x in df["step"].unique().to_list() if x is not None) if df.height else []
    pgs = []
    calls = {c: np.zeros(0, t) for c, t in CALL_COLUMNS.items()}
    if df.height:
        pg_index = pl.DataFrame(
            {"pg_name": [p[0] for p in local], "pg_ranks": [p[1] for p in local], "_pg": list(local.values())},
            schema={"pg_name": pl.String, "pg_ranks": pl.String, "_pg": pl.Int32},
        )
        df = df.join(pg_index, on=["pg_name", "pg_ranks"], how="left", nulls_equal=True).sort("_pg", "seq")
        counts = df.group_by("_pg").agg(n=pl.len(), desc=pl.col("pg_desc").drop_nulls().first()).sort("_pg")
        offset = 0
        for (_, n, desc), i in zip(counts.rows(), order):
            pgs.append(
                {"key": keys[i], "name": pairs[i][0], "ranks": pairs[i][1], "desc": desc, "offset": offset, "n": n}
            )
            offset += n
        code = lambda col, names: (
            df[col].replace_strict(names, list(range(len(names))), default=-1, return_dtype=pl.Int32).to_numpy()
        )
        calls = {
            "pg": df["_pg"].to_numpy().astype(np.int32),
            "seq": _local_seq(df),
            "kind": df["kind"].replace_strict(KIND_CODE, default=UNKNOWN, return_dtype=pl.Int8).to_numpy(),
            "bytes": df["bytes"].fill_null(-1).to_numpy().astype(np.int64),
            "dtype": code("dtype", dtypes),
            "pg_size": df["pg_size"].fill_null(-1).to_numpy().astype(np.int64),
            "ts": df["ts_ns"].to_numpy().astype(np.int64),
            "dur": df["dur_ns"].fill_null(0).to_numpy().astype(np.int64),
            "step": code("step", steps),
        }
    step_cols, names = steps_of_rows(step_rows, steps)
    info.update(pgs=pgs, dtypes=dtypes, steps=names, n_collectives=df.height)
    ex = Extract(info, calls, step_cols)
    if df.height < IN_MEMORY_CALLS:
        return ex
    path = scratch / f"{len(list(scratch.iterdir()))}.rank"
    cache.write(path, ex)
    return cache.read(path)


def _local_seq(df: pl.DataFrame) -> np.ndarray:
    """seq within each group, 0.. in the table's order (a group's seqs as the table numbers them)."""
    return df.select(s=pl.int_range(pl.len(), dtype=pl.Int64).over("_pg"))["s"].to_numpy()
