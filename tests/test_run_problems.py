"""A run says what it left out (issue 28): truncated ranks, files that are no trace, two traces of
one rank, traces without a rank, ranks with no or fewer collectives; on a run folder (one
streaming pass per rank, `runs.scan`) and on a dataset, which agree. And a run folder's first
look is kept (the cache): the second reads no trace."""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
from pathlib import Path

import pytest

from conftest import TESTS
from pipeline.dataset.batch import run_batch
from pipeline.runs.report import analyze_runs, measure, problems_of, runs_json
from pipeline.synthetic import write_run

RUNS = TESTS / "data" / "runs"


def _cut(src: Path, dst: Path, share: float) -> None:
    raw = gzip.decompress(src.read_bytes())
    dst.write_bytes(raw[: int(len(raw) * share)])


@pytest.fixture
def hostile(shared_traces, tmp_path) -> Path:
    """The real DLRM run with rank 3 cut at 40%, a notes.json that is no trace, and a second,
    different trace of rank 0 (the acceptance check's "run folder with problems")."""
    real = shared_traces.parent / "runs" / "dlrm8_v100"
    if not real.is_dir():
        pytest.skip("../shared/runs/dlrm8_v100 not found")
    run = tmp_path / "badrun"
    run.mkdir()
    files = sorted(real.glob("*.json.gz"))
    for f in files:
        shutil.copy(f, run)
    (run / files[3].name).unlink()
    _cut(files[3], run / files[3].name[: -len(".gz")], 0.4)
    (run / "notes.json").write_text('{"comment": "not a trace"}')
    doc = json.loads(gzip.decompress(files[0].read_bytes()))
    doc["traceName"] = "a second trace of rank 0"
    (run / "rank0_again.json").write_text(json.dumps(doc))
    return run


def _kinds(problems: list[dict]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for p in problems:
        out.setdefault(p["problem"], set()).add(p["file"])
    return out


@pytest.mark.real
def test_a_hostile_run_folder_names_each_problem(hostile, tmp_path, run_cli):
    p = run_cli(["ranks", hostile, "--format", "json"], env={"TRACEPIPE_CACHE_DIR": str(tmp_path / "c")})
    assert p.returncode == 1 and "Traceback" not in p.stderr
    lines = p.stderr.strip().splitlines()
    assert 3 <= len(lines) <= 12
    for name in ("worker3_step_12.1694128201557.json", "notes.json", "rank0_again.json"):
        assert any(name in ln for ln in lines), (name, lines)
    run = json.loads(p.stdout)["runs"][0]
    kinds = _kinds(run["problems"])
    assert kinds["not a trace"] == {"notes.json"}
    assert kinds["truncated"] == kinds["no collectives"] == {"worker3_step_12.1694128201557.json"}
    (dup,) = [x for x in run["problems"] if x["problem"] == "duplicate rank"]
    assert "rank 0" in dup["detail"] and "kept" in dup["detail"]
    assert {dup["file"]} | {"rank0_again.json"} == {"rank0_again.json", "worker0_step_12.1694128201545.json.gz"}
    three = next(r for r in run["ranks_detail"] if r["rank"] == 3)
    assert three["collectives"] == 0 and three["missing"] == 8 and three["status"] == "truncated"
    assert three["wait_us"] is None  # not a wait of 0: it recorded nothing
    assert all(c["n_ranks"] == 8 and c["ranks_present"] == 7 and "3" not in c["wait_us"] for c in run["collectives"])


@pytest.mark.real
def test_a_dataset_of_the_hostile_folder_says_the_same(hostile, tmp_path):
    ds = tmp_path / "ds"
    run_batch(hostile, ds, jobs=1)
    from_ds = _kinds(problems_of(ds))
    from_folder = _kinds(problems_of(hostile))
    assert from_ds == from_folder
    assert set(from_ds) == {"not a trace", "truncated", "duplicate rank", "no collectives"}


@pytest.mark.real
def test_analyze_of_a_dataset_with_problems_says_so(hostile, tmp_path, run_cli):
    ds = tmp_path / "ds"
    run_batch(hostile, ds, jobs=1)
    cut = run_cli(["analyze", ds, "--trace", "worker3_step_12.1694128201557", "--section", "devices"])
    assert cut.returncode == 1 and "worker3_step_12.1694128201557: truncated" in cut.stderr
    fine = run_cli(["analyze", ds, "--trace", "worker1_step_12.1694128201556", "--section", "devices"])
    (line,) = fine.stderr.strip().splitlines()
    assert fine.returncode == 1 and "not whole" in line and "notes.json" in line and "worker3" in line


def test_a_rank_cut_short_counts_only_what_it_recorded(tmp_path, run_cli):
    """gloo4 (real, 4 processes) with rank 2 cut at 60%: its later collectives are not waits of 0."""
    run = tmp_path / "gloo4"
    shutil.copytree(RUNS / "gloo4", run)
    (run / "rank-2.json.gz").unlink()
    _cut(RUNS / "gloo4" / "rank-2.json.gz", run / "rank-2.json", 0.6)
    doc = runs_json(measure(run))["runs"][0]
    two = next(r for r in doc["ranks_detail"] if r["rank"] == 2)
    assert two["status"] == "truncated" and 0 < two["collectives"] < two["expected"]
    assert two["missing"] == two["expected"] - two["collectives"]
    kinds = _kinds(doc["problems"])
    assert kinds["truncated"] == kinds["fewer collectives"] == {"rank-2.json"}
    partial = [c for c in doc["collectives"] if c["ranks_present"] < c["n_ranks"]]
    assert partial and all("2" not in c["wait_us"] for c in partial)
    full = [c for c in doc["collectives"] if "2" in c["wait_us"]]
    assert sum(c["wait_us"]["2"] for c in full) == pytest.approx(two["wait_us"])
    p = run_cli(["ranks", run, "--no-cache"])
    assert p.returncode == 1 and "rank-2.json: fewer collectives" in p.stderr
    assert "Problems:" in p.stdout


def test_a_trace_without_rank_is_named(tmp_path):
    run = tmp_path / "gloo4"
    shutil.copytree(RUNS / "gloo4", run)
    doc = json.loads(gzip.decompress((run / "rank-1.json.gz").read_bytes()))
    del doc["distributedInfo"]["rank"]
    doc["traceName"] = "another"
    (run / "extra.json").write_text(json.dumps(doc))
    kinds = _kinds(problems_of(run))
    assert kinds == {"no rank": {"extra.json"}}


def test_a_run_none_of_whose_traces_says_its_rank_leads_with_that(tmp_path, run_cli):
    """A folder of single traces (none says its rank) read as a run led with "Nothing to fix
    found", as if its ranks had been compared and found fine; it now says no rank was read, in
    text and on the page. A run with one rank left out (rank-less extra.json) keeps its findings."""
    folder = tmp_path / "single"
    folder.mkdir()
    for name in ("train", "eval"):
        doc = json.loads(gzip.decompress((RUNS / "gloo4" / "rank-1.json.gz").read_bytes()))
        del doc["distributedInfo"]["rank"]
        (folder / f"{name}.json").write_text(json.dumps(doc))
    p = run_cli(["ranks", folder, "--no-cache"])
    assert p.returncode == 1, p.stderr
    lead = p.stdout.split("Runs: ranks present and missing")[0]
    assert "No rank read: none of this run's traces says its rank" in lead and "Nothing to fix" not in lead
    page = tmp_path / "run.html"
    assert run_cli(["ranks", folder, "--no-cache", "--format", "html", "-o", page]).returncode == 1
    html = page.read_text()
    assert "No rank read: none of this run&#39;s traces says its rank" in html
    assert "0 of 4" in html and "no trace says its rank" in html  # the tile
    mixed = tmp_path / "gloo4"
    shutil.copytree(RUNS / "gloo4", mixed)
    shutil.copy(folder / "train.json", mixed / "extra.json")
    p = run_cli(["ranks", mixed, "--no-cache"])
    assert "No rank read" not in p.stdout and "What to fix across the ranks" in p.stdout


def test_the_ranks_tile_lists_missing_ranks_as_spans():
    """The run page's tile listed each missing rank: 127 of them for one rank of 128."""
    from pipeline.render.html.runs import _ranks_note

    assert _ranks_note(list(range(1, 128)), True, [0]) == "missing: 1-127"
    assert _ranks_note([2, 4, 5, 6], True, [0, 1, 3]) == "missing: 2, 4-6"
    many = list(range(1, 40, 2))
    assert _ranks_note(many, True, [0]) == "missing: 1, 3, 5, 7, 9, 11, 13, 15, … (20 ranks)"
    assert _ranks_note([], False, [0, 1]) == "world size not recorded: ranks above 1 may be missing"


def test_a_run_without_its_world_size_does_not_claim_every_rank(tmp_path, run_cli):
    """A run whose traces record no world size takes the highest rank read + 1 for it, and the
    page's "ranks traced" tile said "every rank of the world": ranks 0-3 of a run of 8 looked
    whole. The world size is now said to be a lower bound (`world_size_from`), and the tile says
    ranks above the highest may be missing."""
    run = tmp_path / "gloo4"
    run.mkdir()
    for src in sorted((RUNS / "gloo4").glob("rank-*.json.gz")):
        doc = json.loads(gzip.decompress(src.read_bytes()))
        del doc["distributedInfo"]["world_size"]
        (run / src.name.removesuffix(".gz")).write_text(json.dumps(doc))
    page = tmp_path / "run.html"
    assert run_cli(["ranks", run, "--no-cache", "--format", "html", "-o", page]).returncode == 0
    html = page.read_text()
    assert "every rank of the world" not in html and "ranks above 3 may be missing" in html
    report = json.loads(run_cli(["ranks", run, "--no-cache", "--format", "json"]).stdout)["runs"][0]
    assert (report["world_size"], report["world_size_from"]) == (4, "highest rank read")  # a lower bound
    (run / "rank-1.json").unlink()
    report = json.loads(run_cli(["ranks", run, "--no-cache", "--format", "json"]).stdout)["runs"][0]
    assert report["missing_ranks"] == [1]  # a gap below the highest rank read is known missing
    assert report["world_size"] == 4 and report["ranks"] == [0, 2, 3]
    whole = tmp_path / "whole.html"
    assert run_cli(["ranks", RUNS / "gloo4", "--no-cache", "--format", "html", "-o", whole]).returncode == 0
    assert "every rank of the world" in whole.read_text()


def test_a_trace_of_another_time_is_left_out_not_compared(tmp_path, run_cli):
    """A folder of traces of several jobs read as one run matched their collectives by order: a
    rank recorded 250 days apart was "the straggler", its clock offset 250 days. A rank whose
    collectives ran over ten minutes from the others' is now a problem (`another time`), left
    out of the run (a missing rank), and no finding names it; the three that ran together stay."""
    run = tmp_path / "mixed"
    shutil.copytree(RUNS / "gloo4", run)
    late = run / "rank-2.json.gz"
    doc = json.loads(gzip.decompress(late.read_bytes()))
    for e in doc["traceEvents"]:
        if isinstance(e.get("ts"), (int, float)):
            e["ts"] += 86_400e6 + 3_600e6  # a day and an hour later
    doc["distributedInfo"]["world_size"] = 300  # another job's world: not this run's
    late.write_bytes(gzip.compress(json.dumps(doc).encode()))
    assert _kinds(problems_of(run)) == {"another time": {"rank-2.json.gz"}}
    report = json.loads(run_cli(["ranks", run, "--no-cache", "--format", "json"]).stdout)["runs"][0]
    assert report["ranks"] == [0, 1, 3] and report["missing_ranks"] == [2] and report["world_size"] == 4
    assert not re.search(r"\brank 2(?![\d.])", json.dumps(report["findings"]))  # not "rank 2.13 ms"
    p = run_cli(["ranks", run, "--no-cache"])
    assert p.returncode == 1 and "rank 2's collectives ran 1 day after those of ranks 0, 1, 3" in p.stderr
    p = run_cli(["combine", run, "--align", "clocks", "-o", tmp_path / "one.json"])  # says what it left out
    assert p.returncode == 1 and p.stdout.startswith("3 traces (rank 0") and "rank-2.json.gz: another time" in p.stderr
    near = tmp_path / "near"  # a rank 5 minutes late is the same job on a skewed clock: kept
    shutil.copytree(RUNS / "gloo4", near)
    doc = json.loads(gzip.decompress((near / "rank-2.json.gz").read_bytes()))
    for e in doc["traceEvents"]:
        if isinstance(e.get("ts"), (int, float)):
            e["ts"] += 300e6
    (near / "rank-2.json.gz").write_bytes(gzip.compress(json.dumps(doc).encode()))
    assert problems_of(near) == []
    # Kineto's ts count from baseTimeNanoseconds, the wall clock floored to three months: a rank
    # started before such a boundary has a base three months earlier and ts as much larger
    quarter = tmp_path / "quarter"
    shutil.copytree(RUNS / "gloo4", quarter)
    doc = json.loads(gzip.decompress((quarter / "rank-2.json.gz").read_bytes()))
    doc["baseTimeNanoseconds"] -= 7_889_238 * 10**9
    for e in doc["traceEvents"]:
        if isinstance(e.get("ts"), (int, float)):
            e["ts"] += 7_889_238e6
    (quarter / "rank-2.json.gz").write_bytes(gzip.compress(json.dumps(doc).encode()))
    assert problems_of(quarter) == []


def test_a_folder_without_traces_is_an_error_not_an_empty_report(tmp_path, run_cli):
    (tmp_path / "empty").mkdir()
    p = run_cli(["ranks", tmp_path / "empty", "--no-cache"])
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.count("\n") == 1 and "holds no trace" in p.stderr
    (tmp_path / "empty" / "notes.json").write_text('{"comment": "not a trace"}')
    p = run_cli(["ranks", tmp_path / "empty", "--no-cache"])  # a file that is no trace is a problem, said
    assert p.returncode == 1 and "notes.json: not a trace" in p.stderr


def test_clean_runs_have_no_problems(tmp_path, run_cli):
    assert problems_of(RUNS / "gloo4") == []
    assert problems_of(RUNS / "gloo4_partial") == []  # a rank missing from a run is normal
    p = run_cli(["ranks", RUNS / "gloo4", "--no-cache", "--format", "csv"])
    assert p.returncode == 0 and p.stderr == "" and "# problems" not in p.stdout


@pytest.mark.parametrize("name", ["gloo4", "gloo4_sub", "gloo4_partial"])
def test_a_run_folder_and_its_dataset_give_one_answer(tmp_path, name):
    """The streaming pass over the trace files and the dataset's tables, measured by one core."""
    ds = tmp_path / "ds"
    run_batch(RUNS / name, ds, jobs=1)
    a = runs_json(measure(RUNS / name, use_cache=False))["runs"][0]
    b = runs_json(analyze_runs(ds))["runs"][0]
    for key in ("ranks", "missing_ranks", "stragglers", "by_kind", "steps", "desyncs", "problems"):
        assert a[key] == b[key], key
    assert a["clock_offset_us"] == pytest.approx(b["clock_offset_us"])
    assert a["collectives"] == b["collectives"]


def test_a_synthetic_run_folder_matches_its_dataset(tmp_path):
    write_run(tmp_path / "run", 6, 40, straggler=4, delay_us=900.0, delayed=7, offsets_us=[0, 300, -200, 50, 0, 10])
    ds = tmp_path / "ds"
    run_batch(tmp_path / "run", ds, jobs=1)
    a = runs_json(measure(tmp_path / "run", use_cache=False, jobs=2))["runs"][0]
    b = runs_json(analyze_runs(ds))["runs"][0]
    assert a["collectives"] == b["collectives"] and a["steps"] == b["steps"]
    assert a["stragglers"][0]["rank"] == 4


def test_the_first_look_is_kept_and_checked(tmp_path, run_cli):
    """A second `ranks` of a folder reads no trace (the cache); a trace changed since is read again."""
    run = tmp_path / "run"
    write_run(run, 4, 12, straggler=1, delay_us=700.0, delayed=2)
    env = {"TRACEPIPE_CACHE_DIR": str(tmp_path / "cache")}
    first = run_cli(["ranks", run, "--format", "json"], env=env)
    assert first.returncode == 0, first.stderr
    assert len(list((tmp_path / "cache" / "runs").glob("*/*.rank"))) == 4
    victim = run / "rank-3.json.gz"
    st = victim.stat()
    victim.write_bytes(b"x" * st.st_size)  # not a trace any more, same size and time: the cache holds
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))
    again = run_cli(["ranks", run, "--format", "json"], env=env)
    assert again.returncode == 0 and again.stdout == first.stdout
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # touched: read again
    changed = run_cli(["ranks", run, "--format", "json"], env=env)
    assert changed.returncode == 1 and "rank-3.json.gz: not a trace" in changed.stderr
    fresh = run_cli(["ranks", run, "--format", "json", "--no-cache"], env={"TRACEPIPE_CACHE_DIR": str(tmp_path / "c2")})
    assert fresh.returncode == 1 and not (tmp_path / "c2").exists()


def test_the_light_path_and_typer_agree(tmp_path, run_cli, capsys):
    """`ranks` parsed by argparse (a clean line) or by typer (any mistake) runs the same command."""
    run = tmp_path / "run"
    write_run(run, 4, 8, straggler=2, delay_us=500.0, delayed=3)
    env = {"TRACEPIPE_CACHE_DIR": str(tmp_path / "cache")}
    light = run_cli(["ranks", run, "--top", "3", "-w", "100"], env=env)
    from pipeline.cli.entry import run as typer_run

    assert typer_run(["ranks", str(run), "--top", "3", "-w", "100"]) == light.returncode == 0
    assert capsys.readouterr().out == light.stdout
    typo = run_cli(["ranks", run, "--tpo", "3"], env=env)
    assert typo.returncode == 2 and "No such option: --tpo" in typo.stderr and len(typo.stderr.splitlines()) == 1


def test_analyze_of_one_rank_of_a_folder_is_kept(tmp_path, run_cli):
    """`analyze RUN_DIR --trace STEM` flattens that trace once into the folder's cache."""
    run = tmp_path / "run"
    write_run(run, 2, 8)
    env = {"TRACEPIPE_CACHE_DIR": str(tmp_path / "cache")}
    first = run_cli(["analyze", run, "--trace", "rank-1", "--section", "kernels", "-w", "0"], env=env)
    assert first.returncode == 0, first.stderr
    assert [p.name for p in (tmp_path / "cache" / "runs").glob("*/flat/*/rank-1")] == ["rank-1"]
    victim = run / "rank-1.json.gz"
    st = victim.stat()
    victim.write_bytes(b"x" * st.st_size)  # same size and time: the kept tables answer
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))
    again = run_cli(["analyze", run, "--trace", "rank-1", "--section", "kernels", "-w", "0"], env=env)
    assert again.returncode == 0 and again.stdout == first.stdout
    many = run_cli(["analyze", run], env=env)
    assert many.returncode == 2 and "rank-0" in many.stderr and len(many.stderr.splitlines()) == 1
