"""batch + query: a dataset of few large part files, built incrementally and crash-safely from
many traces, read by every Parquet reader and by tracepipe's (which read only committed parts)."""

from __future__ import annotations

import contextlib
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
import types
import zipfile
from pathlib import Path

import duckdb
import polars as pl
import pyarrow as pa
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
    return layout.manifest(ds).drop(layout.MANIFEST_FILE).to_dicts()


def table_counts(ds: Path, table: str, glob: bool = False) -> dict[str, int]:
    """Rows per trace_id of a table: as tracepipe reads it (committed parts only), or (`glob`) as a
    plain Parquet reader reads every file of the table's folder."""
    if glob:
        if not any((ds / table).glob("*.parquet")):
            return {}
        return dict(
            duckdb.sql(
                f"select trace_id, count(*) from read_parquet('{ds}/{table}/**/*.parquet', hive_partitioning=true) "
                "group by trace_id"
            ).fetchall()
        )
    df = Q.tables(ds, [table])[table].group_by("trace_id").len().collect()
    return dict(df.iter_rows())


def assert_consistent(ds: Path, want: dict[str, int] | None = None):
    """The manifest names every part file and nothing else, each trace once; no staging; every table
    holds each committed trace's rows once, in the part its manifest row names, for tracepipe and for
    a plain reader of all the files alike."""
    rows = layout.manifest(ds)
    assert rows["trace_id"].is_unique().all()
    assert not (ds / "_staging").exists()
    mfiles = list((ds / "traces").glob("*.parquet")) if (ds / "traces").exists() else []
    assert sum(pq.read_metadata(f).num_rows for f in mfiles) == rows.height  # no superseded manifest file left
    parts = set(rows["part"].drop_nulls())
    for t in TABLES:
        names = {p.name for p in (ds / t).iterdir()} if (ds / t).is_dir() else set()
        assert names == parts, f"{t}: files {names ^ parts} not (or not only) those the manifest names"
    ok = rows.filter(pl.col("status") != "quarantined")
    for t, n in (("events", "n_events"), ("gpu_ops", "n_gpu_ops"), ("flows", "n_flows"), ("devices", "n_devices")):
        expect = {tid: c for tid, c in ok.select("trace_id", n).iter_rows() if c}
        assert table_counts(ds, t) == expect, t
        assert table_counts(ds, t, glob=True) == expect, t
    assert table_counts(ds, "trace", glob=True) == dict.fromkeys(ok["trace_id"], 1)
    for tid, part in ok.select("trace_id", "part").iter_rows():  # a trace's rows live in its part only
        for t in ("events", "trace"):
            ids = pl.read_parquet(ds / t / part, columns=["trace_id"])["trace_id"]
            assert (ids == tid).any()
    if want is not None:
        assert sorted(r["n_events"] for r in ok.to_dicts() if r["status"] == "ok") == sorted(want.values())


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
    # every data file carries trace_id, a string column, first; no hive folders to clash with it
    for t in TABLES:
        for f in (ds / t).iterdir():
            assert f.is_file() and pq.read_schema(f).field("trace_id").type == "string"
    assert duck(ds, "gpu_ops", "count(distinct trace_id)") == [(3,)]
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


def test_query_reads_and_says_so_for_a_statement_that_would_not(built):
    """DROP TABLE gpu_ops printed two empty lines and exit 0 (it dropped the table from the
    query's own view only), CREATE TABLE printed "CREATE TABLE x", and SHOW TABLES listed none (a
    table was registered only where the query named it). Now: one line, exit 2, for a statement
    that does not read; SHOW TABLES lists every table."""
    _, ds, _, _ = built
    for sql in ("drop table gpu_ops", "CREATE TABLE x AS SELECT 1", "  -- a comment\n insert into trace values (1)"):
        q = query(ds, sql)
        word = sql.split("\n")[-1].split()[0].upper()
        assert q.returncode == 2 and q.stdout == "", (sql, q.stdout)
        assert q.stderr.strip() == (
            f"tracepipe: {word} is not run: a query reads the dataset, never changes it "
            "(SELECT, WITH ... SELECT, SHOW TABLES, EXPLAIN SELECT)"
        ), q.stderr
    assert set(Q.run(ds, "show tables")["name"]) == {*TABLES, "traces"}
    assert Q.run(ds, "-- rows\n(select count(*) as n from traces)")["n"][0] == 5  # a comment, a parenthesis
    with pytest.raises(UsageError, match="no SQL given"):
        Q.run(ds, " -- nothing ")


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
DRIVER = (
    "import sys; from pipeline.dataset.batch import run_batch; "
    "run_batch(sys.argv[1], sys.argv[2], jobs=2, group_bytes=int(sys.argv[3]))"
)
KILL_TRACES, KILL_GROUP_BYTES = 24, 40_000  # about 8 tasks of 3 traces, then a compaction


def start_driver(src: Path, ds: Path, group_bytes: int = KILL_GROUP_BYTES) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(src), str(ds), str(group_bytes)],
        cwd=PROJECT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def counts_of(ds: Path) -> dict[str, dict[str, int]]:
    return {t: table_counts(ds, t) for t in TABLES}


def assert_committed_whole(ds: Path, ref: dict[str, dict[str, int]]):
    """What tracepipe's readers see of a dataset (killed at any moment): each committed trace with all
    its rows in every table, and nothing of the others."""
    if not (ds / "traces").is_dir():
        return
    ok = set(layout.manifest(ds).filter(pl.col("status") == "ok")["trace_id"])
    for t in TABLES:
        assert table_counts(ds, t) == {tid: n for tid, n in ref[t].items() if tid in ok}, t


@pytest.fixture(scope="module")
def kill_src(tmp_path_factory):
    """A source of KILL_TRACES traces, each table's rows per trace from an uninterrupted run, and how
    long an uninterrupted run of the driver takes."""
    root = tmp_path_factory.mktemp("kill")
    src = root / "src"
    for i in range(KILL_TRACES):
        write(src / f"run{i % 3}" / f"rank{i:02d}.json.gz", tiny_trace(i, steps=6, kernels=4))
    t0 = time.monotonic()
    p = start_driver(src, root / "ref")
    assert p.wait(timeout=300) == 0
    took = time.monotonic() - t0
    assert_consistent(root / "ref")
    return src, counts_of(root / "ref"), took


@pytest.mark.parametrize("seed", range(20))
def test_kill_9_at_a_random_moment_then_resume(kill_src, tmp_path, seed):
    """kill -9 of the whole process group (driver, workers, forkserver) at a random moment of a run
    (reading, a commit, the compaction at the end...): readers see only whole traces, and the next
    run leaves exactly one copy of every trace in every table."""
    src, ref, took = kill_src
    ds = tmp_path / "ds"
    p = start_driver(src, ds)
    time.sleep(random.Random(seed).uniform(0.2, took))
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    assert_committed_whole(ds, ref)
    r = B.run_batch(src, ds, jobs=2, group_bytes=KILL_GROUP_BYTES)
    assert r.exit_code == 0 and r.added + r.skipped == KILL_TRACES, r.problems
    assert_consistent(ds)
    for t in TABLES:
        assert table_counts(ds, t) == ref[t] and table_counts(ds, t, glob=True) == ref[t], t


def test_workers_exit_when_the_driver_is_killed(kill_src, tmp_path):
    src, ref, _ = kill_src
    ds = tmp_path / "ds"
    p = start_driver(src, ds)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and p.poll() is None and not list((ds / "traces").glob("*.parquet")):
        time.sleep(0.005)
    os.kill(p.pid, signal.SIGKILL)  # kill -9 of the driver alone: its workers notice and exit by themselves
    p.wait()
    deadline = time.monotonic() + 20
    while group_alive(p.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = group_alive(p.pid)
    if left:
        os.killpg(p.pid, signal.SIGKILL)
    assert not left, "worker processes outlived the killed driver"
    assert_committed_whole(ds, ref)
    r = batch(src, "-o", ds, "-j", "2")
    assert r.returncode == 0, r.stderr
    assert_consistent(ds)
    assert counts_of(ds) == ref


class _Crash(BaseException):
    pass


def crash_on(monkeypatch, n: int, *modules) -> list:
    """Make the n-th rename or unlink of `modules` (layout, compact: every step of a commit, a
    compaction and a clean-up) raise, as a kill would stop the process there."""
    calls: list = []

    def step(real):
        def call(*a, **k):
            calls.append(a[0])
            if len(calls) == n:
                raise _Crash(f"killed at step {n}")
            return real(*a, **k)

        return call

    for mod in modules:
        proxy = types.SimpleNamespace(**{k: getattr(os, k) for k in dir(os) if not k.startswith("__")})
        proxy.rename, proxy.unlink = step(os.rename), step(os.unlink)
        monkeypatch.setattr(mod, "os", proxy)
    return calls


@pytest.mark.parametrize("step", range(1, 60, 3))
def test_a_crash_at_any_step_of_commits_and_compaction(tmp_path, monkeypatch, step):
    """Stop a run at its n-th rename or delete (task commits: 7 parts then the manifest; the
    compaction: merged parts, the manifest that switches to them, the clean-up): readers see whole
    traces only, and the next run completes the dataset."""
    from pipeline.dataset import compact as C

    src, ds = tmp_path / "src", tmp_path / "ds"
    for i in range(3):
        write(src / f"r{i}.json", tiny_trace(i))
    B.run_batch(src, tmp_path / "ref", jobs=1)
    ref = counts_of(tmp_path / "ref")
    calls = crash_on(monkeypatch, step, layout, C)
    try:
        B.run_batch(src, ds, jobs=1, group_bytes=1)  # a task per trace: 3 commits, then a compaction
    except _Crash:
        pass
    else:
        assert len(calls) < step  # every step ran: nothing to crash
    monkeypatch.undo()
    (ds / "_staging" / "leftover").mkdir(parents=True, exist_ok=True)  # as if the process had died
    assert_committed_whole(ds, ref)
    r = B.run_batch(src, ds, jobs=1)
    assert r.exit_code == 0 and r.added + r.skipped == 3
    assert_consistent(ds)
    assert counts_of(ds) == ref


@pytest.mark.parametrize("step", range(1, 60, 4))
def test_compaction_is_atomic(tmp_path, monkeypatch, step):
    """`compact` stopped at any step: readers see every row exactly once, before and after; the next
    compaction finishes it."""
    from pipeline.dataset import compact as C

    src, ds = tmp_path / "src", tmp_path / "ds"
    for i in range(6):
        write(src / f"r{i}.json", tiny_trace(i))
    B.run_batch(src, ds, jobs=1, group_bytes=1, compact=False)
    assert len(list((ds / "events").iterdir())) == 6

    def rows_now() -> dict[str, pl.DataFrame]:  # every table's rows (the manifest's but where they live)
        out = {t: lf.collect().sort("trace_id", maintain_order=True) for t, lf in Q.tables(ds).items()}
        out["traces"] = out["traces"].drop("part")
        return out

    view = rows_now()
    crash_on(monkeypatch, step, layout, C)
    with contextlib.suppress(_Crash):
        C.compact(ds)
    monkeypatch.undo()
    for when in ("after the crash", "after compacting again"):
        for t, got in rows_now().items():
            assert got.equals(view[t], null_equal=True), (when, t)
        C.compact(ds)
    assert_consistent(ds)
    assert all(len(list((ds / t).iterdir())) == 1 for t in TABLES)


def test_adding_traces_touches_only_new_files(tmp_path):
    src, ds = tmp_path / "src", tmp_path / "ds"
    make_src(src, n=3)
    B.run_batch(src, ds, jobs=2, compact=False)
    before = snapshot(ds)
    for i in range(2):
        write(src / "new" / f"n{i}.json", tiny_trace(10 + i))
    r = B.run_batch(src, ds, jobs=2, compact=False)
    assert (r.added, r.skipped) == (2, 3)
    after = snapshot(ds)
    assert {k: after[k] for k in before} == before  # every file untouched
    added = set(after) - set(before)
    assert len(added) == len(TABLES) + 1 and all(Path(a).name.startswith("part-") for a in added)
    assert_consistent(ds)
    r = B.run_batch(src, ds, jobs=2)  # nothing new: nothing written, nothing compacted
    assert r.added == 0 and snapshot(ds) == after
    from pipeline.dataset.compact import compact

    compact(ds)  # the two parts merged, the rest as it was
    assert_consistent(ds)
    assert all(len(list((ds / t).iterdir())) == 1 for t in TABLES)


def test_a_dataset_of_the_folder_per_trace_layout_is_read_and_migrated(tmp_path):
    """Datasets written before parts (`<table>/trace_id=<id>/part-0.parquet`) read as they are; the
    next batch adds its traces in parts and compacts the old folders into them."""
    from pipeline.flatten import flatten

    src, ds = tmp_path / "src", tmp_path / "ds"
    old = make_src(src, n=2)
    for path in old:
        item = B.inputs(str(path), tmp_path / "x", ds)
        (it,) = list(item)
        r = flatten(path, tmp_path / "flat", workers=1)
        for t in TABLES:
            d = ds / t / f"trace_id={it.trace_id}"
            d.mkdir(parents=True)
            tbl = pq.read_table(r.out_dir / f"{t}.parquet")
            pq.write_table(tbl.drop_columns(["trace_id"]) if t == "trace" else tbl, d / "part-0.parquet")
        row = {
            "path": str(path),
            "size": it.size,
            "content_hash": it.content_hash,
            "status": "ok",
            "n_events": r.n_events,
            "n_gpu_ops": r.n_gpu_ops,
            "n_flows": r.n_flows,
            "n_devices": r.n_devices,
        }
        (ds / "traces" / f"trace_id={it.trace_id}").mkdir(parents=True)
        pq.write_table(pa.Table.from_pylist([row]), ds / "traces" / f"trace_id={it.trace_id}" / "part-0.parquet")
    want_ev = sum(len(d["traceEvents"]) for d in old.values())
    assert Q.run(ds, "select count(*) as n from events")["n"][0] == want_ev
    assert Q.run(ds, "select count(distinct trace_id) as n from gpu_ops")["n"][0] == 2
    write(src / "new.json", tiny_trace(7))
    r = B.run_batch(src, ds, jobs=1)
    assert (r.added, r.skipped) == (1, 2)
    assert not list(ds.rglob("trace_id=*"))  # migrated into parts
    assert_consistent(ds)
    assert Q.run(ds, "select count(*) as n from events")["n"][0] == want_ev + len(tiny_trace(7)["traceEvents"])


# ------------------------------------------------------------------ archives and lists
def test_a_long_tmpdir_does_not_stop_the_workers(tmp_path):
    """Python < 3.13 puts the forkserver's socket under TMPDIR: with ~80 characters of it, batch
    was a traceback ("OSError: AF_UNIX path too long"). CI's pytest temp folders grew past it."""
    long = tmp_path / ("d" * 90)
    long.mkdir()
    (tmp_path / "in").mkdir()
    for i in range(2):
        (tmp_path / "in" / f"t{i}.json").write_text(json.dumps(tiny_trace(i)))
    p = subprocess.run(
        [sys.executable, "-m", "pipeline", "batch", str(tmp_path / "in"), "-o", str(tmp_path / "ds"), "-j", "2"],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TMPDIR": str(long)},
    )
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr[-500:]
    assert len(pl.read_parquet(tmp_path / "ds" / "traces" / "*.parquet")) == 2


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


def test_warming_workers_of_a_pool_already_shut_down_is_quiet():
    """A batch with nothing to flatten can shut its pool before the thread that starts the workers
    runs: that thread must end quietly (it printed a traceback)."""
    import concurrent.futures as cf

    from pipeline.dataset import engines

    ex = cf.ProcessPoolExecutor(1)
    ex.shutdown()
    engines._warm(ex, 2)


@pytest.mark.parametrize(
    "argv, starts",
    [
        (["src", "-o", "ds"], True),
        (["src", "-o", "ds", "--engine", "local"], True),
        (["src", "--engine", "ray", "-o", "ds"], False),
        (["src", "--engine=dask"], False),
        (["--help"], False),
    ],
)
def test_a_batch_starts_its_workers_forkserver_before_its_imports(argv, starts):
    """`tracepipe batch` starts the local workers' forkserver first (`engines.prestart`), and a pool
    then forks its workers from that one, with tracepipe already imported; not for another engine
    or for help. In a process of its own: the forkserver is per process."""
    code = f"""
import sys
from multiprocessing import forkserver
from pipeline.dataset import engines
engines.prestart({argv!r})
pid = forkserver._forkserver._forkserver_pid
assert "polars" not in sys.modules  # the driver's own imports had not begun
print(pid is not None)
if pid is not None:
    pool = engines.Pool("local", 1)
    print(pool.submit(engines._nothing).result() is None and forkserver._forkserver._forkserver_pid == pid)
    pool.close()
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=PROJECT, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == (["True", "True"] if starts else ["False"])


@pytest.mark.parametrize(
    "total, each, jobs, tasks",
    [
        (2000, 67_000, 2, 6),  # check.py scale's default: 134 MB in 6 tasks of 22 MB, not 12 shrinking ones
        (2000, 25_000, 2, 4),  # 50 MB, but at most GROUP_TRACES traces a task
        (5, 1_000, 2, 1),  # a few small traces: one task, none of less than MIN_GROUP_BYTES for the workers
        (30, 200_000, 2, 2),  # 6 MB: two tasks of at least MIN_GROUP_BYTES
        (100, 1_000_000, 3, 6),  # 100 MB over 3 workers: 5 tasks by size, made 6
    ],
)
def test_a_batch_of_known_size_is_cut_into_equal_tasks_for_its_workers(total, each, jobs, tasks):
    """The inputs' total known, the tasks are as few as GROUP_BYTES and GROUP_TRACES allow, a
    multiple of the workers, and equal: each costs ~0.2 s whatever its size. Unknown: the limits."""
    sizes, cut = [], []
    for n_seen in range(1, total + 1):
        sizes.append(each)
        limit, most = B.group_limits(total, n_seen, n_seen * each, jobs)
        if sum(sizes) >= limit or len(sizes) >= most:
            cut.append(len(sizes))
            sizes = []
    if sizes:
        cut.append(len(sizes))
    assert len(cut) == tasks and max(cut) - min(cut) <= max(2, 0.05 * total / tasks), cut
    assert B.group_limits(None, 10, 10 * each, jobs) == (B.GROUP_BYTES, B.GROUP_TRACES)
