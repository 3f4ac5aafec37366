"""`tracepipe flatten` through the CLI (subprocesses): exit codes, one-line errors, atomic output,
and the real traces in ../shared/traces checked against an independent json.load."""

from __future__ import annotations

import gzip
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import pipeline
from conftest import PROJECT, run_cli
from pipeline import synthetic as synth
from pipeline.schema import TABLES

GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset", "mtia_ccp_events"}


def parquets(root: Path) -> list[Path]:
    return sorted(root.rglob("*.parquet")) if root.exists() else []


def rows(d: Path, name: str) -> int:
    return pq.read_metadata(d / f"{name}.parquet").num_rows


def test_version():
    cp = run_cli(["--version"])
    assert cp.returncode == 0
    assert cp.stdout.strip() == f"tracepipe {pipeline.__version__}"


@pytest.mark.parametrize("given, backend", [(None, "system"), ("mimalloc", "mimalloc")])
def test_the_command_allocates_arrow_memory_from_the_c_library(given, backend):
    """The `tracepipe` process has Arrow's C++ code allocate from the C library's heap, not from
    mimalloc, which kept ~40 MB of freed pages through a read; a choice the user made stands."""
    code = (
        "import sys\n"
        "from pipeline.cli import main\n"
        "assert 'pyarrow' not in sys.modules\n"
        "import pipeline.cli.entry as e\n"
        "e.run = lambda argv=None: print(__import__('pyarrow').default_memory_pool().backend_name) or 0\n"
        "sys.argv = ['tracepipe', '--version']\n"
        "main()\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    if given:
        env["ARROW_DEFAULT_MEMORY_POOL"] = given
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=PROJECT, env=env, timeout=60)
    assert p.returncode == 0 and p.stdout.split() == [backend], p.stderr


def test_good_trace_exit_0(tmp_path):
    t = synth.make_trace(n_steps=3, gpu_devices=(0, 1))
    p = synth.write_trace(t, tmp_path / "good.json.gz", gz=True, indent=2)
    cp = run_cli(["flatten", "--no-link", p, "-o", tmp_path / "out"])
    assert cp.returncode == 0, cp.stderr
    assert cp.stderr == ""
    d = tmp_path / "out" / "good"
    assert sorted(x.name for x in d.iterdir()) == sorted(f"{n}.parquet" for n in TABLES)
    assert rows(d, "events") == len(t["traceEvents"])
    assert rows(d, "gpu_ops") == len(synth.gpu_events(t))
    assert f"{len(t['traceEvents'])} events" in cp.stdout
    # -q: nothing on stdout
    cp = run_cli(["flatten", "--no-link", "-q", p, "-o", tmp_path / "out"])
    assert cp.returncode == 0 and cp.stdout == "" and cp.stderr == ""


# ------------------------------------------------------------------ truncated input
@pytest.fixture(scope="module")
def trace_text() -> bytes:
    return synth.dumps_trace(synth.make_trace(n_steps=4, ops_per_step=4, tricky=True), indent=2)


FRACS = (0.07, 0.33, 0.5, 0.81, 0.999)


def test_truncated_exit_1_salvages_every_complete_event(tmp_path, trace_text):
    paths = []
    for k, frac in enumerate(FRACS):
        p = tmp_path / f"cut{k}.json"
        p.write_bytes(trace_text[: int(len(trace_text) * frac)])
        paths.append(p)
    # one at a time for the exit code, then all at once (one CLI start) for the rest
    cp = run_cli(["flatten", "--no-link", paths[2], "-o", tmp_path / "one"])
    assert cp.returncode == 1, cp.stderr
    assert "truncated" in cp.stderr and "Traceback" not in cp.stderr
    cp = run_cli(["flatten", "--no-link", *paths, "-o", tmp_path / "out"])
    assert cp.returncode == 1, cp.stderr
    assert "Traceback" not in cp.stderr
    lines = cp.stderr.strip().splitlines()
    assert len(lines) == len(paths)
    for p, line in zip(paths, lines):
        assert str(p) in line and "truncated" in line
        want = synth.complete_events(p.read_bytes().decode())
        ev = pq.read_table(tmp_path / "out" / p.stem / "events.parquet")
        assert ev.num_rows == len(want) > 0, p.name
        assert ev.column("name").to_pylist() == [e.get("name") for e in want]
        tr = pq.read_table(tmp_path / "out" / p.stem / "trace.parquet").to_pylist()[0]
        assert tr["truncated"] is True and tr["n_events"] == len(want)


def test_truncated_gzip_exit_1(tmp_path, trace_text):
    comp = gzip.compress(trace_text)
    p = tmp_path / "cutgz.json.gz"
    p.write_bytes(comp[: len(comp) * 3 // 4])
    cp = run_cli(["flatten", "--no-link", p, "-o", tmp_path / "out"])
    assert cp.returncode == 1, cp.stderr
    assert "truncated" in cp.stderr and "Traceback" not in cp.stderr
    n = rows(tmp_path / "out" / "cutgz", "events")
    full = json.loads(trace_text)["traceEvents"]
    assert 0 < n < len(full)
    names = pq.read_table(tmp_path / "out" / "cutgz" / "events.parquet").column("name").to_pylist()
    assert names == [e.get("name") for e in full[:n]]


# ------------------------------------------------------------------ bad input: exit 2, one line, nothing written
def _bad_inputs() -> dict[str, bytes]:
    good = synth.dumps_trace(synth.make_trace(n_steps=1))
    gz = gzip.compress(good)
    return {
        "corrupt.json.gz": gz[:10] + bytes(random.Random(7).randrange(256) for _ in range(3000)),
        "emptygz.json.gz": gzip.compress(b""),
        "empty.json": b"",
        "blank.json": b"  \n\t ",
        "random.json.gz": bytes(random.Random(1).randrange(256) for _ in range(4096)),
        "random.json": bytes(random.Random(2).randrange(256) for _ in range(4096)),
        "notatrace.json": b'{"hello": [1, 2, 3]}',
        "scalar.json": b"42",
        "eventsdict.json": b'{"schemaVersion": 1, "traceEvents": {"ph": "X"}}',
        "eventsstring.json": b'{"traceEvents": "[]"}',
        "eventsnull.json": b'{"traceEvents": null, "x": 1}',
        "badheader.json": b'{"schemaVersion": 1, "x": [1, 2,, 3], "traceEvents": [{"ph": "X"}]}',
    }


BAD = _bad_inputs()


def _check_bad(cp, names, out):
    assert cp.returncode == 2, (cp.returncode, cp.stderr)
    assert "Traceback" not in cp.stderr + cp.stdout
    assert cp.stdout == ""
    lines = cp.stderr.strip().splitlines()
    assert len(lines) == len(names), cp.stderr  # exactly one line per bad file
    for name, line in zip(names, lines):
        assert line.startswith("tracepipe: ") and name in line, line
    assert parquets(out) == []
    assert not out.exists() or [x for x in out.rglob("*") if x.is_file()] == []


@pytest.mark.parametrize("name", ["corrupt.json.gz", "empty.json", "notatrace.json", "eventsdict.json"])
def test_bad_input_exit_2_one_line_nothing_written(tmp_path, name):
    p = tmp_path / name
    p.write_bytes(BAD[name])
    out = tmp_path / "out"
    _check_bad(run_cli(["flatten", "--no-link", p, "-o", out]), [name], out)


def test_every_bad_input_exit_2_one_line_each(tmp_path):
    names = sorted(BAD)
    for name in names:
        (tmp_path / name).write_bytes(BAD[name])
    out = tmp_path / "out"
    _check_bad(run_cli(["flatten", "--no-link", *[tmp_path / n for n in names], "-o", out]), names, out)


def test_missing_file_exit_2(tmp_path):
    cp = run_cli(["flatten", "--no-link", tmp_path / "nope.json", "-o", tmp_path / "out"])
    assert cp.returncode == 2
    assert len(cp.stderr.strip().splitlines()) == 1 and "Traceback" not in cp.stderr
    assert parquets(tmp_path / "out") == []


def test_several_traces_worst_exit_code_wins(tmp_path):
    good = synth.write_trace(synth.make_trace(n_steps=1), tmp_path / "a.json")
    bad = tmp_path / "b.json"
    bad.write_bytes(b'{"no": "trace"}')
    cp = run_cli(["flatten", "--no-link", good, bad, "-o", tmp_path / "out"])
    assert cp.returncode == 2
    assert len(cp.stderr.strip().splitlines()) == 1 and "b.json" in cp.stderr
    assert rows(tmp_path / "out" / "a", "events") > 0
    assert not (tmp_path / "out" / "b").exists()


# ------------------------------------------------------------------ atomic output
def _snapshot(d: Path) -> dict:
    return {
        f.name: pq.read_table(f).drop_columns(["flattened_at"]) if f.name == "trace.parquet" else pq.read_table(f)
        for f in sorted(d.glob("*.parquet"))
    }


def test_failure_keeps_the_previous_good_output(tmp_path):
    t = synth.make_trace(n_steps=2)
    good = synth.write_trace(t, tmp_path / "x.json")
    out = tmp_path / "out"
    cp = run_cli(["flatten", "--no-link", good, "-o", out])
    assert cp.returncode == 0, cp.stderr
    before = _snapshot(out / "x")
    assert len(before) == len(TABLES)
    for data in (b'{"traceEvents": 5}', gzip.compress(b"")[:12] + b"garbage" * 100):
        bad_dir = tmp_path / "bad"
        bad_dir.mkdir(exist_ok=True)
        bad = bad_dir / "x.json.gz"  # same stem "x"
        bad.write_bytes(data)
        cp = run_cli(["flatten", "--no-link", bad, "-o", out])
        assert cp.returncode == 2, cp.stderr
        after = _snapshot(out / "x")
        assert after.keys() == before.keys()
        assert all(after[k].equals(before[k]) for k in before)
    assert sorted(p.name for p in out.iterdir()) == ["x"]  # no temporary directories left behind


def test_interrupt_mid_write_keeps_the_previous_output(tmp_path):
    """SIGINT while a big trace is being written: OUT/<stem> keeps the old tables, no temp dir."""
    out = tmp_path / "out"
    small = synth.write_trace(synth.make_trace(n_steps=1), tmp_path / "big.json")
    assert run_cli(["flatten", "--no-link", small, "-o", out]).returncode == 0
    before = _snapshot(out / "big")
    big_dir = tmp_path / "src"
    big_dir.mkdir()
    big = big_dir / "big.json"
    synth.write_big_trace(big, 24 << 20)
    env = {k: v for k, v in os.environ.items() if k != "TRACEPIPE_DEBUG"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline", "flatten", "--no-link", "-j", "1", str(big), "-o", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=PROJECT,
    )
    deadline = time.monotonic() + 60
    tmp_seen = False
    while time.monotonic() < deadline and proc.poll() is None:
        if any(p.name.startswith(".big.tmp-") and any(p.glob("*.parquet")) for p in out.iterdir()):
            tmp_seen = True
            time.sleep(0.1)
            proc.send_signal(signal.SIGINT)
            break
        time.sleep(0.02)
    _, err = proc.communicate(timeout=120)
    if not tmp_seen or proc.returncode == 0:
        pytest.skip("the flatten finished before it could be interrupted")
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    after = _snapshot(out / "big")
    assert all(after[k].equals(before[k]) for k in before)
    assert sorted(p.name for p in out.iterdir()) == ["big"]


# ------------------------------------------------------------------ the real traces
def _independent_truth(path: Path):
    with gzip.open(path, "rt") as f:
        d = json.load(f)
    d = d if isinstance(d, dict) else {"traceEvents": d}
    ev = d["traceEvents"]
    # device activity: a GPU cat, or (torch_npu) a complete event of the `Ascend Hardware` process
    npu = {
        e.get("pid")
        for e in ev
        if isinstance(e, dict) and e.get("ph") == "M" and e.get("args") == {"name": "Ascend Hardware"}
    }
    gpu = [
        e
        for e in ev
        if isinstance(e, dict) and e.get("ph") == "X" and (e.get("cat") in GPU_CATS or e.get("pid") in npu)
    ]
    dur = sum(round(float(e.get("dur", 0)) * 1000) for e in gpu)
    return d, ev, gpu, dur


def _secrets(obj, out=None):
    """Values of secret-looking keys anywhere in a trace's metadata (as the acceptance check finds them)."""
    out = [] if out is None else out
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k != "traceEvents":
                if (
                    isinstance(v, str)
                    and len(v) >= 8
                    and any(w in str(k).upper() for w in ("TOKEN", "SECRET", "PASSWORD", "API_KEY"))
                ):
                    out.append(v)
                _secrets(v, out)
    elif isinstance(obj, list):
        for v in obj:
            _secrets(v, out)
    return out


@pytest.mark.real
def test_real_traces(shared_traces, tmp_path):
    traces = sorted(shared_traces.glob("*/*.json.gz"))
    out = tmp_path / "out"
    cp = run_cli(["flatten", "--no-link", *traces, "-o", out], timeout=600)
    assert cp.returncode == 0, cp.stderr
    assert "Traceback" not in cp.stderr
    bad = []
    for t in traces:
        d, ev, gpu, want_dur = _independent_truth(t)
        fd = out / t.name[: -len(".json.gz")]
        e = pq.read_table(fd / "events.parquet", columns=["event_idx", "name"])
        g = pq.read_table(fd / "gpu_ops.parquet", columns=["dur_ns"])
        errs = []
        if e.num_rows != len(ev):
            errs.append(f"events {e.num_rows} != {len(ev)}")
        elif e.column("event_idx").to_pylist() != list(range(len(ev))):
            errs.append("event_idx is not the position")
        elif e.column("name").to_pylist() != [x.get("name") if isinstance(x, dict) else None for x in ev]:
            errs.append("names differ")
        if g.num_rows != len(gpu):
            errs.append(f"gpu_ops {g.num_rows} != {len(gpu)}")
        got_dur = sum(x or 0 for x in g.column("dur_ns").to_pylist())
        if got_dur != want_dur:
            errs.append(f"gpu dur_ns {got_dur} != {want_dur}")
        n_props = len(d.get("deviceProperties", []))
        n_ids = len({x.get("args", {}).get("device") for x in gpu})
        n_dev = rows(fd, "devices")
        if not n_props <= n_dev <= n_props + n_ids:
            errs.append(f"devices {n_dev} for {n_props} deviceProperties")
        tr = pq.read_table(fd / "trace.parquet").to_pylist()
        if len(tr) != 1 or tr[0]["n_events"] != len(ev) or tr[0]["truncated"]:
            errs.append("trace row")
        dumped = json.dumps(tr, default=str) + cp.stdout + cp.stderr
        if any(s in dumped for s in _secrets(d)):
            errs.append("a secret from the metadata is in trace.parquet or the output")
        if errs:
            bad.append(f"{t.parent.name}/{t.name}: " + ", ".join(errs))
    assert not bad, "\n".join(bad)


@pytest.mark.real
def test_real_trace_truncated(shared_traces, tmp_path):
    src = shared_traces / "hta" / "a100_nccl.json.gz"
    if not src.exists():
        pytest.skip("hta/a100_nccl.json.gz not in shared/traces")
    raw = gzip.open(src, "rb").read()
    cut = raw[: int(len(raw) * 0.6)]
    p = tmp_path / "truncated.json"
    p.write_bytes(cut)
    cp = run_cli(["flatten", "--no-link", p, "-o", tmp_path / "out"])
    assert cp.returncode == 1, cp.stderr
    assert "truncat" in cp.stderr.lower() and "Traceback" not in cp.stderr
    assert rows(tmp_path / "out" / "truncated", "events") == len(synth.complete_events(cut.decode("utf-8", "ignore")))


# ------------------------------------------------------------------ leaving the process
def test_the_process_leaves_with_its_code_its_output_and_no_scratch(tmp_path):
    """`tracepipe` ends with `os._exit` (`cli.leave`), skipping the interpreter's teardown: the
    exit code, all of a long stdout, atexit's work and the temporary directories that atexit
    removes must all survive that."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    t = synth.make_trace(n_steps=3, gpu_devices=(0,))
    p = synth.write_trace(t, tmp_path / "t.json", gz=False)
    cp = run_cli(["analyze", p, "--format", "json"], env={"TMPDIR": str(scratch)})
    assert cp.returncode == 0, cp.stderr
    assert json.loads(cp.stdout)  # the whole document, flushed
    assert list(scratch.iterdir()) == []  # the scratch flatten is gone
    cp = run_cli(["analyze", tmp_path / "missing.json"])
    assert cp.returncode == 2 and cp.stderr.count("\n") == 1
    code = (
        "import atexit, sys; from pipeline.cli import main; "
        "atexit.register(lambda: print('atexit ran')); sys.argv = ['tracepipe', '--version']; main()"
    )
    buffered = {k: v for k, v in os.environ.items() if k not in ("PYTHONUNBUFFERED", "TRACEPIPE_DEBUG")}
    cp = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=PROJECT, env=buffered
    )
    assert cp.returncode == 0 and cp.stdout.splitlines() == [f"tracepipe {pipeline.__version__}", "atexit ran"]
