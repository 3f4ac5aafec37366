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
__version__ = "0.1.0"

from . import report  # noqa: E402
from .augment import augment  # noqa: E402
from .combine import combine  # noqa: E402
from .errors import BadTrace, DatasetError, TracepipeError, UsageError  # noqa: E402
from .flatten import FlattenResult, flatten  # noqa: E402
from .store import scan  # noqa: E402

__all__ = ["flatten", "scan", "report", "augment", "combine", "FlattenResult", "TracepipeError", "BadTrace",
           "UsageError", "DatasetError", "__version__"]
