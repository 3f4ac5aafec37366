"""synthetic: Kineto (PyTorch profiler) traces written by the project itself: the tests' traces in
every layout (`traces`), the demo and benchmark template (`demo`), and runs of many ranks with
known physics (`runs`)."""

from pipeline.synthetic.demo import kineto_text, write_demo
from pipeline.synthetic.expectations import complete_events, flow_events, gpu_events, ns, tid
from pipeline.synthetic.runs import run_rank_events, write_run
from pipeline.synthetic.traces import (
    DEVICE_PROPS,
    GPU_CATS_BY_LAYOUT,
    TRICKY_ARGS,
    TRICKY_NAME,
    dumps_trace,
    make_trace,
    memory_event,
    metadata_events,
    step_events,
    top_metadata,
    write_big_trace,
    write_trace,
)

__all__ = [
    "DEVICE_PROPS",
    "GPU_CATS_BY_LAYOUT",
    "TRICKY_ARGS",
    "TRICKY_NAME",
    "complete_events",
    "dumps_trace",
    "flow_events",
    "gpu_events",
    "kineto_text",
    "make_trace",
    "memory_event",
    "metadata_events",
    "ns",
    "run_rank_events",
    "step_events",
    "tid",
    "top_metadata",
    "write_big_trace",
    "write_demo",
    "write_run",
    "write_trace",
]
