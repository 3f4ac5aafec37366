"""link: each GPU activity to the CPU call that launched it and the CPU op that issued that call,
with its context (step, annotation, module): polars queries over the flattened tables, in batches
(`links`), by nesting intervals per thread (`nesting`) in windows of time (`windows`)."""
