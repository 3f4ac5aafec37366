"""tracepipe: a columnar analytics pipeline for PyTorch profiler (Kineto) traces.

Public API (everything else is internal):

    flatten(path, out, ...)        -> FlattenResult       one trace -> OUT/<stem>/*.parquet (linked, costed)
    scan(flat_dir, table)          -> polars.LazyFrame    any table of a flattened trace
    report.*(flat)                 -> polars.DataFrame    kernel_table, busy, categories, op_table,
                                                          launch_overhead, compile_view, communication, diff
    augment(trace, out)            -> AugmentResult       the trace with cost fields in kernel args
    combine(paths, out)            -> CombineResult       one trace from several
    batch / query                                          see pipeline.batch, pipeline.query
"""

from pipeline import report
from pipeline.errors import BadTrace, DatasetError, TracepipeError, UsageError
from pipeline.flatten import FlattenResult, flatten
from pipeline.rewrite.augment import augment
from pipeline.rewrite.combine import combine
from pipeline.store import scan
from pipeline.version import __version__

__all__ = [
    "flatten",
    "scan",
    "report",
    "augment",
    "combine",
    "FlattenResult",
    "TracepipeError",
    "BadTrace",
    "UsageError",
    "DatasetError",
    "__version__",
]
