"""rewrite: traces back out as Chrome-trace JSON that opens in Perfetto: the original with costs in
its kernels' args (`augment`), several traces as one (`combine`), written by `jsonout`."""
