"""metadata: the `devices` and `trace` tables, from a trace's top-level metadata and what its events
showed (device ids, counts, problems); secrets in the metadata redacted."""

from __future__ import annotations

import datetime as _dt
import hashlib
import os
from collections.abc import Iterable

import pyarrow as pa

from pipeline import schema
from pipeline.kineto import layout_of, trace_stem
from pipeline.read.rank import int_or_none, rank_of
from pipeline.read.values import Problems, as_int, dumps
from pipeline.redact import redact
from pipeline.version import __version__


def sampled_content_id(path: str) -> str:
    """A content id from the size and the first and last MiB of the file (fast on huge files)."""
    h = hashlib.blake2b(digest_size=8)
    size = os.path.getsize(path)
    h.update(str(size).encode())
    with open(path, "rb") as f:
        h.update(f.read(1 << 20))
        if size > 2 << 20:
            f.seek(-(1 << 20), os.SEEK_END)
            h.update(f.read())
    return h.hexdigest()


def devices_table(metadata: dict, gpu_device_ids: set, problems: Problems) -> pa.Table:
    """One row per deviceProperties entry plus one per device id seen only on GPU events."""
    props = metadata.get("deviceProperties")
    rows = []
    if props is not None and not isinstance(props, list):
        problems.dropped["deviceProperties_not_a_list"] += 1
        props = []
    for p in props or []:
        if not isinstance(p, dict):
            problems.dropped["deviceProperties_entry_not_object"] += 1
            continue
        rows.append(
            {
                "device": as_int(p.get("id"), "device_id", problems),
                "source": "deviceProperties",
                "name": p.get("name") if isinstance(p.get("name"), str) else None,
                "total_global_mem": int_or_none(p.get("totalGlobalMem")),
                "compute_major": int_or_none(p.get("computeMajor")),
                "compute_minor": int_or_none(p.get("computeMinor")),
                "num_sms": int_or_none(p.get("numSms")),
                "warp_size": int_or_none(p.get("warpSize")),
                "max_threads_per_block": int_or_none(p.get("maxThreadsPerBlock")),
                "shared_mem_per_block": int_or_none(p.get("sharedMemPerBlock")),
                "props_json": dumps(p).decode(),
            }
        )
    listed = {r["device"] for r in rows}
    for d in sorted(gpu_device_ids - listed):
        rows.append({"device": d, "source": "gpu_events"})
    return pa.Table.from_pylist(rows, schema=schema.table("devices").arrow_schema())


def trace_row(
    path: str, metadata: dict, counts: dict, problems: Problems, tail, cats: Iterable = (), more: dict | None = None
) -> dict:
    """The trace table's row of a trace read from `path` (`cats`: the event categories it holds,
    which tell its layout; `more`: other problems_json entries, e.g. `read.launches`')."""
    info = metadata.get("distributedInfo")
    dist = info if isinstance(info, dict) else {}
    rest = {k: v for k, v in metadata.items() if k != "deviceProperties"}
    issues = {
        **{f"coerced:{k}": v for k, v in problems.coerced.items()},
        **{f"dropped:{k}": v for k, v in problems.dropped.items()},
        **{f"unmatched:{k}": v for k, v in problems.unmatched.items()},
    }
    issues.update(more or {})
    if tail.truncated:
        issues["truncated"] = 1
    sv = metadata.get("schemaVersion")
    base = metadata.get("baseTimeNanoseconds")
    return {
        "trace_id": sampled_content_id(path),
        "source_path": str(path),
        "source_bytes": os.path.getsize(path),
        "stem": trace_stem(path),
        "schema_version": None if sv is None else str(sv),
        "trace_name": metadata.get("traceName") if isinstance(metadata.get("traceName"), str) else None,
        "layout": layout_of(cats),
        "base_time_ns": base if type(base) is int else None,
        **dict(zip(("rank", "rank_from"), rank_of(path, dist))),
        "world_size": int_or_none(dist.get("world_size")),
        "backend": dist.get("backend") if isinstance(dist.get("backend"), str) else None,
        **counts,
        "n_coerced": sum(problems.coerced.values()),
        "n_dropped": sum(problems.dropped.values()),
        "problems_json": dumps(issues).decode(),
        "truncated": tail.truncated,
        "metadata_json": dumps(redact(rest)).decode(),
        "tracepipe_version": __version__,
        "flattened_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
