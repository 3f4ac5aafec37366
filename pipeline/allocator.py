"""allocator: polars' memory allocator (its own jemalloc) told to give freed memory back promptly.

Imported by `pipeline` before anything loads polars: polars adds `_RJEM_MALLOC_CONF` to its own
settings (dirty_decay_ms:500, muzzy_decay_ms:1000) when it loads, and jemalloc reads them once;
a value the user set is kept. With polars' settings, pages freed stay in the process (first
dirty, then "muzzy", which still count as resident) for up to 1.5 s, so what one batch or stage
freed is still held while the next allocates, and the peak grows with the size of the work units
rather than with the work: linking a 1 GB trace in batches of 32K GPU ops rather than 16K saves
~0.8 CPU-s but took 45 MB more memory on a trace of many batches than on one of one. Returned
after 100 ms, 32K batches peaked lower (382 MB summed PSS, `tracepipe flatten -j 2` of the 1 GB
trace) than 16K did before (387 MB); returning them at once (0 ms) cost ~3 CPU-s in page faults.
"""

import os

MALLOC_CONF = "dirty_decay_ms:100,muzzy_decay_ms:0"
os.environ.setdefault("_RJEM_MALLOC_CONF", MALLOC_CONF)
