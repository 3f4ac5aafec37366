"""Whole runs: collectives per rank, matched across ranks, clocks aligned, waits, stragglers,
bandwidth; on synthetic runs with known physics, on real gloo runs recorded with torch, and on the
shared NCCL traces."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import polars as pl
import pytest

from conftest import TESTS
from pipeline.dataset.batch import run_batch
from pipeline.flatten import flatten
from pipeline.read.metadata import rank_of
from pipeline.runs.collectives import _kind_from_name
from pipeline.runs.report import analyze_runs, runs_json
from pipeline.synthetic import write_run

RUNS = TESTS / "data" / "runs"
OFFSETS = [0.0, 850.0, -400.0, 1200.0, -1500.0, 300.0, 2000.0, -700.0]


def batched(src: Path, tmp: Path) -> Path:
    ds = tmp / f"{src.name}.ds"
    run_batch(src, ds, jobs=1)
    return ds


@pytest.fixture(scope="module")
def skewed(tmp_path_factory):
    """8 ranks, rank 3 starts collective 21 by 2,500 µs late, clocks off by up to 2 ms."""
    tmp = tmp_path_factory.mktemp("skewed")
    truth = write_run(tmp / "run", 8, 96, straggler=3, delay_us=2500.0, delayed=21, offsets_us=OFFSETS)
    return truth, runs_json(analyze_runs(batched(tmp / "run", tmp)))["runs"][0]


def test_synthetic_run_is_measured_exactly(skewed):
    truth, run = skewed
    assert run["ranks"] == list(range(8)) and run["world_size"] == 8 and run["missing_ranks"] == []
    assert len(run["collectives"]) == 96
    for r, o in enumerate(OFFSETS):
        assert run["clock_offset_us"][str(r)] == pytest.approx(o - OFFSETS[0], abs=0.01)
    late = [c for c in run["collectives"] if max(c["wait_us"].values()) > 1]
    assert len(late) == 1 and late[0]["seq"] == 21 and late[0]["last_rank"] == 3
    assert late[0]["wait_us"] == {str(r): (0.0 if r == 3 else pytest.approx(2500.0, abs=0.01)) for r in range(8)}
    assert late[0]["start_skew_us"] == pytest.approx(2500.0, abs=0.01)
    assert run["stragglers"][0] == {"rank": 3, "wait_caused_us": pytest.approx(7 * 2500.0, abs=0.1), "times_last": 1}


@pytest.mark.parametrize("name", ["gloo4", "gloo4_sub"])
def test_a_dataset_codes_small_and_large_traces_alike(tmp_path, monkeypatch, name):
    """A trace's calls are coded row by row when few, by column when many: the same runs either way."""
    from pipeline.runs import from_tables

    ds = batched(RUNS / name, tmp_path)
    by_row = runs_json(analyze_runs(ds))
    monkeypatch.setattr(from_tables, "ROWS_BY_ROW", -1)
    by_column = runs_json(analyze_runs(ds))
    assert by_row == by_column and by_row["runs"][0]["collectives"]


def test_bandwidth_follows_nccl_tests(skewed):
    _, run = skewed
    factor = {"allreduce": 2 * 7 / 8, "allgather": 7 / 8, "reducescatter": 7 / 8}
    for c in run["collectives"]:
        assert c["latency_us"] == pytest.approx(50.0)  # the shortest duration: the straggler's at the late one
        assert c["algbw_gbps"] == pytest.approx(c["bytes"] / (c["latency_us"] * 1e3))
        assert c["busbw_gbps"] == pytest.approx(c["algbw_gbps"] * factor[c["name"]])
    sizes = {c["name"]: c["bytes"] for c in run["collectives"]}
    assert sizes == {"allreduce": (1 << 22) * 2, "allgather": (1 << 18) * 8 * 2, "reducescatter": (1 << 20) * 2}


def test_align_none_keeps_the_clocks(tmp_path):
    write_run(tmp_path / "run", 4, 12, offsets_us=[0.0, 100.0, 0.0, 0.0])
    rep = analyze_runs(batched(tmp_path / "run", tmp_path), align=False)
    doc = runs_json(rep)["runs"][0]
    assert set(doc["clock_offset_us"].values()) == {0.0}
    assert all(c["wait_us"]["1"] == 0.0 and c["wait_us"]["0"] == pytest.approx(100.0) for c in doc["collectives"])


def test_partial_rank_sets_are_normal(tmp_path):
    write_run(tmp_path / "run", 8, 16, straggler=6, delay_us=900.0, delayed=5)
    for r in (0, 2, 3, 4, 7):
        (tmp_path / "run" / f"rank-{r}.json.gz").unlink()
    run = runs_json(analyze_runs(batched(tmp_path / "run", tmp_path)))["runs"][0]
    assert run["ranks"] == [1, 5, 6] and run["missing_ranks"] == [0, 2, 3, 4, 7] and run["world_size"] == 8
    c = next(c for c in run["collectives"] if c["seq"] == 5)
    assert c["n_ranks"] == 8 and c["ranks_present"] == 3 and c["last_rank"] == 6
    assert run["stragglers"][0]["rank"] == 6


def test_desync_is_reported_not_paired(tmp_path):
    write_run(tmp_path / "run", 4, 9)
    path = tmp_path / "run" / "rank-2.json.gz"
    doc = json.loads(gzip.decompress(path.read_bytes()))
    k = next(e for e in doc["traceEvents"] if e.get("cat") == "kernel" and "AllReduce" in e["name"])
    k["args"]["In msg nelems"] *= 2  # rank 2 reduces twice the message at its first allreduce
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    rep = analyze_runs(batched(tmp_path / "run", tmp_path))
    assert rep.desyncs.select("rank", "pg", "seq").rows() == [(2, "0,1,2,3#0", 0)]
    assert 0 not in rep.collectives["seq"].to_list() and rep.collectives.height == 8


def test_runs_group_by_directory_or_by_regex(tmp_path):
    for n, job in enumerate(("jobA", "jobB")):
        write_run(tmp_path / "src" / job, 2, 6 + n)  # distinct contents (the same bytes are one trace)
    ds = batched(tmp_path / "src", tmp_path)
    assert sorted(Path(r).name for r in analyze_runs(ds).runs["run"]) == ["jobA", "jobB"]
    one = analyze_runs(ds, run_by=r"(src)/").runs
    assert one["run"].to_list() == ["src"] and one["traces"].to_list() == [4]
    dup = runs_json(analyze_runs(ds, run_by=r"(src)/"))["runs"][0]
    assert dup["duplicate_rank_traces"] == ["rank-0", "rank-1"]  # a rank held twice: reported, left out


def test_rank_from_distributed_info_then_file_name():
    assert rank_of("x/rank-3.json", {"rank": 5}) == (5, "distributedInfo")
    for name, want in (("rank-3.json.gz", 3), ("rank3.json", 3), ("trace_rank_12.json", 12), ("worker_7.json", 7)):
        assert rank_of(f"d/{name}", {}) == (want, "file name"), name
    assert rank_of("d/host_123456.pt.trace.json", {}) == (None, None)  # a pid, not a rank


def test_kernel_names_of_older_layouts():
    names = [
        "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
        "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
        "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclWorkElem)",
        "ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclDevComm*)",
        "ncclKernel_Reduce_RING_LL_Sum_half",
        "ncclDevKernel_Generic_4(ncclDevKernelArgsStorage<4096ul>)",
    ]
    got = pl.select(_kind_from_name(pl.Series(names))).to_series().to_list()
    assert got == ["allreduce", "allgather", "sendrecv", "broadcast", "reduce", None]


# ------------------------------------------------------------------ real gloo runs (torch, 4 processes)
@pytest.mark.parametrize("name", ["gloo4", "gloo4_sub", "gloo4_partial"])
def test_recorded_gloo_runs(tmp_path, name):
    truth = json.loads((RUNS / f"{name}.truth.json").read_text())
    run = runs_json(analyze_runs(batched(RUNS / name, tmp_path)))["runs"][0]
    S, D = truth["straggler_rank"], truth["delay_ms"] * 1000
    assert run["ranks"] == truth["ranks"] and run["world_size"] == truth["world_size"]
    assert run["missing_ranks"] == sorted(set(range(truth["world_size"])) - set(truth["ranks"]))
    hit = [c for c in run["collectives"] if max(c["wait_us"].values()) >= D / 2]
    assert sorted({c["step"] for c in hit}) == truth["delay_steps"]
    for c in hit:
        assert c["name"] == "allreduce" and c["last_rank"] == S and c["wait_us"][str(S)] == 0
        assert all(abs(w - D) <= truth["tolerance"] * D for r, w in c["wait_us"].items() if int(r) != S)
    assert run["stragglers"][0]["rank"] == S
    assert all(abs(o) < 1000 for o in run["clock_offset_us"].values())  # one host, one clock


def test_gloo_process_groups_come_from_their_runloop_threads(tmp_path):
    flat = flatten(RUNS / "gloo4_sub" / "rank-1.json.gz", tmp_path).out_dir
    t = pl.read_parquet(flat / "collectives.parquet")
    assert t.group_by("pg_ranks", "kind").len().sort("pg_ranks", "kind").rows() == [
        ("[0, 1, 2, 3]", "allgather", 6),
        ("[0, 1, 2, 3]", "allreduce", 6),
        ("[0, 1, 2, 3]", "barrier", 6),
        ("[0, 1, 2, 3]", "broadcast", 6),
        ("[1, 2]", "allreduce", 6),
    ]
    assert t.filter(pl.col("pg_ranks") == "[1, 2]")["bytes"].unique().to_list() == [32]  # 8 floats
    assert t.filter(pl.col("kind") == "allgather")["bytes"].unique().to_list() == [16]  # 1 float x 4 ranks


# ------------------------------------------------------------------ the shared NCCL traces
@pytest.mark.real
def test_collectives_of_real_nccl_traces(shared_traces, tmp_path):
    flat = flatten(shared_traces / "hta/a100_nccl.json.gz", tmp_path).out_dir
    t = pl.read_parquet(flat / "collectives.parquet")
    assert t.group_by("kind").len().sort("kind").rows() == [("allreduce", 15), ("broadcast", 6)]
    assert t["pg_ranks"].unique().to_list() == ["[0, 1]"] and t["seq"].to_list() == list(range(21))
    first = t.filter(pl.col("kind") == "allreduce").row(0, named=True)
    assert first["bytes"] == first["in_nelems"] * 4 and first["dtype"] == "fp32"
    old = pl.read_parquet(
        flatten(shared_traces / "hta/a100_old_format_rank0.json.gz", tmp_path).out_dir / "collectives.parquet"
    )
    # SendRecv kernels of an older layout: the kind comes from the c10d op that launched them
    assert dict(old.group_by("kind").len().rows()) == {
        "alltoall": 45,
        "allreduce": 10,
        "allgather": 10,
        "reducescatter": 10,
        "sendrecv": 5,
    }


@pytest.mark.real
def test_a_run_made_from_a_real_rank(shared_traces, tmp_path):
    """make_run.py's physics on a real trace: one rank late at one collective, clocks off."""
    import subprocess
    import sys

    maker = shared_traces.parent / "acceptance" / "make_run.py"
    if not maker.is_file():
        pytest.skip("make_run.py not found")
    offs = "0,-1300,700,1900"
    subprocess.run(
        [
            sys.executable,
            str(maker),
            str(shared_traces / "hta/a100_nccl.json.gz"),
            "--world",
            "4",
            "--straggler",
            "2",
            "--delay-us",
            "3000",
            "--delay-collective",
            "5",
            "--collective-kind",
            "allreduce",
            "--clock-offsets-us",
            offs,
            "--out",
            str(tmp_path / "run"),
        ],
        check=True,
        capture_output=True,
    )
    run = runs_json(analyze_runs(batched(tmp_path / "run", tmp_path)))["runs"][0]
    for r, o in enumerate(map(float, offs.split(","))):
        assert run["clock_offset_us"][str(r)] == pytest.approx(o, abs=20)
    hit = [c for c in run["collectives"] if max(c["wait_us"].values()) > 1500]
    assert len(hit) == 1 and hit[0]["last_rank"] == 2 and hit[0]["name"] == "allreduce"
    assert all(abs(w - 3000) <= 60 for r, w in hit[0]["wait_us"].items() if r != "2")
    assert run["stragglers"][0]["rank"] == 2


def test_a_folder_of_traces_is_batched_for_ranks(tmp_path, run_cli):
    write_run(tmp_path / "run", 4, 8, straggler=1, delay_us=700.0, delayed=2)
    p = run_cli(["ranks", tmp_path / "run", "--format", "json"])
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["runs"][0]["stragglers"][0]["rank"] == 1
    shutil.rmtree(tmp_path / "run")


@pytest.mark.parametrize("fmt", ["table", "md", "csv"])
def test_ranks_sections_in_every_format(tmp_path, run_cli, fmt):
    write_run(tmp_path / "run", 4, 16, straggler=2, delay_us=800.0, delayed=3)
    ds = batched(tmp_path / "run", tmp_path)
    p = run_cli(["ranks", ds, "--format", fmt])
    assert p.returncode == 0, p.stderr
    marks = (
        ("# ranks", "# stragglers", "# steps")
        if fmt == "csv"
        else ("Ranks: clock offset", "Stragglers:", "Per rank and step")
    )
    assert all(m in p.stdout for m in marks), p.stdout[:300]
    assert run_cli(["ranks", ds, "--run", "nope"]).returncode == 2
    assert run_cli(["ranks", ds, "--align", "sideways"]).returncode == 2


def test_ranks_tables_show_top_rows_slowest_steps_first(tmp_path, run_cli):
    """A run of many ranks and steps stays readable at a terminal: --top rows of each section
    (steps slowest first) and how many more; --top 0 and csv give every row; --columns picks."""
    write_run(tmp_path / "run", 4, 16, straggler=2, delay_us=800.0, delayed=3)
    ds = batched(tmp_path / "run", tmp_path)
    n = run_cli(["ranks", ds, "--format", "csv", "--top", "1"]).stdout.count("ProfilerStep#")  # csv: every row
    assert n > 5
    p = run_cli(["ranks", ds, "--top", "5", "-w", "0"])
    assert p.returncode == 0, p.stderr
    steps = p.stdout.split("Per rank and step (slowest first)\n")[1].split("\n\n")[0].splitlines()
    rows = [r for r in steps[2:] if not r.startswith("(")]
    assert len(rows) == 5 and steps[-1].startswith(f"({n - 5} more rows: --top 0 shows all")
    at = steps[0].split().index("step_us")
    step_us = [float(r.split()[at].replace(",", "")) for r in rows]
    assert step_us == sorted(step_us, reverse=True) and step_us[0] > step_us[-1]
    every = run_cli(["ranks", ds, "--top", "0", "-w", "0"]).stdout
    assert "more rows" not in every and every.count("ProfilerStep#") == n
    picked = run_cli(["ranks", ds, "-c", "rank,wait_caused_us"]).stdout
    assert "Collectives by kind" not in picked and "offset_us" not in picked and "wait_caused_us" in picked
    assert p.stdout.startswith(f"run: {tmp_path / 'run'}\n") and "run  " not in p.stdout  # one run: named once


def test_ranks_plots(tmp_path, run_cli):
    pytest.importorskip("matplotlib")
    write_run(tmp_path / "run", 4, 16, straggler=2, delay_us=800.0, delayed=3)
    p = run_cli(
        [
            "ranks",
            batched(tmp_path / "run", tmp_path),
            "--plot",
            tmp_path / "plots",
            "-o",
            tmp_path / "r.md",
            "--format",
            "md",
        ]
    )
    assert p.returncode == 0, p.stderr
    assert sorted(f.name for f in (tmp_path / "plots").iterdir()) == [
        "run_busbw.png",
        "run_busbw.svg",
        "run_waits.png",
        "run_waits.svg",
    ]


def test_run_level_query_examples(tmp_path):
    from pipeline.dataset import query as Q

    write_run(tmp_path / "run", 4, 12, straggler=1, delay_us=900.0, delayed=4)  # one clock: raw SQL is right
    ds = batched(tmp_path / "run", tmp_path)
    top = Q.run(ds, Q.example("stragglers")).row(0, named=True)
    assert top["rank"] == 1 and top["wait_caused_us"] == pytest.approx(3 * 900.0)
    bw = Q.run(ds, Q.example("collective_bandwidth"))
    assert sorted(bw["kind"].to_list()) == ["allgather", "allreduce", "reducescatter"] and set(bw["ranks"]) == {4}
    # 10 µs of each comm kernel is exposed; the waiters' wait (900) too; the late rank's kernel (50) is all exposed
    exposed = Q.run(ds, Q.example("exposed_comm_by_rank"))["exposed_comm_us"].to_list()
    assert exposed == [pytest.approx(x) for x in (120 + 900, 120 + 40, 120 + 900, 120 + 900)]


def test_steps_are_measured_the_same_a_few_steps_at_a_time(tmp_path, monkeypatch):
    """The steps table reads its kernels a run of steps at a time (`KERNELS_AT_ONCE` kernels, about),
    never all of them: the same table as reading them at once, communication and exposure included."""
    from pipeline.runs import steps as steps_mod
    from pipeline.runs.collectives import collectives, profiler_steps

    write_run(tmp_path / "run", 2, 24, straggler=1, delay_us=500.0, delayed=5, per_step=4)
    flat = flatten(sorted((tmp_path / "run").iterdir())[0], tmp_path / "flat").out_dir
    colls, _ = collectives(flat, 0, {})
    whole = steps_mod.steps(flat, colls)
    assert whole.height >= 4 and whole["comm_ns"].sum() > 0 and whole["compute_ns"].sum() > 0
    assert whole.equals(pl.read_parquet(flat / "steps.parquet").cast(whole.schema))
    for at_once in (1, 3, 10):
        monkeypatch.setattr(steps_mod, "KERNELS_AT_ONCE", at_once)
        ranges = steps_mod._step_ranges(flat, profiler_steps(flat), "gpu_ops", steps_mod.IS_KERNEL)
        assert ranges is not None and len(ranges) > 1
        assert steps_mod.steps(flat, colls).equals(whole), at_once


def test_step_cover_without_communication_is_all_compute():
    """A step's kernels without communication: kernel and compute time are the union of their
    intervals (worked out once), communication and exposed communication 0; the same measures
    as the general path gives once a communication kernel, in another step, is among them."""
    from pipeline.runs.steps import INTERVAL, kernel_cover_ns

    by = [INTERVAL, "device"]

    k = pl.DataFrame(
        {
            INTERVAL: [0, 0, 0, 1, 1],
            "device": [0, 0, 1, 0, 0],
            "ts_ns": [0, 50, 0, 1000, 1500],
            "end_ns": [100, 300, 40, 1200, 1600],  # step 0, device 0: [0, 300) overlapped
            "comm": [False] * 5,
        }
    ).with_columns(pl.col(INTERVAL).cast(pl.UInt32))
    alone = kernel_cover_ns(k, by).sort(by)
    assert alone.rows() == [(0, 0, 300, 300, 0, 0), (0, 1, 40, 40, 0, 0), (1, 0, 300, 300, 0, 0)]
    comm = pl.DataFrame({INTERVAL: [2], "device": [0], "ts_ns": [5000], "end_ns": [5100], "comm": [True]}).with_columns(
        pl.col(INTERVAL).cast(pl.UInt32)
    )
    general = kernel_cover_ns(pl.concat([k, comm]), by).sort(by)
    assert general.head(3).equals(alone)
    assert general.row(3) == (2, 0, 100, 0, 100, 100)


# ------------------------------------------------------------------ steps of the same name
def _doubled(src: Path, out: Path) -> Path:
    """The trace `src` twice on one timeline: every timed event again, after the last one ends, so
    that each ProfilerStep#N name names two intervals (as two profiling sessions in one file, or
    copies put end to end, do)."""
    d = json.loads(gzip.decompress(src.read_bytes()) if src.suffix == ".gz" else src.read_bytes())
    timed = [e for e in d["traceEvents"] if "ts" in e]
    start = min(float(e["ts"]) for e in timed)
    shift = max(float(e["ts"]) + float(e.get("dur", 0)) for e in timed) - start + 1000.0
    d["traceEvents"] += [{**e, "ts": float(e["ts"]) + shift} for e in timed]
    out.write_text(json.dumps(d))
    return out


def _steps_twice(single: pl.DataFrame, doubled: pl.DataFrame):
    """`doubled` is `single` twice, each interval measured on its own: as many rows again, and the
    copy of each step measured as the step itself."""
    measures = ["step", "device", "kernel_ns", "compute_ns", "comm_ns", "exposed_comm_ns"]
    assert single.height and doubled.height == 2 * single.height
    assert single["step"].n_unique() == doubled["step"].n_unique()  # the same names, each twice
    first, second = doubled.head(single.height), doubled.tail(single.height)
    assert first.select(measures).equals(single.select(measures))
    assert second.select(measures).equals(single.select(measures))
    assert (second["step_ts_ns"] > first["step_ts_ns"].max()).all()


@pytest.mark.parametrize("kind", ["gloo", "nccl"])
def test_steps_of_one_name_are_measured_apart(tmp_path, kind):
    """Keyed by name, every interval of a name was joined with every other's measures: rows grew
    with the square of the copies (a 50 MB CPU-only trace of 10,254 copies took 27 s and 9 GB)."""
    if kind == "gloo":
        src = RUNS / "gloo4" / "rank-1.json.gz"
    else:
        write_run(tmp_path / "run", 2, 16, per_step=4)
        src = tmp_path / "run" / "rank-0.json.gz"
    single = pl.read_parquet(flatten(src, tmp_path / "one").out_dir / "steps.parquet")
    twice = flatten(_doubled(src, tmp_path / "twice.json"), tmp_path / "two").out_dir
    _steps_twice(single, pl.read_parquet(twice / "steps.parquet"))
    assert single["comm_ns"].sum() > 0


def test_steps_of_one_name_are_measured_apart_in_a_batch(tmp_path):
    """The same in a batch, whose small traces without collectives are measured in one query per
    group (`dataset.group.run_tables`)."""
    from pipeline import synthetic as synth
    from pipeline.dataset.tables import scan

    for k in (1, 2):
        (tmp_path / f"src{k}").mkdir()
    one = synth.write_trace(synth.make_trace(n_steps=3), tmp_path / "src1" / "t.json", gz=False)
    _doubled(Path(one), tmp_path / "src2" / "t.json")
    got = {}
    for k in (1, 2):
        run_batch(tmp_path / f"src{k}", tmp_path / f"ds{k}", jobs=1)
        got[k] = scan(tmp_path / f"ds{k}", "steps").drop("trace_id").collect().sort("step_ts_ns", "device")
    _steps_twice(got[1], got[2])
    assert got[1]["kernel_ns"].sum() > 0


# ------------------------------------------------------------------ a table of millions of collectives
@pytest.mark.parametrize("kind", ["gloo", "nccl"])
def test_collectives_are_made_a_slice_at_a_time(tmp_path, kind):
    """A trace of millions of gloo calls (hta/cpu_only scaled to 1 GB: 2 M) is made whole and
    written a slice at a time: the slices put together are the whole table, each group numbered
    on across slices, in start order."""
    from pipeline.runs.collectives import collective_slices, collectives

    if kind == "gloo":
        src = RUNS / "gloo4_sub" / "rank-1.json.gz"
    else:
        write_run(tmp_path / "run", 2, 24, per_step=4)
        src = tmp_path / "run" / "rank-0.json.gz"
    flat = flatten(src, tmp_path / "flat").out_dir
    written = pl.read_parquet(flat / "collectives.parquet")
    whole, problems = collectives(flat, written["rank"][0], {})
    assert whole.height > 20 and whole.equals(collectives(flat, written["rank"][0], {})[0])
    in_slices: dict = {}
    parts = list(collective_slices(flat, written["rank"][0], {}, in_slices, rows=7))
    assert all(p.height <= 7 for p in parts) and pl.concat(parts).equals(whole) and in_slices == problems
    if kind == "nccl":
        assert len(parts) == -(-whole.height // 7)
    else:  # gloo work is read a time cell (about CELL_SLICES slices) at a time: the cells' slices in order
        assert len(parts) >= -(-whole.height // 7)
    groups = whole.group_by("pg_name", "pg_ranks", maintain_order=True).agg("seq", "ts_ns")
    for seq, ts in groups.select("seq", "ts_ns").iter_rows():
        assert seq == list(range(len(seq))) and ts == sorted(ts)
    if kind == "nccl":  # the flattened trace's table is the same, its process groups known to it
        assert written.drop("pg_size").equals(whole.drop("pg_size"))


def test_gloo_work_is_read_a_time_cell_at_a_time(tmp_path, monkeypatch):
    """A CPU-only trace's gloo calls are read one time cell of a few slices at a time, never all at
    once: held whole, compact (~50 bytes a call), they took `hta/cpu_only` scaled to 2 GB (4.7 M
    calls) to 565 MB, growing with the trace. The cells' slices make the table read in one cell."""
    from pipeline.runs import collectives as C

    flat = flatten(RUNS / "gloo4_sub" / "rank-1.json.gz", tmp_path / "flat").out_dir
    rank = pl.read_parquet(flat / "collectives.parquet")["rank"][0]
    whole, problems = C.collectives(flat, rank, {})
    reads: list[int] = []
    read = C._events

    def counted(flat_dir, where, columns):
        out = read(flat_dir, where, columns)
        if "_args" in out.columns and out.height:  # gloo work (not steps, threads' names, HCCL ops: none)
            reads.append(out.height)
        return out

    monkeypatch.setattr(C, "_events", counted)
    monkeypatch.setattr(C, "CELL_SLICES", 1)
    in_slices: dict = {}
    parts = list(C.collective_slices(flat, rank, {}, in_slices, rows=8))
    assert pl.concat(parts).equals(whole) and in_slices == problems
    assert sum(reads) == whole.height > 20 and len(reads) > 3 and max(reads) < whole.height / 2, reads


def test_cpu_only_steps_read_their_collectives_a_few_steps_at_a_time(tmp_path, monkeypatch):
    """A trace without kernels measures its steps by its collectives, read back from their table a
    run of steps at a time (holding every collective's times grew with the trace: `hta/cpu_only`
    scaled to 1 GB, 2.35 M gloo calls, peaked at 430-510 MB, now 290-315): the same table as
    from all of them at once."""
    from pipeline.runs import steps as steps_mod
    from pipeline.runs.collectives import profiler_steps

    flat = flatten(RUNS / "gloo4" / "rank-1.json.gz", tmp_path / "flat").out_dir
    whole = steps_mod.steps(flat, pl.read_parquet(flat / "collectives.parquet"))
    assert whole.height > 2 and whole["comm_ns"].sum() > 0 and whole["kernel_ns"].is_null().all()
    assert whole.equals(pl.read_parquet(flat / "steps.parquet").cast(whole.schema))
    for at_once in (1, 3):
        monkeypatch.setattr(steps_mod, "KERNELS_AT_ONCE", at_once)
        ranges = steps_mod._step_ranges(flat, profiler_steps(flat), "collectives", steps_mod.IS_TIMED)
        assert ranges is not None and len(ranges) > 1
        assert steps_mod.steps(flat).equals(whole), at_once


def test_calls_alike_but_for_their_counters_share_one_reading():
    """A call's args are read once for all calls whose args differ only in the numbers each call
    writes anew (`kineto.CALL_COUNTERS`): External id, Ev Idx, record_param_comms' Seq..."""
    from pipeline.runs.collectives import _arg_texts, _args_key, _with_args

    def args(ext: int, dims: str, idx: int, seq: str = "") -> str:
        return f'{{"External id": {ext}, "Input Dims": {dims}, {seq}"Ev Idx": {idx}}}'

    texts = [
        args(1025, "[[321271]]", 0),
        args(1026, "[[321271]]", 1),
        args(7, "[[321271]]", 12, '"Seq": 3, '),
        args(8, "[[321271]]", 13, '"Seq": 4, '),
        args(1027, "[[2082411]]", 2),
        None,
    ]
    frame = pl.DataFrame({"event_idx": range(6), "args_json": texts})
    keyed = frame.select("event_idx", _args_key())
    assert keyed["_args"].n_unique() == 4  # 0 and 1 alike, 2 and 3 (with a Seq) alike
    assert keyed["_args"][0] == keyed["_args"][1] and keyed["_args"][2] == keyed["_args"][3]
    got = _with_args(frame.select("event_idx", _args_key()), ("Input Dims", "Ev Idx"))
    assert got.columns == ["event_idx", "_arg:Input Dims", "_arg:Ev Idx"]
    assert got["_arg:Input Dims"].to_list() == ["[[321271]]"] * 4 + ["[[2082411]]", None]
    assert got["_arg:Input Dims"].to_list() == frame.select(_arg_texts(("Input Dims",))).to_series().to_list()


def test_no_arg_the_collectives_read_is_a_call_counter():
    """A counter is read as 0 once calls share their args (`_args_key`): the args the collectives
    table reads (sizes, groups, names) must not be among `kineto.CALL_COUNTERS`."""
    from pipeline.kineto import CALL_COUNTERS
    from pipeline.runs import collectives as c

    read = {*c.ARG_KEYS.values(), *c.OP_ARGS, *c.KERNEL_ARGS, *c.COMM_EVENT_ARGS, *c.HCCL_SIZE.read.args}
    assert {"Process Group Ranks", "In msg nelems", "Input Dims"} <= read
    assert not read & set(CALL_COUNTERS)


def test_rows_read_some_at_a_time_are_those_read_at_once(tmp_path):
    """`runs.source.collect_rows` (how the collectives read the args of calls and kernels) reads
    the rows `row_ids` found a few at a time across row groups; on a table in memory at once."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline.runs import source

    n = 1_000
    table = pa.table({"event_idx": range(n), "name": [f"op_{i % 7}" for i in range(n)]})
    pq.write_table(table, tmp_path / "events.parquet", row_group_size=130)
    where = pl.col("name") != "op_3"
    columns = ["event_idx", pl.col("name").str.slice(3).alias("tail")]
    whole = pl.scan_parquet(tmp_path / "events.parquet").filter(where).select(columns).collect()
    assert whole.height == n - len(range(3, n, 7))
    ids = source.row_ids(tmp_path, "events", where)
    assert ids.to_list() == whole["event_idx"].to_list()
    for rows in (7, 300, 856, 857, 5_000):
        assert source.collect_rows(tmp_path, "events", ids, columns, rows).equals(whole), rows
    in_memory = {"events": pl.from_arrow(table)}
    assert source.collect_rows(in_memory, "events", source.row_ids(in_memory, "events", where), columns, 300).equals(
        whole
    )
    none = source.collect_rows(tmp_path, "events", ids.clear(), columns, 300)
    assert none.height == 0 and none.columns == ["event_idx", "tail"]


def _swept(intervals: list[tuple[int, int]]) -> int:
    """The union length of intervals (start, end), by a direct sweep in start order: one that
    starts after every end before it opens a run, which covers from its start to its last end."""
    total, latest, run = 0, None, None
    for start, end in sorted(intervals):
        if latest is None or start > latest:
            total += 0 if run is None else run[1] - run[0]
            run = [start, end]
        run[1] = max(run[1], end)
        latest = end if latest is None else max(latest, end)
    return total + (0 if run is None else run[1] - run[0])


@pytest.mark.parametrize("scale", [1, 10**12, 2**53], ids=["ns", "hours", "beyond 64 bits together"])
def test_union_lengths_per_group_are_a_direct_sweeps(scale):
    """`steps.union_ns` (the time kernels cover per step and device): per group, the length a
    direct sweep gives, with zero-length, negative and missing ends, groups with a null key, and
    times so far apart that the groups cannot share one 64-bit line (they are then swept apart)."""
    import random

    from pipeline.runs.steps import union_ns

    rng = random.Random(scale % 1000)
    rows = []
    for g in range(12):
        for d in (None, 0, 1):
            for s in rng.sample(range(-50, 400), rng.randint(1, 30)):  # distinct starts: no tie order
                end = None if not rng.randrange(20) else s + rng.choice([0, rng.randint(0, 90), -rng.randint(1, 5)])
                rows.append((g, d, s * scale, None if end is None else end * scale))
    frame = pl.DataFrame(rows, schema=["g", "d", "ts_ns", "end_ns"], orient="row")
    got = {(g, d): n for g, d, n in union_ns(frame, ["g", "d"]).collect().iter_rows()}
    want: dict = {}
    for g, d, s, e in rows:
        want.setdefault((g, d), []).append((s, s if e is None else e))
    assert got == {k: _swept(v) for k, v in want.items()}
    assert union_ns(frame.clear(), ["g", "d"]).collect().is_empty()


@pytest.mark.parametrize("scale", [1, 2**53], ids=["ns", "beyond 64 bits together"])
def test_kernel_cover_is_three_direct_sweeps(scale):
    """`steps.kernel_cover_ns` (a step's kernel, compute and communication time on a device, sorted
    once for the three): per group, what direct sweeps of all its kernels, of those not
    communication and of those that are give (0 where it has none), and exposed communication
    the kernel time compute leaves; groups of only one kind included, and kernels of no known
    kind (null), which count in the kernel time only."""
    import random

    from pipeline.runs.steps import kernel_cover_ns

    rng = random.Random(7)
    rows = []
    for g in range(10):
        kinds = [False] if g == 0 else [True] if g == 1 else [False, True]  # compute only, comm only, both
        for d in (None, 0, 1):
            for s in rng.sample(range(-50, 400), rng.randint(1, 25)):
                end = s + rng.choice([0, rng.randint(0, 90)])
                rows.append((g, d, s * scale, end * scale, None if not rng.randrange(15) else rng.choice(kinds)))
    frame = pl.DataFrame(rows, schema=["g", "d", "ts_ns", "end_ns", "comm"], orient="row")
    got = {r[:2]: r[2:] for r in kernel_cover_ns(frame, ["g", "d"]).iter_rows()}
    want = {}
    for key in {(g, d) for g, d, *_ in rows}:
        mine = [(s, e, c) for g, d, s, e, c in rows if (g, d) == key]
        kernel = _swept([(s, e) for s, e, _ in mine])
        compute = _swept([(s, e) for s, e, c in mine if c is False])
        comm = _swept([(s, e) for s, e, c in mine if c is True])
        want[key] = (kernel, compute, comm, kernel - compute)
    assert got == want
    assert kernel_cover_ns(frame.clear(), ["g", "d"]).is_empty()
