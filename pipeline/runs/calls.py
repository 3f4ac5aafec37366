"""calls: what a whole run is made of, per rank: an `Extract` (the trace's metadata, its
collective calls and its steps as numpy columns), whether it came from one streaming pass over the
trace file (`runs.scan`) or from a dataset's `trace`, `collectives` and `steps` tables
(`runs.from_tables`). Every measure of a run (`runs.analysis`) reads Extracts only.

A rank's calls are sorted by process group, then `seq` (their order in the group on that rank), so
the calls of one group and a range of seqs are one slice: a run is measured a window of seqs at a
time, whatever its size. Text columns are codes into the Extract's own lists (`info`): `pgs`
(the group's cross-rank key, name, ranks, and how many calls), `dtypes`, `steps`; `kind` is a code
into KIND_NAMES. Null is -1.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from pipeline.cost.formulas.collectives import KINDS

KIND_NAMES = (*KINDS, "unknown")
KIND_CODE = {k: i for i, k in enumerate(KIND_NAMES)}
UNKNOWN = KIND_CODE["unknown"]
CALL_COLUMNS = {
    "pg": np.int32,
    "seq": np.int64,
    "kind": np.int8,
    "bytes": np.int64,
    "dtype": np.int32,
    "pg_size": np.int64,
    "ts": np.int64,
    "dur": np.int64,
    "step": np.int32,
}
STEP_COLUMNS = {
    "step": np.int32,
    "step_ts": np.int64,
    "step_end": np.int64,
    "device": np.int64,
    "kernel_ns": np.int64,
    "compute_ns": np.int64,
    "comm_ns": np.int64,
    "exposed_comm_ns": np.int64,
}


@dataclass
class Extract:
    """One trace: `info` (JSON-able: source, stem, size, mtime_ns, status, reason, rank, rank_from,
    world_size, base_time_ns, n_events, n_collectives, problems, pgs, dtypes, steps), its calls and
    its steps."""

    info: dict
    calls: dict[str, np.ndarray]
    steps: dict[str, np.ndarray]

    @classmethod
    def empty(cls, info: dict) -> Extract:
        info = {"rank": None, "rank_from": None, "world_size": None, "n_collectives": 0, "problems": {}, **info}
        info.setdefault("pgs", [])
        info.setdefault("dtypes", [])
        info.setdefault("steps", [])
        return cls(info, _empty(CALL_COLUMNS), _empty(STEP_COLUMNS))

    def pg_slice(self, pg: int, start: int, stop: int) -> dict[str, np.ndarray]:
        """The calls of local group `pg` with seq in [start, stop)."""
        first, n = self.info["pgs"][pg]["offset"], self.info["pgs"][pg]["n"]
        a, b = first + min(start, n), first + min(stop, n)
        return {c: v[a:b] for c, v in self.calls.items()}

    def column(self, name: str) -> np.ndarray:
        """A whole call column (`ts`, say), as `cache.CachedExtract.column` reads one from its file."""
        return self.calls[name]


def _empty(columns: dict) -> dict[str, np.ndarray]:
    return {c: np.zeros(0, t) for c, t in columns.items()}


def pg_keys(groups: list[tuple[str | None, str | None]]) -> list[str]:
    """The cross-rank key of each of one rank's process groups (pg_name, pg_ranks): its sorted
    global ranks (`all` when none are recorded), then `#` and its place among the rank's groups
    with those ranks, by name (as a number first): `0,1,2,3#0`. Names may differ between ranks."""
    members = []
    for _, ranks in groups:
        found = sorted(int(x) for x in re.findall(r"-?\d+", ranks)) if ranks else []
        members.append(",".join(map(str, found)) or "all")
    order: dict[str, set] = {}
    for (name, _), m in zip(groups, members):
        num = int(name) if name is not None and re.fullmatch(r"-?\d+", name) else -1
        order.setdefault(m, set()).add((num, name or ""))
    rank_of = {m: {v: i for i, v in enumerate(sorted(vals))} for m, vals in order.items()}
    out = []
    for (name, _), m in zip(groups, members):
        num = int(name) if name is not None and re.fullmatch(r"-?\d+", name) else -1
        out.append(f"{m}#{rank_of[m][(num, name or '')]}")
    return out


def calls_of_rows(rows: list[dict]) -> tuple[dict[str, np.ndarray], list[dict], list[str], list[str]]:
    """Call columns (sorted by group, then seq), the groups, dtypes and step names of one rank's
    collective rows (dicts with pg_name, pg_ranks, pg_desc, kind, bytes, dtype, pg_size, ts_ns,
    dur_ns, step, and `order`: their order in the trace)."""
    rows = sorted(rows, key=lambda r: (r["ts_ns"], r["order"]))
    groups: dict[tuple, list] = {}
    for r in rows:
        groups.setdefault((r["pg_name"], r["pg_ranks"]), []).append(r)
    keys = pg_keys(list(groups))
    order = sorted(range(len(keys)), key=lambda i: keys[i])
    dtypes = sorted({r["dtype"] for r in rows if r["dtype"] is not None})
    steps = sorted({r["step"] for r in rows if r["step"] is not None})
    dcode, scode = {d: i for i, d in enumerate(dtypes)}, {s: i for i, s in enumerate(steps)}
    pgs: list[dict] = []
    cols: dict[str, list] = {c: [] for c in CALL_COLUMNS}
    offset = 0
    items = list(groups.items())
    for local, i in enumerate(order):
        (name, ranks), members = items[i]
        desc = next((r["pg_desc"] for r in members if r.get("pg_desc")), None)
        pgs.append({"key": keys[i], "name": name, "ranks": ranks, "desc": desc, "offset": offset, "n": len(members)})
        offset += len(members)
        for seq, r in enumerate(members):
            cols["pg"].append(local)
            cols["seq"].append(seq)
            cols["kind"].append(KIND_CODE.get(r["kind"], UNKNOWN))
            cols["bytes"].append(-1 if r["bytes"] is None else r["bytes"])
            cols["dtype"].append(dcode.get(r["dtype"], -1))
            cols["pg_size"].append(-1 if r["pg_size"] is None else r["pg_size"])
            cols["ts"].append(r["ts_ns"])
            cols["dur"].append(r["dur_ns"])
            cols["step"].append(scode.get(r["step"], -1))
    calls = {c: np.array(v, dtype=CALL_COLUMNS[c]) for c, v in cols.items()}
    return calls, pgs, dtypes, steps


def steps_of_rows(rows: list[tuple], names: list[str]) -> tuple[dict[str, np.ndarray], list[str]]:
    """Step columns of (step, step_ts, step_end, device, kernel_ns, compute_ns, comm_ns,
    exposed_comm_ns) rows (None: null), step names coded into `names` (extended as needed)."""
    code = {s: i for i, s in enumerate(names)}
    names = list(names)
    out: dict[str, list] = {c: [] for c in STEP_COLUMNS}
    for row in rows:
        if row[0] not in code:
            code[row[0]] = len(names)
            names.append(row[0])
        out["step"].append(code[row[0]])
        for c, v in zip(list(STEP_COLUMNS)[1:], row[1:]):
            out[c].append(-1 if v is None else v)
    return {c: np.array(v, dtype=STEP_COLUMNS[c]) for c, v in out.items()}, names
