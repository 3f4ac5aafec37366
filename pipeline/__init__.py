"""tracepipe: a columnar analytics pipeline for PyTorch profiler (Kineto) traces.

Public API (everything else is internal):

    flatten(path, out, ...)        -> FlattenResult       one trace -> OUT/<stem>/*.parquet (linked, costed)
    scan(path, table, trace=None)  -> polars.LazyFrame    a table of a flattened trace or a batch dataset
    report.*(trace)                -> polars.DataFrame    kernel_table, busy, op_table, idle, critical_path, ...
    augment(trace, out)            -> AugmentResult       the trace with cost fields in kernel args
    load_formulas(path)            -> UserFormulas        a formula file, checked (for formulas=...)
    combine(paths, out)            -> CombineResult       one trace from several; a run's ranks on one clock
    slice_trace(trace, out, ...)   -> SliceResult         a window of a trace as a trace (`tracepipe slice`)
    run_batch(src, out)            -> BatchResult         many traces -> one dataset (`tracepipe batch`)
    analyze_runs(dataset)          -> RunReport           ranks of a run together (`tracepipe ranks`)

>>> import pipeline, polars as pl
>>> from pipeline.synthetic import write_demo
>>> write_demo("example.json.gz", 0.3)                       # a small realistic trace
>>> r = pipeline.flatten("example.json.gz", "flat/")
>>> kernels = pipeline.scan(r.out_dir, "gpu_ops").filter(pl.col("kind") == "kernel")
>>> top = kernels.group_by("name").agg(pl.col("dur_ns").sum()).sort("dur_ns", descending=True).collect()
>>> top.columns
['name', 'dur_ns']
"""

import sys
from importlib import import_module
from types import ModuleType
from typing import TYPE_CHECKING

from pipeline import allocator  # noqa: F401  (first: it configures polars' allocator before polars loads)
from pipeline.errors import BadTrace, DatasetError, TracepipeError, UsageError
from pipeline.version import __version__

if TYPE_CHECKING:  # imported on first use: `tracepipe query` does not pay for the reader or reports
    from pipeline import report
    from pipeline.cost.formulas.user import load as load_formulas
    from pipeline.dataset.batch import run_batch
    from pipeline.dataset.tables import scan
    from pipeline.flatten import FlattenResult, flatten
    from pipeline.rewrite.augment import augment
    from pipeline.rewrite.combine import combine
    from pipeline.rewrite.slice import slice_trace
    from pipeline.runs.report import analyze_runs

_LAZY = {
    "flatten": ("pipeline.flatten", "flatten"),
    "FlattenResult": ("pipeline.flatten", "FlattenResult"),
    "report": ("pipeline.report", None),
    "run_batch": ("pipeline.dataset.batch", "run_batch"),
    "scan": ("pipeline.dataset.tables", "scan"),
    "augment": ("pipeline.rewrite.augment", "augment"),
    "combine": ("pipeline.rewrite.combine", "combine"),
    "slice_trace": ("pipeline.rewrite.slice", "slice_trace"),
    "analyze_runs": ("pipeline.runs.report", "analyze_runs"),
    "load_formulas": ("pipeline.cost.formulas.user", "load"),
}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'pipeline' has no attribute {name!r}")
    module, attr = _LAZY[name]
    value = import_module(module) if attr is None else getattr(import_module(module), attr)
    globals()[name] = value
    return value


class _Package(ModuleType):
    """`pipeline.flatten` stays the function when the submodule of that name is imported."""

    def __setattr__(self, name: str, value: object) -> None:
        if name == "flatten" and isinstance(value, ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


__all__ = [
    "flatten",
    "scan",
    "report",
    "augment",
    "combine",
    "slice_trace",
    "run_batch",
    "analyze_runs",
    "load_formulas",
    "FlattenResult",
    "TracepipeError",
    "BadTrace",
    "UsageError",
    "DatasetError",
    "__version__",
]
