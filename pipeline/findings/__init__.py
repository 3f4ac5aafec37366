"""findings: what to fix, as rules over the analyses' results (as sqlglot's optimizer RULES).

Each rule is one file: a function of one trace's `Facts` (`rules.RULES`) or of one run's
`RunFacts` (`run.RUN_RULES`, for `ranks`) that returns a `Finding` when its premise holds (else
None: it says nothing), with the evidence it cites, its saving as ranges bounded by what can move
(see `facts`), its remedy and the section to look at next. Thresholds, name patterns and saving
factors are data (data/findings.toml). A new rule is one file and one line in RULES or RUN_RULES.

This package imports nothing heavy: `ranks` reads a run's findings without polars (`run`).
"""
