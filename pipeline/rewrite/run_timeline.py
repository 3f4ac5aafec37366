"""run_timeline: the ranks of one run on one timeline: what `combine --align clocks` adds to the
traces it puts together.

Ranks' clocks disagree by up to milliseconds. `tracepipe ranks` (`pipeline.runs`) matches each
collective across the ranks of a run and estimates each rank's clock offset from the ends of the
blocking ones (`runs.clock`); this module asks it (nothing here estimates anything) and turns its
answer into what a combined trace shows:

- each rank's shift: its events move by -offset, so collectives that ended together end together
  (a rank that shares no blocking collective with another cannot be aligned: shift 0, said);
- each rank's processes named `rank N · <name>` (a process without a name gets one);
- per matched collective, flows from the collective of the rank that started it last (the one
  the others waited for) to each other rank's (cat `collective`, one flow per other rank):
  Perfetto draws an arrow from that rank's kernel to the others';
- per rank, a track `collective waits (tracepipe)` beside its kernels: a slice per collective it
  waited in, from its own start for as long as it waited (`ranks`' wait: the last start less its
  own), named after the rank it waited for; and an instant at the last rank's start naming it
  the straggler of that collective, with the longest wait it caused.

Everything is keyed by the collective's own call on each rank: its (start, duration) in ns on that
rank's clock, as the scan read it (`runs.calls`), so `combine` finds the event while copying it.
Only a run's few tables are held: per rank its calls (ts, dur) and per collective its ranks and waits.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pipeline.errors import UsageError
from pipeline.runs.analysis import analyze
from pipeline.runs.problems import LEFT_OUT

WAITS_TID = 2_000_000_000  # the waits track's tid in a rank's GPU process (streams are small numbers)
WAITS_NAME = "collective waits (tracepipe)"
SHOWN_WAIT_NS = 1_000  # a wait shorter than 1 µs is no wait worth a slice (as `ranks`' LAST_BY)
FLOW_CAT = "collective"


@dataclass
class RankPlan:
    """One rank: its trace, clock offset (ns, None: not aligned), and what to add beside each of its
    collectives' events, keyed by the event's (ts_ns, dur_ns) on its own clock."""

    rank: int
    path: str
    offset_ns: float | None
    marks: dict = field(default_factory=dict)  # (ts_ns, dur_ns) -> [event templates: no pid/tid/ts]


@dataclass
class RunPlan:
    run: str
    ranks: list[RankPlan]
    n_collectives: int = 0  # matched across two ranks or more
    n_flows: int = 0
    left_out: list[str] = field(default_factory=list)  # "file: problem: detail" of each trace not combined


def _extracts_run(extracts: list, run_by: str | None, run: str | None):
    res = analyze(extracts, run_by, align=True)
    runs = sorted(set(res.ranks.data["run"])) if res.ranks.height else []
    if not runs:
        raise UsageError("no rank of a run found: the traces record no distributedInfo rank and no rank in their names")
    if run is None and len(runs) > 1:
        raise UsageError(f"{len(runs)} runs here ({', '.join(runs[:5])}): pick one with --run")
    if run is not None and run not in runs:
        raise UsageError(f"--run {run}: no such run (runs: {', '.join(runs[:5])})")
    return res, run or runs[0]


def plan(extracts: list, run_by: str | None = None, run: str | None = None) -> RunPlan:
    """What combining the ranks of one run adds (see the module docstring), from the Extracts of
    its traces (`runs.scan.folder.scanned`)."""
    res, name = _extracts_run(extracts, run_by, run)
    rows = [r for r in res.ranks.iter_rows(named=True) if r["run"] == name]
    by_stem: dict = {}
    for ex in extracts:
        by_stem.setdefault((ex.info.get("stem"), ex.info.get("rank")), ex)
    ranks: dict[int, RankPlan] = {}
    calls: dict[int, dict] = {}  # rank -> pg key -> (ts, dur) arrays by seq
    for r in rows:
        ex = by_stem.get((r["trace"], r["rank"]))
        if ex is None or r["status"] == "quarantined":
            continue
        ranks[r["rank"]] = RankPlan(r["rank"], ex.info["source"], r["offset_ns"])
        calls[r["rank"]] = {pg["key"]: _times(ex, i, pg["n"]) for i, pg in enumerate(ex.info["pgs"])}
    out = RunPlan(name, [ranks[k] for k in sorted(ranks)])
    out.left_out = [
        f"{p['file']}: {p['problem']}: {p['detail']}"
        for p in res.problems.iter_rows(named=True)
        if p["run"] == name and p["problem"] in LEFT_OUT
    ]
    for coll in res.collectives.iter_rows(named=True):
        if coll["run"] != name:
            continue
        who, waits = res.waits.get(coll["_store"])
        present = [(rk, w) for rk, w in zip(who, waits) if rk in ranks and coll["pg"] in calls[rk]]
        if len(present) < 2:
            continue
        out.n_collectives += 1
        last = coll["last_rank"] if coll["last_rank"] in ranks else present[0][0]
        label = f"{coll['kind']} #{coll['seq']}"
        flow_name = f"{coll['kind']} (group {coll['pg']}) #{coll['seq']}"
        longest = max(w for _, w in present)
        for rk, w in present:
            ts, dur = calls[rk][coll["pg"]]
            key = (int(ts[coll["seq"]]), int(dur[coll["seq"]]))
            marks = ranks[rk].marks.setdefault(key, [])
            if rk == last:
                for other, _ in present:
                    if other != rk:
                        marks.append(_flow("s", out.n_flows + other, flow_name, rk, other))
                if longest >= SHOWN_WAIT_NS:
                    marks.append(_straggler(label, rk, longest))
            else:
                marks.append(_flow("f", out.n_flows + rk, flow_name, last, rk))
                if w >= SHOWN_WAIT_NS:
                    marks.append(_wait(label, last, int(round(w))))
        out.n_flows += max(ranks) + 1
    _clip_waits(out)
    return out


def _times(ex, pg: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    calls = ex.pg_slice(pg, 0, n)
    return calls["ts"], calls["dur"]


def _flow(ph: str, fid: int, name: str, source: int, target: int) -> dict:
    e = {"ph": ph, "cat": FLOW_CAT, "name": name, "id": fid, "args": {"from_rank": source, "to_rank": target}}
    if ph == "f":
        e["bp"] = "e"
    return e


def _wait(label: str, last: int, wait_ns: int) -> dict:
    return {
        "ph": "X",
        "cat": "collective_wait",
        "name": f"waiting for rank {last}: {label}",
        "tid": WAITS_TID,
        "dur_ns": wait_ns,
        "args": {"wait_us": wait_ns / 1000, "last_rank": last},
    }


def _straggler(label: str, rank: int, longest_ns: float) -> dict:
    return {
        "ph": "i",
        "s": "t",
        "cat": "collective_straggler",
        "name": f"rank {rank} started {label} last",
        "tid": WAITS_TID,
        "args": {"longest_wait_caused_us": round(longest_ns) / 1000},
    }


def _clip_waits(p: RunPlan) -> None:
    """A rank's wait slices end before its next one starts (one track, nested as Perfetto needs)."""
    for r in p.ranks:
        starts = sorted(k[0] for k, ms in r.marks.items() if any(m["ph"] == "X" for m in ms))
        arr = np.array(starts, np.int64)
        for (ts, _), ms in r.marks.items():
            for m in ms:
                if m["ph"] == "X":
                    nxt = np.searchsorted(arr, ts, side="right")
                    if nxt < len(arr):
                        m["dur_ns"] = max(0, min(m["dur_ns"], int(arr[nxt]) - ts))


def run_sources(src: Path, jobs: int | None = None):
    """The Extracts of a run folder, archive or list of traces (`runs.scan`), as a context."""
    from pipeline.runs.scan.folder import scanned

    return scanned(src, jobs, use_cache=True)


def rank_traces(src: Path, run: str | None = None, run_by: str | None = None) -> list[tuple[int, str, float | None]]:
    """(rank, trace path, clock offset ns or None) of each rank of the run in `src`, by rank."""
    with run_sources(src) as extracts:
        res, name = _extracts_run(extracts, run_by, run)
        paths = {(ex.info.get("stem"), ex.info.get("rank")): ex.info.get("source") for ex in extracts}
    rows = [r for r in res.ranks.iter_rows(named=True) if r["run"] == name and r["status"] != "quarantined"]
    return sorted((r["rank"], paths[(r["trace"], r["rank"])], r["offset_ns"]) for r in rows)
