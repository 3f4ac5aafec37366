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


def rank_of(path: str, distributed: dict) -> tuple[int | None, str | None]:
    """(rank, where it came from): `distributedInfo.rank`, else the file name (`rank-3`, `rank3`,
    `_3.`), else (None, None)."""
    rank = int_or_none(distributed.get("rank"))
    if rank is not None:
        return rank, "distributedInfo"
    name = os.path.basename(str(path))
    for pattern in RANK_IN_NAME:
        m = pattern.search(name)
        if m:
            return int(m.group(1)), "file name"
    return None, None
