#!/usr/bin/env python3
"""Record real before/after pairs with torch.profiler (CPU) for the findings' estimates.

Each pair is one fix applied to one small training or inference loop: the "before" loop has the
problem a finding names, the "after" loop has it fixed, everything else equal. Each side is
profiled under ``torch.profiler.schedule(wait=1, warmup=2, active=STEPS)`` (so the traces hold
``ProfilerStep#3`` .. ``#(2+STEPS)``), three times, the two sides interleaved (before, after,
before, ...: a load spike on this shared machine hits both); of the three recordings of a side
the one whose median step is the median is kept (as ../shared/traces/pairs was recorded).

Written per pair to ``OUT/<pair>/``: ``<pair>_before.json.gz``, ``<pair>_after.json.gz`` and
``MANIFEST.toml``: the finding id expected on the before trace (``expected = "absent"``: a fix
whose premise a CPU trace cannot show: no such finding on either side), the realized saving
(median before step - median after step, from the kept traces' ProfilerStep spans, times the
before trace's steps: what the acceptance check `findings` computes), each recording's median
step, and whether the saving is noise (the three recordings' savings disagree by more than the
saving: machine load).

The pairs (``--only a,b``):

* ``optimizer``: 24 Linear(64, 64) layers, AdamW(foreach=False) -> AdamW(fused=True).
* ``dataloader``: a Dataset whose items cost 1.5 ms of IO each (time.sleep: robust on a loaded
  machine), batches of 8; DataLoader(num_workers=0) -> DataLoader(num_workers=2).
* ``sync`` (expected absent): a training step that reads ``loss.item()`` every step -> keeps the
  loss on the device. On a CPU there is no device to drain: no `sync` finding on either side.
* ``copies``: an inference MLP whose weights are kept in bfloat16 and transposed and cast to
  float32 in every forward (plus a ``.contiguous()`` of its input) -> converted once at load.
* ``fusion``: RMSNorm + SwiGLU blocks run eagerly (inference) -> the same model ``torch.compile``d
  (inductor's C++ backend; compiled before profiling).

Needs torch (``make install-oracle``: the 2.13.0 CPU wheel) and gcc for ``fusion``. Run::

    .venv/bin/python scripts/record_pairs.py --out tests/data/pairs [--only optimizer,copies]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, schedule

WAIT, WARMUP, STEPS, ROUNDS = 1, 2, 12, 3

Step = Callable[[], None]


# ------------------------------------------------------------------ the loops
def optimizer_loop(fixed: bool, fix: str = "fused") -> Step:
    """AdamW over 48 small parameters: a per-parameter loop, or `fix` ("fused" / "foreach")."""
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(64, 64) for _ in range(24)])
    how = {fix: True} if fixed else {"foreach": False}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, **how)
    x = torch.randn(16, 64)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        opt.step()

    return step


class SlowIO(torch.utils.data.Dataset):
    """Items that cost IO time (a sleep: a disk or network read) and a little decoding."""

    def __init__(self, n: int, io_s: float):
        self.n, self.io_s = n, io_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        time.sleep(self.io_s)
        g = torch.Generator().manual_seed(i)
        return torch.randn(64, generator=g), torch.randint(0, 10, (), generator=g)


def dataloader_loop(fixed: bool) -> Step:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, foreach=True)
    data = SlowIO(8 * 200, 1.5e-3)
    loader = torch.utils.data.DataLoader(data, batch_size=8, num_workers=2 if fixed else 0, persistent_workers=fixed)
    it = iter(loader)

    def step() -> None:
        x, y = next(it)
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        time.sleep(4e-3)  # the rest of the step (logging, a device's work): what loading can hide behind

    return step


def sync_loop(fixed: bool) -> Step:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, foreach=True)
    x = torch.randn(256, 256)
    total = torch.zeros(())
    seen: list[float] = []

    def step() -> None:
        nonlocal total
        opt.zero_grad(set_to_none=True)
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        if fixed:
            total = total + loss.detach()  # kept on the device, read once after the loop
        else:
            seen.append(loss.item())  # a host-device sync every step (on a GPU)

    return step


class CastingMLP(nn.Module):
    """Linear layers whose weights live in bfloat16 ([out, in]): `cast` converts them to float32
    [in, out] in every forward (and makes its input contiguous); otherwise they are converted once."""

    def __init__(self, width: int, depth: int, cast: bool):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        ws = [torch.randn(width, width, generator=g).bfloat16() for _ in range(depth)]
        self.cast = cast
        self.ws = ws if cast else [w.float().t().contiguous() for w in ws]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for w in self.ws:
            if self.cast:
                x = x.contiguous()
                w = w.float().t().contiguous()
            x = torch.relu(x @ w)
        return x


def copies_loop(fixed: bool) -> Step:
    torch.manual_seed(0)
    model = CastingMLP(1024, 6, cast=not fixed)
    x = torch.randn(1024, 16).t()  # a transposed (non-contiguous) batch of 16

    def step() -> None:
        with torch.no_grad():
            model(x)

    return step


class Block(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.g = nn.Parameter(torch.ones(d))
        self.up = nn.Linear(d, 2 * d, bias=False)
        self.gate = nn.Linear(d, 2 * d, bias=False)
        self.down = nn.Linear(2 * d, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.g  # RMSNorm
        return x + self.down(nn.functional.silu(self.gate(h)) * self.up(h))  # SwiGLU


def fusion_loop(fixed: bool) -> Step:
    torch.manual_seed(0)
    model = nn.Sequential(*[Block(32) for _ in range(6)])
    run = torch.compile(model) if fixed else model
    x = torch.randn(32, 128, 32)

    def step() -> None:
        with torch.no_grad():
            run(x)

    return step


PAIRS: dict[str, tuple[Callable[[bool], Step], str, str]] = {
    # name: (loop, the finding id expected on "before" (with "!": expected absent on both sides, its
    # premise cannot show on a CPU), how the pair was made)
    "optimizer": (
        optimizer_loop,
        "optimizer",
        "24 Linear(64, 64) layers (48 parameters), batch 16; torch.optim.AdamW(foreach=False) -> AdamW(fused=True)",
    ),
    "dataloader": (
        dataloader_loop,
        "dataloader",
        "items cost 1.5 ms of IO each (time.sleep), batches of 8, a small MLP and 4 ms of other work per step; "
        "DataLoader(num_workers=0) -> DataLoader(num_workers=2, persistent_workers=True)",
    ),
    "sync": (
        sync_loop,
        "sync!",
        "an MLP 256-1024-256, batch 256; loss.item() every step -> the loss accumulated on the device. On a CPU "
        "there is no device queue to drain: `sync` has no premise and no finding may claim the (nil) saving",
    ),
    "copies": (
        copies_loop,
        "copies",
        "6 layers 1024x1024 kept in bfloat16 and cast to float32 and transposed (.float().t().contiguous()) in every "
        "forward, input made contiguous, no_grad, batch 16 -> weights converted once at load",
    ),
    "fusion": (
        fusion_loop,
        "fusion",
        "6 RMSNorm + SwiGLU blocks (d=32, 32x128 tokens), inference (no_grad); eager -> torch.compile(model) "
        "(inductor C++, compiled before profiling)",
    ),
}


# ------------------------------------------------------------------ recording
def record(step: Step, dest: Path) -> list[float]:
    """Profile one side: warm up outside the profiler, then wait/warmup/active steps; the trace is
    written to dest (plain JSON); returns its profiled steps' durations (µs)."""
    for _ in range(3):  # first calls: allocations, torch.compile, worker start-up
        step()
    sched = schedule(wait=WAIT, warmup=WARMUP, active=STEPS, repeat=1)
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=sched,
        on_trace_ready=lambda p: p.export_chrome_trace(str(dest)),
    ) as prof:
        for _ in range(WAIT + WARMUP + STEPS):
            step()
            prof.step()
    return steps_us(json.loads(dest.read_text())["traceEvents"])


def steps_us(events: list[dict]) -> list[float]:
    """The CPU-side ProfilerStep#N durations (µs), one per step, sorted (as the acceptance check)."""
    out: dict[str, float] = {}
    for e in events:
        n = str(e.get("name", ""))
        if n.startswith("ProfilerStep#") and e.get("ph") == "X" and e.get("cat") != "gpu_user_annotation":
            out[n] = max(out.get(n, 0.0), float(e["dur"]))
    return sorted(out.values())


def median(xs: list[float]) -> float:
    return float(statistics.median(xs))


def record_pair(name: str, out: Path) -> dict:
    loop, expect, how = PAIRS[name]
    tmp = Path(tempfile.mkdtemp(prefix=f"pair-{name}-"))
    runs: dict[str, list[tuple[float, Path, int]]] = {"before": [], "after": []}
    for r in range(ROUNDS):
        for side in ("before", "after"):
            dest = tmp / f"{side}{r}.json"
            steps = record(loop(side == "after"), dest)
            runs[side].append((median(steps), dest, len(steps)))
            print(f"{name} {side} #{r}: median step {median(steps) / 1e3:.2f} ms", file=sys.stderr)
    kept = {side: sorted(rs, key=lambda x: x[0])[len(rs) // 2] for side, rs in runs.items()}
    d = out / name
    d.mkdir(parents=True, exist_ok=True)
    for side, (_, src, _) in kept.items():
        with open(src, "rb") as fh, gzip.open(d / f"{name}_{side}.json.gz", "wb", compresslevel=9) as gz:
            gz.write(fh.read())
    n_before = kept["before"][2]
    realized = (kept["before"][0] - kept["after"][0]) * n_before
    per_round = [(b[0] - a[0]) * n_before for b, a in zip(runs["before"], runs["after"], strict=True)]
    spread = max(per_round) - min(per_round)
    noisy = abs(realized) < 1.0 * spread or min(per_round) * max(per_round) < 0
    manifest = {
        "pair": name,
        "finding": expect.rstrip("!"),
        "expected": "absent" if expect.endswith("!") else "present",
        "realized_us": round(realized, 1),
        "before_median_step_us": round(kept["before"][0], 1),
        "after_median_step_us": round(kept["after"][0], 1),
        "steps": n_before,
        "rounds_before_median_step_us": [round(x[0], 1) for x in runs["before"]],
        "rounds_after_median_step_us": [round(x[0], 1) for x in runs["after"]],
        "rounds_realized_us": [round(x, 1) for x in per_round],
        "noisy": noisy,
        "how": how,
        "recorded": (
            f"torch {torch.__version__}, {torch.get_num_threads()} intra-op thread(s), torch.profiler CPU activity, "
            f"schedule(wait={WAIT}, warmup={WARMUP}, active={STEPS}); {ROUNDS} recordings per side, interleaved, "
            "the one with the median median step kept; realized = (median before step - median after step) x "
            f"steps; noisy when the {ROUNDS} recordings' savings disagree by more than the saving (machine load: "
            f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores at the end)"
        ),
        "script": "scripts/record_pairs.py",
    }
    (d / "MANIFEST.toml").write_text(toml(manifest))
    for p in tmp.iterdir():
        p.unlink()
    tmp.rmdir()
    return manifest


def toml(d: dict) -> str:
    """A flat dict as TOML (str, bool, numbers, lists of numbers)."""
    lines = ["# A real before/after pair recorded by scripts/record_pairs.py (tests/test_findings_pairs.py)."]
    for k, v in d.items():
        lines.append(f"{k} = {json.dumps(v) if not isinstance(v, bool) else str(v).lower()}")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("tests/data/pairs"))
    ap.add_argument("--only", default="", help="comma-separated pair names (default: all)")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1: steadier on a shared machine)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    names = [n for n in a.only.split(",") if n] or list(PAIRS)
    unknown = set(names) - set(PAIRS)
    if unknown:
        print(f"record_pairs: unknown pair(s) {', '.join(sorted(unknown))}; known: {', '.join(PAIRS)}", file=sys.stderr)
        return 2
    for n in names:
        m = record_pair(n, a.out)
        print(
            f"{n}: {m['finding']} ({m['expected']}), realized {m['realized_us'] / 1e3:.1f} ms over {m['steps']} steps"
            + (" (noisy)" if m["noisy"] else ""),
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
