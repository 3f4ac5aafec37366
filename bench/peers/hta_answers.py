"""Run with a Holistic Trace Analysis (or traceinsight) Python: HTA's answers on a folder of traces.

python hta_answers.py run DIR     -> {"straggler": rank or null}  (get_potential_stragglers)
python hta_answers.py trace DIR   -> {"kernel_time_us", "idle_time_us", "busy_us"} of its one rank
"""

import json
import os
import sys

os.environ.setdefault("HTA_DISABLE_NS_ROUNDING", "1")
from hta.trace_analysis import TraceAnalysis

mode, folder = sys.argv[1], sys.argv[2]
ta = TraceAnalysis(trace_dir=folder)
if mode == "run":
    try:
        found = ta.get_potential_stragglers(num_candidates=1)
        out = {"straggler": int(found[0]) if len(found) else None}
    except Exception as e:  # a peer's failure is an answer too
        out = {"straggler": None, "error": f"{type(e).__name__}: {e}"[:200]}
else:
    df = ta.get_temporal_breakdown(visualize=False)
    row = df.iloc[0]
    out = {  # kernel_time is HTA's name for the span the breakdown covers: busy is compute + non-compute
        "busy_us": float(row["compute_time(us)"] + row["non_compute_time(us)"]),
        "idle_us": float(row["idle_time(us)"]),
    }
print(json.dumps(out))
