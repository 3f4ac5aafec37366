"""collectives: one row per collective call on one rank, from a flattened (linked) trace.

Sources, in order:
- the GPU kernels of a process group's collectives (`comm_kernels.COLLECTIVE_KERNEL`: NCCL, RCCL):
  kind and process group from the kernel's args (`Collective name`, `Process Group Name`...), else
  from the communication CPU events around its launch (`record_param_comms` args, else the name of
  an `nccl:*` annotation or a `c10d::` op), else from the kernel's name
  (`ncclKernel_AllReduce_RING_LL_Sum_float`); a kernel with none of these is a collective of
  unknown kind (NCCL >= 2.19 names every kernel `ncclDevKernel_Generic`, and kernels of a first
  iteration may carry no args), kept for matching. Its message size comes from the first of
  `messages.SIZE_SOURCES` that has it (the kernel's args; the `nccl:*` annotation, the
  `record_param_comms` and the `c10d::` op around its launch; the calls a coalesced group holds;
  the kernel's name for the dtype), as `messages.SIZE_RULE` counts it. A kernel without a process
  group takes the one the other kernels of its stream name (one NCCL communicator, one stream).
- without such kernels, gloo's work: the `gloo:*` annotations on `pt_gloo_runloop` threads (the
  blocking part of a CPU collective, where waiting shows). A rank's process groups (`distributedInfo
  .pg_config`, in creation order) own its runloop threads in creation (tid) order, an equal number
  each; nothing else in a trace says which group a gloo thread serves.
`seq` numbers a process group's collectives on the rank in start order; `step` is the
`ProfilerStep#N` whose interval holds the start.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import astuple
from pathlib import Path
from typing import Any

import orjson
import polars as pl

from pipeline.comms import (
    ARG_KEYS,
    COMM_OP,
    GLOO_WORK,
    HCCL_GROUP_LANE,
    HCCL_OP_ARGS,
    HCCL_OP_KIND,
    HCCL_TASK_ARGS,
    HCCL_TASK_LINK,
    HCCL_TASK_SIZE,
    KERNEL_KINDS,
    NCCL_KERNEL,
    PG_KEYS,
    RANK_IN_LIST,
    RUNLOOP_THREAD,
)
from pipeline.cost.formulas.collectives import normalize_kind
from pipeline.cost.formulas.dtypes import DTYPE_SIZE
from pipeline.cost.formulas.messages import (
    COMM_EVENT_ARGS,
    DEFAULT_SIZE_RULE,
    HCCL_SIZE,
    MSG_ARGS,
    SIZE_RULE,
    SIZE_SOURCES,
    Reading,
    SizeRule,
    SizeSource,
    op_message,
)
from pipeline.kineto import ANNOTATION_CATS, ARG_ALIASES, CALL_COUNTERS, CPU_OP_CATS, OP_FLOWS, STEP_CATS, STEP_NAME
from pipeline.link import nesting
from pipeline.link.links import api_call
from pipeline.link.windows import EventReach, TimeBins, TimeCells
from pipeline.read.device_tasks import device_ids as task_device_ids
from pipeline.runs import source as trace_source
from pipeline.runs.source import TraceTables

MESSAGE = tuple(f"m_{c}" for c in MSG_ARGS)  # one source's reading (m_in_nelems, ...), prefixed per source
KERNEL_ARGS = tuple(dict.fromkeys(a for s in SIZE_SOURCES if s.on == "kernel" for a in s.read.args))
OP_ARGS = tuple(
    dict.fromkeys([*COMM_EVENT_ARGS, *(a for s in SIZE_SOURCES if s.on == "coalesced" for a in s.read.args)])
)
LONG_PG_KEYS = ("pg_name", "pg_desc", "pg_ranks")  # repeated on every call, a rank list as long as the group


def _arg(key: str) -> pl.Expr:
    return pl.col("args_json").str.json_path_match(f"$['{key}']")


def _arg_texts(keys: tuple[str, ...]) -> list[pl.Expr]:
    """The texts of the args `keys` of `args_json` (columns `_arg:KEY`, what `_read` reads), as
    categoricals: they are joined onto every call and kernel of a trace, and repeat a few values
    (as strings, those of a 1.1 GB trace's 320K calls were ~60 MB more at its peak)."""
    return [_arg_text(k).cast(pl.Categorical).alias(f"_arg:{k}") for k in keys]


# a call's own numbers (`kineto.CALL_COUNTERS`), set to 0 where calls' args are compared
_ESCAPED = tuple(re.sub(r"([][\\.^$|?*+(){}])", r"\\\1", key) for key in CALL_COUNTERS)
_COUNTER = '("(?:' + "|".join(_ESCAPED) + ')":\\s*)-?[0-9][0-9.eE+-]*'


def _args_key() -> pl.Expr:
    """An event's args with its call's own numbers (External id, Ev Idx...) set to 0, as a
    categorical (`_args`): the events of a collective repeat a few args over thousands of calls, and
    `_with_args` reads each distinct one once (a trace scaled to 1 GB has 2 M gloo calls: reading 7
    args of each took 6 s). A collective's args can be kilobytes (the group's rank list); a trace
    of hundreds of thousands of collectives holds each once."""
    return pl.col("args_json").str.replace_all(_COUNTER, "${1}0").cast(pl.Categorical).alias("_args")


def _with_args(frame: pl.DataFrame, keys: tuple[str, ...], pg: bool = False) -> pl.DataFrame:
    """`frame` (with `_args_key()`) with `_arg_texts(keys)` and, with `pg`, the collective args
    (`ARG_KEYS`; the process group's as categoricals), read once per distinct `_args`; without
    `_args`."""
    columns = _arg_texts(keys)
    if pg:
        columns += [
            _arg(key).cast(pl.Categorical if name in LONG_PG_KEYS else pl.String).alias(name)
            for name, key in ARG_KEYS.items()
        ]
    said = frame.select(pl.col("_args").unique()).with_columns(args_json=pl.col("_args").cast(pl.String))
    said = said.with_columns(columns).drop("args_json")
    return frame.join(said, on="_args", how="left", nulls_equal=True, maintain_order="left").drop("_args")


def _kind_from_name(name: pl.Expr) -> pl.Expr:
    """The kind an NCCL kernel's name says (None for ncclDevKernel_Generic and the like)."""
    out = pl.lit(None, pl.String)
    for pattern, kind in reversed(KERNEL_KINDS):
        out = pl.when(name.str.contains(f"(?:^|_|\\s){pattern}(?:_|\\(|$)")).then(pl.lit(kind)).otherwise(out)
    return out


def _kind(raw: pl.Expr) -> pl.Expr:
    """The collective kind of each name (`normalize_kind`), worked out once per distinct name."""

    def kinds(names: pl.Series) -> pl.Series:
        names = names.cast(pl.String)
        distinct = names.drop_nulls().unique()
        said = [normalize_kind(n) for n in distinct]
        return names.replace_strict(distinct, said, default=None, return_dtype=pl.String)

    return raw.map_batches(kinds, return_dtype=pl.String)


def _events(flat_dir: TraceTables, where: pl.Expr, columns: list) -> pl.DataFrame:
    return trace_source.collect(flat_dir, trace_source.scan(flat_dir, "events").filter(where).select(columns))


ARGS_ROWS = 1 << 15  # events whose args are read at a time (`_events_with_args`)


def _events_with_args(flat_dir: TraceTables, ids: pl.Series, columns: list) -> pl.DataFrame:
    """`columns` and `_args_key()` of the events `ids` (sorted), read `ARGS_ROWS` at a time
    (`runs.source.collect_rows`). The args are most of a collective trace's text (a 256-rank
    group's list, ~1.2 KB on every call and kernel): read whole by the streaming engine, which
    decodes several row groups at once, the comm ops' args of a 1.1 GB trace took ~200 MB more
    than what the read gives back."""
    return trace_source.collect_rows(flat_dir, "events", ids, [*columns, _args_key()], ARGS_ROWS)


# ------------------------------------------------------------------ NCCL / RCCL kernels
def _json(text: str | None) -> Any:
    """An arg's value from json_path_match's text (JSON for lists and numbers, bare for strings)."""
    if text is None:
        return None
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return text


def _arg_text(key: str) -> pl.Expr:
    """An event arg's JSON text, under its name or an older layout's (`kineto.ARG_ALIASES`:
    `Input dims` in torch 1.8)."""
    names = [key, *(alias for alias, k in ARG_ALIASES.items() if k == key)]
    return pl.coalesce(pl.col("args_json").str.json_path_match(f"$['{n}']") for n in names)


def _read(frame: pl.DataFrame, prefix: str, read: Reading | None, keys: tuple[str, ...]) -> pl.DataFrame:
    """`frame` with the `MESSAGE` columns (prefixed) each row's event says: `read`, else the source
    that reads events of its name (`messages.op_message`), applied once per distinct name and
    `keys` args (a trace repeats a few sizes over thousands of calls), whose texts the event scan
    took (`_arg_texts`)."""
    taken = [f"_a{i}" for i in range(len(keys))]
    frame = frame.with_columns(pl.col(f"_arg:{k}").alias(t) for k, t in zip(keys, taken, strict=True))
    distinct = frame.select("name", *taken).unique()
    rows = []
    for name, *values in distinct.iter_rows():
        args = {k: _json(v) for k, v in zip(keys, values, strict=True) if v is not None}
        m = read(name, args) if read is not None else op_message(name, args)
        rows.append((name, *values, *(astuple(m) if m is not None else (None,) * len(MESSAGE))))
    schema: dict[str, Any] = {"name": pl.String, **{t: frame.schema[t] for t in taken}}
    schema |= {f"{prefix}{c}": pl.String if c == "m_dtype" else pl.Int64 for c in MESSAGE}
    said = pl.DataFrame(rows, schema=schema, orient="row")
    return frame.join(said, on=["name", *taken], how="left", nulls_equal=True, maintain_order="left").drop(taken)


COMM_OP_COLUMNS = ["pid", "tid", "ts_ns", (pl.col("ts_ns") + pl.col("dur_ns").fill_null(0)).alias("end_ns"), "name"]


def _with_comm_ops(flat_dir: TraceTables, kernels: pl.Series) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The `_args_key()` of the events `kernels` (sorted: event_idx, _args) and the communication
    CPU events (`COMM_OP`, as `_comm_ops` takes them), their args read in one pass: the args
    column is most of a trace's bytes, and a few thousand kernels spread over a trace have a row
    in every row group, so each read decoded all of it (a 1 GB trace of 5,540 NCCL kernels:
    ~0.2 s a read)."""
    ops = trace_source.row_ids(
        flat_dir,
        "events",
        pl.col("cat").str.to_lowercase().is_in([*CPU_OP_CATS, *ANNOTATION_CATS])
        & pl.col("name").str.contains(COMM_OP)
        & pl.col("ts_ns").is_not_null(),
    )
    both = _events_with_args(flat_dir, pl.concat([kernels, ops]).unique().sort(), ["event_idx", *COMM_OP_COLUMNS])

    def of(ids: pl.Series) -> pl.DataFrame:  # in event_idx order
        return both.filter(pl.col("event_idx").is_in(ids.implode()))

    return of(kernels).select("event_idx", "_args"), of(ops).drop("event_idx")


def _comm_ops(ops: pl.DataFrame) -> pl.DataFrame:
    """Communication CPU events (`COMM_OP`: ops and annotations; `_with_comm_ops`): thread, start,
    end, kind, pg args and what each says about its message (`messages.op_message`, over these few
    events), in start order."""
    op_kind = pl.coalesce(
        _kind(pl.col("collective")), pl.when(pl.col("name") != "record_param_comms").then(_kind(pl.col("name")))
    )
    said = _said_once(ops, OP_ARGS, lambda s: _read(s, "", None, COMM_EVENT_ARGS).with_columns(op_kind=op_kind))
    return said.sort("ts_ns", maintain_order=True)


def _said_once(frame: pl.DataFrame, keys: tuple[str, ...], say: Callable[[pl.DataFrame], pl.DataFrame]) -> pl.DataFrame:
    """`frame` (with `name` and `_args_key()`'s `_args`) with the pg args and `_arg_texts(keys)`
    (`_with_args`) and the columns `say` adds to those, worked out once per distinct name and args
    and joined onto `frame` once: a trace's calls and kernels repeat a few over hundreds of
    thousands of rows, and each join onto them copies them whole. Without `_args`."""
    said = say(_with_args(frame.select("name", "_args").unique().with_columns(_key="_args"), keys, pg=True))
    said = said.rename({"_key": "_args"})
    return frame.join(said, on=["name", "_args"], how="left", nulls_equal=True, maintain_order="left").drop("_args")


def last_running(points: pl.DataFrame, at: str, spans: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """`points` with the columns of the span (`spans`: `_ts`, `_end` and others) that started last
    at or before each point's time `at` on its `by` keys, where it still runs then (else null)."""
    joined = points.sort(at).join_asof(
        spans.sort("_ts"), left_on=at, right_on="_ts", by=by, strategy="backward", check_sortedness=False
    )
    inside = pl.col("_end") >= pl.col(at)
    return joined.with_columns(pl.when(inside).then(pl.col(c)).alias(c) for c in spans.columns if c not in by)


def _around_launch(
    kernels: pl.DataFrame, ops: pl.DataFrame, which: pl.Expr, prefix: str, columns: list[str]
) -> pl.DataFrame:
    """For each kernel, `columns` of the last op (of those `which` selects) that started at or
    before its launch on the launch's thread and was still running then (else null)."""
    chosen = ops.filter(which).select(
        "pid", "tid", *(pl.col(c).alias(f"{prefix}{c}") for c in columns), _ts="ts_ns", _end="end_ns"
    )
    points = kernels.select("event_idx", "pid", "tid", "launch_ts_ns")
    joined = last_running(points, "launch_ts_ns", chosen, ["pid", "tid"])
    return joined.select("event_idx", *(f"{prefix}{c}" for c in columns))


def _coalesced(launched: pl.DataFrame, ops: pl.DataFrame, source: SizeSource, prefix: str) -> pl.DataFrame:
    """For each kernel launched inside a coalesced group's annotation (`source.events`), the
    messages of the calls recorded on its thread since the thread's previous collective launch, as
    `source.read` reads them, summed (one `record_param_comms` per call; null when one of them is
    unknown), and their kind if they agree."""
    which = pl.col("name").str.contains(source.events)
    calls = ops.filter(pl.col("name") == "record_param_comms").drop(MESSAGE)
    if not calls.height or not ops.select(which.any()).item():
        return launched.select("event_idx")
    calls = _read(calls, "", source.read, source.read.args).select("pid", "tid", "ts_ns", "op_kind", *MESSAGE)
    launches = launched.select("pid", "tid", "event_idx", "launch_ts_ns").sort("launch_ts_ns")
    owned = calls.sort("ts_ns").join_asof(
        launches,
        left_on="ts_ns",
        right_on="launch_ts_ns",
        by=["pid", "tid"],
        strategy="forward",
        check_sortedness=False,
    )  # each call belongs to the first collective launch after it on its thread
    summed = (
        owned.filter(pl.col("event_idx").is_not_null())
        .group_by("event_idx")
        .agg(
            *(
                pl.when(pl.col(c).is_not_null().all()).then(pl.col(c).sum()).alias(f"{prefix}{c}")
                for c in ("m_in_nelems", "m_out_nelems")
            ),
            pl.col("m_dtype").drop_nulls().first().alias(f"{prefix}m_dtype"),
            pl.col("m_group_size").drop_nulls().first().alias(f"{prefix}m_group_size"),
            pl.when(pl.col("op_kind").n_unique() == 1).then(pl.col("op_kind").first()).alias(f"{prefix}op_kind"),
        )
    )
    marked = _around_launch(launched, ops, which, "c_", ["name"]).filter(pl.col("c_name").is_not_null())
    return launched.select("event_idx").join(
        summed.join(marked.select("event_idx"), on="event_idx"), on="event_idx", how="left"
    )


def _nccl_kernels(flat_dir: TraceTables) -> tuple[pl.DataFrame, list[str]]:
    """The collective kernels with their args, the CPU events' kind and pg args around their launch,
    and one message reading per source of `SIZE_SOURCES` (columns `<prefix>m_in_nelems`...); and
    the prefixes in the sources' order."""
    g = trace_source.collect(
        flat_dir,
        trace_source.scan(flat_dir, "gpu_ops")
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
        ),
    )
    if not g.height:
        return g, []
    prefixes = [f"s{i}_" for i in range(len(SIZE_SOURCES))]
    keys, comm_ops = _with_comm_ops(flat_dir, g["event_idx"].sort())

    def read_kernels(said: pl.DataFrame) -> pl.DataFrame:  # the sources that read the kernel itself
        for prefix, source in zip(prefixes, SIZE_SOURCES, strict=True):
            if source.on == "kernel":
                said = _read(said, prefix, source.read, source.read.args)
        return said

    g = _said_once(g.join(keys, on="event_idx", how="left", maintain_order="left"), KERNEL_ARGS, read_kernels)
    launches = _events(
        flat_dir,
        pl.col("event_idx").is_in(g["launch_event_idx"].drop_nulls().implode()),
        [pl.col("event_idx").alias("launch_event_idx"), "pid", "tid"],
    )
    k = g.join(launches, on="launch_event_idx", how="left")
    ops = _comm_ops(comm_ops)
    launched = k.select("event_idx", "pid", "tid", "launch_ts_ns").filter(  # what the sources look up by
        pl.col("launch_ts_ns").is_not_null() & pl.col("pid").is_not_null()
    )
    # what each source says, joined onto the launched kernels' ids and then onto the kernels once:
    # joined onto them source by source, the wide rows of 320K kernels were copied at each
    said = launched.select("event_idx")
    for prefix, source in zip(prefixes, SIZE_SOURCES, strict=True):
        if source.on == "launch":  # the innermost such event around the launch
            which = pl.col("name").str.contains(source.events)
            columns = [*MESSAGE, "op_kind", "name", *PG_KEYS]
            said = said.join(_around_launch(launched, ops, which, prefix, columns), on="event_idx", how="left")
        elif source.on == "coalesced":  # the calls a coalesced group holds
            said = said.join(_coalesced(launched, ops, source, prefix), on="event_idx", how="left")
    k = k.join(said, on="event_idx", how="left")
    k = k.with_columns(  # a source that read nothing (or only a dtype) gets null columns
        pl.lit(None, pl.String if c in ("m_dtype", "op_kind") else pl.Int64).alias(f"{p}{c}")
        for p in prefixes
        for c in (*MESSAGE, "op_kind")
        if f"{p}{c}" not in k.columns
    )
    around = [p for p, s in zip(prefixes, SIZE_SOURCES, strict=True) if s.on == "launch"]
    coalesced = [p for p, s in zip(prefixes, SIZE_SOURCES, strict=True) if s.on == "coalesced"]
    return (
        k.with_columns(pl.coalesce(c, *(f"{p}{c}" for p in around)).alias(c) for c in PG_KEYS).with_columns(
            kind=pl.coalesce(
                _kind(pl.col("collective")),
                *(f"{p}op_kind" for p in around + coalesced),
                _kind_from_name(pl.col("name")),
            ),
            op_name=pl.coalesce(
                *(pl.when(pl.col(f"{p}op_kind").is_not_null()).then(pl.col(f"{p}name")) for p in around)
            ),
            group_size=pl.coalesce(*(f"{p}m_group_size" for p in prefixes)),
            source=pl.lit("gpu_kernel"),
        ),
        prefixes,
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


# ------------------------------------------------------------------ HCCL collectives on torch_npu's lanes
def _without_cat(keys: tuple[str, ...]) -> pl.Expr:
    """Complete events without a cat whose args hold every key of `keys` (`comms.HCCL_OP_ARGS`, ...)."""
    has = [pl.col("args_json").str.contains(f'"{k}":', literal=True) for k in keys]
    return (pl.col("ph") == "X") & pl.col("cat").is_null() & pl.col("ts_ns").is_not_null() & pl.all_horizontal(has)


HCCL_OP = _without_cat(HCCL_OP_ARGS)  # the events `_hccl_ops` reads: a trace with one has HCCL collectives


def _hccl_ops(flat_dir: TraceTables) -> tuple[pl.DataFrame, list[str]]:
    """HCCL collectives (`comms.HCCL_OP_ARGS`) with their group (the lane's name), device (from the
    pid, as the device tasks'), message (`messages.HCCL_SIZE`, prefix `s_`), the host op a flow
    from it names (`op_name`) and what their plane tasks say (`_planes`); and the prefixes."""
    end = (pl.col("ts_ns") + pl.col("dur_ns").fill_null(0)).alias("end_ns")
    ops = _events(
        flat_dir,
        HCCL_OP,
        [
            "event_idx",
            "name",
            "pid",
            "tid",
            "ts_ns",
            pl.col("dur_ns").fill_null(0),
            end,
            _args_key(),
        ],
    )
    ops = _with_args(ops, HCCL_SIZE.read.args)
    if not ops.height:
        return ops, []
    pids = ops["pid"].drop_nulls().unique()
    lanes = _events(
        flat_dir,
        (pl.col("ph") == "M") & (pl.col("name") == "thread_name") & pl.col("pid").is_in(pids.implode()),
        ["pid", "tid", pl.col("args_json").str.json_path_match("$.name").alias("lane")],
    ).unique(["pid", "tid"], keep="first")
    devices = task_device_ids(trace_source.scan(flat_dir, "events"), set(pids.to_list()))
    ops = (
        ops.join(lanes, on=["pid", "tid"], how="left")
        .with_columns(
            pg_name=pl.col("lane").str.extract(HCCL_GROUP_LANE, 1),
            device=pl.col("pid").replace_strict(devices, default=None, return_dtype=pl.Int64),
            kind=_kind(pl.col("name").str.extract(HCCL_OP_KIND, 1)),
        )
        .join(_planes(flat_dir, ops, lanes), on="event_idx", how="left")
        .join(_host_ops(flat_dir, ops), on="event_idx", how="left")
    )
    return (
        _read(ops, "s_", HCCL_SIZE.read, HCCL_SIZE.read.args).with_columns(
            source=pl.lit("hccl_op"),
            collective=pl.col("name"),
            pg_desc=pl.lit(None, pl.String),
            pg_ranks=pl.lit(None, pl.String),
            stream=pl.lit(None, pl.Int64),
        ),
        ["s_"],
    )


def _planes(flat_dir: TraceTables, ops: pl.DataFrame, lanes: pl.DataFrame) -> pl.DataFrame:
    """(event_idx, group_size, link_type, transit_bytes, transit_ns) of HCCL collectives from the
    tasks on their group's `Plane N` lanes (Level1 and above): a task belongs to the collective of
    the nearest group lane before its lane (msprof numbers a group's planes after its lane) that runs
    at its start; group_size: the ranks the group's tasks name (src and dst), at least the highest
    of them + 1."""
    none = pl.DataFrame(
        schema={
            "event_idx": pl.Int64,
            "group_size": pl.Int64,
            "link_type": pl.String,
            "transit_bytes": pl.Int64,
            "transit_ns": pl.Int64,
        }
    )
    rank = lambda key: pl.col("args_json").str.json_path_match(f"$['{key}']").cast(pl.Int64, strict=False)
    tasks = _events(
        flat_dir,
        _without_cat(HCCL_TASK_ARGS) & pl.col("pid").is_in(ops["pid"].unique().implode()),
        [
            "pid",
            "tid",
            "ts_ns",
            pl.col("dur_ns").fill_null(0),
            rank(HCCL_TASK_ARGS[0]).alias("src"),
            rank(HCCL_TASK_ARGS[1]).alias("dst"),
            rank(HCCL_TASK_SIZE).alias("size"),
            pl.col("args_json").str.json_path_match(f"$['{HCCL_TASK_LINK}']").alias("link"),
        ],
    )
    if not tasks.height:
        return none
    group_lanes = (
        lanes.filter(pl.col("lane").str.contains(HCCL_GROUP_LANE)).select("pid", group_tid="tid").sort("group_tid")
    )
    tasks = tasks.sort("tid").join_asof(
        group_lanes, left_on="tid", right_on="group_tid", by="pid", strategy="backward", check_sortedness=False
    )
    windows = ops.select("event_idx", "pid", group_tid="tid", _ts="ts_ns", _end="end_ns")
    owned = last_running(tasks, "ts_ns", windows, ["pid", "group_tid"]).filter(pl.col("event_idx").is_not_null())
    ranks = pl.concat_list("src", "dst").explode().drop_nulls()
    sized = pl.col("size").fill_null(0) > 0
    per_group = owned.group_by("pid", "group_tid").agg(
        group_size=pl.max_horizontal(ranks.n_unique(), ranks.max() + 1).cast(pl.Int64)
    )
    per_op = owned.group_by("event_idx", "pid", "group_tid").agg(
        link_type=pl.col("link")
        .filter(sized & (pl.col("link") != "INVALID_TYPE"))
        .drop_nulls()
        .unique()
        .sort()
        .str.join(","),
        transit_bytes=pl.col("size").filter(sized).sum(),
        transit_ns=pl.col("dur_ns").filter(sized).sum(),
    )
    out = per_op.join(per_group, on=["pid", "group_tid"], how="left")
    return out.select(
        "event_idx",
        "group_size",
        link_type=pl.when(pl.col("link_type") != "").then("link_type"),
        transit_bytes="transit_bytes",
        transit_ns="transit_ns",
    )


def _host_ops(flat_dir: TraceTables, ops: pl.DataFrame) -> pl.DataFrame:
    """(event_idx, op_name) of HCCL collectives a flow from their host op ends at (`kineto.OP_FLOWS`:
    torch_npu's async_npu): the innermost CPU op around the flow's start that is not the API call
    itself (`kineto.API_OPS`: HcclAllreduce inside c10d::allreduce_)."""
    none = pl.DataFrame(schema={"event_idx": pl.Int64, "op_name": pl.String})
    cats = [cat for cat, _ in OP_FLOWS]
    flows = trace_source.scan(flat_dir, "flows").filter(pl.col("cat").is_in(cats))
    ends = (
        flows.filter(pl.col("ph") == "f")
        .select("cat", "id", "pid", "tid", "ts_ns")
        .join(ops.lazy().select("event_idx", "pid", "tid", "ts_ns"), on=["pid", "tid", "ts_ns"], how="inner")
        .select("event_idx", "cat", "id")
        .collect()
    )
    if not ends.height:
        return none
    starts = (
        flows.filter((pl.col("ph") == "s") & pl.col("id").is_in(ends["id"].implode()))
        .select("cat", "id", "pid", "tid", t="ts_ns")
        .collect()
        .join(ends, on=["cat", "id"], how="inner")
    )
    cpu = _events(
        flat_dir,
        pl.col("cat").str.to_lowercase().is_in(CPU_OP_CATS)
        & pl.col("tid").is_in(starts["tid"].unique().implode())
        & (pl.col("ts_ns") <= starts["t"].max()),
        ["pid", "tid", "name", "ts_ns", (pl.col("ts_ns") + pl.col("dur_ns").fill_null(0)).alias("end_ns")],
    ).filter(~api_call())
    # the innermost op around each flow start by binary searches per thread (`link.nesting`): a join
    # of every start with every op of its thread took 3 GB for 480 collectives of a 200 MB trace
    cpu = cpu.with_row_index("iv_idx").with_columns(pl.col("iv_idx").cast(pl.Int64))
    points = starts.with_row_index("point_id").with_columns(pl.col("point_id").cast(pl.Int64))
    inner = nesting.enclosing(points.select("point_id", "pid", "tid", "t"), cpu, nesting.LONGER_FIRST)
    around = (
        points.join(inner, on="point_id", how="inner")
        .join(cpu.select("iv_idx", "name", "ts_ns"), on="iv_idx", how="inner")
        .sort("ts_ns", "point_id")
    )
    return around.group_by("event_idx", maintain_order=True).agg(op_name=pl.col("name").last())


# ------------------------------------------------------------------ gloo work on runloop threads
IS_GLOO_WORK = (  # the events of gloo's work (`_gloo_works`)
    pl.col("cat").str.to_lowercase().is_in(ANNOTATION_CATS)
    & pl.col("name").str.contains(GLOO_WORK)
    & pl.col("ts_ns").is_not_null()
)


def runloop_threads(flat_dir: TraceTables) -> list[tuple[int, int]]:
    """(pid, tid) of the threads any of whose names says pt_gloo_runloop, in creation (tid) order."""
    names = _events(
        flat_dir,
        (pl.col("ph") == "M") & (pl.col("name") == "thread_name"),
        ["pid", "tid", pl.col("args_json").str.json_path_match("$.name").alias("thread")],
    )
    runloop = names.filter(pl.col("thread").str.contains(RUNLOOP_THREAD)).select("pid", "tid").unique()
    return sorted(runloop.drop_nulls().iter_rows())


def gloo_groups_of_threads(threads: list[tuple[int, int]], pg_config: list) -> dict:
    """(pid, tid) -> pg_config entry: the groups' threads in creation order, an equal share each;
    {} when the threads do not divide evenly among the groups."""
    groups = [g for g in pg_config if isinstance(g, dict)]
    if not groups or not threads or len(threads) % len(groups):
        return {}
    share = len(threads) // len(groups)
    return {t: groups[i // share] for i, t in enumerate(threads)}


def _gloo_works(
    flat_dir: TraceTables, pg_config: list, threads_groups: dict | None, rows: int
) -> tuple[Iterator[pl.DataFrame] | None, list[str], int, Finish]:
    """gloo:* annotations as collectives, in (ts_ns, event_idx) order about `rows` at a time (None:
    the trace has none), their message as the annotation says it (the one size source of gloo
    work: `messages.op_message`, prefix `s_`); how many ran on threads no group could be given.
    A CPU-only trace can hold millions: the rows come compact (name and args as categoricals),
    read a time cell at a time (`_gloo_cells`), with what makes each slice of them whole
    (`Finish`: the kind, the group of the thread, what the args say). `threads_groups`: each
    runloop thread's pg_config entry, where the caller knows them (several traces' rows at
    once), else `gloo_groups_of_threads` of this one's."""
    events = trace_source.scan(flat_dir, "events")
    bins = TimeBins.over(_span(flat_dir, events))
    # per thread and time bin, in one pass: the threads' counts and the cells' histogram
    counted = trace_source.collect(
        flat_dir, events.filter(IS_GLOO_WORK).group_by("pid", "tid", bins.of(pl.col("ts_ns")).alias("bin")).len("n")
    )
    if not counted.height:
        return None, [], 0, _whole
    per_thread = counted.group_by("pid", "tid").agg(pl.col("n").sum())
    owner = threads_groups
    if owner is None:
        owner = gloo_groups_of_threads(runloop_threads(flat_dir), pg_config)
    # each thread's group joined to its works (a row made in Python for each work took ~0.5 s a
    # million: hta/cpu_only scaled to 1 GB has 2 M)
    threads = pl.DataFrame(
        [(pid, tid, *_gloo_pg(group)) for (pid, tid), group in owner.items()],
        schema={"pid": per_thread.schema["pid"], "tid": per_thread.schema["tid"], **_GLOO_PG},
        orient="row",
    )
    unowned = int(per_thread.join(threads, on=["pid", "tid"], how="anti")["n"].sum())
    histogram = counted.group_by("bin").agg(pl.col("n").sum())

    def finish(part: pl.DataFrame) -> pl.DataFrame:
        part = part.with_columns(pl.col("name").cast(pl.String))
        part = _with_args(part.join(threads, on=["pid", "tid"], how="left", maintain_order="left"), COMM_EVENT_ARGS)
        return _read(part, "s_", None, COMM_EVENT_ARGS).with_columns(
            kind=_kind(pl.col("name")),
            source=pl.lit("gloo_work"),
            op_name=pl.lit(None, pl.String),
            device=pl.lit(None, pl.Int64),
            stream=pl.lit(None, pl.Int64),
            collective=pl.col("name").str.strip_prefix("gloo:"),
        )

    return _gloo_cells(flat_dir, TimeCells.of(histogram, bins, CELL_SLICES * rows), rows), ["s_"], unowned, finish


CELL_SLICES = 4  # slices of gloo works read at once (`_gloo_cells`): each read has a cost of its own


def _span(flat_dir: TraceTables, events: pl.LazyFrame) -> tuple[int, int] | None:
    """(first, last) start of a trace's events: from the Parquet statistics of its events file,
    else (tables in memory, or no statistics) from the starts; None without any."""
    if not isinstance(flat_dir, Mapping):
        span = EventReach.of(Path(flat_dir) / "events.parquet").span
        if span is not None:
            return span
    ts = pl.col("ts_ns")
    lo, hi = trace_source.collect(flat_dir, events.select(ts.min().alias("lo"), ts.max().alias("hi"))).row(0)
    return None if lo is None else (lo, hi)


def _gloo_cells(flat_dir: TraceTables, cells: TimeCells, rows: int) -> Iterator[pl.DataFrame]:
    """The gloo works (compact: name and args as categoricals) in (ts_ns, event_idx) order, `rows`
    at a time, read one time cell (`cells`: of about CELL_SLICES * `rows` of them, more where many
    start at one time) at a time, by its time range. Holding them all, compact, took a CPU-only
    trace of 4.7 M gloo calls (`hta/cpu_only` scaled to 2 GB) to 565 MB, ~50 bytes a call more
    with every call."""
    cuts = cells.cuts.to_list()
    columns = ["event_idx", pl.col("name").cast(pl.Categorical), "pid", "tid", "ts_ns", pl.col("dur_ns").fill_null(0)]
    for since, until in zip([None, *cuts], [*cuts, None]):
        where = IS_GLOO_WORK & trace_source.starting_in(since, until)
        cell = _events(flat_dir, where, [*columns, _args_key()]).sort("ts_ns", "event_idx")
        for start in range(0, cell.height, rows):
            yield cell.slice(start, rows)


_GLOO_PG = {"pg_name": pl.String, "pg_desc": pl.String, "pg_ranks": pl.String, "group_size": pl.Int64}


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


# ------------------------------------------------------------------ the table
def _by_rule(rule: SizeRule, n_in: pl.Expr, n_out: pl.Expr, group: pl.Expr) -> pl.Expr:
    counts = [(n_in if count == "in" else n_out) * (group if per_rank else 1) for count, per_rank in rule]
    return pl.coalesce(counts) if counts else pl.lit(None, pl.Int64)


def _nelems(prefix: str) -> pl.Expr:
    """nccl-tests' size in elements by one source's reading (`messages.SIZE_RULE` of the row's kind;
    a per-rank count times the group size the source says, else the collective's)."""
    n_in, n_out = pl.col(f"{prefix}m_in_nelems"), pl.col(f"{prefix}m_out_nelems")
    group = pl.coalesce(f"{prefix}m_group_size", "pg_size")
    out = _by_rule(DEFAULT_SIZE_RULE, n_in, n_out, group)
    for kind, rule in SIZE_RULE.items():
        out = pl.when(pl.col("kind") == kind).then(_by_rule(rule, n_in, n_out, group)).otherwise(out)
    return out


def with_message(rows: pl.DataFrame, prefixes: list[str], names: list[str]) -> pl.DataFrame:
    """`in_nelems`, `out_nelems`, `dtype`, `bytes` and `size_from` of each collective from its
    sources' readings (columns `<prefix>m_*`, in `SIZE_SOURCES` order, named `names`): the counts
    of the first source by which the kind's size is known, the dtype of that source else of the
    first that says one; bytes = nccl-tests' size x the dtype's size (null for barrier)."""
    sized = [_nelems(p).alias(f"{p}n") for p in prefixes]
    rows = rows.with_columns(sized)
    first = pl.coalesce(*(pl.when(pl.col(f"{p}n").is_not_null()).then(pl.lit(i)) for i, p in enumerate(prefixes)))
    rows = rows.with_columns(_from=first)

    def chosen(c: str) -> pl.Expr:
        return pl.coalesce(*(pl.when(pl.col("_from") == i).then(pl.col(f"{p}{c}")) for i, p in enumerate(prefixes)))

    dtype = pl.coalesce(chosen("m_dtype"), *(f"{p}m_dtype" for p in prefixes))
    size = dtype.replace_strict(DTYPE_SIZE, default=None, return_dtype=pl.Int64)
    return rows.with_columns(
        in_nelems=chosen("m_in_nelems"),
        out_nelems=chosen("m_out_nelems"),
        dtype=dtype,
        bytes=pl.when(pl.col("kind") != "barrier").then(chosen("n") * size),
        size_from=pl.col("_from").replace_strict(list(range(len(names))), names, default=None, return_dtype=pl.String),
    )


# the events of ProfilerStep#N intervals, and each one's (step, step_ts_ns, step_end_ns)
PROFILER_STEP = (
    pl.col("cat").str.to_lowercase().is_in(STEP_CATS)
    & pl.col("name").str.contains(STEP_NAME)
    & pl.col("ts_ns").is_not_null()
)
STEP_INTERVAL = [
    pl.col("name").alias("step"),
    pl.col("ts_ns").alias("step_ts_ns"),
    (pl.col("ts_ns") + pl.col("dur_ns").fill_null(0)).alias("step_end_ns"),
]


def profiler_steps(flat_dir: TraceTables) -> pl.DataFrame:
    """ProfilerStep#N intervals (step, step_ts_ns, step_end_ns) in start order."""
    return _events(flat_dir, PROFILER_STEP, STEP_INTERVAL).sort("step_ts_ns")


def with_steps(rows: pl.DataFrame, steps: pl.DataFrame, start: str = "ts_ns", by: str | None = None) -> pl.DataFrame:
    """Rows with `step`: the ProfilerStep whose interval holds their start (null outside every step),
    and the other columns of `steps` but its times (such as a number for each interval); `by`: a
    column of both whose values keep apart traces measured together."""
    if not steps.height:
        return rows.with_columns(step=pl.lit(None, pl.String))
    j = rows.sort(start).join_asof(
        steps, left_on=start, right_on="step_ts_ns", by=by, strategy="backward", check_sortedness=False
    )
    return j.with_columns(step=pl.when(pl.col(start) <= pl.col("step_end_ns")).then(pl.col("step"))).drop(
        "step_ts_ns", "step_end_ns"
    )


def in_steps(rows: pl.DataFrame, steps: pl.DataFrame, start: str = "ts_ns", by: str | None = None) -> pl.DataFrame:
    """`with_steps`, the rows outside every step dropped."""
    return with_steps(rows, steps, start, by).filter(pl.col("step").is_not_null())


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
    "size_from",
    "ts_ns",
    "dur_ns",
    "end_ns",
    "pid",
    "tid",
    "device",
    "stream",
    "step",
]


SLICE_ROWS = 1 << 16  # collectives made whole and written at a time (`collective_slices`)


def collectives(
    flat_dir: TraceTables, rank: int | None, distributed: dict, threads_groups: dict | None = None
) -> tuple[pl.DataFrame, dict]:
    """The `collectives` table of one flattened trace (schemas/collectives.toml), whole, and counts
    of what could not be classified, by reason. `threads_groups`: as `collective_slices`."""
    problems: dict[str, int] = {}
    parts = list(collective_slices(flat_dir, rank, distributed, problems, threads_groups=threads_groups))
    whole = pl.concat(parts) if parts else pl.DataFrame(schema=_schema())
    return whole.cast(_schema()), problems  # the declared types: strings


def collective_slices(
    flat_dir: TraceTables,
    rank: int | None,
    distributed: dict,
    problems: dict,
    rows: int = SLICE_ROWS,
    threads_groups: dict | None = None,
) -> Iterator[pl.DataFrame]:
    """The `collectives` table of one flattened trace, `rows` at a time in (ts_ns, event_idx) order:
    a trace scaled to 1 GB of CPU-only work has 2 M gloo calls, whose whole table took 1.6 GB. Its
    `dict` columns come as categoricals (`collectives` gives the whole table with strings).
    Counts of what could not be classified go into `problems`, by reason, by the end.
    `threads_groups`: the process group (pg_config entry) of each gloo runloop thread (pid, tid),
    for rows of several traces at once (`dataset.group.run_tables`); else found from the trace's
    thread names and `distributed`'s pg_config."""
    found, prefixes = _nccl_kernels(flat_dir)
    names = [source.name for source in SIZE_SOURCES]
    finish: Finish = _whole
    if found.height:
        found = _pg_of_stream(found)
    if not found.height:
        found, prefixes = _hccl_ops(flat_dir)
        names = [HCCL_SIZE.name]
    in_order = _in_order(found, rows) if found.height else None
    if in_order is None:
        pg_config = distributed.get("pg_config")
        pg_config = pg_config if isinstance(pg_config, list) else []
        in_order, prefixes, unowned, finish = _gloo_works(flat_dir, pg_config, threads_groups, rows)
        names = ["the gloo: annotation"]
        if unowned:
            problems[UNOWNED_GLOO] = unowned
    if in_order is None:
        return
    world = world_size(distributed)
    steps = profiler_steps(flat_dir)
    numbered = pl.DataFrame(schema={"_pg": pl.Categorical, "_ranks": pl.Categorical, "_before": pl.Int64})
    unknown = 0
    for part in in_order:
        out = finish(part)
        unknown += out.filter(pl.col("kind").is_null()).height
        listed = out.select("pg_ranks").unique().with_columns(listed=_count_ranks(pl.col("pg_ranks").cast(pl.String)))
        out = out.join(listed, on="pg_ranks", how="left", nulls_equal=True, maintain_order="left").with_columns(
            kind=pl.col("kind").cast(pl.String).fill_null("unknown"),
            rank=pl.lit(rank, pl.Int64),
            pg_size=pl.coalesce("group_size", "listed", pl.lit(world, pl.Int64)),
            end_ns=pl.col("ts_ns") + pl.col("dur_ns"),
        )
        out = with_message(out, prefixes, names).with_columns(
            pl.lit(None, t).alias(c) for c, t in HCCL_COLUMNS.items() if c not in out.columns
        )
        out, numbered = _numbered(out, numbered)
        out = with_steps(out, steps)
        yield out.select(pl.col(c).cast(t) for c, t in _schema(pl.Categorical).items()).sort("ts_ns", "event_idx")
    if unknown:
        problems[UNKNOWN_KIND] = unknown


def _in_order(found: pl.DataFrame, rows: int) -> Iterator[pl.DataFrame]:
    """`found`'s rows in (ts_ns, event_idx) order, `rows` at a time."""
    order = found.select(pl.arg_sort_by("ts_ns", "event_idx")).to_series()  # not a sorted copy of every row
    for start in range(0, found.height, rows):
        yield found[order.slice(start, rows)]


UNKNOWN_KIND = "collective_of_unknown_kind"  # the problem of a collective whose kind no source says
UNOWNED_GLOO = "gloo_work_without_process_group"  # ... of gloo work on a thread no group was given
# what `seq` numbers collectives within: their process group, by name and ranks (either may be null,
# as ""). Categoricals: a rank list is ~1.2 KB at 256 ranks, and as strings a slice's keys were 75 MB
# to copy and hash (a 1.1 GB trace of 320K collectives peaked at 766 MB)
SEQ_GROUP = [
    pl.col(c).cast(pl.Categorical).fill_null(pl.lit("", pl.Categorical)).alias(a)
    for c, a in (("pg_name", "_pg"), ("pg_ranks", "_ranks"))
]


def world_size(distributed: dict) -> int | None:
    """The world size a trace's `distributedInfo` says, if an integer."""
    world = distributed.get("world_size")
    return world if type(world) is int else None


def _numbered(out: pl.DataFrame, before: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """`out` (a slice, in start order) with `seq`: each group's collectives numbered on from its
    count in the slices before (`before`: _pg, _ranks, _before); and the counts with this slice's."""
    out = out.with_columns(SEQ_GROUP).join(before, on=["_pg", "_ranks"], how="left", maintain_order="left")
    first = pl.col("_before").fill_null(0)
    out = out.with_columns(seq=pl.int_range(pl.len(), dtype=pl.Int64).over("_pg", "_ranks") + first)
    counted = out.group_by("_pg", "_ranks").agg(_before=pl.len().cast(pl.Int64))
    return out, pl.concat([before, counted]).group_by("_pg", "_ranks").agg(pl.col("_before").sum())


def _whole(part: pl.DataFrame) -> pl.DataFrame:
    return part


Finish = Callable[[pl.DataFrame], pl.DataFrame]  # what makes a slice of a source's rows whole


HCCL_COLUMNS = {"link_type": pl.String, "transit_bytes": pl.Int64, "transit_ns": pl.Int64}  # null elsewhere


def _count_ranks(text: pl.Expr) -> pl.Expr:
    """How many ranks a `pg_ranks` text lists (its integers; null for none)."""
    found = text.str.count_matches(RANK_IN_LIST).cast(pl.Int64)
    return pl.when(found > 0).then(found)


def _schema(repeated: type[pl.DataType] = pl.String) -> dict:
    """The collectives table's polars types; its `dict` columns (repeated strings) as `repeated`."""
    from pipeline import schema

    return {
        c.name: {"int64": pl.Int64, "string": pl.String, "dict": repeated, "float64": pl.Float64}[c.type]
        for c in schema.table("collectives").columns
    }
