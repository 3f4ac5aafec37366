"""group: which traces make a run, and which rank each one is.

A run is the set of traces of one job. By default it is the directory that holds the traces (an
archive member's directory inside its archive; for torch_npu's `<run>/<worker>_ascend_pt/
ASCEND_PROFILER_OUTPUT/trace_view.json`, `<run>`); `run_by` overrides it: a regex searched in the
trace's path (its first group, else the whole match, names the run) or `col:NAME`, a column of
the `trace` table (`col:trace_name`, `col:base_time_ns`). A trace's rank is `trace.rank`
(distributedInfo, else its file name); a run's world size is the largest its traces record.
Ranks of a run that no trace holds are missing, reported by number, never an error; traces with
no rank, or a rank held twice, are reported and left out: of two traces of one rank the one kept
is the complete one (not truncated), else the one with more collectives, else the first by path.
Files that are no trace (quarantined) hold no rank.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from pipeline.errors import UsageError
from pipeline.read.rank import PROFILER_OUTPUT

# trace-table column -> the Extract info key that holds it (what `--run-by col:NAME` may name)
TRACE_FIELDS = {
    "source_path": "source",
    "stem": "stem",
    "rank": "rank",
    "rank_from": "rank_from",
    "world_size": "world_size",
    "backend": "backend",
    "trace_name": "trace_name",
    "base_time_ns": "base_time_ns",
    "source_bytes": "size",
}
_DIR = re.compile(r"[/\\][^/\\!]*$")


def run_of(info: dict, run_by: str | None, pattern: re.Pattern | None) -> str:
    """The run of one trace, by the rule above (a torch_npu trace's directory is its rank's
    `<worker>_ascend_pt/ASCEND_PROFILER_OUTPUT`: its run is the folder holding the ranks' folders)."""
    path = str(info.get("source") or "")
    default = _DIR.sub("", path, count=1)
    npu = PROFILER_OUTPUT.match(default)
    default = npu["run"] if npu else default
    if not run_by:
        return default
    if run_by.startswith("col:"):
        v = info.get(TRACE_FIELDS.get(run_by[4:], run_by[4:]))
        return "" if v is None else str(v)
    assert pattern is not None
    m = pattern.search(path)
    if m is None:
        return default
    return m.group(1) if pattern.groups else m.group(0)


def check_run_by(run_by: str | None, columns: list[str]) -> re.Pattern | None:
    """The compiled --run-by regex (None for col: or none); a UsageError for a bad one."""
    if not run_by:
        return None
    if run_by.startswith("col:"):
        if run_by[4:] not in columns:
            raise UsageError(
                f"--run-by {run_by}: the trace table has no column {run_by[4:]!r} (columns: {', '.join(columns)})"
            )
        return None
    try:
        return re.compile(run_by)
    except re.error as e:
        raise UsageError(f"--run-by: not a regex ({e})") from None


@dataclass
class Run:
    """One run: its traces by rank (`ranks`: rank -> index into the traces given), world size,
    missing ranks, and what was left out (indices, with the reason for duplicates)."""

    name: str
    world_size: int | None  # the largest a trace records, else the highest rank + 1 (`settle`)
    traces: list[int] = field(default_factory=list)  # every trace of the run, quarantined ones too
    ranks: dict[int, int] = field(default_factory=dict)
    missing: list[int] = field(default_factory=list)
    no_rank: list[int] = field(default_factory=list)
    duplicates: list[tuple[int, int, str]] = field(default_factory=list)  # (left out, kept, why)
    quarantined: list[int] = field(default_factory=list)
    apart: list[tuple[int, str]] = field(default_factory=list)  # (left out, why): `apart.split_in_time`

    world_from: str | None = None  # "distributedInfo" (recorded), "highest rank read" (inferred)

    def settle(self, worlds: list) -> None:
        """The world size: the largest of `worlds` (what the run's traces record), else the highest
        rank read + 1, a lower bound (`world_from` says which: ranks above it may be missing, and
        the run page says so); then the ranks below it that no trace holds."""
        recorded = [w for w in worlds if type(w) is int]
        if recorded:
            self.world_size, self.world_from = max(recorded), "distributedInfo"
        elif self.ranks:
            self.world_size, self.world_from = max(self.ranks) + 1, "highest rank read"
        else:
            self.world_size, self.world_from = None, None
        self.missing = sorted(set(range(self.world_size or 0)) - set(self.ranks))


def _preference(info: dict) -> tuple:
    return (info.get("status") == "truncated", -(info.get("n_collectives") or 0), str(info.get("source")))


def _why_kept(kept: dict, other: dict) -> str:
    if kept.get("status") != "truncated" and other.get("status") == "truncated":
        return "the other is truncated"
    a, b = kept.get("n_collectives") or 0, other.get("n_collectives") or 0
    if a != b:
        return f"it holds more collectives ({a:,} against {b:,})"
    return f"both hold {a:,} collectives: the first by path"


def group_runs(infos: list[dict], run_by: str | None = None) -> list[Run]:
    """The runs of traces (Extract infos), sorted by name."""
    pattern = check_run_by(run_by, list(TRACE_FIELDS))
    runs: dict[str, Run] = {}
    for i, info in enumerate(infos):
        name = run_of(info, run_by, pattern)
        run = runs.setdefault(name, Run(name, None))
        run.traces.append(i)
        if info.get("status") == "quarantined":
            run.quarantined.append(i)
            continue
        rank = info.get("rank")
        if rank is None:
            run.no_rank.append(i)
            continue
        held = run.ranks.get(rank)
        if held is None:
            run.ranks[rank] = i
            continue
        keep, drop = (held, i) if _preference(infos[held]) <= _preference(info) else (i, held)
        run.ranks[rank] = keep
        run.duplicates = [(d, keep if k == drop else k, w) for d, k, w in run.duplicates]
        run.duplicates.append((drop, keep, _why_kept(infos[keep], infos[drop])))
    for run in runs.values():
        run.ranks = dict(sorted(run.ranks.items()))
        run.settle([infos[i].get("world_size") for i in run.traces if i not in run.quarantined])
        run.duplicates.sort(key=lambda d: str(infos[d[0]].get("source")))
    return [runs[k] for k in sorted(runs)]
