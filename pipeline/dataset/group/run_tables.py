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
    its collectives from `runs.tables` itself, over its rows of the group's tables in memory; the
    others have none. Steps are measured by the kernels of a trace that has some, for every such
    member in one query keyed by member (`runs.steps.steps` per trace: ~14 ms each of the ~50 ms
    of an NCCL member's run tables); a member without kernels but with collectives (gloo)
    measures its steps by them, alone."""
    from pipeline.kineto import ANNOTATION_CATS
    from pipeline.runs.collectives import GLOO_WORK, NCCL_KERNEL, PROFILER_STEP, STEP_INTERVAL
    from pipeline.runs.steps import INTERVAL, IS_KERNEL, union_ns
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
    annotation = pl.col("cat").str.to_lowercase().is_in(ANNOTATION_CATS) & pl.col("ts_ns").is_not_null()
    gloo = events.filter(annotation & pl.col("name").str.contains(GLOO_WORK))["_m"]
    nccl = kernels.filter(
        (pl.col("kind") == "kernel") & pl.col("name").str.contains(NCCL_KERNEL) & pl.col("ts_ns").is_not_null()
    )["_m"]
    alone = sorted(set(gloo.to_list()) | set(nccl.to_list()))
    has_kernels = set(kernels.filter(IS_KERNEL)["_m"].unique().to_list())
    got: dict[str, dict[int, pa.Table]] = {"collectives": {}, "steps": {}}
    stages = {"events": ("flatten",), "gpu_ops": schema.ALL_STAGES, "flows": ("flatten",)}
    starts = {n: t.starts(n) for n in stages}
    for k, frame in _nccl_together(members, t, sorted(set(nccl.to_list()) & has_kernels)).items():
        got["collectives"][k] = schema.conform(frame.to_arrow(), "collectives", schema.ALL_STAGES)
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
    k_in = (
        k_rows.sort("ts_ns")
        .join_asof(
            intervals.sort("step_ts_ns"),
            left_on="ts_ns",
            right_on="step_ts_ns",
            by="_m",
            strategy="backward",
            check_sortedness=False,
        )
        .with_columns(step=pl.when(pl.col("ts_ns") <= pl.col("step_end_ns")).then(pl.col("step")))
        .drop("step_ts_ns", "step_end_ns")
        .filter(pl.col("step").is_not_null())
    )
    covered = k_in.lazy().select(by).unique()
    for name, lf in (
        ("kernel_ns", union_ns(k_in, by)),
        ("compute_ns", union_ns(k_in.filter(~pl.col("comm")), by)),
        ("comm_ns", union_ns(k_in.filter(pl.col("comm")), by)),
    ):
        covered = covered.join(lf.rename({"covered_ns": name}), on=by, how="left")
    covered = covered.with_columns(pl.col("kernel_ns", "compute_ns", "comm_ns").fill_null(0))
    with_k = covered.with_columns(exposed_comm_ns=pl.col("kernel_ns") - pl.col("compute_ns")).collect()
    cpu_only = intervals.filter(~pl.col("_m").is_in(with_kernels.implode())).select(
        "_m",
        INTERVAL,
        device=pl.lit(None, pl.Int64),
        kernel_ns=pl.lit(None, pl.Int64),
        compute_ns=pl.lit(None, pl.Int64),
        comm_ns=pl.lit(0, pl.Int64),
        exposed_comm_ns=pl.lit(None, pl.Int64),
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


# what the collectives of NCCL/RCCL kernels read of a trace's tables
_NCCL_READS = {
    "events": ["event_idx", "ph", "cat", "name", "pid", "tid", "ts_ns", "dur_ns", "args_json"],
    "gpu_ops": ["event_idx", "kind", "name", "device", "stream", "ts_ns", "dur_ns", "launch_event_idx", "launch_ts_ns"],
}


def _nccl_together(members: list[Member], t: Tables, ks: list[int]) -> dict[int, pl.DataFrame]:
    """The collectives of the members `ks` (NCCL/RCCL kernels; their steps are measured by their
    kernels), made by one `runs.collectives` call per world size over their rows together, each
    as `runs.tables.collectives_table` makes them alone, its row counted as there. Measured one
    member at a time they took ~37 ms each, a few dozen small queries, most of a group's time.

    Whatever the collectives join on is made the member's own: event_idx, launch_event_idx,
    pid and device moved to its band (`bands.BAND`: a member whose devices do not fit one is
    measured alone); the rest depends on one trace's rows and is done again per member: its
    rank, its collectives' numbers in each group (`seq`), their steps (its own ProfilerSteps)."""
    from pipeline.dataset.group.bands import BAND, ID_LIMIT
    from pipeline.runs.collectives import (
        PROFILER_STEP,
        SEQ_GROUP,
        STEP_INTERVAL,
        UNKNOWN_KIND,
        collectives,
        with_steps,
        world_size,
    )
    from pipeline.runs.tables import count_problems, distributed_info

    if not ks:
        return {}
    gpu_owner = t.owner["gpu_ops"]
    device = t.tables["gpu_ops"].column("device").to_numpy(zero_copy_only=False).astype(np.float64)
    far = np.unique(gpu_owner[~np.isnan(device) & (np.abs(device) >= ID_LIMIT)])
    ks = [k for k in ks if k not in set(far.tolist())]
    worlds: dict[int | None, list[int]] = {}
    for k in ks:
        worlds.setdefault(world_size(distributed_info(members[k].row)), []).append(k)
    out: dict[int, pl.DataFrame] = {}
    for world, some in worlds.items():
        chosen = np.zeros(t.n, dtype=bool)
        chosen[some] = True
        tables = {}
        for name, columns in _NCCL_READS.items():
            rows = np.flatnonzero(chosen[t.owner[name]])
            stages = ("flatten",) if name == "events" else schema.ALL_STAGES  # as a member's own files
            frame = store.frame_from_arrow(schema.conform(t.tables[name].take(rows), name, stages))
            band = pl.Series(t.owner[name][rows] * BAND, dtype=pl.Int64)
            moved = ["event_idx", *(("launch_event_idx", "device") if name == "gpu_ops" else ("pid",))]
            tables[name] = frame.select(columns).with_columns(pl.col(c) + band for c in moved)
        made, _ = collectives(tables, None, {"world_size": world})
        member, columns = pl.col("event_idx") // BAND, made.columns
        made = made.with_columns(_m=member).with_columns(
            *(pl.col(c) - pl.col("_m") * BAND for c in ("event_idx", "pid", "device")),
            rank=pl.col("_m").replace_strict({k: members[k].row.get("rank") for k in some}, return_dtype=pl.Int64),
            # numbered in each group of each member, in (ts_ns, event_idx) order as made
            seq=pl.int_range(pl.len(), dtype=pl.Int64).over("_m", *SEQ_GROUP),
        )
        steps = tables["events"].filter(PROFILER_STEP).select(*STEP_INTERVAL, _m=member).sort("_m", "step_ts_ns")
        made = with_steps(made.drop("step"), steps, by="_m").sort("_m", "ts_ns", "event_idx")
        for key, mine in made.partition_by("_m", as_dict=True, include_key=False).items():
            k, mine = int(key[0]), mine.select(columns)
            unknown = mine.filter(pl.col("kind") == "unknown").height
            count_problems(members[k].row, {UNKNOWN_KIND: unknown} if unknown else {}, mine.height)
            out[k] = mine
        for k in set(some) - set(out):  # no collective made of its kernels
            count_problems(members[k].row, {}, 0)
            out[k] = made.select(columns).clear()
    return out
