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

TICK = 100  # clock ticks a second in /proc/PID/stat (USER_HZ, 100 on Linux)


def _stat(pid: int) -> tuple[int, int] | None:
    """(CPU ticks, minor faults) of a process, None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[11]) + int(fields[12]), int(fields[7])


def _descendants(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            kids = [int(k) for k in f.read().split()]
    except OSError:
        return []
    return kids + [d for k in kids for d in _descendants(k)]


def sample(cmd: list[str], every: float) -> tuple[list[tuple[float, float, float, int]], int]:
    """(seconds since start, main %, others %, faults so far) per interval, and the exit code."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    seen: dict[int, tuple[int, int]] = {}
    rows, before, t0 = [], (0, 0, 0), time.perf_counter()
    while proc.poll() is None:
        for pid in [proc.pid, *_descendants(proc.pid)]:
            got = _stat(pid)
            if got is not None:
                seen[pid] = got
        main = seen.get(proc.pid, (0, 0))[0]
        others = sum(c for p, (c, _) in seen.items() if p != proc.pid)
        faults = sum(f for _, f in seen.values())
        now = time.perf_counter() - t0
        share = 100 / TICK / every
        rows.append((now, (main - before[0]) * share, (others - before[1]) * share, faults))
        before = (main, others, faults)
        time.sleep(every)
    return rows, proc.returncode


def summary(rows: list[tuple[float, float, float, int]]) -> list[str]:
    """Average cores per stretch: before the other processes work, while they do, after."""
    busy = [i for i, r in enumerate(rows) if r[2] > 0]
    if not busy:
        cuts = [("the whole run", rows)]
    else:
        first, last = busy[0], busy[-1]
        cuts = [("before the workers", rows[:first]), ("with the workers", rows[first : last + 1])]
        cuts.append(("after the workers", rows[last + 1 :]))
    out = []
    for name, part in cuts:
        if part:
            cores = sum(r[1] + r[2] for r in part) / len(part) / 100
            span = part[-1][0] - part[0][0] + (part[1][0] - part[0][0] if len(part) > 1 else 0)
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
    for t, m, o, f in rows:
        print(f"{t:5.2f}  {m:6.0f}  {o:8.0f}  {m + o:7.0f}  {f:6d}")
    print("\n".join(summary(rows)))
    if code:
        print(f"the command exited {code}: {' '.join(cmd)}", file=sys.stderr)
    sys.exit(code)


if __name__ == "__main__":
    main()
