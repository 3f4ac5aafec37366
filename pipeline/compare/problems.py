"""problems: what is wrong with a run that a comparison must say, one line each: ranks its world
size names that no trace holds, and every problem `tracepipe ranks` reports of it (a truncated
trace, a file that is not a trace, a rank held twice, a rank with fewer collectives than its
groups: `pipeline.runs.problems`, through the one whole-run core).

This is the one place `compare` and `trend` ask for a run's problems.
"""

from __future__ import annotations

from pipeline.compare.measured import measured
from pipeline.compare.runs import Run
from pipeline.render.tables import spans

SHOWN = 8  # spans of ranks named in one line


def run_problems(run: Run) -> list[str]:
    """One line per problem of the run."""
    m = measured(run)
    out = []
    if m.missing:
        out.append(
            f"run {run.label}: {len(m.missing)} of {m.world_size} ranks have no trace (rank {spans(m.missing, SHOWN)})"
        )
    for p in m.problems:
        out.append(f"run {run.label}: {p['file']}: {p['problem']}: {p['detail']}")
    return out
