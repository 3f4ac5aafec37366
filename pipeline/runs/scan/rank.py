"""rank: one trace file read once, streaming, into what a whole-run answer needs of it (an
`Extract`): its metadata, its collectives and its steps, the rows `runs.collectives` and
`runs.steps` make of a flattened trace, by the same rules (`describe`, `pipeline.comms`).

A trace cut short gives what its complete events hold (status `truncated`, with the reason); a
file that is no trace gives no rows (status `quarantined`, with the reason): `tracepipe ranks`
reports both.
"""

from __future__ import annotations

import os
import re
from bisect import bisect_right

import numpy as np

from pipeline.comms import HCCL_GROUP_LANE, HCCL_OP_KIND, NCCL_KERNEL, RANK_IN_LIST, RUNLOOP_THREAD
from pipeline.cost.formulas.collectives import normalize_kind
from pipeline.cost.formulas.messages import HCCL_SIZE, op_message
from pipeline.errors import BadTrace
from pipeline.findings.vendor import by_names
from pipeline.kineto import task_device, trace_stem
from pipeline.read.rank import int_or_none, rank_of
from pipeline.runs.calls import Extract, calls_of_rows, steps_of_rows
from pipeline.runs.scan.describe import OpsAround, canonical, describe, message
from pipeline.runs.scan.events import ANNOTATION, KERNEL, OP, Kept

_NCCL = re.compile(NCCL_KERNEL)
_GROUP_LANE, _HCCL_KIND = re.compile(HCCL_GROUP_LANE), re.compile(HCCL_OP_KIND)


def scan_trace(path: str, max_inflate: float | None = None) -> Extract:
    """The Extract of one trace file; never raises for bad input (its status says)."""
    from pipeline.read.chunks import ChunkParseError, FileSpan, Salvaged
    from pipeline.read.source import TraceSource

    st = os.stat(path)
    info = {
        "source": str(path),
        "stem": trace_stem(path),
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "status": "ok",
        "reason": None,
    }
    kept = Kept()
    try:
        with TraceSource(path, max_inflate=max_inflate) as src:
            for piece in src.pieces():
                if isinstance(piece, Salvaged):
                    kept.add_events(piece.events)
                else:
                    kept.add_text(piece.read() if isinstance(piece, FileSpan) else piece)
            meta, tail = src.metadata, src.tail
    except (BadTrace, ChunkParseError, OSError, ValueError) as e:
        return Extract.empty({**info, "status": "quarantined", "reason": _one_line(e)})
    if tail.truncated:
        info.update(status="truncated", reason=tail.reason)
    return extract(kept, meta, info)


def _vendor(meta: dict) -> str | None:
    """The device vendor the trace's deviceProperties name (`findings.vendor.by_names`); None: none."""
    props = meta.get("deviceProperties")
    names = [p.get("name") for p in props if isinstance(p, dict)] if isinstance(props, list) else []
    return by_names(n for n in names if isinstance(n, str))


def _one_line(e: Exception) -> str:
    text = " ".join(str(e).split())
    return text.split(": ", 1)[1] if text.startswith("/") and ": " in text else text


def extract(kept: Kept, meta: dict, info: dict) -> Extract:
    """The Extract of a trace's kept events and top-level metadata."""
    found = meta.get("distributedInfo")
    dist: dict = found if isinstance(found, dict) else {}
    rank, rank_from = rank_of(info["source"], dist)
    world = int_or_none(dist.get("world_size"))
    info.update(
        rank=rank,
        rank_from=rank_from,
        world_size=world,
        backend=dist.get("backend") if isinstance(dist.get("backend"), str) else None,
        trace_name=meta.get("traceName") if isinstance(meta.get("traceName"), str) else None,
        base_time_ns=int_or_none(meta.get("baseTimeNanoseconds")),
        n_events=kept.n_events,
    )
    problems: dict[str, int] = {}
    kept.task_devices()
    info["vendor"] = _vendor(meta)
    rows = _kernel_rows(kept)
    if not rows:
        rows, planes_world = _hccl_rows(kept)
        info["vendor"] = "ascend" if rows else info["vendor"]
        if world is None and planes_world:
            info["world_size"] = world = planes_world
    if not rows:
        pg_config = dist.get("pg_config")
        rows, unowned = _gloo_rows(kept, pg_config if isinstance(pg_config, list) else [])
        if unowned:
            problems["gloo_work_without_process_group"] = unowned
    unknown = sum(1 for r in rows if r["kind"] is None)
    if unknown:
        problems["collective_of_unknown_kind"] = unknown
    steps = sorted(kept.steps, key=lambda s: s[1])
    starts = [s[1] for s in steps]
    counted: dict = {}
    for r in rows:
        group = r.pop("group_size")
        r["kind"] = r["kind"] or "unknown"
        if r["pg_ranks"] not in counted:
            counted[r["pg_ranks"]] = _count_ranks(r["pg_ranks"])
        r["pg_size"] = next((v for v in (group, counted[r["pg_ranks"]], world) if v is not None), None)
        r["in_nelems"], r["out_nelems"], r["dtype"], r["bytes"], r["size_from"] = message(
            r["kind"], r.pop("readings"), r["pg_size"], r.pop("sources", None)
        )
        r["step"] = _step_of(r["ts_ns"], steps, starts)
    info["problems"] = problems
    info["n_collectives"] = len(rows)
    calls, info["pgs"], info["dtypes"], names = calls_of_rows(rows)
    step_cols, info["steps"] = steps_of_rows(_step_rows(kept, steps, rows), names)
    return Extract(info, calls, step_cols)


def _count_ranks(text: str | None) -> int | None:
    return len(re.findall(RANK_IN_LIST, text)) or None if text else None


def _step_of(ts: int, steps: list[tuple], starts: list[int]) -> str | None:
    """The ProfilerStep whose interval holds `ts` (the last one started at or before it)."""
    i = bisect_right(starts, ts) - 1
    return steps[i][0] if i >= 0 and ts <= steps[i][2] else None


# ------------------------------------------------------------------ collective kernels
def _kernel_rows(kept: Kept) -> list[dict]:
    kernels = kept.comm_kernels
    if not kernels:
        return []
    launches = kept.launches_of_comm_kernels()
    ops = OpsAround([o for o in kept.ops if o["cat"] in (OP, ANNOTATION)])
    launch_of = [launches.get(k["correlation"]) if k["correlation"] is not None else None for k in kernels]
    previous = _previous_launches(launch_of)
    rows = []
    for i, k in enumerate(kernels):
        d = describe(k, launch_of[i], ops, previous[i])
        rows.append(
            {
                **d,
                "order": i,
                "name": k["name"],
                "ts_ns": k["ts_ns"],
                "dur_ns": k["dur_ns"],
                "device": k["device"],
                "stream": k["stream"],
            }
        )
    _pg_of_stream(rows)
    return rows


def _previous_launches(launch_of: list[tuple | None]) -> list[int | None]:
    """For each collective kernel, the launch time of the collective launched before it on its
    launching thread (the calls of a coalesced group are those recorded in between)."""
    out: list[int | None] = [None] * len(launch_of)
    by_thread: dict = {}
    for i, launch in enumerate(launch_of):
        if launch is not None:
            by_thread.setdefault((launch[0], launch[1]), []).append((launch[2], i))
    for items in by_thread.values():
        items.sort()
        for (_, i), (prev, _) in zip(items[1:], items[:-1]):
            out[i] = prev
    return out


PG = ("pg_name", "pg_desc", "pg_ranks", "group_size")


def _pg_of_stream(rows: list[dict]) -> None:
    """Kernels without a process group take the one most kernels of their stream name (ties: the
    one seen first)."""
    count: dict = {}
    for r in rows:
        if r["pg_ranks"] is not None or r["pg_name"] is not None:
            key = (r["device"], r["stream"])
            pg = tuple(r[c] for c in PG)
            n, first = count.setdefault(key, {}).get(pg, (0, r["ts_ns"]))
            count[key][pg] = (n + 1, min(first, r["ts_ns"]))
    best = {key: min(pgs.items(), key=lambda x: (-x[1][0], x[1][1]))[0] for key, pgs in count.items()}
    for r in rows:
        if r["pg_ranks"] is None and r["pg_name"] is None:
            chosen = best.get((r["device"], r["stream"]))
            if chosen is not None:
                r.update(zip(PG, chosen))


# ------------------------------------------------------------------ HCCL collectives (torch_npu)
def _hccl_rows(kept: Kept) -> tuple[list[dict], int | None]:
    """The HCCL collectives of a torch_npu trace, as `runs.collectives._hccl_ops` makes them of a
    flattened one (group from the lane's name, device from the pid, size from `count` and
    `data_type`, group size from the ranks the group's plane tasks name), and the largest group
    size the planes reveal (None without plane tasks)."""
    if not kept.hccl_ops:
        return [], None
    lanes = {(pid, tid): name for pid, tid, name in kept.thread_names}
    groups = sorted((pid, tid) for (pid, tid), name in lanes.items() if _GROUP_LANE.match(name or ""))
    group_size = _plane_group_sizes(kept, groups)
    rows = []
    for i, op in enumerate(sorted(kept.hccl_ops, key=lambda o: o["ts_ns"])):
        lane = _GROUP_LANE.match(lanes.get((op["pid"], op["tid"])) or "")
        index = kept.sort_index.get(op["pid"])
        found = _HCCL_KIND.match(op["name"])
        rows.append(
            {
                "order": i,
                "name": op["name"],
                "kind": normalize_kind(found.group(1)) if found else None,
                "op_name": None,
                "collective": op["name"],
                "pg_name": lane.group(1) if lane else None,
                "pg_desc": None,
                "pg_ranks": None,
                "group_size": group_size.get((op["pid"], op["tid"])),
                "readings": [HCCL_SIZE.read(op["name"], op["args"])],
                "sources": [HCCL_SIZE.name],
                "ts_ns": op["ts_ns"],
                "dur_ns": op["dur_ns"],
                "device": task_device(op["pid"], index if type(index) is int else None)
                if type(op["pid"]) is int
                else None,
                "stream": None,
            }
        )
    return rows, max(group_size.values(), default=None)


def _plane_group_sizes(kept: Kept, groups: list[tuple]) -> dict:
    """(pid, group lane tid) -> the ranks its plane tasks name (src and dst), at least the highest
    + 1: a task's group is the nearest group lane before its lane (msprof numbers a group's planes
    after it)."""
    seen: dict = {}
    for pid, tid, _, src, dst, _, _ in kept.hccl_tasks:
        lane = next((g for g in reversed(groups) if g[0] == pid and g[1] <= tid), None)
        if lane is not None:
            seen.setdefault(lane, set()).update(r for r in (src, dst) if r is not None)
    return {g: max(len(r), max(r) + 1) for g, r in seen.items() if r}


# ------------------------------------------------------------------ gloo work on runloop threads
def _gloo_rows(kept: Kept, pg_config: list) -> tuple[list[dict], int]:
    works = [o for o in kept.ops if o["cat"] != OP and o["cat"] != KERNEL and o["name"].startswith("gloo:")]
    if not works:
        return [], 0
    runloop = sorted(
        {
            (pid, tid)
            for pid, tid, name in kept.thread_names
            if type(pid) is int and type(tid) is int and RUNLOOP_THREAD in name
        }
    )
    groups = [g for g in pg_config if isinstance(g, dict)]
    owner = {}
    if groups and runloop and not len(runloop) % len(groups):
        share = len(runloop) // len(groups)
        owner = {t: groups[i // share] for i, t in enumerate(runloop)}
    rows, unowned = [], 0
    for i, w in enumerate(sorted(works, key=lambda o: o["ts_ns"])):
        g = owner.get((w["pid"], w["tid"]))
        unowned += g is None
        a = canonical(w["args"])
        rows.append(
            {
                "order": i,
                "name": w["name"],
                "kind": normalize_kind(w["name"]),
                "op_name": None,
                "collective": w["name"].removeprefix("gloo:"),
                **dict(zip(PG, _gloo_pg(g))),
                "readings": [op_message(w["name"], a)],
                "ts_ns": w["ts_ns"],
                "dur_ns": w["end_ns"] - w["ts_ns"],
                "device": None,
                "stream": None,
            }
        )
    return rows, unowned


def _gloo_pg(group: dict | None) -> tuple:
    if group is None:
        return (None, None, None, None)
    ranks, size = group.get("ranks"), group.get("pg_size")
    return (
        str(group.get("pg_name")) if group.get("pg_name") is not None else None,
        group.get("pg_desc") if isinstance(group.get("pg_desc"), str) else None,
        str(ranks) if isinstance(ranks, list) else None,
        size if type(size) is int else None,
    )


# ------------------------------------------------------------------ steps
def _step_rows(kept: Kept, steps: list[tuple], rows: list[dict]) -> list[tuple]:
    """(step, step_ts_ns, step_end_ns, device, kernel_ns, compute_ns, comm_ns, exposed_comm_ns) of
    each ProfilerStep and device, as `runs.steps` makes them (device None: a CPU-only trace's row)."""
    if not steps:
        return []
    starts = np.array([s[1] for s in steps], np.int64)
    ends = np.array([s[2] for s in steps], np.int64)
    out = []
    if len(kept.k_ts):
        ts, end = np.frombuffer(kept.k_ts, np.int64), np.frombuffer(kept.k_end, np.int64)
        dev, comm = np.frombuffer(kept.k_dev, np.int64), np.frombuffer(kept.k_comm, np.int8).astype(bool)
        step = _steps_of(ts, starts, ends)
        cover: dict = {}
        for s, d in sorted(set(zip(step[step >= 0].tolist(), dev[step >= 0].tolist()))):
            sel = (step == s) & (dev == d)
            k, c = _union(ts[sel], end[sel]), _union(ts[sel & ~comm], end[sel & ~comm])
            cover.setdefault(s, []).append((d if d >= 0 else None, k, c, _union(ts[sel & comm], end[sel & comm])))
        for i, (name, s_ts, s_end) in enumerate(steps):
            for d, k, c, m in cover.get(i, [(None, None, None, None)]):
                out.append((name, s_ts, s_end, d, k, c, m, None if k is None else k - c))
        return out
    work_ts = np.array([r["ts_ns"] for r in rows], np.int64)
    work_end = work_ts + np.array([r["dur_ns"] for r in rows], np.int64)
    step = _steps_of(work_ts, starts, ends)
    for i, (name, s_ts, s_end) in enumerate(steps):
        sel = step == i
        out.append((name, s_ts, s_end, None, None, None, _union(work_ts[sel], work_end[sel]), None))
    return out


def _steps_of(ts: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """For each start, the index of the step holding it (the last started at or before), else -1."""
    i = np.searchsorted(starts, ts, side="right") - 1
    inside = (i >= 0) & (ts <= ends[np.maximum(i, 0)])
    return np.where(inside, i, -1)


def _union(start: np.ndarray, end: np.ndarray) -> int:
    """The length of the union of the intervals."""
    if not len(start):
        return 0
    order = np.argsort(start, kind="stable")
    s, e = start[order], end[order]
    reach = np.maximum.accumulate(e)
    new = np.ones(len(s), bool)
    new[1:] = s[1:] > reach[:-1]
    first = np.flatnonzero(new)
    last = np.append(first[1:], len(s)) - 1
    return int((reach[last] - s[first]).sum())
