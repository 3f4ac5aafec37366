"""rank: which rank of its job a trace is: `distributedInfo.rank`, else its file name. Light (no
Arrow): the streaming pass of `tracepipe ranks` reads it too."""

from __future__ import annotations

import os
import re

RANK_IN_NAME = (
    re.compile(r"(?i)rank[-_ .]?(\d+)"),  # rank-3, rank3, rank_3
    re.compile(r"_(\d{1,4})\."),
)  # trace_3.json: at most 4 digits (a host_pid name is no rank)


def int_or_none(v):
    return v if type(v) is int else None


# torch_npu writes each rank's trace as <run>/<worker>_ascend_pt/ASCEND_PROFILER_OUTPUT/trace_view.json,
# the rank in <worker>_ascend_pt/profiler_info_<rank>.json beside it (torch_npu profiler_interface.py)
PROFILER_OUTPUT = re.compile(r"(?P<run>.*)[/\\](?P<worker>[^/\\!]*_ascend_pt)[/\\]ASCEND_PROFILER_OUTPUT$")
PROFILER_INFO = re.compile(r"^profiler_info_(\d+)\.json$")


def rank_of(path: str, distributed: dict) -> tuple[int | None, str | None]:
    """(rank, where it came from): `distributedInfo.rank`, else the file name (`rank-3`, `rank3`,
    `_3.`), else, for torch_npu's trace_view.json, the `profiler_info_<rank>.json` torch_npu wrote
    beside its ASCEND_PROFILER_OUTPUT folder or the name of that folder's parent (`rank3_ascend_pt`),
    else (None, None)."""
    rank = int_or_none(distributed.get("rank"))
    if rank is not None:
        return rank, "distributedInfo"
    name = os.path.basename(str(path))
    for pattern in RANK_IN_NAME:
        m = pattern.search(name)
        if m:
            return int(m.group(1)), "file name"
    out = PROFILER_OUTPUT.match(os.path.dirname(str(path)))
    if out is None:
        return None, None
    try:
        found = [
            int(m.group(1))
            for f in os.listdir(os.path.join(out["run"], out["worker"]))
            if (m := PROFILER_INFO.match(f))
        ]
    except OSError:  # a member of an archive: no folder to look in
        found = []
    if len(found) == 1:
        return found[0], "profiler_info"
    m = RANK_IN_NAME[0].search(out["worker"])
    return (int(m.group(1)), "folder name") if m else (None, None)
