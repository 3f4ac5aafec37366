"""Shared fixtures: a session tmp dir, the real traces beside the project, the CLI in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
PROJECT = TESTS.parent
SHARED_TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"

if str(TESTS) not in sys.path:  # `import fuzz` from any test module
    sys.path.insert(0, str(TESTS))


# peak RSS (bytes) of the process running this line, for memory tests' subprocess scripts: its own
# high-water mark (VmHWM). Not getrusage's ru_maxrss: a child spawned with vfork + exec inherits its
# parent's peak in it, so under a pytest worker of 700 MB every child "peaked" at 700 MB (CI failed).
PEAK_RSS = "int(open('/proc/self/status').read().split('VmHWM:')[1].split()[0]) * 1024"


def shared_memory_folders() -> set[str]:
    """tracepipe's slot folders in /dev/shm now (none where there is no /dev/shm)."""
    return {d for d in os.listdir("/dev/shm") if d.startswith("tracepipe-")} if os.path.isdir("/dev/shm") else set()


def shared_memory_left(before: set[str], wait: float = 60) -> set[str]:
    """The slot folders made since `before` that stay. Tests in other processes (`make test` runs
    one per core) make and remove their own meanwhile: one of theirs goes within seconds, one a
    command left behind stays."""
    deadline = time.monotonic() + wait
    while (left := shared_memory_folders() - before) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def run_cli(args, timeout: float = 300, **kw) -> subprocess.CompletedProcess:
    """`python -m pipeline ARGS` in a subprocess, text output captured, no debug tracebacks."""
    env = {k: v for k, v in os.environ.items() if k != "TRACEPIPE_DEBUG"}
    env.update(kw.pop("env", {}) or {})
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        env=env,
        cwd=kw.pop("cwd", PROJECT),
        **kw,
    )


@pytest.fixture(scope="session", autouse=True)
def _private_cache(tmp_path_factory):
    """`tracepipe ranks` keeps a run folder's first look in a cache: the tests' own, not the user's."""
    os.environ["TRACEPIPE_CACHE_DIR"] = str(tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="session")
def session_tmp(tmp_path_factory) -> Path:
    """One temporary directory for the whole session (for files several tests share)."""
    return tmp_path_factory.mktemp("session")


@pytest.fixture(scope="session")
def shared_traces() -> Path:
    """The real traces in ../shared/traces (CI clones the project beside shared/); skip when absent."""
    if not SHARED_TRACES.is_dir() or not any(SHARED_TRACES.glob("*/*.json.gz")):
        pytest.skip(f"real traces not found at {SHARED_TRACES}")
    return SHARED_TRACES


@pytest.fixture(scope="session")
def run_report(tmp_path_factory):
    """The RunReport of a synthetic 4-rank run (rank 2 late at collective 3), batched."""
    from pipeline import synthetic as synth
    from pipeline.dataset.batch import run_batch
    from pipeline.runs.report import analyze_runs

    tmp = tmp_path_factory.mktemp("run")
    synth.write_run(tmp / "demo_run", 4, 16, straggler=2, delay_us=800.0, delayed=3)
    run_batch(tmp / "demo_run", tmp / "ds", jobs=1)
    return analyze_runs(tmp / "ds")


@pytest.fixture(name="run_cli")
def run_cli_fixture():
    return run_cli
