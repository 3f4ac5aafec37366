"""collectives: one row per collective call on one rank, from a flattened (linked) trace.

Sources, in order:
- the GPU kernels of NCCL/RCCL (name holds `nccl` or `rccl`): kind, sizes, dtype and process group
  from the kernel's args (`Collective name`, `In msg nelems`, ...), else from the communication CPU
  op around its launch (`record_param_comms` args, else a `c10d::` / `nccl:` op's name), else from
  the kernel's name (`ncclKernel_AllReduce_RING_LL_Sum_float`); a kernel with none of these is a
  collective of unknown kind (NCCL >= 2.19 names every kernel `ncclDevKernel_Generic`, and kernels
  of a first iteration may carry no args), kept for matching. A kernel without a process group
  takes the one the other kernels of its stream name (one NCCL communicator, one stream).
- without such kernels, gloo's work: the `gloo:*` annotations on `pt_gloo_runloop` threads (the
  blocking part of a CPU collective, where waiting shows). A rank's process groups (`distributedInfo
  .pg_config`, in creation order) own its runloop threads in creation (tid) order, an equal number
  each; nothing else in a trace says which group a gloo thread serves.
`seq` numbers a process group's collectives on the rank in start order; `step` is the
`ProfilerStep#N` whose interval holds the start.
"""

from __future__ import annotations

import re
from pathlib import Path

import orjson
import polars as pl

from pipeline.cost.formulas.collectives import normalize_kind
from pipeline.cost.formulas.dtypes import DTYPE_SIZE, normalize_dtype
from pipeline.kineto import ANNOTATION_CATS, CPU_OP_CATS, STEP_CATS, STEP_NAME

NCCL_KERNEL = r"(?i)nccl|rccl"
COMM_OP = r"^(?:c10d::|_c10d_functional::|nccl:|rccl:|record_param_comms$)"
GLOO_WORK = r"^gloo:"
RUNLOOP_THREAD = "pt_gloo_runloop"
# kernel name -> kind, for kernels whose args and CPU ops say nothing (older layouts)
KERNEL_KINDS = (
    ("AllReduce", "allreduce"),
    ("AllGather", "allgather"),
    ("ReduceScatter", "reducescatter"),
    ("AllToAll", "alltoall"),
    ("Broadcast", "broadcast"),
    ("SendRecv", "sendrecv"),
    ("Send", "sendrecv"),
    ("Recv", "sendrecv"),
    ("Reduce", "reduce"),
)
ARG_KEYS = {
    "collective": "Collective name",
    "in_nelems": "In msg nelems",
    "out_nelems": "Out msg nelems",
    "group_size": "Group size",
    "dtype_text": "dtype",
    "pg_name": "Process Group Name",
    "pg_desc": "Process Group Description",
    "pg_ranks": "Process Group Ranks",
}
INT_ARGS = ("in_nelems", "out_nelems", "group_size")


def _arg(key: str) -> pl.Expr:
    return pl.col("args_json").str.json_path_match(f"$['{key}']")


def _args(frame: pl.DataFrame) -> pl.DataFrame:
    """The collective args of rows with `args_json` (null where absent)."""
    cols = [_arg(key).alias(name) for name, key in ARG_KEYS.items()]
    out = frame.with_columns(cols)
    return out.with_columns(pl.col(c).cast(pl.Int64, strict=False) for c in INT_ARGS)


def _kind_from_name(name: pl.Expr) -> pl.Expr:
    """The kind an NCCL kernel's name says (None for ncclDevKernel_Generic and the like)."""
    out = pl.lit(None, pl.String)
    for pattern, kind in reversed(KERNEL_KINDS):
        out = pl.when(name.str.contains(f"(?:^|_|\\s){pattern}(?:_|\\(|$)")).then(pl.lit(kind)).otherwise(out)
    return out


def _kind(raw: pl.Expr) -> pl.Expr:
    return raw.map_elements(normalize_kind, return_dtype=pl.String, skip_nulls=True)


def _events(flat_dir: Path, where: pl.Expr, columns: list) -> pl.DataFrame:
    return pl.scan_parquet(flat_dir / "events.parquet").filter(where).select(columns).collect(engine="streaming")


# ------------------------------------------------------------------ NCCL / RCCL kernels
def _comm_ops(flat_dir: Path) -> pl.DataFrame:
    """Communication CPU ops (thread, start, end, kind and pg args) in start order."""
    ops = _events(
        flat_dir,
        pl.col("cat").str.to_lowercase().is_in(CPU_OP_CATS)
        & pl.col("name").str.contains(COMM_OP)
        & pl.col("ts_ns").is_not_null(),
        ["pid", "tid", "ts_ns", (pl.col("ts_ns") + pl.col("dur_ns").fill_null(0)).alias("end_ns"), "name", "args_json"],
    )
    return (
        _args(ops)
        .with_columns(
            op_kind=pl.coalesce(
                _kind(pl.col("collective")), pl.when(pl.col("name") != "record_param_comms").then(_kind(pl.col("name")))
            )
        )
        .sort("ts_ns")
    )


def _around_launch(
    kernels: pl.DataFrame, ops: pl.DataFrame, which: pl.Expr, prefix: str, columns: list[str]
) -> pl.DataFrame:
    """For each kernel, `columns` of the last op (of those `which` selects) that started at or
    before its launch on the launch's thread and was still running then (else null)."""
    chosen = ops.filter(which).select("pid", "tid", *columns, op_ts="ts_ns", op_end="end_ns")
    joined = kernels.sort("launch_ts_ns").join_asof(
        chosen, left_on="launch_ts_ns", right_on="op_ts", by=["pid", "tid"], strategy="backward", check_sortedness=False
    )
    inside = pl.col("op_end") >= pl.col("launch_ts_ns")
    return joined.select("event_idx", *(pl.when(inside).then(pl.col(c)).alias(f"{prefix}{c}") for c in columns))


def _nccl_kernels(flat_dir: Path) -> pl.DataFrame:
    g = (
        pl.scan_parquet(flat_dir / "gpu_ops.parquet")
        .filter((pl.col("kind") == "kernel") & pl.col("name").str.contains(NCCL_KERNEL) & pl.col("ts_ns").is_not_null())
        .select(
            "event_idx",
            "name",
            "device",
            "stream",
            "ts_ns",
            pl.col("dur_ns").fill_null(0),
            "launch_event_idx",
            "launch_ts_ns",
        )
        .collect(engine="streaming")
    )
    if not g.height:
        return g
    args = _events(flat_dir, pl.col("event_idx").is_in(g["event_idx"].implode()), ["event_idx", "args_json"])
    g = _args(g.join(args, on="event_idx", how="left"))
    launches = _events(
        flat_dir,
        pl.col("event_idx").is_in(g["launch_event_idx"].drop_nulls().implode()),
        [pl.col("event_idx").alias("launch_event_idx"), "pid", "tid"],
    )
    k = g.join(launches, on="launch_event_idx", how="left")
    ops = _comm_ops(flat_dir)
    launched = k.filter(pl.col("launch_ts_ns").is_not_null() & pl.col("pid").is_not_null())
    keys = ["collective", "in_nelems", "out_nelems", "group_size", "dtype_text", "pg_name", "pg_desc", "pg_ranks"]
    informed = _around_launch(launched, ops, pl.col("collective").is_not_null(), "rpc_", [*keys, "op_kind"])
    named = _around_launch(
        launched,
        ops.rename({"name": "op"}),
        pl.col("op").str.starts_with("record_param_comms").not_() & pl.col("op_kind").is_not_null(),
        "c10d_",
        ["op_kind", "op"],
    )
    k = (
        k.join(informed, on="event_idx", how="left")
        .join(named, on="event_idx", how="left")
        .with_columns(pl.coalesce(c, f"rpc_{c}").alias(c) for c in keys)
    )
    return k.with_columns(
        kind=pl.coalesce(_kind(pl.col("collective")), "rpc_op_kind", "c10d_op_kind", _kind_from_name(pl.col("name"))),
        op_name=pl.coalesce("c10d_op", pl.when(pl.col("rpc_op_kind").is_not_null()).then(pl.lit("record_param_comms"))),
        source=pl.lit("gpu_kernel"),
    )


def _pg_of_stream(k: pl.DataFrame) -> pl.DataFrame:
    """Kernels without a process group get the one most kernels of their stream name (ties: the first)."""
    pg = ["pg_name", "pg_desc", "pg_ranks", "group_size"]
    named = (
        k.filter(pl.col("pg_ranks").is_not_null() | pl.col("pg_name").is_not_null())
        .group_by("device", "stream", *pg)
        .agg(n=pl.len(), first=pl.col("ts_ns").min())
        .sort("n", "first", descending=[True, False])
        .group_by("device", "stream", maintain_order=True)
        .agg(pl.col(c).first().alias(f"stream_{c}") for c in pg)
    )
    k = k.join(named, on=["device", "stream"], how="left")
    unnamed = pl.col("pg_ranks").is_null() & pl.col("pg_name").is_null()
    return k.with_columns(pl.when(unnamed).then(pl.col(f"stream_{c}")).otherwise(pl.col(c)).alias(c) for c in pg)


# ------------------------------------------------------------------ gloo work on runloop threads
def _runloop_threads(flat_dir: Path) -> list[tuple[int, int]]:
    """(pid, tid) of the threads any of whose names says pt_gloo_runloop, in creation (tid) order."""
    names = _events(
        flat_dir,
        (pl.col("ph") == "M") & (pl.col("name") == "thread_name"),
        ["pid", "tid", pl.col("args_json").str.json_path_match("$.name").alias("thread")],
    )
    runloop = names.filter(pl.col("thread").str.contains(RUNLOOP_THREAD)).select("pid", "tid").unique()
    return sorted(runloop.drop_nulls().iter_rows())


def _gloo_pg_of_threads(threads: list[tuple[int, int]], pg_config: list) -> dict:
    """(pid, tid) -> pg_config entry: the groups' threads in creation order, an equal share each;
    {} when the threads do not divide evenly among the groups."""
    groups = [g for g in pg_config if isinstance(g, dict)]
    if not groups or not threads or len(threads) % len(groups):
        return {}
    share = len(threads) // len(groups)
    return {t: groups[i // share] for i, t in enumerate(threads)}


def _gloo_works(flat_dir: Path, pg_config: list) -> tuple[pl.DataFrame, int]:
    """gloo:* annotations as collectives; and how many ran on threads no group could be given."""
    works = _events(
        flat_dir,
        pl.col("cat").str.to_lowercase().is_in(ANNOTATION_CATS)
        & pl.col("name").str.contains(GLOO_WORK)
        & pl.col("ts_ns").is_not_null(),
        ["event_idx", "name", "pid", "tid", "ts_ns", pl.col("dur_ns").fill_null(0), "args_json"],
    )
    if not works.height:
        return works, 0
    owner = _gloo_pg_of_threads(_runloop_threads(flat_dir), pg_config)
    rows = [_gloo_pg(owner.get((pid, tid))) for pid, tid in works.select("pid", "tid").iter_rows()]
    pg = pl.DataFrame(
        rows,
        schema={"pg_name": pl.String, "pg_desc": pl.String, "pg_ranks": pl.String, "group_size": pl.Int64},
        orient="row",
    )
    dims = pl.col("args_json").str.json_path_match("$['Input Dims']")
    out = pl.concat([works, pg], how="horizontal").with_columns(
        kind=_kind(pl.col("name")),
        in_nelems=dims.map_elements(_numel, return_dtype=pl.Int64, skip_nulls=True),
        dtype_text=pl.col("args_json").str.json_path_match("$['Input type'][0]"),
        out_nelems=pl.lit(None, pl.Int64),
        source=pl.lit("gloo_work"),
        op_name=pl.lit(None, pl.String),
        device=pl.lit(None, pl.Int64),
        stream=pl.lit(None, pl.Int64),
        collective=pl.col("name").str.strip_prefix("gloo:"),
    )
    return out, sum(1 for pid, tid in works.select("pid", "tid").iter_rows() if (pid, tid) not in owner)


def _gloo_pg(group: dict | None) -> tuple:
    if group is None:
        return (None, None, None, None)
    ranks = group.get("ranks")
    size = group.get("pg_size")
    return (
        str(group.get("pg_name")) if group.get("pg_name") is not None else None,
        group.get("pg_desc") if isinstance(group.get("pg_desc"), str) else None,
        str(ranks) if isinstance(ranks, list) else None,
        size if type(size) is int else None,
    )


def _numel(dims_text: str) -> int | None:
    """Elements of the first input of an `Input Dims` text (`[[2632]]` -> 2632)."""
    try:
        dims = orjson.loads(dims_text)
    except orjson.JSONDecodeError:
        return None
    first = dims[0] if isinstance(dims, list) and dims else None
    if not isinstance(first, list) or not all(type(d) is int and d >= 0 for d in first):
        return None
    n = 1
    for d in first:
        n *= d
    return n


# ------------------------------------------------------------------ the table
def _message_bytes() -> pl.Expr:
    """nccl-tests' size: the gathered output of allgather, the scattered input of reducescatter,
    the send buffer of alltoall, the buffer of the others (group size x a shard when only it is known)."""
    size = pl.col("dtype").replace_strict(DTYPE_SIZE, default=None, return_dtype=pl.Int64)
    gathered = pl.coalesce("out_nelems", pl.col("in_nelems") * pl.col("group_size"))
    nelems = (
        pl.when(pl.col("kind") == "allgather")
        .then(gathered)
        .when(pl.col("kind") == "reducescatter")
        .then(pl.coalesce("in_nelems", pl.col("out_nelems") * pl.col("group_size")))
        .otherwise(pl.coalesce("in_nelems", "out_nelems"))
    )
    return pl.when(pl.col("kind") != "barrier").then(nelems * size)


def profiler_steps(flat_dir: Path) -> pl.DataFrame:
    """ProfilerStep#N intervals (step, step_ts_ns, step_end_ns) in start order."""
    return _events(
        flat_dir,
        pl.col("cat").str.to_lowercase().is_in(STEP_CATS)
        & pl.col("name").str.contains(STEP_NAME)
        & pl.col("ts_ns").is_not_null(),
        [
            pl.col("name").alias("step"),
            pl.col("ts_ns").alias("step_ts_ns"),
            (pl.col("ts_ns") + pl.col("dur_ns").fill_null(0)).alias("step_end_ns"),
        ],
    ).sort("step_ts_ns")


def with_steps(rows: pl.DataFrame, steps: pl.DataFrame, start: str = "ts_ns") -> pl.DataFrame:
    """Rows with `step`: the ProfilerStep whose interval holds their start (null outside every step)."""
    if not steps.height:
        return rows.with_columns(step=pl.lit(None, pl.String))
    j = rows.sort(start).join_asof(
        steps, left_on=start, right_on="step_ts_ns", strategy="backward", check_sortedness=False
    )
    return j.with_columns(step=pl.when(pl.col(start) <= pl.col("step_end_ns")).then(pl.col("step"))).drop(
        "step_ts_ns", "step_end_ns"
    )


COLUMNS = [
    "event_idx",
    "rank",
    "source",
    "name",
    "op_name",
    "kind",
    "collective",
    "pg_name",
    "pg_desc",
    "pg_ranks",
    "pg_size",
    "seq",
    "dtype",
    "in_nelems",
    "out_nelems",
    "bytes",
    "ts_ns",
    "dur_ns",
    "end_ns",
    "pid",
    "tid",
    "device",
    "stream",
    "step",
]


def collectives(flat_dir: Path, rank: int | None, distributed: dict) -> tuple[pl.DataFrame, dict]:
    """The `collectives` table of one flattened trace (schemas/collectives.toml), and counts of what
    could not be classified, by reason."""
    flat_dir = Path(flat_dir)
    problems: dict[str, int] = {}
    rows = _nccl_kernels(flat_dir)
    if rows.height:
        rows = _pg_of_stream(rows)
    else:
        pg_config = distributed.get("pg_config")
        rows, unowned = _gloo_works(flat_dir, pg_config if isinstance(pg_config, list) else [])
        if unowned:
            problems["gloo_work_without_process_group"] = unowned
    if not rows.height:
        return pl.DataFrame(schema=_schema()), problems
    unknown = rows.filter(pl.col("kind").is_null()).height
    if unknown:
        problems["collective_of_unknown_kind"] = unknown
    world = distributed.get("world_size") if type(distributed.get("world_size")) is int else None
    out = rows.with_columns(
        kind=pl.col("kind").fill_null("unknown"),
        rank=pl.lit(rank, pl.Int64),
        dtype=pl.col("dtype_text").map_elements(normalize_dtype, return_dtype=pl.String, skip_nulls=True),
        pg_size=pl.coalesce(
            "group_size",
            pl.col("pg_ranks").map_elements(_count_ranks, return_dtype=pl.Int64, skip_nulls=True),
            pl.lit(world, pl.Int64),
        ),
        end_ns=pl.col("ts_ns") + pl.col("dur_ns"),
    )
    out = out.with_columns(bytes=_message_bytes())
    out = out.sort("ts_ns", "event_idx").with_columns(
        seq=pl.int_range(pl.len(), dtype=pl.Int64).over(
            pl.col("pg_name").fill_null(""), pl.col("pg_ranks").fill_null("")
        )
    )
    out = with_steps(out, profiler_steps(flat_dir))
    return out.select(pl.col(c).cast(t) for c, t in _schema().items()).sort("ts_ns", "event_idx"), problems


def _count_ranks(text: str) -> int | None:
    found = re.findall(r"-?\d+", text)
    return len(found) or None


def _schema() -> dict:
    from pipeline import schema

    return {
        c.name: {"int64": pl.Int64, "string": pl.String, "dict": pl.String, "float64": pl.Float64}[c.type]
        for c in schema.table("collectives").columns
    }
