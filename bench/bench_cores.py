"""make bench-cores: how many cores a command keeps busy, over time (where a run waits).

    python bench/bench_cores.py [--every 0.1] -- tracepipe analyze TRACE --section kernels

Runs the command once and samples /proc every `--every` seconds: the CPU time of its main
process and of all its other processes (the reading workers), as a share of one core in each
interval, and the page faults of all of them. On two cores a stage that shows 100-130% leaves a
core idle; one that shows ~200% is limited by the CPU it does, not by waiting. Then a summary per
stretch of the run: cores used on average while the workers run and after they end, and faults.

A ratio against a baseline (`make bench`, `bench-peers`, `bench-shapes`) says how fast; this says
why: the 209 MB `analyze` of the slow-host stop showed 0.35 s on one core before the workers start
(Python, pyarrow and numpy imported), a stall of the workers while the main process imports
polars and the analyses, ~2 cores while reading and ~1.5 in the link.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import group_stats  # the one reader of a command's processes in /proc

TICK = 100  # clock ticks a second in /proc/PID/stat (USER_HZ, 100 on Linux)


def sample(cmd: list[str], every: float) -> tuple[list[tuple[float, float, float, float, int]], int]:
    """(seconds since start, seconds of the interval, main %, others %, faults so far) per interval,
    and the exit code. A process keeps its last reading once it is gone (workers end before the
    command)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, start_new_session=True)
    seen: dict[int, tuple[int, int]] = {}  # pid -> (CPU ticks, minor faults)
    rows, before, t0 = [], (0, 0, 0.0), time.perf_counter()
    while proc.poll() is None:
        for pid, fields in group_stats(proc.pid):
            seen[pid] = int(fields[11]) + int(fields[12]), int(fields[7])
        main = seen.get(proc.pid, (0, 0))[0]
        others = sum(c for p, (c, _) in seen.items() if p != proc.pid)
        now = time.perf_counter() - t0
        share = 100 / TICK / max(now - before[2], 1e-9)  # of the time this interval really took
        faults = sum(f for _, f in seen.values())
        rows.append((now, now - before[2], (main - before[0]) * share, (others - before[1]) * share, faults))
        before = (main, others, now)
        time.sleep(every)
    return rows, proc.returncode


def summary(rows: list[tuple[float, float, float, float, int]]) -> list[str]:
    """Average cores per stretch: before the other processes work, while they do, after."""
    busy = [i for i, r in enumerate(rows) if r[3] > 0]
    if not busy:
        cuts = [("the whole run", rows)]
    else:
        first, last = busy[0], busy[-1]
        cuts = [("before the workers", rows[:first]), ("with the workers", rows[first : last + 1])]
        cuts.append(("after the workers", rows[last + 1 :]))
    out = []
    for name, part in cuts:
        span = sum(r[1] for r in part)
        if span > 0:
            cores = sum(r[1] * (r[2] + r[3]) for r in part) / span / 100
            out.append(f"{name}: {span:.2f} s at {cores:.2f} cores")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--every", type=float, default=0.1, help="seconds between samples")
    ap.add_argument("cmd", nargs=argparse.REMAINDER, help="the command (after --)")
    a = ap.parse_args()
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    if not cmd:
        ap.error("no command given: bench_cores.py -- tracepipe analyze TRACE")
    rows, code = sample(cmd, a.every)
    print("    s  main %  others %  total %  faults")
    for t, _, m, o, f in rows:
        print(f"{t:5.2f}  {m:6.0f}  {o:8.0f}  {m + o:7.0f}  {f:6d}")
    print("\n".join(summary(rows)))
    if code:
        print(f"the command exited {code}: {' '.join(cmd)}", file=sys.stderr)
    sys.exit(code)


if __name__ == "__main__":
    main()
