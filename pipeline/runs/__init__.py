"""runs: the ranks of one job together. Per trace, its collectives and steps (`collectives`,
`steps`, written by `tables`); per run, collectives matched across ranks, clocks aligned, waits,
stragglers and bandwidth (`group`, `match`, `clock`, `measures`, `report`)."""
