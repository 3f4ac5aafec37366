"""run: the rules over one run of `tracepipe ranks` (RUN_RULES): what to fix across its ranks.

A rule is a function of the run's `RunFacts` returning a `Finding` or None. No polars here: a
first look at a run folder stays light (`pipeline.runs.report`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from pipeline.findings.finding import Finding, ranked
from pipeline.findings.run.comm_exposed import comm_exposed
from pipeline.findings.run.facts import RunFacts
from pipeline.findings.run.host_bound import host_bound
from pipeline.findings.run.straggler import straggler

__all__ = ["RUN_RULES", "RunFacts", "run_findings"]

RUN_RULES: tuple[Callable[[RunFacts], Finding | None], ...] = (
    straggler,
    host_bound,
    comm_exposed,
)


def run_findings(facts: RunFacts) -> list[Finding]:
    """RUN_RULES over one run, largest saving first; each one's gain_pct a share of the run's time."""
    found = [x for rule in RUN_RULES if (x := rule(facts)) is not None]
    return ranked([replace(x, window_us=facts.window_us or None) for x in found])
