"""tables: a decoded chunk's three tables (events, gpu_ops, flows), whichever builder made its
events table: the GPU activity and flow endpoints are taken from it the same way."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline import schema
from pipeline.kineto import DEVICE_FROM_PID, FLOW_PHASES, GPU_KINDS, THREAD_ID_FORMS
from pipeline.read.arrays import INT64_MIN, coerced_ints
from pipeline.read.device_tasks import task_columns, task_rows
from pipeline.read.durations import OpenEnds
from pipeline.read.values import Problems


@dataclass
class ChunkTables:
    events: pa.Table
    gpu_ops: pa.Table
    flows: pa.Table
    problems: Problems
    device_ids: set
    task_pids: set = field(default_factory=set)  # pids of device tasks without a cat (`device_tasks`)
    open_ends: OpenEnds | None = None  # B/E events left to pair across chunks (`read.durations`)
    launches: Counter | None = None  # launch and capture calls (`read.launches`); None: not counted yet
    cats: set = field(default_factory=set)  # the event categories held


def gpu_and_flow_rows(ev: pa.Table) -> tuple[list, pa.Array]:
    """Rows of GPU activity (ph X, a GPU cat; of a cat the host uses too, on a device's process:
    `kineto.DEVICE_FROM_PID`; or a device task without a cat: `device_tasks`) and of flow endpoints
    (ph s/f/t; int64, as `flows_of` takes them: a chunk's ~10K flow rows made Python ints and back
    took 0.4 ms of its ~13)."""
    ph, cat = ev.column("ph"), ev.column("cat")
    is_gpu = pc.is_in(cat, _GPU_CATS_ARRAY)
    for c, pid_below in ON_DEVICE_PIDS.items():
        elsewhere = pc.and_kleene(pc.equal(cat, c), pc.invert(pc.less(ev.column("pid"), pid_below)))
        is_gpu = pc.and_not_kleene(is_gpu, elsewhere)  # null (no pid): not on a device's process
    is_gpu = pc.and_(pc.equal(ph, "X"), is_gpu)
    gpu_rows = with_task_rows(pc.indices_nonzero(pc.fill_null(is_gpu, False)).to_pylist(), ev)
    flow_rows = pc.indices_nonzero(pc.fill_null(pc.is_in(ph, _FLOW_PHASES_ARRAY), False)).cast(pa.int64())
    return gpu_rows, flow_rows


def with_task_rows(gpu_rows: list, ev: pa.Table) -> list:
    """GPU activity rows with the device tasks without a cat among them (`device_tasks`), in order."""
    tasks = task_rows(ev)
    return sorted(gpu_rows + tasks) if tasks else gpu_rows


# ---------------------------------------------------------------- 2. and 3. dicts (orjson)
_FLOW_PHASES_ARRAY = pa.array(sorted(FLOW_PHASES), pa.string())


_GPU_CATS_ARRAY = pa.array(sorted(GPU_KINDS), pa.string())
ON_DEVICE_PIDS = {c: below for c, below in DEVICE_FROM_PID.items() if below is not None}


def events_table(cols: dict) -> pa.Table:
    n = len(cols["ph"])
    return pa.table({"event_idx": int64_array(np.arange(n, dtype=np.int64)), **cols, "tid": numbered_tids(cols)})


def int64_array(values: np.ndarray) -> pa.Array:
    """An int64 numpy array as an Arrow array over the same memory. `pa.array` of a numpy array
    looks for numpy's masked arrays first, which imports `numpy.ma` on a process's first call:
    ~45 ms of CPU in each reading worker (they are forked before it is imported)."""
    values = np.ascontiguousarray(values, dtype=np.int64)
    return pa.Array.from_buffers(pa.int64(), len(values), [None, pa.py_buffer(values)])


def numbered_tids(cols: dict) -> pa.Array:
    """`tid`, with the threads that a layout writes as strings naming a number (`"1890023232"`,
    `"stream 7"`: `kineto.THREAD_ID_FORMS`) given that number; the string stays in `tid_str`."""
    tid, text = cols["tid"], cols["tid_str"]
    if text.null_count == len(text):
        return tid
    if isinstance(text, pa.ChunkedArray):
        text = text.combine_chunks()
    # a chunk names a few threads, each on thousands of events: each name is matched once (a chunk
    # of `kineto/v100_tbplugin_resnet50`, whose every tid is a string: 1.29 -> 0.27 ms)
    threads = pc.dictionary_encode(text)
    names, number = threads.dictionary, None
    for form in THREAD_ID_FORMS:
        found = pc.cast(pc.struct_field(pc.extract_regex(names, form), "n"), pa.int64())  # null: no match
        number = found if number is None else pc.coalesce(number, found)
    return tid if number is None else pc.coalesce(tid, number.take(threads.indices))


EVENT_COLUMNS = (
    "ph",
    "cat",
    "name",
    "pid",
    "pid_str",
    "tid",
    "tid_str",
    "ts_ns",
    "dur_ns",
    "id",
    "id_str",
    "correlation",
    "external_id",
    "args_json",
    "extra_json",
)


_GPU_EVENT_COLUMNS = ("cat", "name", "pid", "tid", "correlation", "external_id", "ts_ns", "dur_ns")
_TASK_EVENT_COLUMNS = ("args_json",)  # what `device_tasks.task_columns` reads besides


def typed_gpu_ops(rows: pa.Array, arg_cols: dict, ev: pa.Table):
    """`gpu_ops_of` for GPU rows whose args came typed (`arg_cols`' device and stream int64 arrays:
    the native pass), made a column at a time: the same table, device ids and task pids; None when
    a row needs `gpu_ops_of`'s rules for one row at a time (a device task without a cat, a device
    read from the pid, an id `coerced_ints` would count)."""
    take = ev.select(_GPU_EVENT_COLUMNS).take(rows)
    cat, device, stream = take.column("cat"), arg_cols["device"], arg_cols["stream"]
    if cat.null_count or (len(_FROM_PID_CATS) and pc.any(pc.is_in(cat, _FROM_PID_CATS)).as_py()):
        return None
    if any(len(a) > a.null_count and pc.min(a).as_py() == INT64_MIN for a in (device, stream)):
        return None
    kind = pc.take(_KINDS, pc.index_in(cat, _KIND_CATS))
    return _gpu_ops(_gpu_columns(rows, kind, device, stream, take, arg_cols), set())


_FROM_PID_CATS = pa.array(sorted(DEVICE_FROM_PID), pa.string())
_KIND_CATS = pa.array(list(GPU_KINDS), pa.string())
_KINDS = pa.array(list(GPU_KINDS.values()), pa.string())


def gpu_ops_of(rows: list, cats: list, pids: list, arg_cols: dict, ev: pa.Table, problems: Problems):
    """The gpu_ops rows of a chunk: launch geometry and copy sizes from each GPU event's args
    (`arg_cols`: `gpu_arg_columns`; `cats`, `pids`: the rows' cat and raw pid values); a device task
    without a cat takes its kind, stream, device and copy size from `device_tasks.task_columns`.
    Returns the table, the device ids it holds, and the pids of its device tasks."""
    devices = list(arg_cols["device"])
    for j, cat in enumerate(cats):
        if devices[j] is None and cat in DEVICE_FROM_PID:
            devices[j] = pids[j]  # e.g. MTIA's, Gaudi's device activity lives in the device's process
    device = coerced_ints(devices, "device", problems)
    idx = pa.array(rows, pa.int64())
    tasks = [j for j, c in enumerate(cats) if c is None]
    take = ev.select([*_GPU_EVENT_COLUMNS, *(_TASK_EVENT_COLUMNS if tasks else ())]).take(idx)  # no other column
    kind = pa.array([GPU_KINDS.get(c) for c in cats], pa.string())
    stream = coerced_ints(arg_cols["stream"], "stream", problems)
    cols = _gpu_columns(idx, kind, device, stream, take, arg_cols)
    task_pids: set = set()
    if tasks:
        at = pa.array(tasks, pa.int64())
        pid = take.column("pid").take(at)
        found = task_columns(take.column("args_json").take(at), take.column("name").take(at), pid)
        mask = pa.array([c is None for c in cats])
        for k, v in found.items():
            cols[k] = pc.replace_with_mask(pc.cast(cols[k], v.type), mask, v)
        task_pids = set(pc.unique(pid.drop_null()).to_pylist())
    return _gpu_ops(cols, task_pids)


def _gpu_columns(idx, kind, device, stream, take: pa.Table, arg_cols: dict) -> dict:
    """A chunk's gpu_ops columns, in the table's order: its rows' event indexes, kinds, device and
    stream ids, their events' columns (`take`: _GPU_EVENT_COLUMNS of the rows) and the other args."""
    return {
        "event_idx": idx,
        "kind": kind,
        **{k: take.column(k) for k in ("cat", "name")},
        "device": device,
        "stream": stream,
        **{k: take.column(k) for k in ("pid", "tid", "correlation", "external_id", "ts_ns", "dur_ns")},
        **{k: v for k, v in arg_cols.items() if k not in ("device", "stream")},
    }


def _gpu_ops(cols: dict, task_pids: set) -> tuple[pa.Table, set, set]:
    """(`gpu_ops_of`'s result) the table of `_gpu_columns`, the device ids it holds, `task_pids`."""
    return (
        schema.conform(pa.table(cols), "gpu_ops", ("flatten",)),
        set(pc.unique(cols["device"].drop_null()).to_pylist()),
        task_pids,
    )


_FLOW_EVENT_COLUMNS = ("id", "id_str", "cat", "ph", "name", "ts_ns", "pid", "pid_str", "tid", "tid_str")


def flows_of(rows: pa.Array, bp: pa.Array, ev: pa.Table) -> pa.Table:
    """The flows rows of a chunk (`rows` into the events table; `bp`: their binding points)."""
    take = ev.select(_FLOW_EVENT_COLUMNS).take(rows)
    table = pa.table(
        {
            "event_idx": rows,
            **{k: take.column(k) for k in _FLOW_EVENT_COLUMNS},
            "bp": bp,
        }
    )
    return schema.conform(table, "flows", ("flatten",))
