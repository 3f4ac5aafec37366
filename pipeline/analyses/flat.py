"""flat: a flattened trace opened for the analyses, what they are computed from read once and shared.

Every analysis takes a flattened-trace directory or a `Flat`. A Flat makes each sweep once, on
first use: the GPU sweep's totals (`activity`) and the CPU sweeps' (`cpu`), a few small tables;
nothing holds the trace. `opened` gives a Flat for a trace file too (flattened into a temporary
directory).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import cached_property
from pathlib import Path

import polars as pl

from pipeline import schema, store
from pipeline.analyses.activity import CPU_DEVICE, KERNEL, Activity, activity_rows, gpu_columns, gpu_sweep
from pipeline.analyses.cpu import CpuOps, cpu_sweep
from pipeline.analyses.sweep import read
from pipeline.analyses.window import Intervals, Window, inside
from pipeline.cost.categories import CategoryMemo
from pipeline.cost.devices import one_model
from pipeline.errors import BadTrace, DatasetError, UsageError
from pipeline.kineto import layout_device
from pipeline.link import links as link


class Flat:
    """A flattened trace opened for reports: what they are computed from is read once and shared
    by every report function (`activity`, `cpu`), a few small tables; nothing holds the trace."""

    def __init__(self, path: str | Path, flatten_result=None, window: Window | None = None):
        self.path = Path(path)
        self.flatten_result = flatten_result  # set when `opened` flattened a trace file for us
        self.window = window if window is not None and not window.empty else None
        if not store.is_flat_dir(self.path):
            raise DatasetError(f"{self.path}: not a flattened trace (run `tracepipe flatten` first)")
        self._cpu: dict[tuple, CpuOps] = {}

    def scan(self, table: str) -> pl.LazyFrame:
        return store.scan(self.path, table)

    @cached_property
    def intervals(self) -> Intervals | None:
        """The window's time intervals (`pipeline.analyses.window`), None for the whole trace."""
        return None if self.window is None else self.window.intervals(self.path / "events.parquet")

    @cached_property
    def has_memory(self) -> bool:
        """Whether the trace holds the profiler's `[memory]` events (profile_memory=True)."""
        events = pl.scan_parquet(self.path / "events.parquet").filter(pl.col("name") == "[memory]")
        return events.select(pl.len()).collect(engine="streaming").item() > 0

    def time_filter(self, column: str = "ts_ns") -> pl.Expr:
        """The rows an analysis sees: those whose `column` (their start) lies in the window."""
        return inside(self.intervals, column)

    @cached_property
    def stem(self) -> str:
        return self.scan("trace").select("stem").collect().item() or self.path.name

    @cached_property
    def origin(self) -> dict:
        """Where the trace was read from, for documents: {"dataset", "trace_id"} for a trace of a
        batch dataset, {"flat_dir"} for a flattened trace, {} for a trace file."""
        from pipeline.dataset.pick import ORIGIN

        if self.flatten_result is not None:
            return {}
        copied = self.path / ORIGIN
        return json.loads(copied.read_text()) if copied.is_file() else {"flat_dir": str(self.path)}

    @cached_property
    def source(self) -> str | None:
        return self.scan("trace").select("source_path").collect().item()

    @cached_property
    def gpu_ops_file(self) -> Path:
        """gpu_ops.parquet with the link columns: the directory's own or, for a directory flattened
        with --no-link, a temporary copy linked batch by batch, removed with this Flat."""
        own = self.path / "gpu_ops.parquet"
        if "launch_event_idx" in pl.scan_parquet(own).collect_schema().names():
            return own
        tmp = Path(tempfile.mkdtemp(prefix="tracepipe-linked-"))
        weakref.finalize(self, shutil.rmtree, tmp, True)
        src = link.LinkSources.of(self.path)
        store.write_extended(
            own,
            tmp / "gpu_ops.parquet",
            "gpu_ops",
            lambda batch: link.link_batch(src, batch).select("event_idx", *link.LINK_COLUMNS),
            inputs=link.GPU_LINK_INPUTS,
            batch_rows=link.BATCH_ROWS,
        )
        return tmp / "gpu_ops.parquet"

    @cached_property
    def gpu(self) -> pl.DataFrame:
        """Every GPU op with every declared column (null where link/cost did not run), end_ns and
        category: the whole table, for notebooks (the reports never hold it)."""
        columns = gpu_columns(self.gpu_ops_file, schema.table("gpu_ops").names(schema.ALL_STAGES))
        g = read(self.gpu_ops_file, pl.col("ts_ns").is_not_null(), columns)
        return activity_rows(g, CategoryMemo())

    @cached_property
    def has_gpu(self) -> bool:
        gpu = pl.scan_parquet(self.path / "gpu_ops.parquet").filter(pl.col("ts_ns").is_not_null())
        return gpu.select(pl.len()).collect(engine="streaming").item() > 0

    @cached_property
    def holds_work(self) -> bool:
        """Whether anything ran while the trace was recorded: device activity, or a complete event
        (an op, a runtime call, an annotation, a device task) other than the profiler's own span
        (category Trace). A profile of a region that ran nothing holds only that span."""
        if self.has_gpu:
            return True
        work = (pl.col("ph") == "X") & (pl.col("cat").str.to_lowercase() != "trace").fill_null(True)
        return pl.scan_parquet(self.path / "events.parquet").filter(work).head(1).collect().height > 0

    @cached_property
    def activity(self) -> Activity:
        """The device activity's totals: the GPU sweep's, or for a trace without GPU activity its CPU ops'."""
        if self.has_gpu:
            return gpu_sweep(self)
        activity = self.any_cpu().activity
        assert activity is not None, "a CPU sweep of a trace without GPU activity makes its activity"
        return activity

    @cached_property
    def op_calls(self) -> pl.DataFrame:
        """(cpu_op_name, calls): how many ops of each name launched kernels (`diff`): distinct ops,
        counted while streaming the GPU ops."""
        if not self.has_gpu:  # each CPU op is its own "kernel"
            own = pl.col("cpu_op_name").is_not_null() & (pl.col("kind") == "cpu_op")
            return self.activity.names.filter(own).group_by("cpu_op_name").agg(calls=pl.col("n").sum())
        launched = KERNEL & pl.col("cpu_op_name").is_not_null() & pl.col("ts_ns").is_not_null()
        gpu = pl.scan_parquet(self.gpu_ops_file)
        call = pl.col("cpu_op_event_idx")
        if "graph_id" in gpu.collect_schema().names():  # an op a graph captured ran once per replay
            replayed = pl.col("cpu_op_link") == "graph_capture"
            replay = [pl.when(replayed).then(c) for c in ("launch_event_idx", "capture_trace_id")]
            call = pl.struct(call, *replay)
        return (
            gpu.filter(launched)
            .group_by("cpu_op_name")
            .agg(calls=call.n_unique().cast(pl.Int64))
            .collect(engine="streaming")
        )

    def cpu(
        self,
        group_by: str | None = None,
        stack_n: int = 5,
        frames: bool = False,
        activity: Callable[[], Activity] | None = None,
    ) -> CpuOps:
        """The CPU sweep for an op grouping (`frames`: python_function frames swept too, for
        stacks; grouping by stack needs them). Each is swept once. `activity`: how to get the GPU
        sweep's totals when they are needed (default `Flat.activity`)."""
        frames = frames or group_by == "stack"
        key = (group_by, stack_n if group_by == "stack" else None, frames)
        if key not in self._cpu:
            self._cpu[key] = cpu_sweep(self, group_by, stack_n, frames, activity or (lambda: self.activity))
        return self._cpu[key]

    def sweep_both(self, group_by: str | None = None):
        """Make the GPU and the CPU sweep at once, the GPU one in a second thread: most of their
        work runs in polars, outside the GIL, and each alone keeps two cores only half busy."""
        if not self.has_gpu or "activity" in self.__dict__:
            self.cpu(group_by)
            return
        _ = self.gpu_ops_file  # made once, before both threads need it (it may link a copy)
        with ThreadPoolExecutor(1) as other:
            gpu = other.submit(gpu_sweep, self)
            try:
                self.cpu(group_by, activity=gpu.result)
            finally:
                self.__dict__["activity"] = gpu.result()

    def any_cpu(self) -> CpuOps:
        """A CPU sweep for what no grouping changes (steps, regions, CPU-only activity): any made so far."""
        return next(iter(self._cpu.values())) if self._cpu else self.cpu()

    def any_frames(self) -> CpuOps:
        """A CPU sweep with python_function frames (stacks): any made so far."""
        return next((c for (_, _, frames), c in self._cpu.items() if frames), None) or self.cpu(frames=True)

    @cached_property
    def device_names(self) -> pl.DataFrame:
        """(device, name): the trace's name for the device, else (no name, or an empty one: a
        device recognised by its properties) the spec matched, else the devices its layout runs on
        (torch_npu's: "Ascend NPU", `kineto.layout_device`), else unknown."""
        devs = self.scan("devices").collect()
        model = one_model(devs)  # unlisted ids of a one-model machine are of that model
        only = model["name"] if model and (model["name"] or "").strip() else None
        trace = self.scan("trace")
        has_layout = "layout" in trace.collect_schema().names()
        layout = layout_device(trace.select("layout").collect().item()) if has_layout else None
        devs = devs.select("device", dev_name=pl.when(pl.col("name").str.strip_chars() != "").then(pl.col("name")))
        ids = self.activity.runs["device"].select("device")
        ids = ids.join(self.activity.specs, on="device", how="left")
        return (
            ids.join(devs, on="device", how="left")
            .select(
                "device",
                name=pl.coalesce("dev_name", pl.lit(only, pl.String), "spec_name", pl.lit(layout or "unknown")),
            )
            .sort("device")
        )

    @cached_property
    def lost_activity(self) -> str | None:
        """What the trace lost of its device activity, in one line (`read.launches`); None: nothing."""
        from pipeline.read.launches import lost_activity_line

        row = self.scan("trace").select("problems_json", "n_gpu_ops").collect().row(0, named=True)
        return lost_activity_line(json.loads(row["problems_json"] or "{}"), row["n_gpu_ops"])

    @cached_property
    def activity_devices(self) -> pl.DataFrame:
        if self.has_gpu:
            return self.device_names
        name = "cpu ops (device activity lost)" if self.lost_activity else "cpu"  # not a CPU-only trace
        return (
            pl.DataFrame({"device": [CPU_DEVICE], "name": [name]})
            if self.any_cpu().span[2]
            else pl.DataFrame(schema={"device": pl.Int64, "name": pl.String})
        )


def as_flat(flat) -> Flat:
    """A Flat for what every report function takes: a Flat, a flattened-trace directory, or what
    `opened` opens (a trace file, the one trace of a folder or dataset), whose temporary files go
    when the Flat does (for several reports of a trace file, open it once with `opened`)."""
    if isinstance(flat, Flat):
        return flat
    if store.is_flat_dir(flat):
        return Flat(flat)
    ctx = opened(flat)
    f = ctx.__enter__()
    weakref.finalize(f, ctx.__exit__, None, None, None)
    return f


@contextmanager
def opened(
    path: str | Path, window: Window | None = None, trace: str | None = None, **flatten_options
) -> Iterator[Flat]:
    """A Flat for a trace file (flattened into a temporary directory removed afterwards, without
    the run tables: `pipeline.flatten`'s run_tables), a flattened-trace directory, or the trace
    `trace` names (trace_id, stem or part of its path) in a folder of flattened traces or a batch
    dataset (see `pipeline.dataset.pick`)."""
    path = Path(path)
    if path.is_dir() and flatten_options.get("graph_captures"):
        raise UsageError(f"{path} is flattened already: pair its graph replays with `flatten --graph-capture`")
    if path.is_dir():
        from pipeline.dataset.pick import one_trace

        with one_trace(path, trace) as d:
            yield Flat(d, window=window)
        return
    if not path.is_file():
        raise BadTrace(f"{path}: no such trace file or flattened directory")
    if trace is not None:
        raise UsageError(f"--trace picks a trace from a dataset or a folder of flattened traces, and {path} is a file")
    from pipeline.flatten import flatten

    with tempfile.TemporaryDirectory(prefix="tracepipe-report-") as tmp:
        # one trace's reports read no run tables (collectives, steps: whole runs'): not written
        with store.scratch_files():
            r = flatten(path, tmp, run_tables=False, **flatten_options)
        yield Flat(r.out_dir, flatten_result=r, window=window)
