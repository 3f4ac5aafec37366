#!/usr/bin/env python3
"""Record a real multi-process PyTorch profiler run (CPU, gloo) with a known straggler.

Launches a world of N processes on this machine (torch.multiprocessing.spawn,
MASTER_ADDR=127.0.0.1 and a free port), initialises ``torch.distributed`` with the
"gloo" backend, and has every rank run a few training steps of a tiny MLP under
``torch.profiler.profile(activities=[CPU], record_shapes=True, schedule=...)``
calling ``prof.step()`` each step, so each trace holds ``ProfilerStep#N``
annotations. In every step each rank does real collectives:

* ``all_reduce`` of the flattened gradients (one bucket, explicit ``dist.all_reduce``),
* ``all_gather`` of the loss, ``broadcast`` of a small tensor from rank 0, and a
  ``barrier``,
* with ``--subgroup 0,1`` also an ``all_reduce`` in a ``dist.new_group`` over those ranks.

The straggler rank (``--straggler``, default 2) sleeps ``--delay-ms`` (default 20)
right before its gradient all_reduce in the profiler steps listed in
``--delay-steps`` (profiler step numbers, i.e. the N of ``ProfilerStep#N``), so
every other rank waits about that long inside that collective.

Each rank exports its trace with ``prof.export_chrome_trace``; it is gzipped
(level 9) to ``OUT/rank-{r}.json.gz``. Beside OUT, ``OUT.truth.json`` records the
ground truth (world size, ranks, straggler, delay, the delayed ProfilerStep names).

Needs only torch and the standard library. Run it with a torch install, e.g.::

    python3 -m venv /work/venv-torch && /work/venv-torch/bin/pip install torch==2.13.0 numpy
    /work/venv-torch/bin/python scripts/record_gloo_run.py --out tests/data/runs/gloo4

Options: --world N (4) --steps K (profiled/active steps, 6) --straggler R (2)
--delay-ms D (20) --delay-steps "3,5" --subgroup "0,1" --out DIR.

``--partial-of SRC --drop-rank R --out DIR`` records nothing (no torch needed): it
copies the rank files of an earlier run SRC except rank R into DIR and writes
``DIR.truth.json`` from ``SRC.truth.json`` with "ranks" lacking R (world_size kept).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path

# Profiler schedule: WAIT + WARMUP unprofiled steps, then ACTIVE profiled steps.
# ProfilerStep numbering starts at 0 with the first prof.step() window, so the
# profiled steps are ProfilerStep#(WAIT+WARMUP) .. #(WAIT+WARMUP+ACTIVE-1).
WAIT = 1
WARMUP = 1


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_rank(rank: int, args: argparse.Namespace, port: int, tmpdir: str) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.profiler import ProfilerActivity, profile, schedule

    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    torch.manual_seed(1234 + rank)
    dist.init_process_group("gloo", rank=rank, world_size=args.world)
    sub = None
    if args.subgroup:
        # new_group must be called by every rank, members or not.
        sub = dist.new_group(ranks=args.subgroup)

    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(16, 32)
    y = torch.randn(16, 8)
    delay_s = args.delay_ms / 1000.0
    total = WAIT + WARMUP + args.steps
    path = os.path.join(tmpdir, f"rank-{rank}.json")

    def on_ready(p):
        p.export_chrome_trace(path)

    dist.barrier()
    with profile(
        activities=[ProfilerActivity.CPU],
        record_shapes=True,
        schedule=schedule(wait=WAIT, warmup=WARMUP, active=args.steps, repeat=1),
        on_trace_ready=on_ready,
    ) as prof:
        for _ in range(total):
            step = prof.step_num  # the N of the ProfilerStep#N now open
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            flat = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
            if rank == args.straggler and step in args.delay_steps:
                time.sleep(delay_s)
            dist.all_reduce(flat)
            flat /= args.world
            off = 0
            for p in model.parameters():
                n = p.grad.numel()
                p.grad.copy_(flat[off : off + n].view_as(p.grad))
                off += n
            opt.step()
            losses = [torch.zeros(1) for _ in range(args.world)]
            dist.all_gather(losses, loss.detach().reshape(1))
            token = torch.full((4,), float(step)) if rank == 0 else torch.zeros(4)
            dist.broadcast(token, src=0)
            if sub is not None and rank in args.subgroup:
                t = torch.ones(8) * rank
                dist.all_reduce(t, group=sub)
            dist.barrier()
            prof.step()
    dist.barrier()
    dist.destroy_process_group()


def check_trace(path: Path, rank: int, args: argparse.Namespace) -> list[str]:
    """Return the ProfilerStep names (python thread) that hold the straggler's delayed
    all_reduce; on other ranks just validate the trace. Raises on surprises."""
    with gzip.open(path, "rt") as f:
        doc = json.load(f)
    di = doc.get("distributedInfo")
    if not di or di.get("rank") != rank or di.get("world_size") != args.world:
        raise SystemExit(f"{path}: distributedInfo missing or wrong: {di!r}")
    evs = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    steps = [e for e in evs if e["name"].startswith("ProfilerStep#")]
    want = {f"ProfilerStep#{n}" for n in range(WAIT + WARMUP, WAIT + WARMUP + args.steps)}
    got = {e["name"] for e in steps}
    if got != want:
        raise SystemExit(f"{path}: ProfilerStep names {sorted(got)} != {sorted(want)}")
    if rank != args.straggler:
        return []
    # First c10d allreduce inside each ProfilerStep on the same thread.
    out = []
    for s in sorted(steps, key=lambda e: e["ts"]):
        ars = sorted(
            (
                e
                for e in evs
                if e["name"] == "c10d::allreduce_" and e["tid"] == s["tid"] and s["ts"] <= e["ts"] < s["ts"] + s["dur"]
            ),
            key=lambda e: e["ts"],
        )
        if not ars:
            raise SystemExit(f"{path}: no c10d::allreduce_ in {s['name']}")
        gap = ars[0]["ts"] - s["ts"]
        if int(s["name"].split("#")[1]) in args.delay_steps:
            if gap < args.delay_ms * 1000 * 0.9:
                raise SystemExit(f"{path}: {s['name']} allreduce starts {gap} us in; no delay?")
            out.append(s["name"])
    return out


def derive_partial(src: Path, drop: int, out: Path) -> int:
    truth = json.loads((src.parent / f"{src.name}.truth.json").read_text())
    if drop not in truth["ranks"]:
        raise SystemExit(f"rank {drop} not in {src}")
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("rank-*.json.gz"):
        old.unlink()
    for r in truth["ranks"]:
        if r != drop:
            shutil.copyfile(src / f"rank-{r}.json.gz", out / f"rank-{r}.json.gz")
    truth["ranks"] = [r for r in truth["ranks"] if r != drop]
    truth["notes"] = (
        f"Copy of {src.name} (identical rank files) with rank-{drop}.json.gz removed, to test "
        f"analysis of a run with a missing rank; world_size stays {truth['world_size']}. " + truth["notes"]
    )
    truth_path = out.parent / f"{out.name}.truth.json"
    truth_path.write_text(json.dumps(truth, indent=2) + "\n")
    print(f"{out}: ranks {truth['ranks']}; {truth_path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--steps", type=int, default=6, help="profiled (active) steps")
    ap.add_argument("--straggler", type=int, default=2)
    ap.add_argument("--delay-ms", type=float, default=20.0)
    ap.add_argument("--delay-steps", default="3,5", help="comma list of N in ProfilerStep#N to delay")
    ap.add_argument("--subgroup", default="", help="comma list of ranks for an extra dist.new_group all_reduce")
    ap.add_argument("--out", required=True)
    ap.add_argument("--partial-of", default="", help="derive a partial run from this earlier run dir (no recording)")
    ap.add_argument("--drop-rank", type=int, default=0, help="rank left out by --partial-of")
    args = ap.parse_args(argv)
    if args.partial_of:
        return derive_partial(Path(args.partial_of).resolve(), args.drop_rank, Path(args.out).resolve())
    args.delay_steps = sorted({int(s) for s in args.delay_steps.split(",") if s.strip()})
    args.subgroup = sorted({int(s) for s in args.subgroup.split(",") if s.strip()})
    first, last = WAIT + WARMUP, WAIT + WARMUP + args.steps - 1
    for n in args.delay_steps:
        if not first <= n <= last:
            ap.error(f"delay step {n} outside profiled steps {first}..{last}")
    if not 0 <= args.straggler < args.world:
        ap.error("--straggler must be a rank of the world")
    if any(not 0 <= r < args.world for r in args.subgroup):
        ap.error("--subgroup ranks must be ranks of the world")

    import torch.multiprocessing as mp

    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    tmpdir = tempfile.mkdtemp(prefix="gloo_run_")
    try:
        mp.spawn(run_rank, args=(args, free_port(), tmpdir), nprocs=args.world, join=True)
        for r in range(args.world):
            src = os.path.join(tmpdir, f"rank-{r}.json")
            with open(src, "rb") as fi, gzip.open(out / f"rank-{r}.json.gz", "wb", compresslevel=9) as fo:
                shutil.copyfileobj(fi, fo)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)

    delayed: list[str] = []
    for r in range(args.world):
        delayed += check_trace(out / f"rank-{r}.json.gz", r, args)
    truth = {
        "generator": "record_gloo_run.py",
        "world_size": args.world,
        "ranks": list(range(args.world)),
        "straggler_rank": args.straggler,
        "delay_ms": args.delay_ms,
        "delay_steps": delayed,
        "tolerance": 0.25,
        "notes": (
            f"CPU-only gloo run, {args.world} processes on one host (one clock). Each profiled "
            "step: all_reduce of flattened grads, all_gather of the loss, broadcast from rank 0"
            + (f", all_reduce in subgroup {args.subgroup}" if args.subgroup else "")
            + f", barrier. Rank {args.straggler} sleeps {args.delay_ms:g} ms right before its "
            "gradient all_reduce (the first all_reduce of the step) in the listed steps, so the "
            "other ranks wait about that long in that collective."
        ),
    }
    if args.subgroup:
        truth["subgroup_ranks"] = args.subgroup
    truth_path = out.parent / f"{out.name}.truth.json"
    truth_path.write_text(json.dumps(truth, indent=2) + "\n")
    for r in range(args.world):
        p = out / f"rank-{r}.json.gz"
        print(f"{p} {p.stat().st_size} bytes")
    print(f"{truth_path}: delay_steps={delayed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
