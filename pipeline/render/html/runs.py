"""runs: the page of `ranks --format html`: what to fix across the ranks (per run), then per run
an overview (ranks traced and missing, the worst straggler, time waited, a rank x step heat map
of waits, each rank's step time split, bus bandwidth by message size), then every section of
the run report (`pipeline.runs.sections`: runs, ranks, stragglers, collectives, steps, desyncs,
and whatever is added there), each `<section data-section="NAME">` with every row.
"""

from __future__ import annotations

import polars as pl

import pipeline.render.html.charts as ch
from pipeline.render.html.cells import duration, engineering_bytes
from pipeline.render.html.frames import frames_page
from pipeline.render.html.model import Chart, Findings, Note, Part, Section, Table, Tile
from pipeline.render.html.page import anchor, render_page
from pipeline.render.tables import spans
from pipeline.runs.sections import FINDINGS_TITLE, NO_RANK, SECTIONS, SLOWEST_FIRST, rankless_runs, section_frames

STEP_PREFIX = "ProfilerStep#"  # said once, as the columns' label, rather than in every column
SHOWN_PROBLEMS = 5  # problems said in the overview (the problems section holds them all)
LOG_SPREAD = 50  # bus bandwidths spread wider than this are drawn on a log axis
NARROW_HEAT_STEPS = 8  # a heat map of fewer steps takes half the overview's width
MAX_HEAT_STEPS = 400  # steps in a heat map (the slowest-ranked columns beyond are left out, and said)


def runs_html(rep, facts=()) -> str:
    """The page of `ranks` for a `RunReport`."""
    frames = section_frames(rep)
    one = rep.runs.height == 1
    sections = []
    for name, title, _frame, shown in SECTIONS:
        df = frames[name]
        lead = [c for c in shown if c in df.columns and not (one and c == "run")]
        rest = [c for c in df.columns if c not in lead and not (one and c == "run") and not c.endswith("_ts_us")]
        df = df.select(lead + [c for c in rest if c not in ("step_end_us",)])
        if name in SLOWEST_FIRST and SLOWEST_FIRST[name] in df.columns:
            df = df.sort(SLOWEST_FIRST[name], descending=True, nulls_last=True, maintain_order=True)
        sections.append((name, title, df))
    runs = [str(r) for r in rep.runs["run"].to_list()]
    title = runs[0] if one else f"{len(runs)} runs"
    parts: list[Part] = []
    for run in runs:
        parts += overview(rep, run, None if one else run)
    page, empty = frames_page(title, "run", sections, [("dataset runs", ", ".join(runs)), *facts], parts)
    links = {s.name: anchor(s.name) for s in page.sections if s.name}
    found = getattr(rep.result, "findings", {}) if rep.result is not None else {}
    fix = Section(FINDINGS_TITLE, name="findings", lead=True)
    rankless = rankless_runs(rep.result) if rep.result is not None else set()
    fix.parts = [
        Findings(
            tuple(found.get(run, [])),
            links,
            "the run's steps",
            None if one else run,
            NO_RANK if run in rankless else None,
        )
        for run in runs
    ]
    page.sections.insert(0, fix)
    return render_page(page, empty)


def _times(n: int) -> str:
    return "once" if n == 1 else f"{n} times"


def _of(df: pl.DataFrame, run: str) -> pl.DataFrame:
    return df.filter(pl.col("run").cast(pl.String) == run)


def _ranks_note(missing: list, recorded: bool, ranks: list) -> str:
    """What the count of ranks traced leaves out: the missing ranks, none, or that the traces do
    not record how many ranks the run had (then ranks above the highest read may be missing)."""
    if not ranks:
        return "no trace says its rank"
    above = "" if recorded else f"; ranks above {ranks[-1]} may be: the world size is not recorded"
    if missing:
        return f"missing: {spans(missing)}{above}"
    return "every rank of the world" if recorded else f"world size not recorded: ranks above {ranks[-1]} may be missing"


def overview(rep, run: str, name: str | None) -> list[Part]:
    """One run's tiles and charts (`name`: said in their titles when the page holds several runs)."""
    at = f" ({name})" if name else ""
    info = _of(rep.runs, run).row(0, named=True)
    ranks, missing = sorted(info.get("ranks") or []), sorted(info.get("missing_ranks") or [])
    world = info.get("world_size")
    recorded = info.get("world_size_from") == "distributedInfo"
    parts: list[Part] = []
    if name:
        parts.append(Note(f"Run {name}"))
    parts.append(
        Tile(
            f"ranks traced{at}",
            f"{len(ranks)} of {world}" if recorded else str(len(ranks)),
            _ranks_note(missing, recorded, ranks),
            "bad" if missing or not ranks else "good" if recorded else "",
        )
    )
    parts += _problems(rep, run)
    strag = _of(rep.stragglers, run).sort("wait_caused_ns", descending=True)
    if strag.height and (strag["wait_caused_ns"][0] or 0) > 0:
        s = strag.row(0, named=True)
        parts.append(
            Tile(
                "worst straggler",
                f"rank {s['rank']}",
                f"made the others wait {duration(s['wait_caused_ns'] / 1e3)}; last {_times(s['times_last'])}",
                "warn",
            )
        )
    rk = _of(rep.ranks, run)
    if rk.height:
        waited = float(rk["wait_ns"].sum() or 0) / 1e3
        parts.append(Tile("time waited in collectives", duration(waited), "all ranks together, for later ranks"))
        offsets = rk["offset_ns"].drop_nulls()
        if offsets.len():
            largest = float(offsets.abs().max() or 0)  # type: ignore[arg-type]
            parts.append(Tile("largest clock offset", duration(largest / 1e3), "between ranks, corrected"))
    colls = _of(rep.collectives, run)
    bad = _of(rep.desyncs, run).height
    parts.append(
        Tile(
            "collectives matched",
            f"{colls.height:,}",
            f"{bad:,} desynchronised calls left out" if bad else "",
            "bad" if bad else "",
        )
    )
    parts += [Chart(c, wide=len(c["cols"]) > NARROW_HEAT_STEPS) for c in (wait_heatmap(rep, run, at),) if c]
    parts += [Chart(c) for c in (step_split(rep, run, at), waited_by_rank(rep, run, at), bandwidth(rep, run, at)) if c]
    return parts


def _problems(rep, run: str) -> list[Part]:
    """A tile counting the run's problems (a truncated rank, a file that is no trace, ...) and a
    table of the first, when the report has a problems table."""
    probs = getattr(rep, "problems", None)
    if probs is None or not hasattr(probs, "filter") or "run" not in probs.columns:
        return []
    mine = _of(probs, run)
    if not mine.height:
        return []
    kinds = mine["problem"].value_counts(sort=True) if "problem" in mine.columns else None
    said = ", ".join(f"{k} ({n})" for k, n in kinds.iter_rows()) if kinds is not None else ""
    cols = [c for c in ("file", "problem", "detail") if c in mine.columns]
    first = (
        f"The first {SHOWN_PROBLEMS} problems (all in Problems below)" if mine.height > SHOWN_PROBLEMS else "Problems"
    )
    table = [Table(mine.head(SHOWN_PROBLEMS).select(cols), first, compact=True)] if cols else []
    return [Tile("problems", f"{mine.height:,}", said, "bad"), *table]


def wait_heatmap(rep, run: str, at: str) -> dict | None:
    s = _of(rep.steps, run)
    if not s.height:
        return None
    order = s.group_by("step").agg(pl.col("step_ts_ns").min()).sort("step_ts_ns")["step"].cast(pl.String).to_list()
    note = "Each cell: the time the rank waited in the step's collectives for later ranks. Hover for its value."
    if len(order) > MAX_HEAT_STEPS:
        note += f" The first {MAX_HEAT_STEPS} of {len(order)} steps."
        order = order[:MAX_HEAT_STEPS]
    ranks = sorted(s["rank"].unique().to_list())
    cell = {(r, str(st)): w for r, st, w in s.select("rank", "step", "wait_ns").iter_rows()}
    values = [[(cell[(r, st)] / 1e3 if cell.get((r, st)) is not None else None) for st in order] for r in ranks]
    prefix = STEP_PREFIX if all(st.startswith(STEP_PREFIX) for st in order) else ""
    columns = [st[len(prefix) :] for st in order]
    title = f"Time each rank waited, per step{at}"
    return ch.heatmap(title, [str(r) for r in ranks], columns, values, "us", "rank", prefix or "step", note)


def step_split(rep, run: str, at: str) -> dict | None:
    s = _of(rep.steps, run)
    if not s.height:
        return None
    per = (
        s.group_by("rank")
        .agg(pl.col("step_ns", "compute_ns", "exposed_comm_ns").sum(), steps=pl.len())
        .sort("rank")
        .with_columns(other=(pl.col("step_ns") - pl.col("compute_ns") - pl.col("exposed_comm_ns")).clip(lower_bound=0))
    )
    segs = ch.series(
        ["compute", "exposed communication", "other"],
        {"compute": "#4c72b0", "exposed communication": "#c44e52", "other": "#d9dde3"},
    )
    rows = [
        ch.bar(
            f"rank {r['rank']}",
            [r["compute_ns"] / 1e3, r["exposed_comm_ns"] / 1e3, r["other"] / 1e3],
            f"{duration(r['step_ns'] / 1e3)} in {r['steps']} step{'s' if r['steps'] != 1 else ''}",
        )
        for r in per.to_dicts()
    ]
    note = (
        "Step time summed over the steps: GPU compute, communication not hidden behind compute, the rest (idle, CPU)."
    )
    return ch.bars(f"Where each rank's step time went{at}", rows, "us", segs, note)


def waited_by_rank(rep, run: str, at: str) -> dict | None:
    rk = _of(rep.ranks, run)
    if not rk.height:
        return None
    segs = ch.series(
        ["waited for others", "made others wait"], {"waited for others": "#8172b3", "made others wait": "#dd8452"}
    )
    rows = [
        ch.bar(
            f"rank {r['rank']}",
            [(r["wait_ns"] or 0) / 1e3, (r["wait_caused_ns"] or 0) / 1e3],
            f"last {r['times_last']}x" if r["times_last"] else "",
        )
        for r in rk.sort("rank").to_dicts()
    ]
    note = "A straggler waits little and makes the others wait: its bar is mostly orange."
    return ch.bars(f"Waiting per rank{at}", rows, "us", segs, note)


def _spread(points: list[dict]) -> float:
    """The ratio of the largest to the smallest positive y of the points (1 when none)."""
    ys = [p["y"] for p in points if p["y"] and p["y"] > 0]
    return max(ys) / min(ys) if ys else 1.0


def _latency(r: dict) -> str:
    p50, p99 = ((r[c] or 0) / 1e3 for c in ("latency_p50_ns", "latency_p99_ns"))
    return f"p50 {duration(p50)}, p99 {duration(p99)}"


def bandwidth(rep, run: str, at: str) -> dict | None:
    k = _of(rep.by_kind, run)
    if not k.height:
        return None
    sized = k.filter(pl.col("bytes").is_not_null() & (pl.col("bytes") > 0) & pl.col("busbw_p50_gbps").is_not_null())
    if not sized.height:  # no message sizes in these traces: latency per kind instead
        rows = [
            ch.bar(
                str(r["kind"]),
                [(r["latency_p50_ns"] or 0) / 1e3],
                f"{_latency(r)} ({r['count']}x)",
            )
            for r in k.to_dicts()
        ]
        note = "These traces record no message sizes, so no bandwidth: the latency of each kind of collective."
        return ch.bars(f"Collective latency by kind{at}", rows, "us", note=note)
    kinds = sized["kind"].cast(pl.String).unique(maintain_order=True).to_list()
    groups = ch.series(kinds)
    points = []
    for r in sized.to_dicts():
        tip = [
            f"{r['kind']} of {engineering_bytes(r['bytes'])} ({r['count']:,} calls, {r['n_ranks']} ranks)",
            f"busbw p50 {r['busbw_p50_gbps']:.4g} GB/s, p99 {r['busbw_p99_gbps'] or 0:.4g} GB/s",
            f"latency {_latency(r)}",
        ]
        size = min(4 + r["count"] ** 0.5, 14)
        points.append(
            {
                "x": r["bytes"],
                "y": r["busbw_p50_gbps"],
                "r": round(size, 1),
                "s": kinds.index(str(r["kind"])),
                "tip": tip,
            }
        )
    note = (
        "Median bus bandwidth (nccl-tests' busbw) of each kind and message size; a point's area grows with its calls."
    )
    return ch.scatter(
        f"Bus bandwidth by message size{at}",
        ch.axis("message size", "bytes", log=True),
        ch.axis("busbw (GB/s)", "plain", log=_spread(points) > LOG_SPREAD),
        points,
        groups,
        note=note,
    )
