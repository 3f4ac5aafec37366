"""by_native: the compiled chunk builder, when it is installed (`native/`, built by `make install`
where a C++ compiler is found). One pass of simdjson On-Demand over a chunk's text fills the
column buffers `by_struct` builds from msgspec structs; the tables are then made by the same code
as the struct builder's (`tables`), so they are identical. The native pass declines (None) any
chunk that is not of the plain shape, or anything it is not sure of; `decode` then tries the
Python builders. TRACEPIPE_NATIVE=0 turns it off.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from pipeline import native
from pipeline.kineto import FLOW_PHASES, GPU_KINDS
from pipeline.read.arrays import plain_strings
from pipeline.read.by_struct import ALIAS_FIELDS, GPU_ARG_FIELDS
from pipeline.read.launches import LAUNCH_CATS_LOWER, launch_counts_of_calls
from pipeline.read.tables import (
    EVENT_COLUMNS,
    ON_DEVICE_PIDS,
    ChunkTables,
    events_table,
    flows_of,
    gpu_and_flow_rows,
    gpu_ops_of,
    int64_array,
    typed_gpu_ops,
    with_task_rows,
)
from pipeline.read.values import Problems

try:
    import tracepipe_native as _native
except ImportError:  # not built (no compiler), or built for another CPU: the Python builders
    _native = None

_INT, _DIMS, _FLOAT = 0, 1, 2


def _kind(typ) -> int:
    return {int | None: _INT, list[int] | None: _DIMS, int | float | None: _FLOAT}[typ]


if _native is not None:
    _native.configure(
        [_kind(t) for _, t, _ in GPU_ARG_FIELDS],
        [(key, i, 0) for i, (_, _, key) in enumerate(GPU_ARG_FIELDS)]
        + [
            (alias, [f for f, _, _ in GPU_ARG_FIELDS].index(field), 1 + n)
            for n, (_, field, _, alias) in enumerate(ALIAS_FIELDS)
        ],
    )
    if hasattr(_native, "configure_rows"):  # 0.4.0: the rows `tables.gpu_and_flow_rows` picks, by its rules
        _native.configure_rows(
            sorted(GPU_KINDS), sorted(ON_DEVICE_PIDS.items()), sorted(FLOW_PHASES), sorted(LAUNCH_CATS_LOWER)
        )


def available() -> bool:
    """Whether chunks go through the native builder (installed, and not turned off)."""
    return _native is not None and native.allowed()


def _kept(view: memoryview | None) -> pa.Buffer | None:
    """A copy, in Arrow's memory pool, of a buffer of the module's (which the next chunk reuses).
    Tables holding C-heap blocks while they wait to be written fragmented the heap (the peak RSS
    of a workers=1 flatten grew with the trace's size); the copy is a memcpy of ~1 MB a chunk."""
    if view is None:
        return None
    buf = pa.allocate_buffer(len(view))
    memoryview(buf).cast("B")[:] = view
    return buf


def _view(view: memoryview | None) -> pa.Buffer | None:
    """The module's buffer as it is, for arrays used before the next chunk is built."""
    return None if view is None else pa.py_buffer(view)


def _strings(n: int, parts, buffer=_kept) -> pa.Array:
    offsets, data, validity, nulls = parts
    return pa.StringArray.from_buffers(n, buffer(offsets), buffer(data), buffer(validity), nulls)


def _numbers(n: int, parts, typ=pa.int64(), buffer=_kept) -> pa.Array:
    values, validity, nulls = parts
    return pa.Array.from_buffers(typ, n, [buffer(validity), buffer(values)], nulls)


def tables_by_native(text: bytes) -> ChunkTables | None:
    """The chunk's tables as `by_struct.tables_by_struct` makes them, or None (not installed, turned
    off, or a chunk the native pass does not take)."""
    if not available():
        return None
    assert _native is not None
    out = _native.build(text)
    if out is None:
        return None
    n = out["n"]
    cols = {k: _strings(n, out[k]) for k in ("ph", "cat", "name", "pid_str", "tid_str", "id_str", "args_json")}
    for k in ("pid", "tid", "id", "ts_ns", "dur_ns", "correlation", "external_id"):
        cols[k] = _numbers(n, out[k])
    # `{"bp":"e"}` of each event with a `bp` or `s`, made in the native pass as
    # `by_struct.extra_json_of_struct_keys` makes it (0.9 ms of a chunk's ~14 there)
    cols["extra_json"] = _strings(n, out["extra_json"]) if "extra_json" in out else pa.nulls(n, pa.string())
    ev_table = events_table({k: cols[k] for k in EVENT_COLUMNS})
    if "gpu_rows" in out:  # picked as the native pass read (0.7 ms of a chunk's ~11 in Arrow's kernels)
        gpu_rows = with_task_rows(np.frombuffer(out["gpu_rows"], np.int64).tolist(), ev_table)
        flow_rows = int64_array(np.frombuffer(out["flow_rows"], np.int64).copy())  # the module reuses its buffer
    else:
        gpu_rows, flow_rows = gpu_and_flow_rows(ev_table)
    if gpu_rows and np.frombuffer(out["gpu_bad"], np.uint8)[gpu_rows].any():
        return None  # a GPU event's args of another shape: the struct builder decides
    rows = pa.array(gpu_rows, pa.int64())
    problems = Problems()
    if out["ts_strings"]:  # torch_npu's decimal strings, as `timestamps.ts_column` counts them
        problems.coerced["ts_string_to_number"] += out["ts_strings"]
    arg_cols = _gpu_arg_columns(n, out["gpu"], rows)
    made = typed_gpu_ops(rows, arg_cols, ev_table)
    if made is None:  # a row for gpu_ops_of's rules: the ids as the Python values it takes
        made = gpu_ops_of(
            gpu_rows,
            ev_table.column("cat").take(rows).to_pylist(),
            [
                s if s is not None else i
                for i, s in zip(cols["pid"].take(rows).to_pylist(), cols["pid_str"].take(rows).to_pylist())
            ],
            arg_cols | {k: arg_cols[k].to_pylist() for k in ("device", "stream")},
            ev_table,
            problems,
        )
    gpu_table, device_ids, task_pids = made
    if "bp" in out:
        bp = plain_strings(_strings(n, out["bp"], buffer=_view).take(flow_rows))
    else:
        bp = pa.nulls(len(flow_rows), pa.string())
    tables = ChunkTables(ev_table, gpu_table, flows_of(flow_rows, bp, ev_table), problems, device_ids, task_pids)
    if "calls" in out:  # and its categories and launch calls (`decode._paired` finds them otherwise)
        tables.cats, tables.launches = set(out["cats"]), launch_counts_of_calls(out["calls"])
    return tables


def _gpu_arg_columns(n: int, fields: list, rows: pa.Array) -> dict:
    """`by_struct`'s GPU arg columns, of the GPU rows, from the native per-event buffers."""
    out: dict = {}
    for (name, typ, _), parts in zip(GPU_ARG_FIELDS, fields):
        kind = _kind(typ)
        if kind == _DIMS:
            for d, p in zip("xyz", parts):
                out[f"{name}_{d}"] = _numbers(n, p, buffer=_view).take(rows)
        elif kind == _FLOAT:
            out[name] = _numbers(n, parts, pa.float64(), buffer=_view).take(rows)
        else:
            out[name] = _numbers(n, parts, buffer=_view).take(rows)
    return {k: out[k] for k in _ARG_COLUMN_ORDER}


_ARG_COLUMN_ORDER = (
    "device",
    "stream",
    "grid_x",
    "grid_y",
    "grid_z",
    "block_x",
    "block_y",
    "block_z",
    "registers_per_thread",
    "shared_memory",
    "copy_bytes",
    "kineto_graph_id",
    "kineto_graph_node_id",
    "warps_per_sm",
    "occupancy_pct",
    "copy_bw_gbps",
)
