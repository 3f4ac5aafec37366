"""Peers: tracepipe's idle-time breakdown agrees with Holistic Trace Analysis (HTA) on real traces.

Runs only where HTA is importable in this Python (it lives in its own venv, e.g.
`/work/venv-hta/bin/python -m pytest tests/test_peers_hta.py` with tracepipe importable there too)
and the shared traces exist. HTA's definition (docs/hta_definitions.md): per stream, GPU activities
(kernel, gpu_memcpy, gpu_memset) sorted by ts; gap = next.ts - prev.end; host wait when the next
activity's launch started after prev.end, else kernel wait when gap < 30 µs, else other.
HTA_DISABLE_NS_ROUNDING=1 keeps HTA from ceiling ts / flooring end of float (ns) timestamps.

The two traces are ones where HTA's quirks (no-launch kernels joined to event 0, per-stream only,
kernels launched after the last ProfilerStep dropped) do not change the result.
"""

from __future__ import annotations

import inspect
import json
import os
import shutil

import pytest

os.environ["HTA_DISABLE_NS_ROUNDING"] = "1"  # before HTA is imported: 0.6+ reads it once
hta = pytest.importorskip("hta")
from hta.trace_analysis import TraceAnalysis  # noqa: E402

pytestmark = [pytest.mark.peers, pytest.mark.real]

TRACES = ["hta/a100_nccl.json.gz", "hta/diff_control_a100.json.gz"]
CATEGORIES = ("host_wait", "kernel_wait", "other")


def _hta_idle(trace, tmp_path) -> dict:
    """{(device, stream): {idle_us, host_wait_us, kernel_wait_us, other_us}} from HTA's public API."""
    d = tmp_path / "hta_in"
    d.mkdir()
    shutil.copy(trace, d / trace.name)  # HTA takes a directory of traces
    kw = (
        {"include_last_profiler_step": True}
        if "include_last_profiler_step" in inspect.signature(TraceAnalysis).parameters
        else {}
    )
    ta = TraceAnalysis(trace_dir=str(d), **kw)
    out: dict = {}
    for rank in ta.t.get_ranks():
        df, _ = ta.get_idle_time_breakdown(ranks=[rank], visualize=False, consecutive_kernel_delay=30)
        events = ta.t.get_trace(rank)
        for stream, rows in df.groupby("stream"):
            pids = set(events.loc[events["stream"].eq(stream), "pid"].astype(int))
            assert len(pids) == 1, f"stream {stream} on several devices {pids}: HTA merges them"
            key = (pids.pop(), int(stream))
            row = {f"{c}_us": float(rows.loc[rows["idle_category"].eq(c), "idle_time"].sum()) for c in CATEGORIES}
            row["idle_us"] = sum(row[f"{c}_us"] for c in CATEGORIES)
            out[key] = row
    return out


@pytest.mark.parametrize("rel", TRACES)
def test_idle_breakdown_matches_hta(shared_traces, tmp_path, run_cli, rel):
    trace = shared_traces / rel
    if not trace.exists():
        pytest.skip(f"{rel} not in the shared traces")
    expected = _hta_idle(trace, tmp_path)
    assert expected, "HTA found no GPU stream"

    p = run_cli(["analyze", trace, "--format", "json", "--section", "idle"])
    assert p.returncode == 0, p.stderr
    got = {(int(r["device"]), int(r["stream"])): r for r in json.loads(p.stdout)["idle"]}

    assert sorted(got) == sorted(expected)
    for key, want in expected.items():
        for col in ("idle_us", "host_wait_us", "kernel_wait_us", "other_us"):
            assert got[key][col] == pytest.approx(want[col], abs=0.05, rel=1e-6), (key, col)
