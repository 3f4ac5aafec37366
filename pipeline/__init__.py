"""tracepipe: a columnar analytics pipeline for PyTorch profiler (Kineto) traces.

Public API (everything else is internal):

    flatten(path, out, ...)        -> FlattenResult   one trace -> OUT/<stem>/*.parquet
    scan(flat_dir, table)          -> polars.LazyFrame  any table of a flattened trace
"""
__version__ = "0.1.0"

from .errors import BadTrace, DatasetError, TracepipeError, UsageError  # noqa: E402
from .flatten import FlattenResult, flatten  # noqa: E402
from .store import scan  # noqa: E402

__all__ = ["flatten", "scan", "FlattenResult", "TracepipeError", "BadTrace", "UsageError", "DatasetError",
           "__version__"]
