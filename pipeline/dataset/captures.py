"""captures: which traces of a batch are the capture traces of which others (CUDA/HIP graphs).

Serving engines write the profiler trace of their graph capture phase into a folder beside the
traces of the run: vLLM (`--profiler-config.capture_torch_profiler`) always to
`<torch_profiler_dir>/capture_traces/`, SGLang (`--enable-profile-cuda-graph` with
`SGLANG_GRAPH_BATCH_CAPTURE`) to `capture_traces/bs_<bs>_rank<N>.json.gz`. The rule: the trace
files directly inside `<dir>/<CAPTURE_DIR>/` are the capture traces of every trace directly in
`<dir>`, whose graph replays are paired with them (`pipeline.link.graphs`); they are batched as
traces of their own too. `batch --capture-dir NAME` names another folder ('' turns pairing off).
"""

from __future__ import annotations

import os
from functools import lru_cache

from pipeline.dataset.inputs import Item, file_hash
from pipeline.kineto import is_trace_name

CAPTURE_DIR = "capture_traces"


class CaptureFinder:
    """The capture traces of a trace file by the rule above, each folder listed once."""

    def __init__(self, dir_name: str | None = CAPTURE_DIR):
        self.dir_name = dir_name or None
        self._listed: dict[str, tuple[str, ...]] = {}

    def of(self, path: str) -> tuple[str, ...]:
        if self.dir_name is None:
            return ()
        folder = os.path.join(os.path.dirname(path), self.dir_name)
        if folder not in self._listed:
            try:
                names = sorted(n for n in os.listdir(folder) if is_trace_name(n))
            except OSError:  # no such folder (most runs), or unreadable: nothing to pair
                names = []
            self._listed[folder] = tuple(
                p for p in (os.path.join(folder, n) for n in names) if os.path.isfile(p) and not os.path.islink(p)
            )
        return self._listed[folder]


def capture_trace_ids(paths: tuple[str, ...]) -> list[str | None]:
    """The dataset trace_id of each capture trace (`t` + its content hash: what `batch` gives it as
    a trace of its own); None for one that cannot be read."""
    return [_trace_id(os.path.realpath(p), *_stat(p)) for p in paths]


def _stat(path: str) -> tuple[int, int]:
    try:
        st = os.stat(path)
    except OSError:
        return -1, -1
    return st.st_size, st.st_mtime_ns


@lru_cache(maxsize=256)
def _trace_id(path: str, size: int, mtime_ns: int) -> str | None:
    if size < 0:
        return None
    try:
        digest, n = file_hash(path)
    except OSError:
        return None
    return Item(source=path, path=path, size=n, content_hash=digest).trace_id
