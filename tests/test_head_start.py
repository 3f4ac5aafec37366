"""head_start: a large trace's reading begun before the command's imports reads the same tables,
is taken once by the flatten of its own trace, and leaves nothing behind when nobody takes it."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from conftest import shared_memory_folders, shared_memory_left
from pipeline import synthetic as synth
from pipeline.flatten import flatten
from pipeline.read import head_start
from pipeline.read.by_native import available as native_available
from pipeline.read.workers import PARALLEL_MIN_BYTES, in_flight

needs_native = pytest.mark.skipif(not native_available(), reason="the head start reads with the native builder")


@pytest.fixture(scope="module")
def big_trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("head") / "big.json"
    synth.write_big_trace(path, PARALLEL_MIN_BYTES + (2 << 20))
    return path


@pytest.fixture(autouse=True)
def _none_left():
    yield
    head_start._abandon()


def _tables(d):
    return {n: pq.read_table(d / f"{n}.parquet") for n in ("events", "gpu_ops", "flows", "devices")}


@needs_native
def test_a_head_start_is_taken_and_reads_the_same_tables(big_trace, tmp_path):
    head_start.begin(["flatten", str(big_trace), "-o", "x", "-j", "2"])
    started = head_start._started
    assert started is not None and started.workers == 2 and len(started.submitted) == in_flight(2)
    first = flatten(big_trace, tmp_path / "a", workers=2)
    assert head_start._started is None, "the flatten of its trace takes it"
    assert not os.path.exists(started.spill_dir)
    second = flatten(big_trace, tmp_path / "b", workers=2)
    assert first.n_events == second.n_events > 0 and first.chunking == second.chunking
    for name, table in _tables(first.out_dir).items():
        assert table.equals(_tables(second.out_dir)[name]), name


@needs_native
def test_other_settings_stop_it_and_another_trace_leaves_it(big_trace, tmp_path):
    head_start.begin(["analyze", str(big_trace)])
    started = head_start._started
    assert started is not None
    assert head_start.take(str(tmp_path / "capture.json"), 1, None, None) is None
    assert head_start._started is started, "a graph capture trace read first leaves it for its own"
    assert head_start.take(str(big_trace), 1, None, None) is None
    assert head_start._started is None and not os.path.exists(started.spill_dir)


@pytest.mark.parametrize(
    "argv",
    [
        ["analyze"],
        ["analyze", "--format", "json", "BIG"],  # an option first: not worth parsing
        ["report", "BIG"],
        ["flatten", "BIG", "-j", "1"],
        ["flatten", "BIG", "-j", "two"],
        ["flatten", "BIG", "--workers"],
        ["flatten", "BIG", "--max-inflate", "10"],
        ["analyze", "BIG", "--help"],
        ["analyze", "SMALL"],
        ["analyze", "GZ"],
        ["analyze", "MISSING"],
    ],
)
def test_no_head_start_where_reading_is_not_in_workers_by_these_settings(argv, big_trace, tmp_path):
    small, gz = tmp_path / "small.json", tmp_path / "big.json.gz"
    small.write_bytes(b'{"traceEvents": []}')
    with open(big_trace, "rb") as f, gzip.open(gz, "wb", compresslevel=1) as out:
        out.write(f.read())
    names = {"BIG": big_trace, "SMALL": small, "GZ": gz, "MISSING": tmp_path / "missing.json"}
    head_start.begin([str(names.get(a, a)) for a in argv])
    assert head_start._started is None


@pytest.mark.parametrize(
    ("args", "workers"),
    [([], None), (["-j", "3"], 3), (["--workers", "2"], 2), (["--workers=4"], 4), (["-j5"], 5), (["-o", "x"], None)],
)
def test_workers_option(args, workers):
    assert head_start._workers_option(args) == workers


@needs_native
def test_a_command_that_fails_before_reading_leaves_nothing_behind(big_trace, tmp_path):
    """A typo in an option: one line, exit 2, and the head start's workers and slot files gone."""
    before = shared_memory_folders()
    p = subprocess.run(
        [sys.executable, "-m", "pipeline", "analyze", str(big_trace), "--no-such-option"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr and "--no-such-option" in p.stderr
    assert not shared_memory_left(before)


_FORK_PROBE = """
import sys
from pipeline.read import head_start
original = head_start.begin
def begin(argv):
    original(argv)
    print("started" if head_start._started is not None else "not started", "polars" in sys.modules, flush=True)
head_start.begin = begin
from pipeline.cli import main
sys.argv = ["tracepipe", *sys.argv[1:]]
main()
"""


@needs_native
@pytest.mark.parametrize("command", ["analyze", "flatten"])
def test_the_workers_fork_before_polars_is_imported(command, big_trace, tmp_path):
    """The reading workers are forked before the command line imports polars: forking is safe
    only while no thread pool of the parent's can hold a lock (`workers.start_pool`), and polars
    starts one when first used; its import (0.12 s) runs beside the reading."""
    out = ["-o", str(tmp_path / ("out.json" if command == "analyze" else "flat"))]
    # flatten reads in two workers whatever the cores; analyze (no -j) as the test above assumes
    more = ["--format", "json", "--section", "devices"] if command == "analyze" else ["-j", "2"]
    args = [command, str(big_trace), *out, *more]
    p = subprocess.run([sys.executable, "-c", _FORK_PROBE, *args], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-500:]
    assert p.stdout.splitlines()[0] == "started False", p.stdout[:200]
