"""problems: what is wrong with a run that a comparison must say, one line each: ranks its world
size names that no trace holds, and every problem `tracepipe ranks` reports of it (a truncated
trace, a file that is not a trace, a rank held twice, a rank with fewer collectives than its
groups: `pipeline.runs.problems`, through the one whole-run core).

This is the one place `compare` and `trend` ask for a run's problems.
"""

from __future__ import annotations

from pipeline.compare.measured import measured
from pipeline.compare.runs import Run

SHOWN = 8  # ranks named in one line


def run_problems(run: Run) -> list[str]:
    """One line per problem of the run."""
    t = run.traces
    out = []
    world = t["world_size"].max() if "world_size" in t.columns else None
    ranks = set(t["rank"].drop_nulls().to_list())
    if isinstance(world, int) and world > 0:
        missing = sorted(set(range(world)) - ranks)
        if missing:
            shown = ", ".join(map(str, missing[:SHOWN])) + (
                f" and {len(missing) - SHOWN} more" if len(missing) > SHOWN else ""
            )
            out.append(f"run {run.label}: {len(missing)} of {world} ranks have no trace (rank {shown})")
    for p in measured(run).problems:
        out.append(f"run {run.label}: {p['file']}: {p['problem']}: {p['detail']}")
    return out
