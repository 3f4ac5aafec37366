"""batch + query: a hive-partitioned dataset built incrementally, crash-safely, from many traces."""

from __future__ import annotations

import gzip
import io
import json
import os
import random
import signal
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import duckdb
import polars as pl
import pyarrow.parquet as pq
import pytest

from conftest import PROJECT
from pipeline.dataset import batch as B
from pipeline.dataset import layout
from pipeline.dataset import query as Q
from pipeline.errors import UsageError
from pipeline.schema import TABLES


# ------------------------------------------------------------------ tiny synthetic traces
def tiny_trace(rank: int, steps: int = 2, kernels: int = 2, world: int = 4) -> dict:
    """A small Kineto-shaped trace: per step an annotation, mm ops, launches, kernels and flows."""
    ev, t, corr = [], 1000.0 + rank, 100
    ev.append({"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": f"rank{rank}"}})
    for s in range(steps):
        t0 = t
        for _ in range(kernels):
            corr += 1
            ev.append(
                {
                    "ph": "X",
                    "cat": "cpu_op",
                    "name": "aten::mm",
                    "pid": 1,
                    "tid": 1,
                    "ts": t,
                    "dur": 8.0,
                    "args": {"External id": corr, "Input Dims": [[64, 32], [32, 16]], "Input type": ["float", "float"]},
                }
            )
            ev.append(
                {
                    "ph": "X",
                    "cat": "cuda_runtime",
                    "name": "cudaLaunchKernel",
                    "pid": 1,
                    "tid": 1,
                    "ts": t + 1,
                    "dur": 3.0,
                    "args": {"correlation": corr, "External id": corr},
                }
            )
            ev.append(
                {"ph": "s", "cat": "ac2g", "name": "ac2g", "id": corr, "pid": 1, "tid": 1, "ts": t + 1, "bp": "e"}
            )
            ev.append(
                {
                    "ph": "X",
                    "cat": "kernel",
                    "name": f"gemm_kernel_{rank % 3}",
                    "pid": 0,
                    "tid": 7,
                    "ts": t + 5,
                    "dur": 4.0 + rank,
                    "args": {"device": 0, "stream": 7, "correlation": corr, "grid": [4, 1, 1], "block": [128, 1, 1]},
                }
            )
            ev.append(
                {"ph": "f", "cat": "ac2g", "name": "ac2g", "id": corr, "pid": 0, "tid": 7, "ts": t + 5, "bp": "e"}
            )
            t += 20
        ev.append(
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": f"ProfilerStep#{s}",
                "pid": 1,
                "tid": 1,
                "ts": t0,
                "dur": t - t0 + rank,
            }
        )
        t += 5
    return {
        "schemaVersion": 1,
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world},
        "deviceProperties": [
            {
                "id": 0,
                "name": "NVIDIA A100-SXM4-80GB",
                "totalGlobalMem": 85031714816,
                "computeMajor": 8,
                "computeMinor": 0,
                "numSms": 108,
                "warpSize": 32,
            }
        ],
        "traceEvents": ev,
        "traceName": f"rank{rank}",
    }


def n_kernels(d: dict) -> int:
    return sum(1 for e in d["traceEvents"] if e.get("cat") == "kernel")


def write(path: Path, d: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = json.dumps(d).encode()
    path.write_bytes(gzip.compress(raw, mtime=0) if path.name.endswith(".gz") else raw)
    return path


def make_src(root: Path, n: int = 3, first_rank: int = 0, **kw) -> dict:
    """n good traces under root (nested, .json, .json.gz, .pt.trace.json); returns {path: trace}."""
    names = ["a.json", "sub/b.json.gz", "sub/deeper/c.pt.trace.json"]
    out = {}
    for i in range(n):
        name = names[i] if i < len(names) else f"more/r{i}.json.gz"
        d = tiny_trace(first_rank + i, **kw)
        out[write(root / name, d)] = d
    return out


def batch(*args, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "pipeline", "batch", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=PROJECT,
        stdin=subprocess.DEVNULL,
    )


def query(*args):
    return subprocess.run(
        [sys.executable, "-m", "pipeline", "query", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=PROJECT,
        stdin=subprocess.DEVNULL,
    )


def duck(ds: Path, table: str, what: str = "count(*)"):
    return duckdb.sql(
        f"select {what} from read_parquet('{ds}/{table}/**/*.parquet', hive_partitioning=true)"
    ).fetchall()


def manifest(ds: Path) -> list[dict]:
    return pl.scan_parquet(ds / "traces" / "**" / "*.parquet", hive_partitioning=True).collect().to_dicts()


def assert_consistent(ds: Path, want: dict[str, int] | None = None):
    """Every partition has a manifest row (no orphans), no staging, each trace's rows once."""
    ids = layout.committed_ids(ds)
    for t in TABLES:
        parts = {p.name.split("=", 1)[1] for p in (ds / t).glob("trace_id=*")} if (ds / t).is_dir() else set()
        assert parts <= ids, f"orphan partitions in {t}: {parts - ids}"
    assert not (ds / "_staging").exists()
    rows = {r["trace_id"]: r for r in manifest(ds)}
    assert set(rows) == ids
    got = (
        dict(
            duckdb.sql(
                f"select trace_id, count(*) from read_parquet('{ds}/events/**/*.parquet', "
                "hive_partitioning=true) group by trace_id"
            ).fetchall()
        )
        if ids
        else {}
    )
    for tid, r in rows.items():
        if r["status"] != "quarantined":
            assert got.get(tid) == r["n_events"], tid
    if want is not None:
        assert sorted(r["n_events"] for r in rows.values() if r["status"] == "ok") == sorted(want.values())


def group_alive(pgid: int) -> bool:
    """Whether any live (non-zombie) process is left in process group `pgid`."""
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                f = open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(f[2]) == pgid and f[0] != "Z":
                return True
    return False


def snapshot(ds: Path) -> dict:
    return {
        str(p.relative_to(ds)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in ds.rglob("*")
        if p.is_file() and p.name != ".lock"
    }


# ------------------------------------------------------------------ the dataset
@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A dataset from 3 good traces and 2 bad files, built once by the CLI."""
    root = tmp_path_factory.mktemp("batch")
    src = root / "src"
    traces = make_src(src)
    (src / "garbage.json.gz").write_bytes(random.Random(3).randbytes(1024))
    (src / "notatrace.json").write_text('{"a": 1}')
    (src / "README.md").write_text("not an input")
    ds = root / "ds"
    p = batch(src, "-o", ds, "-j", "2")
    return src, ds, traces, p


def test_batch_quarantines_bad_files_and_keeps_good_rows(built):
    src, ds, traces, p = built
    assert p.returncode == 1, p.stderr
    assert "Traceback" not in p.stderr
    bad = [line for line in p.stderr.splitlines() if "quarantined" in line]
    assert len(bad) == 2 and any("garbage.json.gz" in x for x in bad) and any("notatrace.json" in x for x in bad)
    rows = {Path(r["path"]).name: r for r in manifest(ds)}
    assert {r["status"] for n, r in rows.items() if n in ("garbage.json.gz", "notatrace.json")} == {"quarantined"}
    assert all(rows[n]["error"] for n in ("garbage.json.gz", "notatrace.json"))
    good = [r for r in rows.values() if r["status"] == "ok"]
    assert len(good) == 3
    for r in good:
        assert r["content_hash"] and len(r["content_hash"]) == 64 and r["trace_id"] == "t" + r["content_hash"][:16]
        assert r["size"] == os.path.getsize(r["path"])
        assert r["trace_start_ns"] < r["trace_end_ns"] and r["started_at"] <= r["finished_at"]
    assert_consistent(ds)


def test_duckdb_polars_and_query_agree(built):
    _, ds, traces, _ = built
    want_ev = sum(len(d["traceEvents"]) for d in traces.values())
    want_k = sum(n_kernels(d) for d in traces.values())
    assert duck(ds, "events") == [(want_ev,)]
    assert duck(ds, "gpu_ops") == [(want_k,)]
    assert duck(ds, "events", "typeof(trace_id)")[0] == ("VARCHAR",)
    lf = pl.scan_parquet(ds / "events" / "**" / "*.parquet", hive_partitioning=True)
    assert lf.select(pl.len()).collect().item() == want_ev
    assert lf.collect_schema()["trace_id"] == pl.String
    # the data files carry no trace_id column: the partition path is its only source, no clash
    for t in TABLES:
        f = next((ds / t).glob("trace_id=*/part-0.parquet"))
        assert "trace_id" not in pq.read_schema(f).names
    q = query(ds, "select count(*) as n from gpu_ops", "--format", "json")
    assert q.returncode == 0, q.stderr
    assert json.loads(q.stdout) == [{"n": want_k}]
    q = query(ds, "select trace_id, count(*) as n from events group by trace_id order by trace_id", "-f", "json")
    per = {r["trace_id"]: r["n"] for r in json.loads(q.stdout)}
    assert per == {r["trace_id"]: r["n_events"] for r in manifest(ds) if r["status"] == "ok"}
    # joins across tables on trace_id; the trace table knows the input's path and rank
    df = Q.run(
        ds,
        "select t.rank, count(*) as k from gpu_ops g join trace t on g.trace_id = t.trace_id "
        "group by t.rank order by t.rank",
    )
    assert df["rank"].to_list() == [0, 1, 2] and df["k"].sum() == want_k


def test_query_formats_examples_and_errors(built, tmp_path, capsys):
    _, ds, traces, _ = built
    q = query(ds, "select name, count(*) as n from gpu_ops group by name order by name", "--format", "csv")
    assert q.returncode == 0 and q.stdout.splitlines()[0] == "name,n"
    q = query("--list-examples")
    assert q.returncode == 0 and all(name in q.stdout for name in Q.EXAMPLES)
    q = query(ds, "--example", "top_kernels", "--format", "json")
    assert q.returncode == 0 and sum(r["launches"] for r in json.loads(q.stdout)) == sum(
        map(n_kernels, traces.values())
    )
    for bad in ([ds, "select nope from events"], [ds / "missing", "select 1"], [ds, "--example", "nope"]):
        q = query(*bad)
        assert q.returncode == 2, (bad, q.stdout, q.stderr)
        assert "Traceback" not in q.stderr and len(q.stderr.strip().splitlines()) == 1
    # the same in-process: formats, every example, errors
    out = tmp_path / "r.parquet"
    Q.write(Q.run(ds, "select * from traces"), "parquet", out)
    assert pq.read_table(out).num_rows == 5
    Q.write(Q.run(ds, "select status, count(*) as n from traces group by status order by status"), "table")
    assert "quarantined" in capsys.readouterr().out
    for name in Q.EXAMPLES:  # these traces hold no collective: test_runs runs those examples
        assert Q.run(ds, Q.example(name)).height or name in ("stragglers", "collective_bandwidth"), name
    steps = Q.run(ds, Q.example("slowest_rank_per_step"))  # 3 folders: 3 runs of one rank
    assert steps.height == 6 and set(steps["ranks"]) == {1}
    with pytest.raises(UsageError):
        Q.run(ds, "selec")
    with pytest.raises(UsageError):
        Q.write(pl.DataFrame({"a": [1]}), "xml")
    with pytest.raises(UsageError):
        Q.write(pl.DataFrame({"a": [1]}), "parquet")


def test_query_a_single_flattened_trace(tmp_path):
    from pipeline.flatten import flatten

    d = tiny_trace(5)
    r = flatten(write(tmp_path / "one.json", d), tmp_path / "flat")
    df = Q.run(r.out_dir, "select trace_id, count(*) as n from events group by trace_id")
    assert df["n"].to_list() == [len(d["traceEvents"])] and df["trace_id"][0]
    assert Q.run(r.out_dir, Q.example("top_kernels"))["launches"].sum() == n_kernels(d)


def test_rerun_is_incremental_and_detects_changed_content(built, tmp_path):
    src, ds, traces, _ = built
    before = snapshot(ds)
    t0 = time.monotonic()
    p = batch(src, "-o", ds)
    assert time.monotonic() - t0 < 30
    assert p.returncode == 1  # the bad files are still there: reported again, not re-read
    assert "3 already present" in p.stdout and "0 traces added" in p.stdout
    assert snapshot(ds) == before
    # a copy elsewhere is the same content: nothing new; a file rewritten with new content is new
    import shutil

    ds2, src2 = tmp_path / "ds2", tmp_path / "src2"
    shutil.copytree(ds, ds2)
    shutil.copytree(src, src2)
    write(src2 / "a.json", tiny_trace(9))
    r = B.run_batch(src2, ds2, jobs=1)
    assert (r.added, r.skipped, r.quarantined) == (1, 2, 2)
    assert len(layout.committed_ids(ds2)) == 6
    assert_consistent(ds2)


def test_same_content_twice_is_one_trace(tmp_path):
    d = tiny_trace(1)
    write(tmp_path / "src" / "x.json", d)
    write(tmp_path / "src" / "y" / "x_copy.json", d)
    r = B.run_batch(tmp_path / "src", tmp_path / "ds", jobs=2)
    assert (r.added, r.duplicates, r.exit_code) == (1, 1, 0)
    assert duck(tmp_path / "ds", "events") == [(len(d["traceEvents"]),)]


def test_slowest_rank_example_compares_the_ranks_of_a_run(tmp_path):
    for r in range(3):
        write(tmp_path / "run" / f"rank{r}.json", tiny_trace(r))  # rank r's steps last r µs longer
    B.run_batch(tmp_path / "run", tmp_path / "ds", jobs=1)
    steps = Q.run(tmp_path / "ds", Q.example("slowest_rank_per_step"))
    assert steps["step"].to_list() == ["ProfilerStep#0", "ProfilerStep#1"]
    assert set(steps["slowest_rank"]) == {2} and set(steps["ranks"]) == {3}
    assert (steps["slowest_us"] - steps["fastest_us"]).to_list() == [pytest.approx(2.0)] * 2


# ------------------------------------------------------------------ crashes
def test_kill_9_mid_run_then_resume(tmp_path):
    src, ds = tmp_path / "src", tmp_path / "ds"
    traces = {}
    for i in range(20):
        d = tiny_trace(i, steps=40, kernels=10)
        traces[write(src / f"rank{i:02d}.json", d)] = d
    want = {str(p): len(d["traceEvents"]) for p, d in traces.items()}
    p = subprocess.Popen(
        [sys.executable, "-m", "pipeline", "batch", str(src), "-o", str(ds), "-j", "2"],
        cwd=PROJECT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and p.poll() is None and len(layout.committed_ids(ds) if ds.exists() else ()) < 3:
        time.sleep(0.005)
    os.kill(p.pid, signal.SIGKILL)  # kill -9 of the driver: its workers notice and exit by themselves
    p.wait()
    deadline = time.monotonic() + 20
    while group_alive(p.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = group_alive(p.pid)
    if left:
        os.killpg(p.pid, signal.SIGKILL)
    assert not left, "worker processes outlived the killed driver"
    n_before = len(layout.committed_ids(ds))
    assert n_before < 20, "the run finished before it could be killed: make the traces bigger"
    r = batch(src, "-o", ds, "-j", "2")
    assert r.returncode == 0, r.stderr
    assert f"{n_before} already present" in r.stdout
    assert_consistent(ds, want)
    assert duck(ds, "events") == [(sum(want.values()),)]


@pytest.mark.parametrize("crash_after", [1, 3, 5, 6])
def test_crash_at_each_step_of_a_commit_leaves_no_orphans(tmp_path, monkeypatch, crash_after):
    """Die after the n-th rename of a commit (5 table partitions, then the manifest row)."""
    traces = make_src(tmp_path / "src", n=2)
    real, calls = os.rename, []

    def rename(a, b):
        calls.append(b)
        if len(calls) == crash_after:
            raise KeyboardInterrupt("simulated kill")
        return real(a, b)

    monkeypatch.setattr(B.os, "rename", rename)
    with pytest.raises(KeyboardInterrupt):
        B.run_batch(tmp_path / "src", tmp_path / "ds", jobs=1)
    monkeypatch.setattr(B.os, "rename", real)
    ds = tmp_path / "ds"
    (ds / "_staging" / "leftover").mkdir(parents=True, exist_ok=True)  # as if the process had died
    r = B.run_batch(tmp_path / "src", ds, jobs=1)
    assert r.exit_code == 0 and r.added + r.skipped == 2
    assert_consistent(ds, {str(p): len(d["traceEvents"]) for p, d in traces.items()})


# ------------------------------------------------------------------ archives and lists
def test_hostile_tar_cannot_write_outside_the_output(tmp_path):
    good = json.dumps(tiny_trace(1)).encode()
    outside = tmp_path / "outside"
    outside.mkdir()
    evil = tmp_path / "evil.tar.gz"
    with tarfile.open(evil, "w:gz") as tf:

        def add(name, data=good, **kw):
            info = tarfile.TarInfo(name)
            for k, v in kw.items():
                setattr(info, k, v)
            info.size = len(data) if info.type == tarfile.REGTYPE else 0
            tf.addfile(info, io.BytesIO(data) if info.type == tarfile.REGTYPE else None)

        add("../../escaped.json")
        add(str(outside / "absolute.json"))
        add("link.json", type=tarfile.SYMTYPE, linkname=str(outside / "target.json"))
        add("hard.json", type=tarfile.LNKTYPE, linkname="../../etc/passwd")
        add("dev.json", type=tarfile.CHRTYPE)
        add("ok/good.json")
    work = tmp_path / "cwd"
    work.mkdir()
    ds = tmp_path / "out" / "ds"
    p = subprocess.run(
        [sys.executable, "-m", "pipeline", "batch", str(evil), "-o", str(ds)],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TMPDIR": str(work)},
    )
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert len([x for x in p.stderr.splitlines() if "quarantined" in x]) == 5
    everything = {f for f in tmp_path.rglob("*") if f.is_file() or f.is_symlink()}
    strays = [f for f in everything if not str(f).startswith(str(ds) + os.sep) and f != evil]
    assert strays == [], strays
    rows = {r["path"].split("!", 1)[1]: r for r in manifest(ds)}
    assert rows["ok/good.json"]["status"] == "ok"
    assert {r["status"] for k, r in rows.items() if k != "ok/good.json"} == {"quarantined"}
    assert "'..'" in rows["../../escaped.json"]["error"] and "link" in rows["link.json"]["error"]
    assert_consistent(ds)


def test_zip_and_list_file(tmp_path):
    a, b = tiny_trace(1), tiny_trace(2)
    z = tmp_path / "traces.zip"
    with zipfile.ZipFile(z, "w") as zf:
        zf.writestr("run/a.json", json.dumps(a))
        zf.writestr("run/b.json.gz", gzip.compress(json.dumps(b).encode()))
        zf.writestr("run/notes.txt", "ignored")
        link = zipfile.ZipInfo("run/link.json")
        link.external_attr = 0o120777 << 16  # a symlink entry
        zf.writestr(link, "/etc/passwd")
    p = batch(z, "-o", tmp_path / "ds")
    assert p.returncode == 1 and "link.json: quarantined" in p.stderr, p.stderr
    rows = {r["path"]: r["status"] for r in manifest(tmp_path / "ds")}
    assert rows == {f"{z}!run/a.json": "ok", f"{z}!run/b.json.gz": "ok", f"{z}!run/link.json": "quarantined"}
    assert duck(tmp_path / "ds", "events") == [(len(a["traceEvents"]) + len(b["traceEvents"]),)]
    # a list of paths: relative ones resolve against the list's folder; a missing one is reported
    write(tmp_path / "l" / "c.json", tiny_trace(3))
    listing = tmp_path / "l" / "list.txt"
    listing.write_text(f"# traces\nc.json\n\n{tmp_path / 'l' / 'gone.json'}\n")
    p = batch(listing, "-o", tmp_path / "ds")
    assert p.returncode == 1 and "gone.json" in p.stderr and "1 traces added" in p.stdout
    assert len(layout.committed_ids(tmp_path / "ds")) == 4


def test_truncated_trace_is_kept_and_reported(tmp_path):
    raw = json.dumps(tiny_trace(1, steps=6)).encode()
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "cut.json").write_bytes(raw[: int(len(raw) * 0.6)])
    r = B.run_batch(tmp_path / "src", tmp_path / "ds", jobs=1)
    assert (r.added, r.truncated, r.exit_code) == (1, 1, 1)
    row = manifest(tmp_path / "ds")[0]
    assert row["status"] == "truncated" and row["n_events"] > 0 and row["error"]


def test_bad_usage_exits_2(tmp_path):
    for args in (
        [tmp_path / "nope", "-o", tmp_path / "ds"],
        [tmp_path, "-o", tmp_path / "ds", "-j", "0"],
        [tmp_path, "-o", tmp_path / "ds", "--engine", "spark"],
    ):
        p = batch(*args)
        assert p.returncode == 2 and "Traceback" not in p.stderr, (args, p.stderr)


def test_missing_engine_is_one_clear_line(tmp_path):
    make_src(tmp_path / "src", n=1)
    code = (
        "import sys; sys.modules['ray'] = None; from pipeline.cli import main; "
        f"sys.argv = ['tracepipe', 'batch', {str(tmp_path / 'src')!r}, '-o', {str(tmp_path / 'ds')!r}, "
        "'--engine', 'ray']; main()"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=PROJECT)
    assert p.returncode == 2 and "pip install" in p.stderr and len(p.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("engine, module", [("dask", "dask.distributed"), ("ray", "ray")])
def test_distributed_engine_local_mode(tmp_path, engine, module):
    pytest.importorskip(module)
    traces = make_src(tmp_path / "src", n=3)
    r = B.run_batch(tmp_path / "src", tmp_path / "ds", jobs=2, engine=engine)
    assert (r.added, r.exit_code) == (3, 0)
    assert_consistent(tmp_path / "ds", {str(p): len(d["traceEvents"]) for p, d in traces.items()})


# ------------------------------------------------------------------ real traces
@pytest.mark.real
def test_real_traces_batch_and_rerun(shared_traces, tmp_path):
    picks = ["hta/triton_example", "hta/mi250_rocm62_minitoy", "hta/cpu_only", "tracelens/h100_qwen1.5_0.5b"]
    listing = tmp_path / "list.txt"
    listing.write_text("".join(f"{shared_traces / p}.json.gz\n" for p in picks))
    want = {}
    for p in picks:
        with gzip.open(f"{shared_traces / p}.json.gz") as f:
            want[p] = len(json.load(f)["traceEvents"])
    ds = tmp_path / "ds"
    p = batch(listing, "-o", ds, "-j", "2")
    assert p.returncode == 0, p.stderr
    assert duck(ds, "events") == [(sum(want.values()),)]
    assert Q.run(ds, "select count(*) as n from events")["n"][0] == sum(want.values())
    assert_consistent(ds)
    before = snapshot(ds)
    p = batch(listing, "-o", ds)
    assert p.returncode == 0 and f"{len(picks)} already present" in p.stdout and snapshot(ds) == before


def test_time_by_category_example_uses_kernel_categories(tmp_path):
    """The example answers by kernel category (gemm, elementwise, ...), and its shares add to 100 per run."""
    make_src(tmp_path / "src", n=2)
    B.run_batch(tmp_path / "src", tmp_path / "ds", jobs=1)
    import polars as pl

    from pipeline.cost.categories import CATEGORIES, OTHER
    from pipeline.dataset import query as Q

    df = Q.run(tmp_path / "ds", Q.example("time_by_category"))
    assert df.height > 0 and set(df["category"]) <= {c.name for c in CATEGORIES} | {OTHER}
    for total in df.group_by("run").agg(pl.col("pct").sum())["pct"]:
        assert abs(total - 100.0) < 1e-6
