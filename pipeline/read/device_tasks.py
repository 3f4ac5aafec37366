"""device_tasks: device activity written without a `cat` (torch_npu's `Ascend Hardware` tasks), as
`kineto.DEVICE_TASKS` declares it: which rows of a chunk are such tasks, their kind, stream and
(provisional) device, and, once the whole trace is read, their device ids checked against the
processes' `process_sort_index` (`kineto.DEVICE_PIDS`: which pid scheme wrote them).

A chunk is decoded alone (in a worker), before the process metadata of the trace is known: a task's
device is first read from its pid by the first scheme (torch_npu since CANN 8 writes
`(host pid << 10) | (sort index << 5) | device`); `device_ids` then reads the sort index of each
task process from the events table, and `rewrite_devices` corrects the rows of processes that an
older scheme wrote (`host pid * 10000 + sort index * 100 + device`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import msgspec
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

if TYPE_CHECKING:
    import polars as pl

from pipeline.kineto import DEVICE_PIDS, DEVICE_TASKS, task_device, task_kind

# the args of a device task that gpu_ops reads: the stream (every spelling), the task type, and what
# a copy's args say of it (msprof writes `size(B)` and `bandwidth(GB/s)` on MEMCPY_ASYNC tasks)
STREAM_ARGS = tuple(dict.fromkeys(k for t in DEVICE_TASKS for k in t.stream_args))
TASK_TYPE_ARGS = tuple(dict.fromkeys(t.task_type_arg for t in DEVICE_TASKS))
COPY_BYTES_ARG, COPY_BW_ARG = "size(B)", "bandwidth(GB/s)"

_TaskArgs: Any = msgspec.defstruct(
    "_TaskArgs",
    [
        *((f"s{i}", int | None, msgspec.field(default=None, name=k)) for i, k in enumerate(STREAM_ARGS)),
        *((f"t{i}", str | None, msgspec.field(default=None, name=k)) for i, k in enumerate(TASK_TYPE_ARGS)),
        ("copy_bytes", int | None, msgspec.field(default=None, name=COPY_BYTES_ARG)),
        ("copy_bw", int | float | None, msgspec.field(default=None, name=COPY_BW_ARG)),
    ],
    gc=False,
)
_DECODE = msgspec.json.Decoder(list[Optional[_TaskArgs]])  # a type built at run time: no `X | None`


def task_rows(ev: pa.Table) -> list[int]:
    """Rows of the events table that are device tasks: complete events without a cat whose args
    hold a task's marks and a stream arg."""
    if not DEVICE_TASKS:
        return []
    candidates = pc.and_(pc.equal(ev.column("ph"), "X"), pc.is_null(ev.column("cat")))
    rows = pc.indices_nonzero(pc.fill_null(candidates, False))
    if not len(rows):
        return []
    args = ev.column("args_json").take(rows)
    found = pa.array([False] * len(rows))
    for t in DEVICE_TASKS:
        has = pa.array([True] * len(rows))
        for mark in t.marks:
            has = pc.and_(has, pc.match_substring(args, f'"{mark}":'))
        stream = pa.array([False] * len(rows))
        for key in t.stream_args:
            stream = pc.or_(stream, pc.match_substring(args, f'"{key}":'))
        found = pc.or_(found, pc.and_(has, stream))
    return rows.filter(pc.fill_null(found, False)).to_pylist()


def is_task_event(event: dict) -> bool:
    """Whether one parsed event is a device task without a cat (`task_rows`' rule, on a dict)."""
    args = event.get("args")
    if event.get("ph") != "X" or event.get("cat") is not None or type(args) is not dict:
        return False
    return any(all(m in args for m in t.marks) and any(k in args for k in t.stream_args) for t in DEVICE_TASKS)


def task_columns(args_json: pa.Array, names: pa.Array, pids: pa.Array) -> dict:
    """kind, stream, device (provisional: by the first pid scheme), copy_bytes and copy_bw_gbps of
    device tasks from their args texts (valid JSON objects: the events table's), names and pids."""
    texts = [b"null" if a is None else a.encode() for a in args_json.to_pylist()]
    try:
        parsed = _DECODE.decode(b"[" + b",".join(texts) + b"]")
    except (msgspec.MsgspecError, ValueError):  # an arg of another type: read it leniently
        parsed = [_lenient(t) for t in texts]
    streams: list[int | None] = []
    types: list[str | None] = []
    sizes: list[int | None] = []
    bws: list[float | None] = []
    for a in parsed:
        if a is None:
            streams.append(None)
            types.append(None)
            sizes.append(None)
            bws.append(None)
            continue
        fields = msgspec.structs.astuple(a)
        n = len(STREAM_ARGS)
        streams.append(next((v for v in fields[:n] if v is not None), None))
        types.append(next((v for v in fields[n : n + len(TASK_TYPE_ARGS)] if v is not None), None))
        sizes.append(a.copy_bytes)
        bws.append(None if a.copy_bw is None else float(a.copy_bw))
    name_list = names.to_pylist()
    return {
        "kind": pa.array([task_kind(t, n) for t, n in zip(types, name_list)], pa.string()),
        "stream": pa.array(streams, pa.int64()),
        "device": pa.array([None if p is None else DEVICE_PIDS[0].device(p) for p in pids.to_pylist()], pa.int64()),
        "copy_bytes": pa.array(sizes, pa.int64()),
        "copy_bw_gbps": pa.array(bws, pa.float64()),
    }


def _lenient(text: bytes):
    """A task's args with each value that is not of the type gpu_ops wants left out."""
    try:
        raw = msgspec.json.decode(text)
    except (msgspec.MsgspecError, ValueError):
        return None
    if not isinstance(raw, dict):
        return None
    keep = {}
    for i, k in enumerate(STREAM_ARGS):
        if type(raw.get(k)) is int:
            keep[f"s{i}"] = raw[k]
    for i, k in enumerate(TASK_TYPE_ARGS):
        if isinstance(raw.get(k), str):
            keep[f"t{i}"] = raw[k]
    if type(raw.get(COPY_BYTES_ARG)) is int:
        keep["copy_bytes"] = raw[COPY_BYTES_ARG]
    if type(raw.get(COPY_BW_ARG)) in (int, float):
        keep["copy_bw"] = raw[COPY_BW_ARG]
    return _TaskArgs(**keep)


def device_ids(events: Path | pl.LazyFrame, pids: set[int]) -> dict[int, int]:
    """pid -> device of the processes holding device tasks, by the pid scheme their
    `process_sort_index` says (`kineto.task_device`); from the events table (its metadata rows:
    its Parquet file, or the table itself)."""
    import polars as pl  # not at the top: the reading workers import this module (`read.head_start`)

    sort = (
        (events if isinstance(events, pl.LazyFrame) else pl.scan_parquet(events))
        .filter((pl.col("ph") == "M") & (pl.col("name") == "process_sort_index") & pl.col("pid").is_in(list(pids)))
        .select("pid", index=pl.col("args_json").str.json_path_match("$.sort_index").cast(pl.Int64, strict=False))
        .drop_nulls()
        .unique("pid", keep="first")
        .collect()
    )
    index = dict(sort.iter_rows())
    return {p: task_device(p, index.get(p)) for p in pids}


def rewrite_devices(gpu_ops: Path, fix: dict[int, int]):
    """gpu_ops.parquet with the device of the device tasks of the pids `fix` names set to theirs,
    batch by batch (rows of other pids, and rows with a cat, as they were)."""
    from pipeline import store  # polars, which the reading workers do without (`read.head_start`)

    keys, values = pa.array(list(fix), pa.int64()), pa.array(list(fix.values()), pa.int64())
    with store.atomic_file(gpu_ops) as tmp:
        writer = store.TableWriter(tmp, "gpu_ops")
        try:
            for batch in pq.ParquetFile(gpu_ops).iter_batches(1 << 16):
                t = pa.Table.from_batches([batch])
                at = pc.index_in(t.column("pid"), value_set=keys)
                task = pc.and_(pc.is_null(t.column("cat")), pc.is_valid(at))
                device = pc.if_else(task, pc.take(values, at), t.column("device"))
                writer.write(t.set_column(t.schema.get_field_index("device"), "device", device))
            writer.close()
        except BaseException:
            writer.abandon()
            raise
