"""Run with TraceLens' Python: its answers on one trace (its GPU timeline breakdown).

python tracelens_answers.py TRACE -> {"kernels", "kernel_time_us", "busy_us"}
"""

import json
import sys

from TraceLens import TreePerfAnalyzer

# busy time of the whole device, as tracepipe's: TraceLens leaves out by default the kernels,
# copies and sets that no CPU op launched (graph replays' kernels, runtime copies), 13% of the
# busy time on a graph-replaying 209 MB trace
try:
    t = TreePerfAnalyzer.from_file(sys.argv[1], include_unlinked_kernels=True)
except TypeError:  # a TraceLens before the option: its default
    t = TreePerfAnalyzer.from_file(sys.argv[1])
df = t.get_df_gpu_timeline()
times = {k: v * 1000 for k, v in zip(df["type"], df["time ms"])}  # µs
kernels = [e for e in t.tree.events if t.event_to_category(e) == "kernel"]
print(
    json.dumps(
        {
            "kernels": len(kernels),
            "kernel_time_us": float(sum(e.get("dur", 0) for e in kernels)),
            "busy_us": float(times.get("busy_time", 0)),
        }
    )
)
