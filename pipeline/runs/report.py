"""report: a dataset's runs, measured (`ranks`), as polars frames and as the JSON document of
`tracepipe ranks --format json`.

Only the `trace`, `collectives` and `steps` tables are read, and of them only the columns used:
a run of 256 ranks with 10,000 collectives each is 2.6 M small rows, whatever the traces' sizes.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import orjson
import polars as pl

from pipeline.dataset.tables import tables
from pipeline.runs import clock, match, measures
from pipeline.runs.group import Runs, group_runs, is_trace_folder

__all__ = [
    "RunReport",
    "analyze_runs",
    "opened",
    "runs_json",
    "json_chunks",
    "only_run",
    "format_runs",
    "write_runs_workbook",
]

CALL_COLUMNS = [
    "trace_id",
    "kind",
    "pg_name",
    "pg_ranks",
    "pg_size",
    "seq",
    "bytes",
    "dtype",
    "ts_ns",
    "dur_ns",
    "step",
]
STEP_COLUMNS = ["trace_id", "step", "step_ts_ns", "step_end_ns", "device", "compute_ns", "comm_ns", "exposed_comm_ns"]
QUANTILES = (0.5, 0.99)


@dataclass(frozen=True)
class RunReport:
    """Every frame `ranks` shows; times in ns (the JSON and the tables turn them into µs)."""

    runs: pl.DataFrame  # run, world_size, traces, ranks, missing_ranks, no_rank, duplicate
    ranks: pl.DataFrame  # run, rank, trace, rank_from, offset_ns, collectives, wait_ns, wait_caused_ns, times_last
    collectives: pl.DataFrame  # per matched collective (measures.per_collective)
    waits: pl.DataFrame  # run, pg, seq, rank, wait_ns
    by_kind: pl.DataFrame  # run, kind, bytes: count, latency/algbw/busbw/skew quantiles
    stragglers: pl.DataFrame  # run, rank, wait_caused_ns, times_last
    steps: pl.DataFrame  # run, rank, step, step_ns, compute_ns, comm_ns, exposed_comm_ns, wait_ns
    desyncs: pl.DataFrame  # run, rank, pg, seq, kind, bytes, expected_kind, expected_bytes


def analyze_runs(path: str | Path, run_by: str | None = None, align: bool = True) -> RunReport:
    """The runs of a batch dataset or a folder of flattened traces (see `opened` for trace files)."""
    t = tables(path, {"trace", "collectives", "steps"})
    groups = group_runs(t["trace"], run_by)
    ids = groups.traces.select("run", "rank", "trace_id")
    repeated = [pl.col(c).cast(pl.Categorical) for c in ("kind", "pg_name", "pg_ranks", "dtype", "step")]
    small = [pl.col(c).cast(pl.Int32) for c in ("seq", "pg_size")]
    scanned = (
        t["collectives"]
        .select(CALL_COLUMNS)
        .with_columns(*repeated, *small)
        .join(ids.lazy(), on="trace_id")
        .drop("trace_id")
    )
    calls = match.with_pg(scanned).collect()
    bad = match.desyncs(calls)
    good = match.consistent(calls, bad)
    offsets = clock.clock_offsets(good, align)
    a = measures.aligned(good, offsets)
    colls = measures.per_collective(a)
    waits = measures.rank_waits(colls)
    strag = measures.stragglers(colls)
    steps = (
        t["steps"]
        .select(STEP_COLUMNS)
        .with_columns(pl.col("step").cast(pl.Categorical))
        .join(ids.lazy(), on="trace_id")
        .collect()
    )
    per_step = measures.per_step(steps, waits)
    return RunReport(
        groups.runs, _ranks(groups, calls, offsets, waits, strag), colls, waits, _by_kind(colls), strag, per_step, bad
    )


def _ranks(
    groups: Runs, calls: pl.DataFrame, offsets: pl.DataFrame, waits: pl.DataFrame, strag: pl.DataFrame
) -> pl.DataFrame:
    n = calls.group_by("run", "rank").agg(collectives=pl.len().cast(pl.Int64))
    w = waits.group_by("run", "rank").agg(wait_ns=pl.col("wait_ns").sum())
    return (
        groups.traces.select("run", "rank", trace="stem", rank_from="rank_from")
        .join(offsets, on=["run", "rank"], how="left")
        .join(n, on=["run", "rank"], how="left")
        .join(w, on=["run", "rank"], how="left")
        .join(strag, on=["run", "rank"], how="left")
        .with_columns(
            pl.col("collectives", "times_last").fill_null(0), pl.col("wait_ns", "wait_caused_ns").fill_null(0.0)
        )
        .sort("run", "rank")
    )


def _by_kind(colls: pl.DataFrame) -> pl.DataFrame:
    """Per run, kind and message size: count and the quantiles of latency, bandwidths and skew."""
    q = lambda col: [
        pl.col(col)
        .quantile(x, "nearest")
        .alias(
            f"{col.removesuffix('_ns').removesuffix('_gbps')}"
            f"_p{round(100 * x)}{'_ns' if col.endswith('_ns') else '_gbps'}"
        )
        for x in QUANTILES
    ]
    return (
        colls.group_by("run", "kind", "bytes")
        .agg(
            *q("latency_ns"),
            *q("algbw_gbps"),
            *q("busbw_gbps"),
            *q("start_skew_ns"),
            count=pl.len().cast(pl.Int64),
            n_ranks=pl.col("n_ranks").max(),
        )
        .sort("run", "kind", "bytes", nulls_last=True)
    )


@contextmanager
def opened(path: str | Path, jobs: int | None = None) -> Iterator[Path]:
    """A dataset for `path`: itself when it holds tables, else (a folder or archive of trace files)
    a temporary dataset batched from it, removed afterwards."""
    path = Path(path)
    if not is_trace_folder(path):
        yield path
        return
    from pipeline.dataset.batch import run_batch

    with tempfile.TemporaryDirectory(prefix="tracepipe-ranks-") as tmp:
        run_batch(path, Path(tmp) / "ds", jobs=jobs)
        yield Path(tmp) / "ds"


# ------------------------------------------------------------------ the JSON document
def _us(v) -> float | None:
    return None if v is None or (isinstance(v, float) and not math.isfinite(v)) else v / 1e3


def _num(v) -> float | None:
    return None if v is None or (isinstance(v, float) and not math.isfinite(v)) else v


def runs_json(rep: RunReport) -> dict:
    """{"runs": [{run, world_size, ranks, missing_ranks, clock_offset_us, collectives, stragglers,
    ...}]}: the contract of `tracepipe ranks --format json` (README, "Whole runs")."""
    return {"runs": [{**head, "collectives": list(colls)} for head, colls in _runs(rep)]}


def json_chunks(rep: RunReport) -> Iterator[bytes]:
    """`runs_json`, written a collective at a time: a run of 256 ranks x 10,000 collectives is a
    document of ~200 MB that is never whole in memory."""
    dump = lambda v: orjson.dumps(v, option=orjson.OPT_NON_STR_KEYS)
    yield b'{"runs": ['
    for i, (head, colls) in enumerate(_runs(rep)):
        yield (b", " if i else b"") + dump(head)[:-1] + b', "collectives": ['
        for j, c in enumerate(colls):
            yield (b",\n" if j else b"\n") + dump(c)
        yield b"]}"
    yield b"]}\n"


def _runs(rep: RunReport) -> Iterator[tuple[dict, Iterator[dict]]]:
    for r in rep.runs.iter_rows(named=True):
        run = r["run"]
        ranks = rep.ranks.filter(pl.col("run") == run)
        head = {
            "run": run,
            "world_size": r["world_size"],
            "ranks": list(r["ranks"] or []),
            "missing_ranks": list(r["missing_ranks"] or []),
            "traces_without_rank": list(r["no_rank"] or []),
            "duplicate_rank_traces": list(r["duplicate"] or []),
            "clock_offset_us": {str(k): _us(v) for k, v in ranks.select("rank", "offset_ns").iter_rows()},
            "stragglers": [
                {"rank": s["rank"], "wait_caused_us": _us(s["wait_caused_ns"]), "times_last": s["times_last"]}
                for s in rep.stragglers.filter(pl.col("run") == run).iter_rows(named=True)
            ],
            "ranks_detail": [_row(x, ("run",)) for x in ranks.iter_rows(named=True)],
            "by_kind": [_row(x, ("run",)) for x in rep.by_kind.filter(pl.col("run") == run).iter_rows(named=True)],
            "steps": [
                _row(x, ("run", "step_ts_ns", "step_end_ns"))
                for x in rep.steps.filter(pl.col("run") == run).iter_rows(named=True)
            ],
            "desyncs": [_row(x, ("run",)) for x in rep.desyncs.filter(pl.col("run") == run).iter_rows(named=True)],
        }
        colls = rep.collectives.filter(pl.col("run") == run)
        yield head, (_collective(c) for c in colls.iter_rows(named=True))


def _collective(c: dict) -> dict:
    return {
        "pg": c["pg"],
        "seq": c["seq"],
        "name": c["kind"],
        "step": c["step"],
        "bytes": c["bytes"],
        "dtype": c["dtype"],
        "n_ranks": c["n_ranks"],
        "ranks_present": c["present"],
        "last_rank": c["last_rank"],
        "start_skew_us": _us(c["start_skew_ns"]),
        "latency_us": _us(c["latency_ns"]),
        "algbw_gbps": _num(c["algbw_gbps"]),
        "busbw_gbps": _num(c["busbw_gbps"]),
        "wait_us": {str(k): _us(w) for k, w in zip(c["ranks"], c["waits_ns"])},
    }


def _row(x: dict, drop: tuple[str, ...]) -> dict:
    """A frame row for JSON: ns columns as µs (`*_us`), NaN as null."""
    out = {}
    for k, v in x.items():
        if k in drop:
            continue
        if k.endswith("_ns"):
            out[k[:-3] + "_us"] = _us(v)
        else:
            out[k] = _num(v) if isinstance(v, float) else v
    return out


def only_run(rep: RunReport, run: str) -> RunReport:
    """The report of one run (UsageError naming the runs when there is no such run)."""
    from pipeline.errors import UsageError

    names = rep.runs["run"].to_list()
    if run not in names:
        raise UsageError(f"no run {run!r}; runs: {', '.join(map(str, names)) or 'none'}")
    keep = lambda df: df.filter(pl.col("run") == run)
    return RunReport(*(keep(getattr(rep, f)) for f in RunReport.__dataclass_fields__))


def format_runs(
    rep: RunReport, fmt: str, width: int | None = None, top: int | None = 20, columns: list[str] | None = None
) -> str | Iterator[bytes]:
    """`tracepipe ranks` output: the JSON document, the sections as tables (text fitted to
    `width`, `top` rows each; md; csv; `columns`: only these where a section has them), or an
    html page of every row."""
    from pipeline.errors import UsageError

    if fmt == "json":
        return json_chunks(rep)
    if fmt == "html":
        from pipeline.render.html import runs_html

        return runs_html(rep)
    if fmt not in ("table", "md", "csv"):
        raise UsageError(f"--format must be one of table, md, csv, json, html (got {fmt!r})")
    from pipeline.runs.sections import render_sections

    return render_sections(rep, fmt, width, top, columns)


def write_runs_workbook(rep: RunReport, path) -> None:
    """`tracepipe ranks --format xlsx`: one sheet per section (`pipeline.runs.sections`)."""
    from pipeline.runs.sections import write_runs_workbook as write

    write(rep, path)
