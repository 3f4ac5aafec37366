"""make bench-peers: tracepipe beside its peers on the same run folders and traces, in one run.

    python bench/bench_peers.py [--runs DIR,DIR] [--traces T,T] [--repeat 3]

Peers are found by the Python that runs each (a virtual environment of its own, never
tracepipe's): `PEERS="tracelens=/path/bin/python,hta-0.5.0=/path/bin/python,..."`, else the
venvs `scripts/peers_venvs.sh` makes under `$PEERS_DIR` (default /tmp/peers): tracelens (TraceLens
from its repository), hta050 (HolisticTraceAnalysis 0.5.0), hta061 (traceinsight 0.6.1). A peer
that is not there is skipped.

Each tool runs in a fresh process, `--repeat` times unobserved (the fastest wall time; on one
trace also the fewest CPU seconds, which another engineer's load on the machine changes less), then once
more for its peak memory (summed PSS of every process of the command, sampled every 10 ms). Then
whether the answers agree with tracepipe's: on a run folder the straggler named, the message
sizes (kind and bytes of each implicit-sync collective) and the median busbw per size (within
5%); on one trace the kernel count, kernel time and busy time (within 1%).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from bench import tree_pss_bytes  # noqa: E402  (the one summed-PSS reader of the benches)

SHARED = ROOT.parent / "shared"
VENVS = {"tracelens": "tracelens", "hta-0.5.0": "hta050", "traceinsight-0.6.1": "hta061"}
RANK_REGEX = r"(?:rank|worker)[\[\-_]?(?P<rank>\d+)"
GIB = 2**30 / 1e9  # TraceLens divides bytes by 2^30 and says GB/s; nccl-tests and tracepipe by 10^9


def peers() -> dict[str, str]:
    """name -> python of each peer found."""
    if os.environ.get("PEERS"):
        pairs = [p.split("=", 1) for p in os.environ["PEERS"].split(",") if "=" in p]
        return {k: v for k, v in pairs if Path(v).exists()}
    root = Path(os.environ.get("PEERS_DIR", "/tmp/peers"))
    return {name: str(root / d / "bin" / "python") for name, d in VENVS.items() if (root / d / "bin/python").exists()}


def version(py: str, dist: str) -> str:
    p = subprocess.run([py, "-c", f"import importlib.metadata as m; print(m.version({dist!r}))"], capture_output=True)
    return p.stdout.decode().strip() or "?"


def measure(cmd: list[str], env: dict | None = None, repeat: int = 3) -> tuple[float, float, str, float]:
    """Fastest wall seconds of `repeat` runs (unobserved: sampling /proc every 10 ms costs a
    core's share on a small machine), the peak summed PSS (MB) of one more run, sampled, stdout,
    and the fewest CPU seconds (user + system, every process of the command) of the `repeat` runs:
    on a machine others load, the wall time swings with their load, the CPU time much less."""
    full_env = {**os.environ, **(env or {})}
    best, out, cpu = float("inf"), "", float("inf")
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), _children_cpu()
        p = subprocess.run(cmd, capture_output=True, env=full_env)
        if p.returncode not in (0, 1):
            return float("nan"), float("nan"), json.dumps({"error": p.stderr.decode()[-300:]}), float("nan")
        best, out = min(best, time.perf_counter() - t0), p.stdout.decode()
        cpu = min(cpu, _children_cpu() - c0)
    quiet = subprocess.DEVNULL
    p2 = subprocess.Popen(cmd, stdout=quiet, stderr=quiet, start_new_session=True, env=full_env)
    top = 0
    while p2.poll() is None:
        top = max(top, tree_pss_bytes(p2.pid))
        time.sleep(0.01)
    return best, top / 2**20, out, cpu


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)  # of the waited-for children and theirs
    return r.ru_utime + r.ru_stime


# ------------------------------------------------------------------ run folders
def tracepipe_run(run: Path, work: Path, repeat: int) -> list[dict]:
    out = work / f"{run.name}.ranks.json"
    env = {"TRACEPIPE_CACHE_DIR": str(work / "cache"), "PYTHONPATH": str(ROOT)}
    base = [sys.executable, "-m", "pipeline", "ranks", str(run), "--format", "json", "-o", str(out)]
    t1, m1, *_ = measure([*base, "--no-cache"], env, repeat)
    shutil.rmtree(work / "cache", ignore_errors=True)
    measure(base, env, 1)  # fills the cache
    t2, m2, *_ = measure(base, env, repeat)
    doc = json.loads(out.read_text())["runs"][0]
    answers = {
        "straggler": (doc["stragglers"] or [{}])[0].get("rank"),
        "sizes": Counter((c["name"], c["bytes"]) for c in doc["collectives"] if c["bytes"]),
        "busbw": {(b["kind"], b["bytes"]): b["busbw_p50_gbps"] for b in doc["by_kind"] if b["bytes"]},
    }
    return [
        {"tool": "tracepipe ranks (first look)", "s": t1, "MB": m1, **answers},
        {"tool": "tracepipe ranks (cached)", "s": t2, "MB": m2, **answers},
    ]


def tracelens_run(py: str, run: Path, work: Path, repeat: int) -> dict:
    out = work / f"{run.name}.tracelens"
    shutil.rmtree(out, ignore_errors=True)
    script = Path(py).parent / "TraceLens_generate_multi_rank_collective_report_pytorch"
    files = sorted(f for f in os.listdir(run) if f.endswith((".json", ".json.gz")))
    cmd = [str(script), "--trace_glob", f"{run}/*.json*", "--rank_regex", RANK_REGEX]
    cmd += ["--world_size", str(len(files)), "--output_csvs_dir", str(out)]
    t, m, *_ = measure(cmd, None, repeat)
    answers: dict = {"straggler": None, "sizes": Counter(), "busbw": {}}
    summary = out / "straggler_summary.csv"
    if summary.exists():
        rows = list(csv.DictReader(open(summary)))
        answers["straggler"] = int(rows[0]["rank"]) if rows else None
    sync = out / "nccl_summary_implicit_sync.csv"
    if sync.exists():
        for r in csv.DictReader(open(sync)):
            kind = r["Collective name"].replace("_", "").lower()
            if not r.get("Full msg size (MB)"):
                continue
            size = round(float(r["Full msg size (MB)"]) * 2**20)
            answers["sizes"][(kind, size)] += int(r["count"])
            answers["busbw"][(kind, size)] = float(r["bus bw (GB/s)_median"]) * GIB  # its "GB/s" are GiB/s
    return {"tool": f"TraceLens {version(py, 'TraceLens')}", "s": t, "MB": m, **answers}


def hta_run(name: str, py: str, run: Path, repeat: int) -> dict:
    t, m, out, _ = measure([py, str(HERE / "peers" / "hta_answers.py"), "run", str(run)], None, repeat)
    got = json.loads(out or "{}")
    dist = "HolisticTraceAnalysis" if name.startswith("hta") else "traceinsight"
    return {
        "tool": f"{dist} {version(py, dist)}",
        "s": t,
        "MB": m,
        "straggler": got.get("straggler"),
        "note": got.get("error"),
    }


def agree(ours: dict, theirs: dict) -> str:
    said = []
    said.append(
        "straggler " + ("agrees" if theirs.get("straggler") == ours["straggler"] else f"{theirs.get('straggler')}")
    )
    if "sizes" in theirs:
        mine = Counter(
            {k: v for k, v in ours["sizes"].items() if k[0] in ("allreduce", "allgather", "reducescatter", "alltoall")}
        )
        if not theirs["sizes"]:
            said.append("it gives no sizes")
        else:
            differ = len(set(theirs["sizes"]) ^ set(mine))
            said.append("sizes agree" if theirs["sizes"] == mine else f"sizes differ ({differ})")
        off = [
            k
            for k, v in theirs["busbw"].items()
            if k in ours["busbw"] and abs(v - ours["busbw"][k]) > 0.05 * max(v, 1e-9)
        ]
        if theirs["busbw"]:
            said.append("busbw agrees" if not off else f"busbw differs at {len(off)} sizes")
    return "; ".join(said)


# ------------------------------------------------------------------ single traces
def tracepipe_trace(trace: Path, work: Path, repeat: int, every: bool = False) -> dict:
    """`analyze` of the trace file (flatten, link, cost and report): the sections the peers'
    answers are compared with (devices, kernels), or `every` section (the default analyze)."""
    out = work / f"{trace.name}.analyze.json"
    cmd = [sys.executable, "-m", "pipeline", "analyze", str(trace), "--format", "json", "-o", str(out)]
    cmd += [] if every else ["--section", "devices", "--section", "kernels"]
    t, m, _, cpu = measure(cmd, {"PYTHONPATH": str(ROOT)}, repeat)
    doc = json.loads(out.read_text())
    devices = doc.get("devices") or []
    kernels = [k for d in devices for k in d.get("kernels", [])]
    busy = sum(d.get("busy_us") or 0 for d in devices)
    return {
        "tool": "tracepipe analyze" + (" (every section)" if every else " (devices, kernels)"),
        "s": t,
        "cpu_s": cpu,
        "MB": m,
        "kernels": sum(k.get("count", 0) for k in kernels),
        "kernel_time_us": sum(k.get("dur_us", 0) for k in kernels),
        "busy_us": busy,
    }


def peer_trace(name: str, py: str, trace: Path, work: Path, repeat: int) -> dict:
    if name == "tracelens":
        cmd = [py, str(HERE / "peers" / "tracelens_answers.py"), str(trace)]
        tool = f"TraceLens {version(py, 'TraceLens')}"
    else:
        d = work / f"{trace.name}.dir"
        d.mkdir(exist_ok=True)
        shutil.copy(trace, d / trace.name)
        cmd = [py, str(HERE / "peers" / "hta_answers.py"), "trace", str(d)]
        dist = "HolisticTraceAnalysis" if name.startswith("hta") else "traceinsight"
        tool = f"{dist} {version(py, dist)}"
    t, m, out, cpu = measure(cmd, None, repeat)
    try:
        got = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        got = {"error": out[-200:]}
    return {"tool": tool, "s": t, "cpu_s": cpu, "MB": m, **got}


def trace_agree(ours: dict, theirs: dict) -> str:
    said = []
    for k in ("kernels", "kernel_time_us", "busy_us"):
        if k in theirs and theirs[k] is not None:
            a, b = ours[k], theirs[k]
            said.append(f"{k} " + ("agrees" if abs(a - b) <= 0.01 * max(abs(a), 1) else f"{b:,.0f} vs {a:,.0f}"))
    return "; ".join(said) or str(theirs.get("error", ""))[:80]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--runs",
        help="run folders, comma-separated (default: a synthetic 8-rank NCCL run and ../shared/runs/*; '': none)",
    )
    ap.add_argument("--traces", help="single traces, comma-separated (default: ../shared/traces/hta/a100_nccl.json.gz)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workdir", default="/tmp/tracepipe-bench-peers")
    a = ap.parse_args()
    work = Path(a.workdir)
    work.mkdir(parents=True, exist_ok=True)
    # tracepipe as installed: its modules compiled once (PYTHONDONTWRITEBYTECODE would compile them every run)
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "pipeline")], capture_output=True)
    found = peers()
    print(f"peers: {', '.join(found) or 'none (see scripts/peers_venvs.sh)'}", file=sys.stderr)
    # the versions tracepipe ran with, beside the peers' own
    deps = ", ".join(f"{d} {version(sys.executable, d)}" for d in ("polars", "pyarrow", "tracepipe-native"))
    runs = [Path(r) for r in a.runs.split(",") if r] if a.runs is not None else default_runs(work)
    lines = ["| run | tool | s | peak MB | x tracepipe time | answers |", "|---|---|---|---|---|---|"] if runs else []
    for run in runs:
        ours = tracepipe_run(run, work, a.repeat)
        rows = list(ours)
        for name, py in found.items():
            rows.append(
                tracelens_run(py, run, work, a.repeat) if name == "tracelens" else hta_run(name, py, run, a.repeat)
            )
        for r in rows:
            said = "" if r["tool"].startswith("tracepipe") else agree(ours[0], r)
            if r.get("note"):
                said += f" ({r['note'][:80]})"
            lines.append(
                f"| {run.name} | {r['tool']} | {r['s']:.2f} | {r['MB']:.0f} | {r['s'] / ours[0]['s']:.1f} | {said} |"
            )
    traces = [Path(t) for t in a.traces.split(",")] if a.traces else [SHARED / "traces/hta/a100_nccl.json.gz"]
    for trace in (t for t in traces if t.exists()):
        ours_t = tracepipe_trace(trace, work, a.repeat)
        every = tracepipe_trace(trace, work, a.repeat, every=True)
        rows = [ours_t, every] + [peer_trace(n, py, trace, work, a.repeat) for n, py in found.items()]
        lines += ["", "| trace | tool | s | CPU s | peak MB | x tracepipe time | x its CPU | x its memory | answers |"]
        lines += ["|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            said = "" if r["tool"].startswith("tracepipe") else trace_agree(ours_t, r)
            x = [r[k] / ours_t[k] for k in ("s", "cpu_s", "MB")]
            lines.append(
                f"| {trace.name} | {r['tool']} | {r['s']:.2f} | {r['cpu_s']:.2f} | {r['MB']:.0f} | "
                f"{x[0]:.1f} | {x[1]:.1f} | {x[2]:.1f} | {said} |"
            )
        said = f"{ours_t['kernels']:,} kernels, {ours_t['kernel_time_us']:,.0f} µs, busy {ours_t['busy_us']:,.0f} µs"
        print(f"tracepipe on {trace.name}: {said}", file=sys.stderr)
    print("\n".join([*lines, "", f"tracepipe ran with {deps}"]))


def default_runs(work: Path) -> list[Path]:
    """A synthetic 8-rank NCCL run from the shared a100_nccl trace (rank 3 late, clocks off; the
    acceptance maker), and the real runs of ../shared/runs."""
    out = []
    maker, src = SHARED / "acceptance/make_run.py", SHARED / "traces/hta/a100_nccl.json.gz"
    run = work / "nccl8"
    if maker.exists() and src.exists():
        if not (run / "rank-7.json.gz").exists():
            offsets = "0,850,-400,1200,-1500,300,2000,-700"
            subprocess.run(
                [sys.executable, str(maker), str(src), "--world", "8", "--straggler", "3", "--delay-us", "5000",
                 "--delay-collective", "10", "--collective-kind", "allreduce", "--clock-offsets-us", offsets,
                 "--out", str(run)],
                check=True,
                capture_output=True,
            )  # fmt: skip
        out.append(run)
    out += sorted(p for p in (SHARED / "runs").glob("*") if p.is_dir())
    return out


if __name__ == "__main__":
    main()
