"""report: a run's measures (`ranks`), as the JSON document of `tracepipe ranks --format json`,
as tables, and as polars frames (`RunReport`) for Python.

A run folder (or archive) of trace files is read by `runs.scan` (one streaming pass per trace, in
parallel, kept in a cache); a batch dataset or a folder of flattened traces by `runs.from_tables`.
Both give Extracts, measured by `runs.analysis`. Nothing here imports polars until a frame is
asked for: a first look at a run folder stays light.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from pipeline.runs.analysis import RunResult, WaitStore, analyze

__all__ = [
    "RunReport",
    "analyze_runs",
    "measure",
    "problems_of",
    "runs_json",
    "json_chunks",
    "only_run",
    "format_runs",
    "write_runs_workbook",
    "is_trace_folder",
]


@dataclass(frozen=True)
class RunReport:
    """Every frame `ranks` shows, as polars frames (times in ns; the JSON and the tables turn them
    into µs): runs, ranks, collectives (with `ranks` and `waits_ns` lists), waits (run, pg, seq,
    rank, wait_ns), by_kind, stragglers, steps, desyncs, problems; `result`: what they are made of."""

    runs: Any
    ranks: Any
    collectives: Any
    waits: Any
    by_kind: Any
    stragglers: Any
    steps: Any
    desyncs: Any
    problems: Any
    result: RunResult | None = field(default=None, repr=False, compare=False)

    @classmethod
    def of(cls, res: RunResult) -> RunReport:
        import polars as pl

        c = res.collectives
        ranks, waits = zip(*(res.waits.get(i) for i in c.data["_store"])) if c.height else ((), ())
        colls = c.select([x for x in c.columns if x != "_store"]).to_polars()
        colls = colls.with_columns(
            pl.Series("ranks", list(ranks), pl.List(pl.Int64)), pl.Series("waits_ns", list(waits), pl.List(pl.Float64))
        )
        frames = {
            f: getattr(res, f).to_polars()
            for f in ("runs", "ranks", "by_kind", "stragglers", "steps", "desyncs", "problems")
        }
        w = colls.select("run", "pg", "seq", rank="ranks", wait_ns="waits_ns").explode("rank", "wait_ns")
        return cls(collectives=colls, waits=w, result=res, **frames)


def is_trace_folder(path: Path) -> bool:
    """A folder (or archive, or list) of trace files, rather than tables to read."""
    path = Path(path)
    if path.is_file():
        return True
    if not path.is_dir():
        return False
    if any((path / t).is_dir() for t in ("traces", "trace", "collectives")) or (path / "trace.parquet").is_file():
        return False
    return not any((d / "trace.parquet").is_file() for d in path.iterdir() if d.is_dir())


def measure(
    path: str | Path,
    run_by: str | None = None,
    align: bool = True,
    jobs: int | None = None,
    use_cache: bool = True,
    trace_ids: set[str] | None = None,
) -> RunResult:
    """The runs of a run folder / archive of trace files, a batch dataset, or a folder of
    flattened traces, measured (a RunResult: light tables); of a dataset, only the traces
    `trace_ids` (and the inputs its manifest quarantined) when given."""
    path = Path(path)
    if not path.exists():
        from pipeline.errors import UsageError

        raise UsageError(f"{path}: no such file or directory")
    if is_trace_folder(path):
        from pipeline.runs.scan.folder import scanned

        with scanned(path, jobs, use_cache) as extracts:
            return analyze(extracts, run_by, align)
    from pipeline.runs.from_tables import extracts_of_tables

    with tempfile.TemporaryDirectory(prefix="tracepipe-ranks-") as tmp:
        res = analyze(extracts_of_tables(path, Path(tmp), trace_ids), run_by, align)
        res.waits.get(0) if res.collectives.height else None  # read what the files hold before they go
        return res


def measured_runs(
    source: str | Path,
    run_by: str | None = None,
    align: bool = True,
    jobs: int | None = None,
    use_cache: bool = True,
    run: str | None = None,
) -> RunResult:
    """`tracepipe ranks`: the runs of `source` measured (`measure`), only the run `run` names when
    given; a UsageError when `source` holds no trace."""
    from pipeline.errors import UsageError

    res = measure(source, run_by=run_by, align=align, jobs=jobs, use_cache=use_cache)
    if not res.runs.height:
        raise UsageError(f"{source}: holds no trace (.json, .json.gz or .json.zst files, or a dataset of them)")
    return only_run(res, run) if run is not None else res


def analyze_runs(path: str | Path, run_by: str | None = None, align: bool = True) -> RunReport:
    """The runs of a batch dataset, a folder of flattened traces, or a run folder of trace files."""
    return RunReport.of(measure(path, run_by, align))


def problems_of(path: str | Path, run_by: str | None = None) -> list[dict]:
    """Every problem of the runs in `path` (run, file, problem, detail): truncated or missing
    collectives, files that are no trace, duplicate ranks, ... (`runs.problems`)."""
    res = measure(path, run_by)
    return list(res.problems.iter_rows(named=True))


# ------------------------------------------------------------------ the JSON document
def _us(v) -> float | None:
    return None if v is None or (isinstance(v, float) and not math.isfinite(v)) else v / 1e3


def _num(v) -> float | None:
    return None if v is None or (isinstance(v, float) and not math.isfinite(v)) else v


def _result(rep) -> RunResult:
    if isinstance(rep, RunReport):
        assert rep.result is not None, "a RunReport made by RunReport.of (analyze_runs)"
        return rep.result
    return rep


def runs_json(rep) -> dict:
    """{"runs": [{run, findings, world_size, ranks, missing_ranks, clock_offset_us, collectives,
    stragglers, problems, ...}]}: the contract of `tracepipe ranks --format json` (README, "Whole
    runs"; findings: what to fix across the run's ranks, docs/guides/reading-findings.md)."""
    runs = _runs(_result(rep))
    return {"runs": [{**head, "steps": list(head["steps"]), "collectives": list(colls)} for head, colls in runs]}


def json_chunks(rep) -> Iterator[bytes]:
    """`runs_json`, written a step and a collective at a time: a run of 256 ranks x 10,000
    collectives is a document of ~200 MB that is never whole in memory."""
    dump = lambda v: orjson.dumps(v, option=orjson.OPT_NON_STR_KEYS)
    yield b'{"runs": ['
    for i, (head, colls) in enumerate(_runs(_result(rep))):
        steps = head.pop("steps")
        yield (b", " if i else b"") + dump(head)[:-1] + b', "steps": ['
        for j, x in enumerate(steps):
            yield (b",\n" if j else b"\n") + dump(x)
        yield b'], "collectives": ['
        for j, c in enumerate(colls):
            yield (b",\n" if j else b"\n") + dump(c)
        yield b"]}"
    yield b"]}\n"


def _of_run(rows, run: str) -> list[dict]:
    return list(_iter_run(rows, run))


def _iter_run(rows, run: str) -> Iterator[dict]:
    return (r for r in rows.iter_rows(named=True) if r["run"] == run)


def _runs(res: RunResult) -> Iterator[tuple[dict, Iterator[dict]]]:
    """Per run, the document's head (its steps an iterator: a run of 1,024 ranks x 1,250 steps
    is 1.3 M of them) and its collectives."""
    for r in res.runs.iter_rows(named=True):
        run = r["run"]
        ranks = _of_run(res.ranks, run)
        head = {
            "run": run,
            "findings": res.findings.get(run, []),
            "world_size": r["world_size"],
            "world_size_from": r["world_size_from"],
            "ranks": list(r["ranks"] or []),
            "missing_ranks": list(r["missing_ranks"] or []),
            "traces_without_rank": list(r["no_rank"] or []),
            "duplicate_rank_traces": list(r["duplicate"] or []),
            "problems": [_row(x, ("run",)) for x in _of_run(res.problems, run)],
            "clock_offset_us": {str(x["rank"]): _us(x["offset_ns"]) for x in ranks},
            "stragglers": [
                {"rank": s["rank"], "wait_caused_us": _us(s["wait_caused_ns"]), "times_last": s["times_last"]}
                for s in _of_run(res.stragglers, run)
            ],
            "ranks_detail": [_row(x, ("run",)) for x in ranks],
            "by_kind": [_row(x, ("run",)) for x in _of_run(res.by_kind, run)],
            "steps": (_row(x, ("run", "step_ts_ns", "step_end_ns")) for x in _iter_run(res.steps, run)),
            "desyncs": [_row(x, ("run",)) for x in _of_run(res.desyncs, run)],
        }
        yield head, (_collective(c, res.waits) for c in res.collectives.iter_rows(named=True) if c["run"] == run)


def _collective(c: dict, waits: WaitStore) -> dict:
    ranks, w = waits.get(c["_store"])
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
        "wait_us": {str(k): _us(x) for k, x in zip(ranks, w)},
    }


def _row(x: dict, drop: tuple[str, ...]) -> dict:
    """A table row for JSON: ns columns as µs (`*_us`), NaN as null."""
    out = {}
    for k, v in x.items():
        if k in drop or k.startswith("_"):
            continue
        if k.endswith("_ns"):
            out[k[:-3] + "_us"] = _us(v)
        else:
            out[k] = _num(v) if isinstance(v, float) else v
    return out


def only_run(rep, run: str):
    """The report of one run (UsageError naming the runs when there is no such run)."""
    from pipeline.errors import UsageError

    res = _result(rep)
    names = res.runs.data["run"]
    if run not in names:
        raise UsageError(f"no run {run!r}; runs: {', '.join(map(str, names)) or 'none'}")
    keep = lambda rows: rows.filter([r == run for r in rows.data["run"]])
    per_run = ("waits", "findings", "vendors")  # not tables of rows with a `run` column
    tables = {f: keep(getattr(res, f)) for f in RunResult.__dataclass_fields__ if f not in per_run}
    vendors = {run: res.vendors[run]} if run in res.vendors else {}
    out = RunResult(**tables, waits=res.waits, findings={run: res.findings.get(run, [])}, vendors=vendors)
    return RunReport.of(out) if isinstance(rep, RunReport) else out


def format_runs(
    rep, fmt: str, width: int | None = None, top: int | None = 20, columns: list[str] | None = None
) -> str | Iterator[bytes]:
    """`tracepipe ranks` output: the JSON document, the sections as tables (text fitted to
    `width`, `top` rows each; md; csv; `columns`: only these where a section has them), or an
    html page of every row."""
    from pipeline.errors import UsageError

    if fmt == "json":
        return json_chunks(rep)
    if fmt == "html":
        from pipeline.render.html import runs_html

        return runs_html(rep if isinstance(rep, RunReport) else RunReport.of(rep))
    if fmt not in ("table", "md", "csv"):
        raise UsageError(f"--format must be one of table, md, csv, json, html (got {fmt!r})")
    from pipeline.runs.sections import render_sections

    return render_sections(_result(rep), fmt, width, top, columns)


def write_runs_workbook(rep, path) -> None:
    """`tracepipe ranks --format xlsx`: one sheet per section (`pipeline.runs.sections`)."""
    from pipeline.runs.sections import write_runs_workbook as write

    write(_result(rep), path)
