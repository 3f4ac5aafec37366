"""measured: runs' collectives and problems as `tracepipe ranks` measures them, by the one
whole-run core (`pipeline.runs.report.measure` over those runs' traces only), so that `compare`,
`trend` and `ranks` match, size and fault a run the same way.

`measure_runs(runs)` measures runs of one dataset together (one read of its tables: `trend` asks
for every run); `measured(run)` answers from that, measuring the run alone when it was not.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.compare.runs import Run


@dataclass(frozen=True)
class Measured:
    """A run's rows of the `collectives` and `problems` sections (dicts, `runs.analysis` columns),
    its world size and missing ranks."""

    collectives: list[dict]
    problems: list[dict]
    world_size: int | None = None  # as `ranks` settles it (a trace of another job left out)
    missing: tuple[int, ...] = ()  # the ranks below it no trace holds


_DONE: dict[tuple, Measured] = {}  # (dataset, run_by, run name) -> Measured, of the last measure_runs


def _key(run: Run) -> tuple:
    return (str(run.dataset), run.run_by, run.name)


def measure_runs(runs: list[Run]) -> None:
    """Measure these runs, those of one dataset and --run-by rule together."""
    from pipeline.runs.report import measure

    _DONE.clear()  # what an earlier call measured is not kept: memory follows the runs asked for
    groups: dict[tuple, list[Run]] = {}
    for r in runs:
        groups.setdefault((r.dataset, r.run_by), []).append(r)
    for (dataset, run_by), rs in groups.items():
        ids = {i for r in rs for i in r.ids}
        res = measure(dataset, run_by, align=False, trace_ids=ids)
        names = {r.name for r in rs}
        colls: dict[str, list[dict]] = {n: [] for n in names}
        probs: dict[str, list[dict]] = {n: [] for n in names}
        for section, out in ((res.collectives, colls), (res.problems, probs)):
            for row in section.iter_rows(named=True):
                if row["run"] in out:
                    out[row["run"]].append(row)
        worlds = {row["run"]: row for row in res.runs.iter_rows(named=True)}
        for r in rs:
            w = worlds.get(r.name, {})
            _DONE[_key(r)] = Measured(
                colls[r.name], probs[r.name], w.get("world_size"), tuple(w.get("missing_ranks") or ())
            )


def measured(run: Run) -> Measured:
    """The run measured (see the module docstring)."""
    if _key(run) not in _DONE:
        measure_runs([run])
    return _DONE[_key(run)]
