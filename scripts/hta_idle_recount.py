"""Idle-time breakdown recomputed from a trace's raw JSON with plain Python and Decimal timestamps.

Two rule sets (docs/hta_definitions.md):
  plain - per (args.device, args.stream): activities cat kernel/gpu_memcpy/gpu_memset, ph X, sorted by (ts, end);
          gap = next.ts - prev.end (signed); host wait when the next activity's launch (cuda_runtime/cuda_driver
          event with the same args.correlation) started after prev.end, else kernel wait when gap < 30, else other.
  hta   - plain plus HTA 0.5.0's loading rules: the ProfilerStep filter (>= 2 step names), the launch is any
          non-GPU event with the same correlation (the last one in trace order), and an activity whose
          correlation matches nothing takes the ts of traceEvents[0] as its launch time.
The hta rules reproduce HTA's get_idle_time_breakdown on every shared trace (counts exact, sums to < 0.01 µs).

    python scripts/hta_idle_recount.py TRACE.json.gz [--hta] [--exclude-last-step]
"""

from __future__ import annotations

import collections
import gzip
import json
import sys
from decimal import Decimal

GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
CATEGORIES = ("host_wait", "kernel_wait", "other")


def _corr(e: dict):
    return e.get("args", {}).get("correlation", -1)


def _stream(e: dict) -> int:
    try:
        return int(e.get("args", {}).get("stream", -1))
    except (TypeError, ValueError):
        return -1


def _is_gpu(e: dict) -> bool:  # HTA's GPUKernelFilter (without the Event/Context Sync names)
    return _stream(e) >= 0 and _corr(e) >= 0


def idle(path: str, threshold=Decimal(30), hta_rules: bool = False, include_last_step: bool = True) -> dict:
    """{(device, stream): {category: (sum_us: Decimal, gaps: int)}}"""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        events = json.loads(f.read(), parse_float=Decimal, parse_int=Decimal)["traceEvents"]
    gpu = [e for e in events if e.get("cat") in GPU_CATS and e.get("ph") == "X"]
    if not hta_rules:
        launch = {
            _corr(e): e["ts"] for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver") and e.get("ph") == "X"
        }
        launch_ts = launch.get
    else:
        # HTA keeps events with dur and cat, not cat "Trace"; its row label is the position in traceEvents
        kept = {
            i: e
            for i, e in enumerate(events)
            if e.get("dur") is not None and e.get("cat") is not None and e.get("cat") != "Trace"
        }
        cpu_by_corr = {_corr(e): i for i, e in kept.items() if _corr(e) != -1 and not _is_gpu(e)}
        step_names = {e.get("name") for e in kept.values() if "ProfilerStep" in str(e.get("name"))}
        if len(step_names) > 1:
            steps = [e for e in kept.values() if e.get("name") in step_names and not _is_gpu(e)]
            last_start = max(e["ts"] for e in steps)
            last_end = max(e["ts"] + e["dur"] for e in steps)
            ok = (lambda e: e["ts"] <= last_end) if include_last_step else (lambda e: e["ts"] < last_start)
            n_cpu = collections.Counter(_corr(e) for e in kept.values() if not _is_gpu(e) and ok(e))
            gpu = [g for g in gpu for _ in range(n_cpu.get(_corr(g), 0))]  # an inner merge: duplicates too
            cpu_by_corr = {c: i for c, i in cpu_by_corr.items() if ok(kept[i])}
        first_ts = kept[0]["ts"] if 0 in kept else None

        def launch_ts(c):
            if c in cpu_by_corr:
                return kept[cpu_by_corr[c]]["ts"]
            return first_ts if c >= 0 else None  # index_correlation 0 joins the row labelled 0

    streams = collections.defaultdict(list)
    for g in gpu:
        streams[(int(g["args"].get("device", g["pid"])), _stream(g))].append(g)
    out = {}
    for key, acts in sorted(streams.items()):
        acts.sort(key=lambda g: (g["ts"], g["ts"] + g["dur"]))
        total = collections.Counter()
        count = collections.Counter()
        for prev, nxt in zip(acts, acts[1:]):
            prev_end = prev["ts"] + prev["dur"]
            gap = nxt["ts"] - prev_end
            lt = launch_ts(_corr(nxt))
            cat = "host_wait" if lt is not None and lt > prev_end else "kernel_wait" if gap < threshold else "other"
            total[cat] += gap
            count[cat] += 1
        out[key] = {c: (total[c], count[c]) for c in CATEGORIES}
    return out


def main(argv: list[str]) -> int:
    paths = [a for a in argv if not a.startswith("--")]
    for p in paths:
        res = idle(p, hta_rules="--hta" in argv, include_last_step="--exclude-last-step" not in argv)
        for (dev, stream), cats in res.items():
            row = {"device": dev, "stream": stream, "idle_us": str(sum(v[0] for v in cats.values()))}
            row.update({f"{c}_us": str(v[0]) for c, v in cats.items()})
            row.update({f"{c}_gaps": v[1] for c, v in cats.items()})
            print(json.dumps({"trace": p, **row}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
