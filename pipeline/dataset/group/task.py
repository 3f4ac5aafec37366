"""task: one batch task (`run_group`): its small members flattened together (`_group`), the
others alone (`flatten_alone`), then one part file per table (`_write`)."""

from __future__ import annotations

import gc
import os
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline import schema, store
from pipeline.dataset.group.bands import fits
from pipeline.dataset.group.decode import DECODE_BYTES, READ_TABLES, Tables, concat, decode_some, finish_read, select
from pipeline.dataset.group.facts import facts, flatten_alone, spans
from pipeline.dataset.group.link import link_all
from pipeline.dataset.group.run_tables import run_tables
from pipeline.dataset.layout import KEY, TABLES
from pipeline.dataset.members import Member, read_text
from pipeline.dataset.parts import PART_ROW_GROUP_ROWS, PartWriter
from pipeline.errors import OutputError

FAULT_KILL = "TRACEPIPE_FAULT_KILL"  # tests: a worker given an input whose name holds this value dies


def _repeat(value: str, n: int) -> pa.Array:
    return pa.repeat(pa.scalar(value, pa.string()), n)


@dataclass
class Grouped:
    """What `_group` made of the members it flattened together: their tables (in member order),
    the member of each row, and the members."""

    members: list[Member]
    tables: dict[str, pa.Table]
    owner: dict[str, np.ndarray]

    def rows_of(self, name: str, first: int, last: int) -> tuple[pa.Table, np.ndarray]:
        """The rows of members first..last (consecutive), and their member indexes."""
        owner = self.owner[name]
        lo, hi = np.searchsorted(owner, first, "left"), np.searchsorted(owner, last, "right")
        return self.tables[name].slice(lo, hi - lo), owner[lo:hi]


def _group(members: list[Member], work: Path, max_inflate: float | None, formulas=None) -> Grouped | None:
    """Read, decode, link and cost the small members together; those that cannot be end `alone`."""
    from pipeline.read.metadata import devices_table  # noqa: F401 - imported before the timing-critical part

    grouped: list[Member] = []
    parts: list[Tables] = []
    batch: list[Member] = []
    size = 0
    for m in [*members, None]:  # read and decode DECODE_BYTES of text at a time: texts are not held long
        if m is not None and read_text(m, max_inflate):
            batch.append(m)
            size += len(m.text or b"")
        elif m is not None:
            m.alone = True
        if batch and (m is None or size >= DECODE_BYTES):
            got, some = decode_some(batch)
            grouped += got
            parts.append(some)
            batch, size = [], 0
    t = concat(parts)
    if not grouped:
        return None
    finish_read(grouped, t, {})
    fit = fits(t) & ~_launch_graphs(t) & ~_device_tasks(t)
    if not fit.all():  # ids beyond a band: those members go alone
        for k in np.flatnonzero(~fit):
            grouped[k].alone = True
        keep = np.flatnonzero(fit)
        remap = np.full(t.n, -1, np.int64)
        remap[keep] = np.arange(len(keep))
        tables, owner = {}, {}
        for name in READ_TABLES:
            rows = np.flatnonzero(fit[t.owner[name]])
            tables[name], owner[name] = select(t.tables[name], rows), remap[t.owner[name][rows]]
        grouped = [grouped[k] for k in keep]
        t = Tables(tables, owner, len(grouped))
        if not grouped:
            return None
    t.tables["gpu_ops"] = link_all(grouped, t, work, formulas)
    coll, coll_owner, steps, steps_owner = run_tables(grouped, t)
    span_of = spans(t)
    for i, m in enumerate(grouped):
        m.row[KEY] = m.trace_id
        m.row["source_path"] = m.source
        m.facts = facts(m, m.row, False, None, span_of.get(i, (None, None)))
    devices = [m.devices for m in grouped]
    tables = {
        **t.tables,
        "devices": pa.concat_tables(devices),
        "trace": pa.Table.from_pylist(
            [m.row for m in grouped], schema=schema.table("trace").arrow_schema(schema.ALL_STAGES)
        ),
        "collectives": coll,
        "steps": steps,
    }
    owner = {
        **t.owner,
        "devices": np.repeat(np.arange(len(grouped), dtype=np.int64), [d.num_rows for d in devices]),
        "trace": np.arange(len(grouped), dtype=np.int64),
        "collectives": coll_owner,
        "steps": steps_owner,
    }
    return Grouped(grouped, tables, owner)


def _launch_graphs(t: Tables) -> np.ndarray:
    """Per member, whether it launches CUDA/HIP graphs: such a trace goes alone, its graph replays
    paired by `flatten` (`pipeline.link.graphs`, per trace, with the capture traces beside it)."""
    from pipeline.kineto import GRAPH_LAUNCH

    names = t.tables["events"].column("name")
    if pa.types.is_dictionary(names.type):
        names = names.cast(pa.string())
    hit = np.asarray(pc.fill_null(pc.match_substring(names, "GraphLaunch"), False))
    out = np.zeros(t.n, dtype=bool)
    if hit.any():
        rows = np.flatnonzero(hit)
        exact = np.asarray(pc.fill_null(pc.match_substring_regex(names.take(rows), GRAPH_LAUNCH), False))
        out[np.unique(t.owner["events"][rows[exact]])] = True
    return out


def _device_tasks(t: Tables) -> np.ndarray:
    """Per member, whether it holds device tasks without a cat (torch_npu): such a trace goes alone,
    its device ids checked against its processes' sort indexes and its HCCL collectives read by
    `flatten` (`pipeline.read.device_tasks`, `pipeline.runs.collectives`)."""
    out = np.zeros(t.n, dtype=bool)
    gpu = t.tables["gpu_ops"]
    if gpu.num_rows:
        tasks = np.asarray(pc.is_null(gpu.column("cat")))
        out[np.unique(t.owner["gpu_ops"][tasks])] = True
    return out


def _write(members: list[Member], grouped: Grouped | None, stage: Path):
    """Write the part files (in trace_id order: runs of grouped members, then a member alone...)."""
    writer = PartWriter(stage)
    index = {id(m): k for k, m in enumerate(grouped.members)} if grouped else {}
    ids = pa.array([m.trace_id for m in grouped.members], pa.string()) if grouped else None
    run: list[int] = []  # consecutive grouped members not written yet

    def flush():
        if run and grouped is not None and ids is not None:
            for name in TABLES:
                tbl, owner = grouped.rows_of(name, run[0], run[-1])
                writer.add(name, tbl, ids.take(pa.array(owner, pa.int64())))
            run.clear()

    try:
        for m in members:
            if m.facts is None or m.facts["status"] == "quarantined":
                continue
            if id(m) in index:
                run.append(index[id(m)])
                continue
            flush()
            assert m.flat is not None
            for name in TABLES:
                f = pq.ParquetFile(m.flat / f"{name}.parquet")
                for batch in f.iter_batches(batch_size=PART_ROW_GROUP_ROWS):
                    tbl = pa.Table.from_batches([batch])
                    if name == "trace":
                        for col, value in ((KEY, m.trace_id), ("source_path", m.source)):
                            tbl = tbl.set_column(tbl.schema.get_field_index(col), col, _repeat(value, tbl.num_rows))
                    writer.add(name, tbl, _repeat(m.trace_id, tbl.num_rows))
            shutil.rmtree(m.flat, ignore_errors=True)
        flush()
        writer.close()
    except BaseException:
        writer.abandon()
        raise


def run_group(
    tasks: list[tuple],
    stage: str,
    max_inflate: float | None = None,
    workers: int = 1,
    small: bool = True,
    formulas=None,
) -> list[dict]:
    """Flatten the inputs (path, source, trace_id[, capture traces]) into STAGE/<table>.parquet (`PartWriter`);
    return each input's manifest facts, in the order given. `small`: read, link and cost them
    together (`_group`), else each alone with `workers` processes (a large trace). `formulas`:
    the user's formula file (`pipeline.cost.formulas.user.UserFormulas`), if any.

    A file that is not a readable trace gets status `quarantined`; other exceptions propagate (a
    full disk: OutputError).
    """
    doomed = os.environ.get(FAULT_KILL)
    if doomed and any(doomed in task[1] for task in tasks):  # fault injection, for tests
        os.kill(os.getpid(), signal.SIGKILL)
    stage_dir = Path(stage)
    shutil.rmtree(stage_dir, ignore_errors=True)
    stage_dir.mkdir(parents=True)
    members = sorted(
        (Member(task[0], task[1], task[2], captures=tuple(task[3]) if len(task) > 3 else ()) for task in tasks),
        key=lambda m: m.trace_id,
    )
    grouped = None
    try:
        if small and len(members) > 1:
            try:
                with _gc_paused():
                    grouped = _group(members, stage_dir / "work", max_inflate, formulas)
            except (OutputError, MemoryError):
                raise
            except Exception:  # a group that fails where flatten would not (a bug): each alone
                if os.environ.get("TRACEPIPE_GROUP_STRICT"):
                    raise
                grouped = None
                for m in members:
                    m.alone, m.facts = True, None
        for m in members:
            if m.facts is None:
                flatten_alone(m, stage_dir / "alone", workers, max_inflate, formulas)
        with store.output_of(stage_dir):
            _write(members, grouped, stage_dir)
    finally:
        for d in ("work", "alone"):
            shutil.rmtree(stage_dir / d, ignore_errors=True)
    by_id = {m.trace_id: m.facts for m in members}
    return [by_id[task[2]] or {} for task in tasks]


class _gc_paused:
    """Within: no cyclic garbage collection (a group's many small objects go by refcount)."""

    def __enter__(self):
        self.was = gc.isenabled()
        gc.disable()

    def __exit__(self, *exc):
        if self.was:
            gc.enable()
