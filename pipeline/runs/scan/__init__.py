"""scan: a run folder's traces read for a whole-run answer only: one streaming pass per trace
(`rank`, over `events` and `describe`), several traces at once (`folder`), kept in a cache
(`cache`) so that the next look reads no trace again."""
