"""sections: `tracepipe ranks` as tables (text, Markdown, CSV, xlsx sheets): one section per
question, each a table of the run's result (`analysis.RunResult`) with its times in µs."""

from __future__ import annotations

from typing import Any

from pipeline.render.findings import FLAT_COLUMNS, findings_lines, flat_rows
from pipeline.render.rows import Rows
from pipeline.render.tables import check_columns, render, spans

SECTIONS = (  # (name, title, the result's table, columns shown: by importance, a narrow terminal drops the last)
    ("runs", "Runs: ranks present and missing", "runs", ["run", "world_size", "traces", "ranks", "missing_ranks"]),
    (
        "problems",
        "Problems: what the run left out or could not see (exit status 1)",
        "problems",
        ["run", "file", "problem", "detail"],
    ),
    (
        "ranks",
        "Ranks: clock offset, collectives, time waited, wait caused",
        "ranks",
        [
            "run",
            "rank",
            "trace",
            "status",
            "offset_us",
            "collectives",
            "missing",
            "wait_us",
            "wait_caused_us",
            "times_last",
            "rank_from",
        ],
    ),
    (
        "stragglers",
        "Stragglers: the wait each rank caused others (largest first)",
        "stragglers",
        ["run", "rank", "wait_caused_us", "times_last"],
    ),
    (
        "collectives",
        "Collectives by kind and size",
        "by_kind",
        [
            "run",
            "kind",
            "bytes",
            "count",
            "latency_p50_us",
            "busbw_p50_gbps",
            "algbw_p50_gbps",
            "n_ranks",
            "latency_p99_us",
            "busbw_p99_gbps",
            "start_skew_p50_us",
            "start_skew_p99_us",
        ],
    ),
    (
        "steps",
        "Per rank and step (slowest first)",
        "steps",
        ["run", "rank", "step", "step_us", "compute_us", "comm_us", "exposed_comm_us", "wait_us"],
    ),
    (
        "desyncs",
        "Desynchronised calls (left out of every measure)",
        "desyncs",
        ["run", "rank", "pg", "seq", "kind", "bytes", "expected_kind", "expected_bytes"],
    ),
)


def in_us(rows: Rows) -> Rows:
    """ns columns (`*_ns`) as µs columns (`*_us`); columns starting with `_` left out."""
    out: dict[str, Any] = {}
    numeric = []
    for c in rows.columns:
        if c.startswith("_"):
            continue
        v: Any = rows.data[c]
        num = rows.is_numeric(c)
        if c.endswith("_ns"):
            us = v / 1e3 if hasattr(v, "dtype") else [None if x is None else x / 1e3 for x in v]
            c, v, num = c[:-3] + "_us", us, True
        out[c] = v
        if num:
            numeric.append(c)
    return Rows(out, numeric)


RANK_LISTS = ("ranks", "missing_ranks")  # columns of rank lists, shown as spans in table and md
TOP = 20  # rows of a section in the table and md views (csv, json and xlsx hold every row)
SLOWEST_FIRST = {"steps": "step_us"}  # sections whose table view puts the largest first


def render_sections(
    res, fmt: str, width: int | None = None, top: int | None = TOP, columns: list[str] | None = None
) -> str:
    """The sections as text tables, md or csv; table and md show `top` rows of each (None or 0:
    all) and say how many more there are; `columns`: only these, where a section has them."""
    check_columns(columns, [in_us(getattr(res, table)) for _, _, table, _ in SECTIONS])
    one_run = fmt != "csv" and res.runs.height == 1  # its name once, above the tables, not in every row
    out = [f"run: {res.runs.data['run'][0]}\n"] if one_run else []
    out.append(_findings(res, fmt, width, one_run))
    for name, title, table, shown in SECTIONS:
        df = in_us(getattr(res, table))
        if not df.height:
            continue
        df = df.select([c for c in shown if c in df.columns and not (one_run and c == "run")])
        if fmt != "csv":  # ranks as spans (1-127), not one by one
            df = Rows(
                {c: [spans(v or [], None) for v in vs] if c in RANK_LISTS else vs for c, vs in df.data.items()},
                [c for c in df.columns if df.is_numeric(c)],
            )
        if columns and not set(columns) & set(df.columns) - {"run", "rank"}:
            continue  # none of the chosen columns but the keys: the section has nothing to show
        if fmt == "csv":
            out.append(f"# {name}\n" + render(df, "csv", columns=columns))
            continue
        if name in SLOWEST_FIRST:
            df = df.sort_desc(SLOWEST_FIRST[name])
        more = df.height - top if top and df.height > top else 0
        text = render(df.head(top) if top and more else df, fmt, width=width, columns=columns)
        if more:
            rows = "row" if more == 1 else "rows"
            text += f"({more:,} more {rows}: --top 0 shows all; csv, json and xlsx hold every row)\n"
        out.append((f"## {title}\n\n" if fmt == "md" else f"{title}\n") + text)
    return "\n".join(out)


FINDINGS_TITLE = "What to fix across the ranks (largest saving first; they overlap)"
# a run none of whose traces says its rank (a folder of single traces, say): nothing was compared
NO_RANK = (
    "No rank read: none of this run's traces says its rank (distributedInfo or a rank in its file name), "
    "so nothing was compared; each is listed under Problems"
)


def rankless_runs(res) -> set[str]:
    """The runs of a `RunResult` none of whose traces was read as a rank."""
    data = res.runs.data
    return {str(run) for run, ranks in zip(data["run"], data["ranks"]) if not ranks}


def findings_rows(res) -> Rows:
    """Every run's findings as one flat table (run first)."""
    rows = [{"run": run, **r} for run, found in res.findings.items() for r in flat_rows(found)]
    return Rows({c: [r.get(c) for r in rows] for c in ("run", *FLAT_COLUMNS)})


def _findings(res, fmt: str, width: int | None, one_run: bool) -> str:
    """The findings, first: per run, numbered (table, md), or as rows (csv)."""
    if fmt == "csv":
        return "# findings\n" + render(findings_rows(res), "csv")
    head = f"## {FINDINGS_TITLE}\n\n" if fmt == "md" else f"{FINDINGS_TITLE}\n"
    parts, rankless = [], rankless_runs(res)
    for run, found in res.findings.items():
        label = "" if one_run else (f"### run {run}\n\n" if fmt == "md" else f"run {run}:\n")
        none = NO_RANK if str(run) in rankless else None
        parts.append(label + findings_lines(found, fmt, width, "the run's steps", none))
    return head + "\n".join(parts)


def section_frames(rep) -> dict:
    """Every section's rows (all of its columns, times in µs) as polars frames, by name: the
    sheets of xlsx (and what an html page shows); the findings first."""
    res = getattr(rep, "result", rep)
    frames = {"findings": findings_rows(res).to_polars()}
    return frames | {name: in_us(getattr(res, table)).to_polars() for name, _, table, _ in SECTIONS}


def write_runs_workbook(rep, path) -> None:
    """`ranks --format xlsx`: an `about` sheet, then one sheet per section."""
    from pipeline.render.workbook import write_workbook
    from pipeline.version import __version__

    res = getattr(rep, "result", rep)
    write_workbook(path, section_frames(res), {"runs": res.runs.height, "tracepipe": __version__})
