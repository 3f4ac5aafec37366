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
    them from `runs.tables.run_tables` itself, over its rows of the group's tables in memory; the
    others have no collectives, and their steps come from one query keyed by member
    (`runs.steps.steps`)."""
    from pipeline.kineto import ANNOTATION_CATS, STEP_CATS, STEP_NAME
    from pipeline.runs.collectives import GLOO_WORK, NCCL_KERNEL
    from pipeline.runs.steps import INTERVAL, union_ns
    from pipeline.runs.steps import SCHEMA as STEPS_SCHEMA
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
    got: dict[str, dict[int, pa.Table]] = {"collectives": {}, "steps": {}}
    stages = {"events": ("flatten",), "gpu_ops": schema.ALL_STAGES, "flows": ("flatten",)}
    starts = {n: t.starts(n) for n in stages}
    for k in alone:  # each member's own rows, as its files would read (no scratch files: 2-3x slower)
        member = {
            name: store.frame_from_arrow(
                schema.conform(t.tables[name].slice(at[k], at[k + 1] - at[k]), name, stages[name])
            )
            for name, at in starts.items()
        }
        for name, frame in zip(got, member_run_tables(member, members[k].row)):
            got[name][k] = schema.conform(frame.to_arrow(), name, schema.ALL_STAGES)
    rest = [k for k in range(len(members)) if k not in set(alone)]
    for k in rest:
        members[k].row["n_collectives"] = 0
    intervals = (
        events.filter(
            pl.col("_m").is_in(rest)
            & pl.col("cat").str.to_lowercase().is_in(STEP_CATS)
            & pl.col("ts_ns").is_not_null()
            & pl.col("name").str.contains(STEP_NAME)
        )
        .select("_m", step="name", step_ts_ns="ts_ns", step_end_ns=pl.col("ts_ns") + pl.col("dur_ns").fill_null(0))
        .sort("_m", "step_ts_ns")
        .with_row_index(INTERVAL)  # measures are keyed by interval, not by name (`runs.steps`)
    )
    k_rows = kernels.filter(pl.col("_m").is_in(rest) & (pl.col("kind") == "kernel") & pl.col("ts_ns").is_not_null())
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
    if alone:  # in member order, those of the members run alone in their places
        steps_parts = [steps.filter(~pl.col("_m").is_in(alone))] + [
            store.frame_from_arrow(tbl).with_columns(_m=pl.lit(k, pl.Int64)) for k, tbl in got["steps"].items()
        ]
        steps = pl.concat([p.select(steps.columns) for p in steps_parts], how="vertical_relaxed").sort(
            "_m", maintain_order=True
        )
    coll = [(k, tbl) for k, tbl in got["collectives"].items() if tbl.num_rows]
    coll_tbl = pa.concat_tables([tbl for _, tbl in coll]) if coll else _empty_stage("collectives")
    coll_owner = (
        np.concatenate([np.full(tbl.num_rows, k, np.int64) for k, tbl in coll]) if coll else np.zeros(0, np.int64)
    )
    return coll_tbl, coll_owner, steps.drop("_m").to_arrow(), steps["_m"].to_numpy()
