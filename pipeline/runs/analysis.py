"""analysis: a whole run measured from its ranks' Extracts, a process group and a window of seqs
at a time, so that memory follows the window, not ranks x collectives.

Three passes over the windows of each group (the calls of seqs [a, b) on every rank):
1. `match.desyncs`: the collectives whose calls disagree, left out of every measure; and, per seq,
   how many ranks recorded it as a blocking kind (the collectives the clock may use);
2. `clock.offsets` from the ends of a sample of those (skipped with align=False);
3. `measures.measure`: per collective and per rank, on aligned clocks.
Each rank's steps (`steps` of its Extract) then take the waits of their collectives. The result is
a `RunResult` of small tables (`render.rows.Rows`) and the calls' waits kept aside (`WaitStore`,
in a temporary file past a size), so that nothing in it grows with ranks x collectives but that.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipeline.findings.run import RunFacts, run_findings
from pipeline.render.rows import Rows
from pipeline.runs import clock
from pipeline.runs.apart import split_in_time
from pipeline.runs.calls import KIND_NAMES
from pipeline.runs.group import Run, group_runs
from pipeline.runs.match import desyncs, window
from pipeline.runs.measures import QUANTILES, Totals, measure, nearest
from pipeline.runs.problems import run_problems

WINDOW_CALLS = 1 << 19  # calls gathered at a time (~40 MB of columns and their work)
SPILL_CALLS = 1 << 22  # waits kept in memory up to this many calls, in a temporary file past it
ITEM = np.dtype([("r", np.int32), ("w", np.float64)])  # a call in the file: rank, wait (ns)


class WaitStore:
    """Each measured collective's ranks and waits (ns), by collective number."""

    def __init__(self) -> None:
        self.ranks: list[np.ndarray] = []
        self.waits: list[np.ndarray] = []
        self.offsets = [0]
        self._file: Any = None
        self._in_memory = 0

    def add(self, ranks: np.ndarray, waits: np.ndarray, present: np.ndarray) -> None:
        for n in present.tolist():
            self.offsets.append(self.offsets[-1] + n)
        if self._file is None and self._in_memory + len(ranks) > SPILL_CALLS:
            self._file = tempfile.TemporaryFile(prefix="tracepipe-waits-")  # noqa: SIM115 - lives with the store
            for r, w in zip(self.ranks, self.waits):
                self._write(r, w)
            self.ranks, self.waits = [], []
        if self._file is not None:
            self._write(ranks, waits)
        else:
            self.ranks.append(ranks.astype(np.int32))
            self.waits.append(waits.astype(np.float64))
            self._in_memory += len(ranks)

    def _write(self, r: np.ndarray, w: np.ndarray) -> None:
        rec = np.empty(len(r), ITEM)
        rec["r"], rec["w"] = r, w
        self._file.write(rec.tobytes())

    def get(self, i: int) -> tuple[list[int], list[float]]:
        a, b = self.offsets[i], self.offsets[i + 1]
        if self._file is None:
            if not hasattr(self, "_all_r"):
                self._all_r = np.concatenate(self.ranks) if self.ranks else np.zeros(0, np.int32)
                self._all_w = np.concatenate(self.waits) if self.waits else np.zeros(0)
            return self._all_r[a:b].tolist(), self._all_w[a:b].tolist()
        self._file.seek(a * ITEM.itemsize)
        rec = np.frombuffer(self._file.read((b - a) * ITEM.itemsize), ITEM)
        return rec["r"].tolist(), rec["w"].tolist()


@dataclass
class RunResult:
    """Every section of `ranks` as Rows (times in ns), and the calls' waits (`waits.get(i)`:
    the i-th row of `collectives`, which `_store_index` names)."""

    runs: Rows
    ranks: Rows
    collectives: Rows
    by_kind: Rows
    stragglers: Rows
    steps: Rows
    desyncs: Rows
    problems: Rows
    waits: WaitStore = field(default_factory=WaitStore)
    findings: dict[str, list[dict]] = field(default_factory=dict)  # per run: what to fix (`Finding.as_dict`)
    vendors: dict[str, str | None] = field(default_factory=dict)  # per run: its ranks' device vendor (None: not told)


@dataclass
class Member:
    """A rank of a run in one of its groups: its Extract, the group's local number in it, its
    calls there, and its codes mapped to the run's."""

    rank: int
    ex: Any  # Extract or cache.CachedExtract
    local: int
    n: int
    dtypes: np.ndarray
    steps: np.ndarray


def _map(codes: np.ndarray, table: np.ndarray) -> np.ndarray:
    return np.where(codes >= 0, table[np.maximum(codes, 0)] if len(table) else -1, -1)


def _gather(members: list[Member], a: int, b: int) -> dict[str, np.ndarray]:
    parts = []
    for m in members:
        if a >= m.n:
            continue
        sl = m.ex.pg_slice(m.local, a, b)
        sl["rank"] = np.full(len(sl["seq"]), m.rank, np.int64)
        sl["dtype"] = _map(sl["dtype"], m.dtypes)
        sl["step"] = _map(sl["step"], m.steps)
        parts.append(sl)
    return {c: np.concatenate([p[c] for p in parts]) for c in parts[0]} if parts else {}


def _vendor(infos: list[dict]) -> str | None:
    """The device vendor of a run's ranks: the one their traces name (None: none, or several)."""
    found = {i.get("vendor") for i in infos} - {None}
    return found.pop() if len(found) == 1 else None


def _min_ts(ex) -> int | None:
    ts = ex.column("ts")
    return int(ts.min()) if len(ts) else None


def analyze(extracts: list, run_by: str | None = None, align: bool = True) -> RunResult:
    """The runs of these Extracts, measured (see the module docstring)."""
    infos = [e.info for e in extracts]
    parts: dict[str, list] = {k: [] for k in ("runs", "ranks", "coll", "by_kind", "strag", "steps", "desync", "prob")}
    store = WaitStore()
    vendors: dict[str, str | None] = {}
    for run in group_runs(infos, run_by):
        split_in_time(run, extracts)
        vendors[run.name] = _vendor([extracts[i].info for i in run.ranks.values()])
        _one_run(run, extracts, align, parts, store)
    res = RunResult(
        runs=_rows(parts["runs"], RUNS_COLUMNS),
        ranks=_rows(parts["ranks"], RANKS_COLUMNS),
        collectives=_rows(parts["coll"], COLL_COLUMNS),
        by_kind=_rows(parts["by_kind"], BY_KIND_COLUMNS),
        stragglers=_rows(parts["strag"], ["run", "rank", "wait_caused_ns", "times_last"]),
        steps=_blocks(parts.pop("steps"), STEPS_COLUMNS),
        desyncs=_rows(
            parts["desync"], ["run", "rank", "pg", "seq", "kind", "bytes", "expected_kind", "expected_bytes"]
        ),
        problems=_rows(parts["prob"], ["run", "file", "problem", "detail"]),
        waits=store,
    )
    res.vendors = vendors
    res.findings = {r: [x.as_dict() for x in run_findings(RunFacts.of(res, r))] for r in res.runs.data["run"]}
    return res


RUNS_COLUMNS = [
    "run",
    "world_size",
    "world_size_from",
    "traces",
    "ranks",
    "missing_ranks",
    "no_rank",
    "duplicate",
    "problems",
]
RANKS_COLUMNS = [
    "run",
    "rank",
    "trace",
    "rank_from",
    "status",
    "offset_ns",
    "collectives",
    "expected",
    "missing",
    "wait_ns",
    "wait_caused_ns",
    "times_last",
]
COLL_COLUMNS = [
    "run",
    "pg",
    "seq",
    "kind",
    "bytes",
    "dtype",
    "step",
    "pg_size",
    "n_ranks",
    "present",
    "first_ns",
    "last_rank",
    "start_skew_ns",
    "latency_ns",
    "algbw_gbps",
    "busbw_gbps",
    "_store",
]
STEPS_COLUMNS = [
    "run",
    "rank",
    "step",
    "step_ts_ns",
    "step_end_ns",
    "compute_ns",
    "comm_ns",
    "exposed_comm_ns",
    "wait_ns",
    "step_ns",
]
BY_KIND_COLUMNS = [
    "run",
    "kind",
    "bytes",
    *(
        f"{m}_p{round(100 * q)}_{u}"
        for m, u in (("latency", "ns"), ("algbw", "gbps"), ("busbw", "gbps"), ("start_skew", "ns"))
        for q in QUANTILES
    ),
    "count",
    "n_ranks",
]


def _blocks(blocks: list[dict], columns: list[str]) -> Rows:
    """Rows of numpy column blocks (one per rank), joined; the blocks are emptied as their columns
    are joined, so that a run's rows are held about once, not twice (1,024 ranks x 1,250 steps:
    ~90 MB less at the peak)."""
    if not blocks:
        return _rows([], columns)
    return Rows({c: np.concatenate([b.pop(c) for b in blocks]) for c in columns}, _numeric(columns, []))


def _rows(rows: list[dict], columns: list[str]) -> Rows:
    return Rows({c: [r.get(c) for r in rows] for c in columns}, _numeric(columns, rows))


def _numeric(columns: list[str], rows: list[dict]) -> list[str]:
    text = {"run", "trace", "rank_from", "status", "pg", "kind", "dtype", "step", "file", "problem", "detail"}
    text |= {"expected_kind", "ranks", "missing_ranks", "no_rank", "duplicate"}
    return [c for c in columns if c not in text]


def _nn(v: float) -> float | None:
    return None if v != v else float(v)  # NaN as null


def _one_run(run: Run, extracts: list, align: bool, parts: dict, store: WaitStore) -> None:
    members_of = {r: extracts[i] for r, i in run.ranks.items()}
    dtypes = sorted({d for ex in members_of.values() for d in ex.info.get("dtypes", [])})
    steps = sorted({s for ex in members_of.values() for s in ex.info.get("steps", [])})
    dcode, scode = {d: i for i, d in enumerate(dtypes)}, {s: i for i, s in enumerate(steps)}
    maps = {
        r: (
            np.array([dcode[d] for d in ex.info.get("dtypes", [])], np.int64),
            np.array([scode[s] for s in ex.info.get("steps", [])], np.int64),
        )
        for r, ex in members_of.items()
    }
    groups: dict[str, list[Member]] = {}
    for r, ex in members_of.items():
        for local, pg in enumerate(ex.info.get("pgs", [])):
            groups.setdefault(pg["key"], []).append(Member(r, ex, local, pg["n"], *maps[r]))
    ranks = sorted(members_of)
    starts = [t for t in (_min_ts(ex) for ex in members_of.values()) if t is not None]
    base = min(starts) if starts else 0
    names = {"dtypes": dtypes, "steps": steps}

    # pass 1: desynchronised collectives, and per seq the ranks that recorded it as a blocking kind
    bad: dict[str, np.ndarray] = {}
    blocking: dict[str, np.ndarray] = {}
    anyk: dict[str, np.ndarray] = {}
    for key, members in sorted(groups.items()):
        n = max(m.n for m in members)
        bad[key], blocking[key], anyk[key] = np.zeros(n, bool), np.zeros(n, np.int64), np.zeros(n, np.int64)
        for a, b in _windows(n, len(members)):
            w = window(_gather(members, a, b))
            is_bad, rows = desyncs(w, list(KIND_NAMES))
            seqs = w.cols["seq"][w.starts]
            bad[key][seqs] = is_bad
            parts["desync"] += [
                dict(zip(("rank", "seq", "kind", "bytes", "expected_kind", "expected_bytes"), x), run=run.name, pg=key)
                for x in rows
            ]
            ok = ~is_bad[w.segment_of_rows()]
            blocking_rows = ok & np.isin(w.cols["kind"], clock.BLOCKING_CODES)
            np.add.at(blocking[key], w.cols["seq"][blocking_rows], 1)
            np.add.at(anyk[key], w.cols["seq"][ok], 1)

    # pass 2: clock offsets from a sample of the collectives at least two ranks shared
    if align:
        use_blocking = any(c.any() for c in blocking.values())
        counts = blocking if use_blocking else anyk
        coll, rk, pg_of, end = [], [], [], []
        n_coll = 0
        for gi, (key, members) in enumerate(sorted(groups.items())):
            chosen = clock.sample(np.flatnonzero(counts[key] > 1))
            if not len(chosen):
                continue
            number = np.full(len(counts[key]), -1, np.int64)
            number[chosen] = np.arange(n_coll, n_coll + len(chosen))
            n_coll += len(chosen)
            for a, b in _windows(len(counts[key]), len(members)):
                if not (number[a:b] >= 0).any():
                    continue
                c = _gather(members, a, b)
                sel = number[c["seq"]] >= 0
                if use_blocking:
                    sel &= np.isin(c["kind"], clock.BLOCKING_CODES)
                coll.append(number[c["seq"][sel]])
                rk.append(c["rank"][sel])
                pg_of.append(np.full(int(sel.sum()), gi, np.int64))
                end.append((c["ts"][sel] + c["dur"][sel] - base).astype(np.float64))
        cat = lambda xs, t: np.concatenate(xs) if xs else np.zeros(0, t)
        offsets = clock.offsets(cat(coll, np.int64), cat(rk, np.int64), cat(pg_of, np.int64), cat(end, float), ranks)
    else:
        offsets = {r: 0.0 for r in ranks}

    # pass 3: the measures
    totals = Totals(ranks, len(steps))
    offset_arr = np.array([offsets.get(r) or 0.0 for r in ranks])
    colls: list[dict] = []
    for key, members in sorted(groups.items()):
        for a, b in _windows(len(bad[key]), len(members)):
            w = window(_gather(members, a, b))
            m = measure(w, ~bad[key][w.cols["seq"][w.starts]], offset_arr, base, totals, names)
            if not m:
                continue
            first_i = len(store.offsets) - 1
            store.add(m.pop("_ranks"), m.pop("_waits"), m["present"])
            for i in range(len(m["seq"])):
                colls.append(
                    {
                        "run": run.name,
                        "pg": key,
                        "seq": int(m["seq"][i]),
                        "kind": KIND_NAMES[m["kind"][i]],
                        "bytes": None if m["bytes"][i] < 0 else int(m["bytes"][i]),
                        "dtype": None if m["dtype"][i] < 0 else dtypes[m["dtype"][i]],
                        "step": None if m["step"][i] < 0 else steps[m["step"][i]],
                        "pg_size": None if m["pg_size"][i] < 0 else int(m["pg_size"][i]),
                        "n_ranks": int(m["n_ranks"][i]),
                        "present": int(m["present"][i]),
                        "first_ns": float(m["first_ns"][i]),
                        "last_rank": int(m["last_rank"][i]),
                        "start_skew_ns": float(m["start_skew_ns"][i]),
                        "latency_ns": int(m["latency_ns"][i]),
                        "algbw_gbps": _nn(m["algbw_gbps"][i]),
                        "busbw_gbps": _nn(m["busbw_gbps"][i]),
                        "_store": first_i + i,
                    }
                )
    colls.sort(key=lambda c: (c["first_ns"], c["pg"], c["seq"]))
    parts["coll"] += colls
    parts["by_kind"] += _by_kind(run.name, colls)
    expected = _expected(groups, ranks)
    ranks_rows = []
    for r in ranks:
        i, ex = totals.index[r], members_of[r]
        n = int(ex.info.get("n_collectives") or 0)
        ranks_rows.append(
            {
                "run": run.name,
                "rank": r,
                "trace": ex.info.get("stem"),
                "rank_from": ex.info.get("rank_from"),
                "status": ex.info.get("status", "ok"),
                "offset_ns": offsets.get(r),
                "collectives": n,
                "expected": expected.get(r, n),
                "missing": max(expected.get(r, n) - n, 0),
                "wait_ns": float(totals.wait[i]) if totals.measured[i] else None,
                "wait_caused_ns": float(totals.caused[i]),
                "times_last": int(totals.times_last[i]),
            }
        )
    parts["ranks"] += ranks_rows
    strag = [x for x in ranks_rows if x["times_last"]]
    strag.sort(key=lambda x: (-x["wait_caused_ns"], -x["times_last"], x["rank"]))
    parts["strag"] += [{k: x[k] for k in ("run", "rank", "wait_caused_ns", "times_last")} for x in strag]
    parts["steps"] += _steps(run.name, members_of, maps, steps, totals)
    problems = run_problems(run, extracts, ranks_rows)
    parts["prob"] += problems
    stem = lambda i: extracts[i].info.get("stem")
    parts["runs"].append(
        {
            "run": run.name,
            "world_size": run.world_size,
            "world_size_from": run.world_from,
            "traces": len(run.traces) - len(run.quarantined),
            "ranks": list(run.ranks),
            "missing_ranks": run.missing,
            "no_rank": sorted(stem(i) for i in run.no_rank),
            "duplicate": sorted(stem(d) for d, _, _ in run.duplicates),
            "problems": len(problems),
        }
    )


def _windows(n: int, members: int):
    step = max(1, WINDOW_CALLS // max(members, 1))
    for a in range(0, n, step):
        yield a, min(n, a + step)


def _expected(groups: dict[str, list[Member]], ranks: list[int]) -> dict[int, int]:
    """Per rank, the collectives of the groups it belongs to (by the group's recorded ranks, or
    every rank of the run for a group that records none): as many as any of their ranks recorded."""
    out = dict.fromkeys(ranks, 0)
    for key, members in groups.items():
        most = max(m.n for m in members)
        listed = key.split("#")[0]
        belong = set(ranks) if listed == "all" else {int(x) for x in listed.split(",")} & set(ranks)
        for r in belong | {m.rank for m in members}:
            out[r] += most
    return out


def _by_kind(run: str, colls: list[dict]) -> list[dict]:
    """Per kind and message size: count and the quantiles of latency, bandwidths and skew."""
    groups: dict[tuple, list[dict]] = {}
    for c in colls:
        groups.setdefault((c["kind"], c["bytes"]), []).append(c)
    out = []
    for (kind, size), cs in sorted(groups.items(), key=lambda x: (x[0][0], x[0][1] is None, x[0][1] or 0)):
        row = {"run": run, "kind": kind, "bytes": size}
        for metric, col, unit in (
            ("latency", "latency_ns", "ns"),
            ("algbw", "algbw_gbps", "gbps"),
            ("busbw", "busbw_gbps", "gbps"),
            ("start_skew", "start_skew_ns", "ns"),
        ):
            values = np.array([np.nan if c[col] is None else c[col] for c in cs], float)
            for q in QUANTILES:
                row[f"{metric}_p{round(100 * q)}_{unit}"] = nearest(values, q)
        row["count"] = len(cs)
        row["n_ranks"] = max(c["n_ranks"] for c in cs)
        out.append(row)
    return out


def _steps(run: str, members_of: dict, maps: dict, names: list[str], totals: Totals) -> list[dict]:
    """Per rank and step: the step's time, compute, communication and exposed communication (summed
    over the rank's devices; compute and exposed null without a device) and the time waited in its
    collectives: numpy columns, a block per rank (a run of 1,024 ranks x 1,250 steps is 1.3 M rows)."""
    out = []
    label = np.array(names, dtype=object)
    for r, ex in sorted(members_of.items()):
        s = ex.steps
        if not len(s["step"]):
            continue
        codes = maps[r][1][s["step"]]
        order = np.lexsort((codes,))  # a step's device rows together, in the order they came
        codes = codes[order]
        first = np.flatnonzero(np.r_[True, codes[1:] != codes[:-1]])
        col = {c: v[order] for c, v in s.items()}
        total = {c: np.add.reduceat(np.maximum(col[c], 0), first) for c in ("compute_ns", "comm_ns", "exposed_comm_ns")}
        gpu = np.maximum.reduceat((col["device"] >= 0).astype(np.int8), first) > 0
        step_ts, step_end = col["step_ts"][first], col["step_end"][first]
        by_ts = np.argsort(step_ts, kind="stable")
        code = codes[first]
        block = {
            "run": np.full(len(first), run, dtype=object),
            "rank": np.full(len(first), r, np.int64),
            "step": label[code],
            "step_ts_ns": step_ts,
            "step_end_ns": step_end,
            "compute_ns": np.where(gpu, total["compute_ns"], np.nan),
            "comm_ns": total["comm_ns"],
            "exposed_comm_ns": np.where(gpu, total["exposed_comm_ns"], np.nan),
            "wait_ns": totals.step_wait[totals.index[r], code] if len(names) else np.zeros(len(first)),
            "step_ns": step_end - step_ts,
        }
        out.append({c: v[by_ts] for c, v in block.items()})
    return out
