"""run_tables: the `collectives` and `steps` tables of a group's members, as `write_run_tables`
gives each trace's (`run_tables`)."""

from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow as pa

from pipeline import schema, store
from pipeline.dataset.group.decode import Tables
from pipeline.dataset.members import Member


def _empty_stage(name: str) -> pa.Table:
    return schema.table(name).arrow_schema(schema.ALL_STAGES).empty_table()


def run_tables(members: list[Member], t: Tables) -> tuple[pa.Table, np.ndarray, pa.Table, np.ndarray]:
    """The `collectives` and `steps` tables of the group (and the member of each row), as
    `write_run_tables` writes them per trace: a member with NCCL/RCCL kernels or gloo work gets
    its collectives made with the other members' of its kind (`_nccl_together`, `_gloo_together`)
    or, where that cannot be, from `runs.tables` itself over its rows of the group's tables; the
    others have none. Steps are measured for every member in one query keyed by member
    (`runs.steps.steps` per trace: ~14 ms each of the ~50 ms of an NCCL member's run tables): by
    the kernels of a trace that has some, else by its gloo work."""
    from pipeline.runs.collectives import IS_GLOO_WORK, NCCL_KERNEL, PROFILER_STEP, STEP_INTERVAL, in_steps
    from pipeline.runs.steps import INTERVAL, IS_KERNEL, kernel_cover_ns, union_ns
    from pipeline.runs.steps import SCHEMA as STEPS_SCHEMA
    from pipeline.runs.tables import collectives_table
    from pipeline.runs.tables import run_tables as member_run_tables

    ev, gpu = t.tables["events"], t.tables["gpu_ops"]
    events = store.frame_from_arrow(ev.select(["cat", "name", "ts_ns", "dur_ns"])).with_columns(
        _m=pl.Series(t.owner["events"], dtype=pl.Int64)
    )
    kernels = store.frame_from_arrow(
        gpu.select(["kind", "name", "device", "ts_ns", "dur_ns", "category"])
    ).with_columns(_m=pl.Series(t.owner["gpu_ops"], dtype=pl.Int64))
    gloo = set(events.filter(IS_GLOO_WORK)["_m"].to_list())
    nccl = set(
        kernels.filter(
            (pl.col("kind") == "kernel") & pl.col("name").str.contains(NCCL_KERNEL) & pl.col("ts_ns").is_not_null()
        )["_m"].to_list()
    )
    alone = sorted(gloo | nccl)
    has_kernels = set(kernels.filter(IS_KERNEL)["_m"].unique().to_list())
    got: dict[str, dict[int, pa.Table]] = {"collectives": {}, "steps": {}}
    stages = {"events": ("flatten",), "gpu_ops": schema.ALL_STAGES, "flows": ("flatten",)}
    starts = {n: t.starts(n) for n in stages}
    got["collectives"].update(_nccl_together(members, t, sorted(nccl & has_kernels)))
    gloo_only = _gloo_together(members, t, sorted(gloo - nccl - has_kernels))
    got["collectives"].update(gloo_only)
    for k in (k for k in alone if k not in got["collectives"]):  # its own rows, as its files would read
        member = {
            name: store.frame_from_arrow(
                schema.conform(t.tables[name].slice(at[k], at[k + 1] - at[k]), name, stages[name])
            )
            for name, at in starts.items()
        }
        if k in has_kernels:  # its steps by its kernels, with the others' below
            got["collectives"][k] = schema.conform(
                collectives_table(member, members[k].row).to_arrow(), "collectives", schema.ALL_STAGES
            )
            continue
        for name, frame in zip(got, member_run_tables(member, members[k].row)):
            got[name][k] = schema.conform(frame.to_arrow(), name, schema.ALL_STAGES)
    for k in set(range(len(members))) - set(alone):
        members[k].row["n_collectives"] = 0
    rest = [k for k in range(len(members)) if k not in got["steps"]]  # steps measured by one query
    intervals = (
        events.filter(pl.col("_m").is_in(rest) & PROFILER_STEP)
        .select("_m", *STEP_INTERVAL)
        .sort("_m", "step_ts_ns")
        .with_row_index(INTERVAL)  # measures are keyed by interval, not by name (`runs.steps`)
    )
    k_rows = kernels.filter(pl.col("_m").is_in(rest) & IS_KERNEL)
    k_rows = k_rows.select(
        "_m",
        "device",
        "ts_ns",
        end_ns=pl.col("ts_ns") + pl.col("dur_ns").fill_null(0),
        comm=pl.col("category").fill_null("") == "communication",
    )
    with_kernels = k_rows["_m"].unique()
    by = ["_m", INTERVAL, "device"]
    by_start = intervals.sort("step_ts_ns")  # join_asof's order (by member: `by="_m"`)
    k_in = in_steps(k_rows, by_start, by="_m")
    with_k = kernel_cover_ns(k_in, by)
    work = _work(gloo_only)  # a CPU-only trace's steps are measured by its collectives' work
    comm = union_ns(in_steps(work, by_start, by="_m"), ["_m", INTERVAL]).collect().rename({"covered_ns": "comm_ns"})
    cpu_only = (
        intervals.filter(~pl.col("_m").is_in(with_kernels.implode()))
        .join(comm, on=["_m", INTERVAL], how="left")
        .select(
            "_m",
            INTERVAL,
            device=pl.lit(None, pl.Int64),
            kernel_ns=pl.lit(None, pl.Int64),
            compute_ns=pl.lit(None, pl.Int64),
            comm_ns=pl.col("comm_ns").fill_null(0).cast(pl.Int64),
            exposed_comm_ns=pl.lit(None, pl.Int64),
        )
    )
    rows = pl.concat([with_k.select(cpu_only.columns), cpu_only], how="vertical_relaxed")
    steps = (
        intervals.join(rows, on=["_m", INTERVAL], how="left")
        .select("_m", *(pl.col(c).cast(dt) for c, dt in STEPS_SCHEMA.items()))
        .sort("_m", "step_ts_ns", "device", nulls_last=True)
    )
    if got["steps"]:  # in member order, those of the members measured alone in their places
        steps_parts = [steps.filter(~pl.col("_m").is_in(list(got["steps"])))] + [
            store.frame_from_arrow(tbl).with_columns(_m=pl.lit(k, pl.Int64)) for k, tbl in got["steps"].items()
        ]
        steps = pl.concat([p.select(steps.columns) for p in steps_parts], how="vertical_relaxed").sort(
            "_m", maintain_order=True
        )
    coll = [(k, tbl) for k, tbl in sorted(got["collectives"].items()) if tbl.num_rows]  # in member order
    coll_tbl = pa.concat_tables([tbl for _, tbl in coll]) if coll else _empty_stage("collectives")
    coll_owner = (
        np.concatenate([np.full(tbl.num_rows, k, np.int64) for k, tbl in coll]) if coll else np.zeros(0, np.int64)
    )
    return coll_tbl, coll_owner, steps.drop("_m").to_arrow(), steps["_m"].to_numpy()


def _work(made: dict[int, pa.Table]) -> pl.DataFrame:
    """(ts_ns, end_ns, _m) of the members' collectives `made` (by member)."""
    ks = sorted(made)
    times = [made[k].select(["ts_ns", "end_ns"]) for k in ks] or [
        _empty_stage("collectives").select(["ts_ns", "end_ns"])
    ]
    owner = np.repeat(np.array(ks, dtype=np.int64), [made[k].num_rows for k in ks])
    return store.frame_from_arrow(pa.concat_tables(times)).with_columns(_m=pl.Series(owner, dtype=pl.Int64))


# what the collectives of a group's members read of their tables
_READS = {
    "events": ["event_idx", "ph", "cat", "name", "pid", "tid", "ts_ns", "dur_ns", "args_json"],
    "gpu_ops": ["event_idx", "kind", "name", "device", "stream", "ts_ns", "dur_ns", "launch_event_idx", "launch_ts_ns"],
}


def _worlds(infos: dict[int, dict]) -> dict[int | None, list[int]]:
    """The members by the world size their trace's `distributedInfo` (`infos`, by member) says (the
    group size of a collective whose group says none): each world's made in one call."""
    from pipeline.runs.collectives import world_size

    worlds: dict[int | None, list[int]] = {}
    for k, info in infos.items():
        worlds.setdefault(world_size(info), []).append(k)
    return worlds


def _banded(t: Tables, some: list[int]) -> dict[str, pl.DataFrame]:
    """The rows of the members `some`, as their own files read (`_READS`), with whatever the
    collectives join on moved to each member's band (`bands.BAND`): event_idx, launch_event_idx,
    pid and device."""
    from pipeline.dataset.group.bands import BAND

    chosen = np.zeros(t.n, dtype=bool)
    chosen[some] = True
    tables = {}
    for name, columns in _READS.items():
        rows = np.flatnonzero(chosen[t.owner[name]])
        stages = ("flatten",) if name == "events" else schema.ALL_STAGES  # as a member's own files
        frame = store.frame_from_arrow(schema.conform(t.tables[name].take(rows), name, stages))
        band = pl.Series(t.owner[name][rows] * BAND, dtype=pl.Int64)
        moved = ["event_idx", *(("launch_event_idx", "device") if name == "gpu_ops" else ("pid",))]
        tables[name] = frame.select(columns).with_columns(pl.col(c) + band for c in moved)
    return tables


def _as_members(
    made: pl.DataFrame, tables: dict, members: list[Member], some: list[int], problems: dict[int, dict]
) -> dict[int, pa.Table]:
    """The collectives `made` of the members `some` together, each member's as it makes them alone:
    ids back from its band, its rank, its numbers in each group (`seq`), its steps (its own
    ProfilerSteps); its problems counted in its row (`problems`: any found per member before, in
    the order its trace would count them). Each member's rows are a slice of one table."""
    from pipeline.dataset.group.bands import BAND
    from pipeline.runs.collectives import PROFILER_STEP, SEQ_GROUP, STEP_INTERVAL, UNKNOWN_KIND, with_steps
    from pipeline.runs.tables import count_problems

    member, columns = pl.col("event_idx") // BAND, made.columns
    made = made.with_columns(_m=member).with_columns(
        *(pl.col(c) - pl.col("_m") * BAND for c in ("event_idx", "pid", "device")),
        rank=pl.col("_m").replace_strict({k: members[k].row.get("rank") for k in some}, return_dtype=pl.Int64),
        # numbered in each group of each member, in (ts_ns, event_idx) order as made
        seq=pl.int_range(pl.len(), dtype=pl.Int64).over("_m", *SEQ_GROUP),
    )
    steps = tables["events"].filter(PROFILER_STEP).select(*STEP_INTERVAL, _m=member).sort("_m", "step_ts_ns")
    made = with_steps(made.drop("step"), steps, by="_m").sort("_m", "ts_ns", "event_idx")
    unknown = dict(made.group_by("_m").agg((pl.col("kind") == "unknown").sum()).iter_rows())
    at = np.searchsorted(made["_m"].to_numpy(), [*some, max(some, default=0) + 1])  # `some` ascending
    whole = schema.conform(made.select(columns).to_arrow(), "collectives", schema.ALL_STAGES)
    out: dict[int, pa.Table] = {}
    for i, k in enumerate(some):
        lo, rows, n = int(at[i]), int(at[i + 1] - at[i]), unknown.get(k, 0)
        count_problems(members[k].row, {**problems.get(k, {}), **({UNKNOWN_KIND: n} if n else {})}, rows)
        out[k] = whole.slice(lo, rows)
    return out


def _nccl_together(members: list[Member], t: Tables, ks: list[int]) -> dict[int, pa.Table]:
    """The collectives of the members `ks` (NCCL/RCCL kernels; their steps are measured by their
    kernels), made by one `runs.collectives` call per world size over their rows together, each
    as `runs.tables.collectives_table` makes them alone, its row counted as there. Measured one
    member at a time they took ~37 ms each, a few dozen small queries, most of a group's time.

    Whatever the collectives join on is made the member's own (`_banded`: a member whose devices
    do not fit a band is measured alone); the rest depends on one trace's rows and is done again
    per member (`_as_members`)."""
    from pipeline.dataset.group.bands import ID_LIMIT
    from pipeline.runs.collectives import collectives
    from pipeline.runs.tables import distributed_info

    if not ks:
        return {}
    gpu_owner = t.owner["gpu_ops"]
    device = t.tables["gpu_ops"].column("device").to_numpy(zero_copy_only=False).astype(np.float64)
    far = np.unique(gpu_owner[~np.isnan(device) & (np.abs(device) >= ID_LIMIT)])
    ks = [k for k in ks if k not in set(far.tolist())]
    out: dict[int, pa.Table] = {}
    for world, some in _worlds({k: distributed_info(members[k].row) for k in ks}).items():
        tables = _banded(t, some)
        made, _ = collectives(tables, None, {"world_size": world})
        out.update(_as_members(made, tables, members, some, {}))
    return out


def _gloo_together(members: list[Member], t: Tables, ks: list[int]) -> dict[int, pa.Table]:
    """The collectives of the members `ks` (gloo work, no kernels: their steps are measured by
    these), made together as `_nccl_together` makes NCCL's. What is one trace's own: which process
    group each of its runloop threads serves (its threads in creation order, shared out among its
    pg_config's groups) and how many of its works ran on a thread no group was given. One at a
    time, a small CPU-only trace's collectives and steps took ~26 ms: 15 ms a trace of a batch.
    A member with HCCL collectives (which come before gloo's) is left out, to be made alone."""
    from pipeline.dataset.group.bands import BAND, ID_LIMIT
    from pipeline.runs.collectives import (
        HCCL_OP,
        IS_GLOO_WORK,
        UNOWNED_GLOO,
        collectives,
        gloo_groups_of_threads,
        runloop_threads,
    )
    from pipeline.runs.tables import distributed_info

    infos = {k: distributed_info(members[k].row) for k in ks}
    out: dict[int, pa.Table] = {}
    for world, some in _worlds(infos).items():
        tables = _banded(t, some)
        hccl = set((tables["events"].filter(HCCL_OP)["event_idx"] // BAND).to_list())
        if hccl:  # their rows left out
            some = [k for k in some if k not in hccl]
            tables = {n: f.filter(~(pl.col("event_idx") // BAND).is_in(list(hccl))) for n, f in tables.items()}
        threads: dict[int, list] = {}
        for pid, tid in runloop_threads(tables):  # pids within +-ID_LIMIT of their band (`bands.fits`)
            threads.setdefault((pid + ID_LIMIT) // BAND, []).append((pid, tid))
        groups: dict = {}
        for k, mine in threads.items():
            pg_config = infos[k].get("pg_config")
            groups.update(gloo_groups_of_threads(mine, pg_config if isinstance(pg_config, list) else []))
        owned = pl.DataFrame(list(groups), schema={"pid": pl.Int64, "tid": pl.Int64}, orient="row")
        unowned = (
            tables["events"]
            .filter(IS_GLOO_WORK)
            .join(owned, on=["pid", "tid"], how="anti")
            .group_by(_m=pl.col("event_idx") // BAND)
            .len()
        )
        problems = {k: {UNOWNED_GLOO: n} for k, n in unowned.iter_rows()}
        made, _ = collectives(tables, None, {"world_size": world}, threads_groups=groups)
        out.update(_as_members(made, tables, members, some, problems))
    return out
