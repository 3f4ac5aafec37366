"""integrations: where traces are born. `torch`: a `torch.profiler` handler that writes each trace
into a dataset as the profiler finishes it."""
