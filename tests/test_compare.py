"""compare and trend end to end: generated runs with known changes and realistic noise
(`pipeline.synthetic.regression`) batched into a dataset, compared and followed through the CLI in
every format; runs made from a real trace; the CI gate; a dataset written by several processes
at once (`pipeline.dataset.append`)."""

from __future__ import annotations

import gzip
import json
import multiprocessing as mp
import random
import shutil
from pathlib import Path

import polars as pl
import pytest

from pipeline.compare.report import compare_runs
from pipeline.compare.runs import load_run
from pipeline.dataset.append import add_trace
from pipeline.dataset.batch import run_batch
from pipeline.dataset.layout import STAGING, held_stage, recover
from pipeline.synthetic.regression import kernel_name, write_runs

CHANGES = {3: (4, 1.3), 7: (4, 0.7), 11: (4, 1.15)}  # kernel -> (first run changed, factor)
SEED = 0  # of the noise the real-trace runs get


@pytest.fixture(scope="module")
def nightly(tmp_path_factory) -> tuple[Path, dict]:
    """Six nightly runs of 4 ranks x 3 steps, 24 kernels; from run04 on, three kernels changed."""
    tmp = tmp_path_factory.mktemp("nightly")
    truth = write_runs(tmp / "arch", runs=6, world=4, steps=3, kernels=24, changes=CHANGES, run_sd=0.01)
    run_batch(tmp / "arch", tmp / "ds", jobs=1)
    return tmp / "ds", truth


def flagged(doc: dict, level: str = "kernel") -> dict[str, str]:
    return {
        r["name"]: r["verdict"]
        for r in doc["rows"]
        if r["level"] == level and r["verdict"] in ("regressed", "improved")
    }


@pytest.mark.slow
def test_changes_found_and_nothing_else(nightly, run_cli):
    ds, truth = nightly
    p = run_cli(["compare", ds, "--base", "run03", "--new", "run04", "--format", "json"])
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    want = {kernel_name(k): "regressed" if f > 1 else "improved" for k, (_, f) in CHANGES.items()}
    assert flagged(doc) == want
    row = next(r for r in doc["rows"] if r["name"] == kernel_name(3))
    assert row["level"] == "kernel" and row["delta_pct"] == pytest.approx(30, abs=8)
    assert row["ci_low_pct"] < row["delta_pct"] < row["ci_high_pct"] and row["q"] < 0.01
    assert {"base_us", "new_us", "delta_pct", "verdict", "q", "p", "base_n", "new_n"} <= set(row)
    assert row["base_n"] == row["new_n"] == 4 and row["units"] == "ranks"
    ops = flagged(doc, "op")
    assert ops == {"aten::op_03": "regressed", "aten::op_07": "improved", "aten::op_11": "regressed"}
    assert (
        doc["base"]["run"].endswith("run03")
        and doc["base"]["ranks"] == 4
        and doc["base"]["time"].startswith("2023-11-17")
    )
    assert doc["problems"] == [] and doc["method"]["fdr"] == 0.01
    levels = {r["level"] for r in doc["rows"]}
    assert levels == {"kernel", "op", "category", "collective", "step", "idle"}


@pytest.mark.slow
def test_unchanged_runs_flag_nothing(nightly, run_cli):
    ds, _ = nightly
    for base, new in (("run00", "run01"), ("run01", "run02"), ("run04", "run05")):
        p = run_cli(["compare", ds, "--base", base, "--new", new, "--format", "json", "--fail-above", "5"])
        assert p.returncode == 0, p.stderr
        doc = json.loads(p.stdout)
        assert [r for r in doc["rows"] if r["verdict"] in ("regressed", "improved")] == []


@pytest.mark.slow
def test_gate_fails_on_regression(nightly, run_cli):
    ds, _ = nightly
    p = run_cli(["compare", ds, "--base", "run03", "--new", "run04", "--fail-above", "5", "--format", "csv"])
    assert p.returncode == 1
    assert "--fail-above 5:" in p.stderr and "kernel_03" in p.stderr and len(p.stderr.splitlines()) == 1
    p = run_cli(["compare", ds, "--base", "run03", "--new", "run04", "--fail-above", "50", "--format", "csv"])
    assert p.returncode == 0  # nothing regressed by more than 50%
    rows = pl.read_csv(p.stdout.encode())
    assert {"level", "name", "verdict", "delta_pct", "base_us", "new_us"} <= set(rows.columns)


@pytest.mark.slow
def test_latest_two_runs_by_default_and_table_at_80(nightly, run_cli):
    ds, _ = nightly
    p = run_cli(["compare", ds, "--width", "80", "--top", "5"])
    assert p.returncode == 0, p.stderr
    assert "comparing run05 against run04" in p.stderr
    lines = p.stdout.splitlines()
    assert max(map(len, lines)) <= 80, max(lines, key=len)
    assert lines[0].startswith("base:") and "run04" in lines[0] and "run05" in lines[1]
    assert any(line.startswith("Kernels") for line in lines) and any(line.startswith("Collectives") for line in lines)


@pytest.mark.slow
def test_markdown_and_xlsx(nightly, run_cli, tmp_path):
    ds, _ = nightly
    p = run_cli(["compare", ds, "--base", "run03", "--new", "run04", "--format", "md"])
    assert p.returncode == 0 and "## Kernels" in p.stdout and "| regressed |" in p.stdout
    out = tmp_path / "c.xlsx"
    p = run_cli(["compare", ds, "--base", "run03", "--new", "run04", "--format", "xlsx", "-o", out])
    assert p.returncode == 0, p.stderr
    import openpyxl

    wb = openpyxl.load_workbook(out)
    assert wb.sheetnames[0] == "about" and "kernel" in wb.sheetnames
    names = [c.value for c in wb["kernel"]["B"]][1:]
    assert kernel_name(3) in names  # full names


@pytest.mark.slow
def test_usage_errors_are_one_line(nightly, run_cli):
    ds, _ = nightly
    for args, said in (
        (["--base", "nope", "--new", "run04"], "--base nope: no such run"),
        (["--base", "run04", "--new", "run04"], "same run"),
        (["--base", "run03", "--new", "run04", "--level", "kernels"], "--level kernels"),
        (["--base", "run03", "--new", "run04", "--fdr", "2"], "--fdr"),
    ):
        p = run_cli(["compare", ds, *args])
        assert p.returncode == 2 and said in p.stderr and len(p.stderr.splitlines()) == 1, p.stderr


@pytest.mark.slow
def test_trend_flags_the_change_where_it_happened(nightly, run_cli, tmp_path):
    ds, _ = nightly
    p = run_cli(["trend", ds, "--name", "kernel_0[37]|kernel_10", "--format", "json", "--plot", tmp_path])
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    cps = {c["name"]: c for c in doc["change_points"]}
    assert set(cps) == {kernel_name(3), kernel_name(7)}
    assert cps[kernel_name(3)]["label"] == "run04" and cps[kernel_name(3)]["delta_pct"] > 15
    assert cps[kernel_name(7)]["label"] == "run04" and cps[kernel_name(7)]["delta_pct"] < -15
    runs = [r["label"] for r in doc["rows"] if r["name"] == kernel_name(10)]
    assert runs == [f"run{i:02d}" for i in range(6)]  # time order
    assert (tmp_path / "trend_kernel.png").stat().st_size > 10_000 and (tmp_path / "trend_kernel.svg").is_file()
    p = run_cli(["trend", ds, "--level", "step", "--width", "80"])
    assert p.returncode == 0 and max(map(len, p.stdout.splitlines())) <= 80


def test_trend_over_too_few_runs_says_none_could_be_found(tmp_path, run_cli):
    """Over 2 runs trend said "0 found", as if nothing had changed, where no change point can be
    found: it takes 2 runs on each side. It now says so first among the problems."""
    write_runs(tmp_path / "arch", runs=2, world=1, steps=2, kernels=3, names=["a", "b"])
    run_batch(tmp_path / "arch", tmp_path / "ds", jobs=1)
    p = run_cli(["trend", tmp_path / "ds", "--format", "json"])
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["problems"][0] == "2 runs: a change point needs at least 2 runs on each side, 4 in all"
    p = run_cli(["trend", tmp_path / "ds", "--width", "80"])
    assert "2 runs in time order" in p.stdout and "problem: 2 runs: a change point needs" in p.stdout


@pytest.mark.slow
def test_one_rank_runs_are_tested_over_steps(tmp_path):
    write_runs(tmp_path / "arch", runs=2, world=1, steps=8, kernels=12, changes={2: (1, 1.5)}, names=["a", "b"])
    run_batch(tmp_path / "arch", tmp_path / "ds", jobs=1)
    c = compare_runs(load_run(tmp_path / "ds", "a", "base"), load_run(tmp_path / "ds", "b", "new"))
    assert c.units == "steps" and c.base_units == c.new_units == 8
    k = c.rows.filter(pl.col("level") == "kernel")
    assert k.filter(pl.col("verdict") != "same")["name"].to_list() == [kernel_name(2)]


@pytest.mark.slow
def test_new_gone_and_vendor_renamed_kernels(tmp_path):
    """A kernel found in one run only is new or gone, untested; a kernel whose template arguments
    changed is matched by its name without them, as diff matches across vendors."""
    arch = tmp_path / "arch"
    write_runs(arch, world=2, steps=2, kernels=6, names=["a"])
    write_runs(arch, world=2, steps=2, kernels=7, names=["b"])  # kernel_06 is new
    for f in (arch / "b").glob("*.json.gz"):  # kernel_00 built with other template arguments
        doc = json.loads(gzip.decompress(f.read_bytes()))
        for e in doc["traceEvents"]:
            if e.get("name") == kernel_name(0):
                e["name"] = kernel_name(0).replace("<float, 128>", "<__half, 256>")
        f.write_bytes(gzip.compress(json.dumps(doc).encode()))
    run_batch(arch, tmp_path / "ds", jobs=1)
    c = compare_runs(load_run(tmp_path / "ds", "a", "base"), load_run(tmp_path / "ds", "b", "new"))
    k = {r["name"]: r for r in c.rows.filter(pl.col("level") == "kernel").iter_rows(named=True)}
    assert k[kernel_name(6)]["verdict"] == "new" and k[kernel_name(6)]["p"] is None
    assert k["kernel_00"]["base_names"] == [kernel_name(0)] and k["kernel_00"]["verdict"] == "same"
    assert kernel_name(0) not in k


@pytest.mark.slow
def test_missing_rank_is_said(tmp_path, run_cli):
    write_runs(tmp_path / "arch", runs=2, world=4, steps=2, kernels=6)
    (tmp_path / "arch" / "run01" / "rank-2.json.gz").unlink()
    (tmp_path / "arch" / "run01" / "notes.json").write_text('{"not": "a trace"}')
    run_batch(tmp_path / "arch", tmp_path / "ds", jobs=1)
    p = run_cli(["compare", tmp_path / "ds", "--base", "run00", "--new", "run01", "--format", "json"])
    assert p.returncode == 1
    assert "run run01: 1 of 4 ranks have no trace (rank 2)" in p.stderr
    assert "run run01: notes.json: not a trace" in p.stderr  # as `tracepipe ranks` says it
    assert len(json.loads(p.stdout)["problems"]) == 2


@pytest.mark.slow
@pytest.mark.real
def test_runs_from_a_real_trace(shared_traces, tmp_path):
    """Runs of 8 ranks (as make_regression.py makes them) from the real H100 trace, noise per rank
    and instance, one kernel slowed by 40% in the new run: it alone is flagged among the kernels, and
    nothing between base and again."""
    src = json.loads(gzip.decompress((shared_traces / "tracelens" / "h100_qwen1.5_0.5b.json.gz").read_bytes()))
    kernels = [e for e in src["traceEvents"] if e.get("cat") == "kernel" and e.get("ph") == "X"]
    counts: dict[str, int] = {}
    for e in kernels:
        counts[e["name"]] = counts.get(e["name"], 0) + 1
    slowed = sorted((n for n in counts if counts[n] >= 20), key=lambda n: -counts[n])[1]
    for run, factor in (("base", 1.0), ("again", 1.0), ("new", 1.4)):
        for rank in range(8):
            rng = random.Random(f"{SEED}-{run}-{rank}")
            system = {n: rng.lognormvariate(0, 0.04) for n in counts}
            doc = dict(src)
            doc["traceEvents"] = [
                {
                    **e,
                    "dur": round(
                        e["dur"]
                        * system[e["name"]]
                        * rng.lognormvariate(0, 0.08)
                        * (factor if e["name"] == slowed else 1),
                        3,
                    ),
                }
                if e.get("cat") == "kernel" and e.get("ph") == "X"
                else e
                for e in src["traceEvents"]
            ]
            doc["distributedInfo"] = {"rank": rank, "world_size": 8}
            (tmp_path / "arch" / run).mkdir(parents=True, exist_ok=True)
            (tmp_path / "arch" / run / f"rank-{rank}.json").write_text(json.dumps(doc))
    run_batch(tmp_path / "arch", tmp_path / "ds", jobs=1)
    for new, want in (("new", {slowed: "regressed"}), ("again", {})):
        c = compare_runs(load_run(tmp_path / "ds", "base", "base"), load_run(tmp_path / "ds", new, "new"))
        k = c.rows.filter((pl.col("level") == "kernel") & pl.col("verdict").is_in(["regressed", "improved"]))
        got = dict(k.select("name", "verdict").iter_rows())
        assert got == want, (new, k.select("name", "delta_pct", "q", "p", "base_count").to_dicts())


# ------------------------------------------------------------------ written as traces are born
def _add(args):
    ds, path, source = args
    return add_trace(ds, path, source).status


@pytest.mark.slow
def test_concurrent_writers_commit_every_trace_once(tmp_path):
    """Four processes add 8 traces into one dataset at once (each trace twice): every trace is in
    it exactly once, whole, and the readers see nothing half-written."""
    write_runs(tmp_path / "src", runs=2, world=4, steps=1, kernels=4)
    jobs = [
        (str(tmp_path / "ds"), str(f), f"night/{f.parent.name}/{f.name}")
        for f in sorted((tmp_path / "src").rglob("*.json.gz"))
    ]
    with mp.get_context("spawn").Pool(4) as pool:
        got = pool.map(_add, jobs + jobs)
    assert got.count("ok") == 8 and got.count("already") == 8
    import pipeline

    trace = pipeline.scan(tmp_path / "ds", "trace").select("trace_id", "source_path", "rank").collect()
    assert trace.height == 8 and trace["trace_id"].n_unique() == 8
    assert sorted(trace["rank"].to_list()) == [0, 0, 1, 1, 2, 2, 3, 3]
    per = pipeline.scan(tmp_path / "ds", "gpu_ops").group_by("trace_id").len().collect()
    assert per.height == 8 and per["len"].n_unique() == 1
    assert not any((tmp_path / "ds" / STAGING).glob("*/*.parquet"))


def test_held_staging_survives_recovery(tmp_path):
    """A writer's staging folder (held) is left alone by another writer's clean-up; a leftover of a
    killed one is removed."""
    ds = tmp_path / "ds"
    ds.mkdir()
    (ds / STAGING / "dead").mkdir(parents=True)
    with held_stage(ds) as stage:
        (stage / "x.parquet").write_bytes(b"work in progress")
        recover(ds)
        assert (stage / "x.parquet").is_file() and not (ds / STAGING / "dead").exists()
    assert not stage.exists()
    shutil.rmtree(ds)
