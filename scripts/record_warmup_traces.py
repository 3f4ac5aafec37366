#!/usr/bin/env python3
"""Record real PyTorch profiler traces (CPU) of a torch.compile'd model, for the `warmup` finding.

Three traces of the same small MLP compiled with torch.compile, each profiled for four steps (a
schedule recording from the first, `prof.step()` after each: each step is a ProfilerStep#N), gzipped (level 9) into OUT:

* ``cold.json.gz``: profiling starts before the first call, so the window holds the compilation
  of the forward and of the backward (torch.compile's `(dynamo_timed)` phases);
* ``recompile.json.gz``: warmed up first, then the batch size changes in two of the profiled
  steps, and each new size compiles again (automatic dynamic shapes are turned off);
* ``warm.json.gz``: warmed up for two steps before profiling: no compilation in the window.

Needs torch (and a C++ compiler for inductor's CPU code). Run it with a torch install::

    make install-oracle
    .venv/bin/python scripts/record_warmup_traces.py --out tests/data/warmup
"""

from __future__ import annotations

import argparse
import gzip
import os
import shutil
import tempfile


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    out = ap.parse_args().out
    import torch
    import torch._dynamo
    from torch.profiler import ProfilerActivity, profile, schedule

    torch.manual_seed(0)
    torch._dynamo.config.automatic_dynamic_shapes = False  # a new batch size compiles anew
    os.makedirs(out, exist_ok=True)

    def fresh():
        torch._dynamo.reset()
        model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8))
        return torch.compile(model), torch.optim.SGD(model.parameters(), lr=0.01)

    def step(model, opt, batch: int) -> None:
        model(torch.randn(batch, 64)).sum().backward()
        opt.step()
        opt.zero_grad()

    def record(name: str, warm_steps: int, batches: list[int]) -> None:
        model, opt = fresh()
        for _ in range(warm_steps):
            step(model, opt, batches[0])
        every = schedule(wait=0, warmup=0, active=len(batches), repeat=1)  # ProfilerStep#N from the first
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True, schedule=every) as prof:
            for b in batches:
                step(model, opt, b)
                prof.step()
        with tempfile.TemporaryDirectory() as tmp:
            raw = os.path.join(tmp, "trace.json")
            prof.export_chrome_trace(raw)
            with open(raw, "rb") as src, gzip.open(os.path.join(out, f"{name}.json.gz"), "wb", compresslevel=9) as dst:
                shutil.copyfileobj(src, dst)

    record("cold", 0, [32, 32, 32, 32])
    record("recompile", 2, [32, 48, 32, 96])
    record("warm", 2, [32, 32, 32, 32])


if __name__ == "__main__":
    main()
