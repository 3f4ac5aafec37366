"""analyses: the reports of a flattened trace as polars DataFrames. A `Flat` (`flat`) sweeps the
trace in windows of time (`sweep`), its GPU ops (`activity`) and CPU ops (`cpu`), into small totals
that every analysis reads: `kernels`, `busy`, `categories`, `ops`, `stacks`, `launch`, `compiled`,
`communication`, `diff` (names matched by `names`). `registry` declares `analyze`'s sections."""
