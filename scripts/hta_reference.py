"""Run Holistic Trace Analysis (HTA) on shared traces and record its idle-time and queue-length numbers.

Run with the Python of a separate venv that has HTA (never tracepipe's own env):

    python3 -m venv /work/venv-hta
    /work/venv-hta/bin/pip install 'HolisticTraceAnalysis==0.5.0' 'pandas<3'
    HTA_DISABLE_NS_ROUNDING=1 /work/venv-hta/bin/python scripts/hta_reference.py \
        ../shared/traces/tracelens/h100_qwen1.5_0.5b.json.gz ... > docs/hta_reference.json

Each trace is copied into a temporary directory of its own (HTA takes a trace directory) and analysed in a
child process, so one trace that crashes HTA does not stop the others. Nothing is written next to the traces.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

CALL = (
    "TraceAnalysis(trace_dir=D, include_last_profiler_step=True)"
    ".get_idle_time_breakdown(ranks=[r], visualize=False, show_idle_interval_stats=True,"
    " consecutive_kernel_delay=30)  # env HTA_DISABLE_NS_ROUNDING=1;"
    " get_queue_length_summary(ranks=[r]); get_time_spent_blocked_on_full_queue(get_queue_length_time_series([r]))"
)


def _analyse(trace: str) -> dict:
    """In the child: HTA on one trace; returns plain JSON data."""
    os.environ.setdefault("HTA_DISABLE_NS_ROUNDING", "1")
    import logging

    import pandas as pd
    from hta.trace_analysis import TraceAnalysis

    logging.getLogger("hta").setLevel(logging.ERROR)
    out: dict = {"trace": trace}
    with tempfile.TemporaryDirectory(prefix="hta_ref_") as d:
        shutil.copy(trace, Path(d) / Path(trace).name)
        ta = TraceAnalysis(trace_dir=d, include_last_profiler_step=True)
        ranks = ta.t.get_ranks()
        out["ranks"] = ranks
        # HTA's result is .round(2); also keep the unrounded sums (round() made a no-op for the call)
        idle_rows: list = []
        for rank in ranks:
            res = {}
            for rounded in (True, False):
                orig = pd.DataFrame.round
                if not rounded:
                    pd.DataFrame.round = lambda self, *a, **k: self  # type: ignore[method-assign]
                try:
                    df, stats = ta.get_idle_time_breakdown(
                        ranks=[rank], visualize=False, show_idle_interval_stats=True, consecutive_kernel_delay=30
                    )
                finally:
                    pd.DataFrame.round = orig  # type: ignore[method-assign]
                res[rounded] = (df, stats)
            trace_df = ta.t.get_trace(rank)
            gpu = trace_df[trace_df["stream"].ne(-1)]
            pid_of_stream = gpu.groupby("stream")["pid"].agg(lambda s: sorted(set(int(x) for x in s)))
            df_r, stats = res[True]
            df_u, _ = res[False]
            for stream in sorted(set(int(s) for s in df_r["stream"])):
                row = {"rank": int(rank), "stream": stream, "device_pids": pid_of_stream.get(stream, [])}
                for cat in ("host_wait", "kernel_wait", "other"):
                    r = df_r[(df_r["stream"] == stream) & (df_r["idle_category"] == cat)]["idle_time"]
                    u = df_u[(df_u["stream"] == stream) & (df_u["idle_category"] == cat)]["idle_time"]
                    row[f"{cat}_us"] = float(r.iloc[0]) if len(r) else 0.0
                    row[f"{cat}_us_unrounded"] = float(u.iloc[0]) if len(u) else 0.0
                    if stats is not None:
                        s = stats[(stats["stream"] == stream)]
                        s = s[s.index == cat] if cat in s.index else s.iloc[0:0]
                        row[f"{cat}_count"] = int(s["count"].iloc[0]) if len(s) else 0
                row["idle_us"] = round(sum(row[f"{c}_us_unrounded"] for c in ("host_wait", "kernel_wait", "other")), 6)
                idle_rows.append(row)
        out["idle"] = idle_rows
        q = ta.get_queue_length_summary(ranks=ranks)
        qrows = []
        if q is not None:
            for (rank, stream), r in q.iterrows():
                qrows.append(
                    {
                        "rank": int(rank),
                        "stream": int(stream),
                        "count": int(r[("queue_length", "count")]),
                        "mean": float(r[("queue_length", "mean")]),
                        "max": float(r[("queue_length", "max")]),
                        "min": float(r[("queue_length", "min")]),
                    }
                )
        out["queue"] = qrows
        try:
            ts = ta.get_queue_length_time_series(ranks=ranks)
            blocked = ta.get_time_spent_blocked_on_full_queue(ts)
            out["blocked_on_full_queue"] = [] if blocked is None else json.loads(blocked.to_json(orient="records"))
        except Exception as e:
            out["blocked_on_full_queue_error"] = f"{type(e).__name__}: {e}"
    return out


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "--child":
        try:
            print(json.dumps(_analyse(argv[1])))
        except Exception as e:
            print(
                json.dumps(
                    {
                        "trace": argv[1],
                        "error": f"{type(e).__name__}: {e}",
                        "traceback": traceback.format_exc().splitlines()[-6:],
                    }
                )
            )
        return 0
    from importlib.metadata import version

    import hta

    env = dict(os.environ, HTA_DISABLE_NS_ROUNDING="1")
    results = []
    for trace in argv:
        p = subprocess.run([sys.executable, __file__, "--child", trace], capture_output=True, text=True, env=env)
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
        if lines:
            results.append(json.loads(lines[-1]))
        else:
            results.append(
                {"trace": trace, "error": f"child exited {p.returncode}", "stderr_tail": p.stderr.splitlines()[-8:]}
            )
    for r in results:  # a path relative to the shared traces folder, not this machine's
        r["trace"] = "/".join(Path(r["trace"]).parts[-2:])
    doc = {
        "hta_version": version("HolisticTraceAnalysis"),
        "hta_module": Path(hta.__file__).parent.name,
        "pandas_version": version("pandas"),
        "env": {"HTA_DISABLE_NS_ROUNDING": "1"},
        "call": CALL,
        "units": "µs (trace ts/dur units); HTA's public result is rounded to 0.01 (…_us); …_us_unrounded "
        "is the same call with DataFrame.round disabled",
        "results": results,
    }
    print(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
