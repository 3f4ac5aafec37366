"""rewrite: traces back out as Chrome-trace JSON that Perfetto draws: the original with costs and
timeline tracks (`augment`), a window of a trace (`slice`, `run_slice`), several traces or a run's
ranks on one clock as one (`combine`, `run_timeline`), every slice Perfetto cannot nest moved to a
sibling track (`lanes`), written by `jsonout`."""
