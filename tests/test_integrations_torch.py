"""pipeline.integrations.torch: traces written into a dataset by torch.profiler's on_trace_ready,
by several ranks at once, then compared. Needs the CPU torch wheel (`pip install torch`, the
`torch` extra); skipped where torch is absent."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from conftest import PROJECT

pytest.importorskip("torch")

TRAIN = textwrap.dedent(
    """
    import sys
    import torch
    from pipeline.integrations.torch import on_trace_ready

    dataset, run, rank = sys.argv[1], sys.argv[2], int(sys.argv[3])
    torch.manual_seed(rank)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
    x = torch.randn(32, 64)
    done = []
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU],
        schedule=torch.profiler.schedule(wait=1, warmup=1, active=3, repeat=1),
        on_trace_ready=on_trace_ready(dataset, run=run, rank=rank, on_added=done.append),
    ) as prof:
        for _ in range(6):
            model(x).sum().backward()
            prof.step()
    print(";".join(a.status for a in done))
    """
)


def train(dataset, run: str, ranks: int) -> list[str]:
    """`ranks` processes profiling at once, each writing its trace into `dataset`."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", TRAIN, str(dataset), run, str(r)],
            cwd=PROJECT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(ranks)
    ]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=600)
        assert p.returncode == 0, stderr[-2000:]
        out.append(stdout.strip().splitlines()[-1])
    return out


@pytest.mark.slow
def test_ranks_write_at_once_and_runs_compare(tmp_path, run_cli):
    ds = tmp_path / "ds"
    assert train(ds, "nightly/a", 2) == ["ok", "ok"]
    assert train(ds, "nightly/b", 2) == ["ok", "ok"]
    p = run_cli(["query", ds, "select source_path, rank, rank_from from trace order by source_path", "-f", "json"])
    rows = json.loads(p.stdout)
    assert [r["source_path"] for r in rows] == [
        f"nightly/{run}/rank-{r}.step-5.pt.trace.json" for run in "ab" for r in (0, 1)
    ]
    assert [r["rank"] for r in rows] == [0, 1, 0, 1]
    p = run_cli(["query", ds, "select count(distinct step) as steps from steps", "-f", "json"])
    assert json.loads(p.stdout)[0]["steps"] == 3  # the three active steps of each trace
    p = run_cli(["compare", ds, "--base", "a", "--new", "b", "--format", "json", "--min-effect", "50"])
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["base"]["ranks"] == 2 and doc["new"]["ranks"] == 2
    assert {r["name"] for r in doc["rows"] if r["level"] == "step"} >= {"step"}
