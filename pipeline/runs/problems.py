"""problems: what a run left out or could not see, one row per file and problem, so that a
report of a run never reads as complete when it is not (`tracepipe ranks` prints each on stderr,
lists them in its `problems` section, and exits 1).

| problem | when |
|---|---|
| not a trace | the file is no trace (or cannot be read): nothing of it is measured |
| truncated | the trace ends before its events do: its collectives before the cut are measured |
| duplicate rank | another trace of the run holds the same rank: which one was kept, and why |
| no rank | neither distributedInfo nor the file name says the trace's rank: left out |
| another time | its collectives ran over ten minutes from the other ranks' (another job's): left out |
| no collectives | a rank recorded no collective while others of its groups did |
| fewer collectives | a rank recorded fewer collectives than others of its groups (the gap named) |

`trace_problems(run_dir_or_dataset)` gives them for any run (`compare` uses it).
"""

from __future__ import annotations

import os

PROBLEMS = (
    "not a trace",
    "truncated",
    "duplicate rank",
    "no rank",
    "another time",
    "no collectives",
    "fewer collectives",
)

LEFT_OUT = ("not a trace", "duplicate rank", "no rank", "another time")  # a trace the run's measures leave out


def file_name(info: dict) -> str:
    """How a problem names a file: its name (an archive member's, after the archive's)."""
    source = str(info.get("source") or info.get("stem") or "?")
    if "!" in source:
        archive, member = source.rsplit("!", 1)
        return f"{os.path.basename(archive)}!{member}"
    return os.path.basename(source)


def run_problems(run, extracts: list, ranks_rows: list[dict]) -> list[dict]:
    """The problems of one run (`group.Run`) as rows: run, file, problem, detail."""
    out = []
    row = lambda i, problem, detail: {
        "run": run.name,
        "file": file_name(extracts[i].info),
        "problem": problem,
        "detail": detail,
    }
    for i in run.quarantined:
        out.append(row(i, "not a trace", extracts[i].info.get("reason") or "not read"))
    for i in run.traces:
        info = extracts[i].info
        if info.get("status") == "truncated":
            n = info.get("n_collectives") or 0
            out.append(
                row(
                    i,
                    "truncated",
                    f"{info.get('reason') or 'cut short'}; its {n:,} collectives before the cut are measured",
                )
            )
    for drop, keep, why in run.duplicates:
        rank = extracts[drop].info.get("rank")
        out.append(
            row(
                drop,
                "duplicate rank",
                f"rank {rank} is also in {file_name(extracts[keep].info)}, which was kept: {why}",
            )
        )
    for i in run.no_rank:
        out.append(row(i, "no rank", "neither distributedInfo nor the file name says its rank: left out"))
    for i, detail in run.apart:
        out.append(row(i, "another time", detail))
    index = {r: i for r, i in run.ranks.items()}
    for r in ranks_rows:
        if not r["missing"]:
            continue
        i = index[r["rank"]]
        if not r["collectives"]:
            detail = f"rank {r['rank']} recorded no collectives; its groups' other ranks recorded {r['expected']:,}"
            out.append(row(i, "no collectives", detail))
        else:
            detail = (
                f"rank {r['rank']} recorded {r['collectives']:,} of the {r['expected']:,} collectives of its groups "
                f"({r['missing']:,} missing: its totals cover only those it recorded)"
            )
            out.append(row(i, "fewer collectives", detail))
    return out
