"""Findings: each rule on the real traces that have it (and those that must not), the contract every
finding keeps on every real trace (shape, bounds, order), the real before/after pair's saving
inside its estimate, the run rules on a real 8-rank run, and the What to fix block in a browser."""

from __future__ import annotations

import gzip
import json
import re
import shutil
from functools import cache
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from pipeline import report as rp
from pipeline.findings import spans
from pipeline.findings.finding import ABOUT_THE_WINDOW, Finding, capped, narrowed, ranked
from pipeline.findings.limits import table
from pipeline.findings.rules import RULES
from pipeline.findings.run import RUN_RULES

VOCABULARY = {
    "host_bound",
    "small_kernels",
    "sync",
    "dataloader",
    "fusion",
    "layout",
    "precision",
    "optimizer",
    "copies",
    "comm_exposed",
    "straggler",
    "compile_breaks",
    "warmup",
}
NOT_IN_SHARED = {"straggler", "warmup"}  # a run rule; no shared trace holds a compilation (tests/data/warmup do)
WARMUP = Path(__file__).resolve().parent / "data" / "warmup"  # scripts/record_warmup_traces.py
DOC = Path(__file__).resolve().parents[1] / "docs" / "guides" / "reading-findings.md"


@pytest.fixture(scope="module")
def flat_dirs(shared_traces, tmp_path_factory):
    """Every shared trace flattened once, by stem."""
    from pipeline.flatten import flatten

    out = tmp_path_factory.mktemp("findings")
    paths = sorted(shared_traces.glob("*/*.json.gz"))
    return {p.name.removesuffix(".json.gz"): flatten(p, out / p.parent.name).out_dir for p in paths}


@cache
def _findings(flat_dir: Path) -> tuple[dict, ...]:
    sections = rp.analyze(rp.Flat(flat_dir), only=["findings"])
    return tuple(sections["findings"].to_dicts())


def ids(flat_dirs, stem: str) -> dict[str, dict]:
    return {f["id"]: f for f in _findings(flat_dirs[stem])}


# ------------------------------------------------------------------ each rule on real traces
def test_layout_on_the_vgg13_and_nothing_host_side(flat_dirs):
    found = ids(flat_dirs, "h100_vgg13")
    assert "layout" in found and not {"host_bound", "sync", "dataloader", "small_kernels"} & set(found)
    f = found["layout"]
    names = " ".join(e["name"] for e in f["evidence"])
    assert "nchwToNhwcKernel" in names and "nhwcToNchwKernel" in names
    assert "channels_last" in f["remedy"] and f["section"] == "kernels"
    # ~20% of its 347 ms of GPU time are conversions: the device saving is about that, the wall
    # saving a little less (95% of the device's time is on the critical path)
    assert 30e3 < f["gpu_gain_us"][0] < f["gpu_gain_us"][1] < 70e3
    assert f["gain_us"][1] <= f["gpu_gain_us"][1]


def test_fusion_on_the_h100_qwen_names_its_chain_and_patterns(flat_dirs):
    found = ids(flat_dirs, "h100_qwen1.5_0.5b")
    assert "fusion" in found and not {"host_bound", "dataloader"} & set(found)
    f = found["fusion"]
    assert next(iter(found)) == "fusion"  # the largest saving
    chain = [e for e in f["evidence"] if e["what"] == "chain"]
    assert chain and " → " in chain[0]["name"] and chain[0]["count"] >= 2
    assert "RMSNorm" in f["title"] and "SwiGLU" in f["title"] and "torch.compile" in f["remedy"]
    # copy kernels are `copies`', not counted twice (a chain may show the casts inside it)
    assert "copies" in found and not any("copy" in e["name"] for e in f["evidence"] if e["what"] == "op")


def test_dataloader_precision_copies_and_sync_on_the_rtx2080_resnet(flat_dirs):
    found = ids(flat_dirs, "rtx2080_resnet")
    assert {"dataloader", "precision", "copies", "sync"} <= set(found)
    assert next(iter(found)) == "dataloader"  # the device idles 46% of the window waiting for batches
    p = found["precision"]
    assert "autocast" in p["remedy"] and "GradScaler" in p["remedy"]  # Turing: FP16 tensor cores
    assert "sgemm" in " ".join(e["name"] for e in p["evidence"])
    # a device-side fix on a trace the host bounds: less wall time than device time
    assert p["gain_us"][1] < 0.7 * p["gpu_gain_us"][1]
    assert "Pageable" in " ".join(e["name"] for e in found["copies"]["evidence"])
    assert "pin_memory" in found["copies"]["remedy"]


def test_dataloader_without_workers_says_so(flat_dirs):
    f = ids(flat_dirs, "v100_tbplugin_resnet50")["dataloader"]  # the TensorBoard plugin's num_workers=0 sample
    assert "num_workers=0" in f["title"] and "num_workers" in f["remedy"]


def test_host_side_findings_on_host_bound_traces(flat_dirs):
    assert "host_bound" in ids(flat_dirs, "a100_nccl")
    assert {"host_bound", "small_kernels"} <= set(ids(flat_dirs, "b200_eager"))
    # a100_nccl's device is off the critical path: its device-side findings save device time only
    for f in _findings(flat_dirs["a100_nccl"]):
        if f["gpu_gain_us"] and f["id"] in ("fusion", "layout"):
            assert f["gain_us"][1] < 0.05 * f["gpu_gain_us"][1]


def test_compile_breaks_count_same_direction_gaps_only(flat_dirs):
    # a100_old_format compiles 7 forward and 7 backward graphs per step: 12 breaks per step
    assert "12 per step" in ids(flat_dirs, "a100_old_format_rank0")["compile_breaks"]["title"]
    # diff_test_v100 runs one forward and one backward graph per step: the gap between them is
    # the loss and autograd, no break
    assert "compile_breaks" not in ids(flat_dirs, "diff_test_v100")


def _warmup_findings(name: str, tmp_path) -> list[dict]:
    from pipeline.flatten import flatten

    flat = flatten(WARMUP / f"{name}.json.gz", tmp_path / name).out_dir
    return list(_findings(flat))


def test_warmup_when_the_window_holds_torch_compile_compiling(tmp_path):
    """Real CPU traces of a compiled MLP (torch 2.13): profiled from its first call, the window is
    its compilation and nothing else said so; warmed up first, nothing is said."""
    cold = _warmup_findings("cold", tmp_path)
    f = cold[0]
    assert f["id"] == "warmup" and f["gain_us"] == [0.0, 0.0] and f["gpu_gain_us"] is None
    assert re.search(r"compiled for 1\.\d+ s \(99% of the window\)", f["title"]), f["title"]
    phases = [e for e in f["evidence"] if e["what"] == "phase"]
    assert phases and all(e["name"].endswith("(dynamo_timed)") and e["note"] == "self time" for e in phases)
    assert [e["time_us"] for e in phases] == sorted((e["time_us"] for e in phases), reverse=True)
    union = next(e for e in f["evidence"] if e["what"] == "measure")
    assert sum(e["time_us"] for e in phases) <= union["time_us"] * 1.001 <= f["window_us"] * 1.001
    assert next(e for e in f["evidence"] if e["what"] == "steps")["count"] == 1  # all in the first step
    assert "schedule(wait=1, warmup=2" in f["remedy"] and "recompiles" in f["remedy"]
    assert "warmup" not in {x["id"] for x in _warmup_findings("warm", tmp_path)}


def test_warmup_says_recompiles_when_later_steps_compile(tmp_path):
    # warmed up at one batch size; two of the four profiled steps bring a new one, and compile
    f = next(x for x in _warmup_findings("recompile", tmp_path) if x["id"] == "warmup")
    assert f["title"].startswith("torch.compile recompiles: 2 of 4 steps compile"), f["title"]


def test_findings_about_the_window_come_before_any_saving():
    def finding(id_: str, high: float) -> Finding:
        return Finding(id_, id_, (high / 2, high), None, "a remedy text", "ops")

    order = [f.id for f in ranked([finding("sync", 5.0), finding("warmup", 0.0), finding("fusion", 9.0)])]
    assert order == ["warmup", "fusion", "sync"]


def test_cpu_only_traces_get_host_findings_and_no_device_time(flat_dirs):
    found = ids(flat_dirs, "optimizer_loop")
    assert next(iter(found)) == "optimizer" and set(found) <= {"optimizer", "fusion", "copies"}
    for stem in ("optimizer_loop", "optimizer_foreach", "cpu_only"):
        assert all(f["gpu_gain_us"] is None for f in _findings(flat_dirs[stem]))


# ------------------------------------------------------------------ the real pair
def _steps_us(path: Path) -> list[float]:
    with gzip.open(path, "rt") as fh:
        ev = json.load(fh)["traceEvents"]
    out: dict[str, float] = {}
    for e in ev:
        if (
            str(e.get("name", "")).startswith("ProfilerStep#")
            and e.get("ph") == "X"
            and e.get("cat") != "gpu_user_annotation"
        ):
            out[e["name"]] = max(out.get(e["name"], 0.0), float(e["dur"]))
    return sorted(out.values())


def test_optimizer_estimate_holds_on_the_real_pair(flat_dirs, shared_traces):
    before, after = (shared_traces / "pairs" / f"optimizer_{s}.json.gz" for s in ("loop", "foreach"))
    sb, sa = _steps_us(before), _steps_us(after)
    realized = (float(np.median(sb)) - float(np.median(sa))) * len(sb)  # ~99 ms over 10 steps
    loop = ids(flat_dirs, "optimizer_loop")["optimizer"]
    lo, hi = loop["gain_us"]
    assert 0.5 * lo <= realized <= 1.5 * hi and hi <= 5 * lo, (lo, hi, realized)
    assert "foreach=True" in loop["remedy"] and "Python" in loop["title"]
    # after the fix the finding shrinks (a fused step is still possible)
    foreach = ids(flat_dirs, "optimizer_foreach")["optimizer"]
    assert foreach["gain_us"][1] < 0.6 * hi and "fused=True" in foreach["remedy"]


# ------------------------------------------------------------------ the contract on every real trace
def _span_and_busy(flat_dir: Path) -> tuple[float, float]:
    """The trace's span (first start to last end of its complete events) and its devices' busy
    time (each device's union of activity, summed), in µs, from the flattened tables."""
    ev = pl.read_parquet(flat_dir / "events.parquet", columns=["ph", "ts_ns", "dur_ns"]).filter(
        (pl.col("ph") == "X") & pl.col("ts_ns").is_not_null()
    )
    end = ev["ts_ns"] + ev["dur_ns"].fill_null(0)
    span = (end.max() - ev["ts_ns"].min()) / 1e3 if ev.height else 0.0
    g = pl.read_parquet(flat_dir / "gpu_ops.parquet", columns=["device", "ts_ns", "dur_ns"]).drop_nulls("ts_ns")
    busy = 0
    for (_,), d in g.group_by("device"):
        u = spans.union(d["ts_ns"].to_numpy(), (d["ts_ns"] + d["dur_ns"].fill_null(0)).to_numpy())
        busy += spans.length(u)
    return span, busy / 1e3


@pytest.mark.slow
def test_every_finding_keeps_the_contract_on_every_real_trace(flat_dirs):
    seen = set()
    for stem, flat_dir in flat_dirs.items():
        found = _findings(flat_dir)
        span, busy = _span_and_busy(flat_dir)
        highs = [f["gain_us"][1] for f in found if f["id"] not in ABOUT_THE_WINDOW]
        assert highs == sorted(highs, reverse=True), stem
        for f in found:
            seen.add(f["id"])
            where = f"{stem}: {f['id']}"
            assert f["id"] in VOCABULARY, where
            assert f["title"].strip() and "\n" not in f["title"] and len(f["title"]) <= 240, where
            lo, hi = f["gain_us"]
            assert 0 <= lo <= hi <= span * 1.001 and hi <= 5.001 * lo or hi == 0, (where, lo, hi, span)
            if f["gpu_gain_us"] is not None:
                glo, ghi = f["gpu_gain_us"]
                assert 0 <= glo <= ghi <= busy * 1.001 and ghi <= 5.001 * glo, (where, glo, ghi, busy)
                assert hi <= ghi * 1.001 or f["id"] in ("optimizer", "copies"), where  # wall from device time
            assert f["evidence"] and all(e["name"] for e in f["evidence"]), where
            assert all(e["pct"] is None or e["pct_of"] for e in f["evidence"]), where  # a share says of what
            assert len(f["remedy"]) >= 10 and f["section"] and f["basis"], where
            assert f["gain_pct"] == pytest.approx([100 * x / f["window_us"] for x in f["gain_us"]], abs=0.01)
    # the shared traces show every trace rule at least once
    assert seen >= VOCABULARY - NOT_IN_SHARED


def test_findings_alone_equal_the_findings_of_the_whole_analysis(flat_dirs):
    f = rp.Flat(flat_dirs["h100_qwen1.5_0.5b"])
    whole = rp.analyze(f)
    assert list(whole)[0] == "findings"
    assert whole["findings"].to_dicts() == list(_findings(flat_dirs["h100_qwen1.5_0.5b"]))


# ------------------------------------------------------------------ every format
def test_findings_first_in_every_format(flat_dirs, tmp_path, run_cli):
    d = flat_dirs["h100_vgg13"]
    p = run_cli(["analyze", d, "--width", "80"])
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[2].startswith("What to fix") and lines[3].startswith(" 1. layout: saves")
    assert max(len(x) for x in lines[:40]) <= 80
    doc = json.loads(run_cli(["analyze", d, "-f", "json", "--section", "findings"]).stdout)
    assert list(doc) == ["trace", "findings"] and doc["findings"][0]["id"] == "layout"
    md = run_cli(["analyze", d, "-f", "md"]).stdout
    assert md.index("## What to fix") < md.index("## Devices") and "1. **layout**" in md
    csv = run_cli(["analyze", d, "-f", "csv", "--section", "findings"]).stdout
    assert csv.splitlines()[0].startswith("rank,id,gain_low_us,gain_high_us") and ",layout," in csv
    assert run_cli(["analyze", d, "-f", "xlsx", "-o", tmp_path / "a.xlsx"]).returncode == 0
    from openpyxl import load_workbook

    assert load_workbook(tmp_path / "a.xlsx").sheetnames[1] == "findings"


def test_a_trace_with_nothing_to_fix_says_so(flat_dirs, run_cli):
    p = run_cli(["analyze", flat_dirs["triton_example"], "--section", "findings"])
    assert p.returncode == 0 and "Nothing to fix found" in p.stdout
    doc = json.loads(run_cli(["analyze", flat_dirs["triton_example"], "-f", "json", "--section", "findings"]).stdout)
    assert doc["findings"] == []


# ------------------------------------------------------------------ whole runs
def test_straggler_and_host_bound_across_the_ranks_of_a_real_run(shared_traces, run_cli, tmp_path):
    run = shared_traces.parent / "runs" / "dlrm8_v100"
    if not run.is_dir():
        pytest.skip("no ../shared/runs/dlrm8_v100")
    p = run_cli(["ranks", run, "-f", "json"])
    found = {f["id"]: f for f in json.loads(p.stdout)["runs"][0]["findings"]}
    assert {"straggler", "host_bound"} <= set(found) and "comm_exposed" not in found
    s = found["straggler"]
    assert s["title"].startswith("Rank 7 is the straggler") and s["evidence"][0]["name"] == "rank 7"
    # its lag behind the next-latest rank over the 5 collectives it was last in: ~1.3 ms
    assert 1.0e3 < s["gain_us"][1] < 1.6e3
    h = found["host_bound"]
    assert all(e["what"] == "rank" for e in h["evidence"]) and len(h["evidence"]) == 8
    assert h["title"].startswith("Host-bound on every rank:")  # each of the 8 below the busy limit
    one = tmp_path / "one"  # a run of one rank said "on every rank"
    one.mkdir()
    shutil.copy(shared_traces / "hta" / "a100_old_format_rank0.json.gz", one)
    solo = json.loads(run_cli(["ranks", one, "-f", "json", "--no-cache"]).stdout)["runs"][0]["findings"]
    assert [f["title"] for f in solo if f["id"] == "host_bound"][0].startswith("Host-bound on its one rank:")
    text = run_cli(["ranks", run, "-w", "100"]).stdout
    assert text.index("What to fix across the ranks") < text.index("Runs: ranks present")


# ------------------------------------------------------------------ the page
def test_the_page_opens_with_what_to_fix_in_a_browser(flat_dirs, tmp_path, run_cli):
    from test_html import in_browser

    out = tmp_path / "vgg.html"
    assert run_cli(["analyze", flat_dirs["h100_vgg13"], "-f", "html", "-o", out]).returncode == 0
    dom, errors = in_browser(out)
    assert not errors
    order = re.findall(r'data-section="([^"]+)"', dom)
    assert order[0] == "findings"
    block = dom.split('data-section="findings"')[1].split("</section>")[0]
    assert re.findall(r'data-finding="([^"]+)"', block) == ["layout"]
    assert 'href="#s-kernels"' in block and 'class="frange wall"' in block and "nchwToNhwcKernel" in block
    assert dom.index('data-section="findings"') < dom.index('id="overview"')


def test_hostile_names_in_findings_are_escaped(tmp_path):
    """A kernel whose name holds markup, in a layout finding's evidence: text on the page, never markup."""
    from pipeline.flatten import flatten
    from pipeline.synthetic import write_demo

    write_demo(tmp_path / "demo.json.gz", 0.2)
    with gzip.open(tmp_path / "demo.json.gz", "rt") as fh:
        d = json.load(fh)
    evil = 'nchwToNhwcKernel<img src=x onerror="alert(1)"></script>'
    for e in d["traceEvents"]:
        if e.get("cat") == "kernel":
            e["name"] = evil
            break
    n = sum(1 for e in d["traceEvents"] if e.get("cat") == "kernel")
    for e in [e for e in d["traceEvents"] if e.get("cat") == "kernel"][: n // 4]:
        e["name"] = evil
    with gzip.open(tmp_path / "evil.json.gz", "wt") as fh:
        json.dump(d, fh)
    f = rp.Flat(flatten(tmp_path / "evil.json.gz", tmp_path / "flat").out_dir)
    html = rp.format_analysis(f, rp.analyze(f), "html")
    block = html.split('data-section="findings"')[1].split("</section>")[0]
    assert 'data-finding="layout"' in block
    assert (
        "<img" not in block and "</script>" not in block and "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in block
    )


# ------------------------------------------------------------------ the rules and their data
def test_one_file_per_rule_each_documented_with_its_thresholds():
    here = Path(rp.__file__).resolve().parent / "findings"
    trace_rules = {r.__name__ for r in RULES}
    run_rules = {r.__name__ for r in RUN_RULES}
    assert trace_rules | run_rules == VOCABULARY
    for name in trace_rules:
        assert (here / f"{name}.py").is_file(), name
    for name in run_rules:
        assert (here / "run" / f"{name}.py").is_file(), name
    doc = DOC.read_text()
    data = table()
    for name in VOCABULARY:
        assert f"### {name}:" in doc, name
        assert name in data, name  # its thresholds are data


def test_ranges_are_capped_then_narrowed():
    assert capped((10.0, 50.0), 20.0) == (10.0, 20.0)
    assert narrowed((1.0, 50.0), 5.0) == (10.0, 50.0) and narrowed((0.0, 0.0), 5.0) == (0.0, 0.0)


def test_spans_cover_and_drain():
    u = spans.union([0, 5, 20], [10, 12, 30])  # [0, 12], [20, 30]
    assert spans.length(u) == 22
    assert list(spans.covered([8, 11, 15], [25, 21, 18], u)) == [4 + 5, 1 + 1, 0]
    assert spans.overlap(u, spans.union([10], [25])) == 2 + 5
    assert list(spans.holding(u, [12, 13, 20])) == [True, False, True]
    # a gap that begins inside a sync call and lasts past its end, or not
    assert list(spans.drained(u, [11, 11, 13], [15, 12, 40])) == [True, False, False]


def test_straggler_saving_is_its_lag_on_a_synthetic_run(tmp_path):
    """Rank 2 starts collective 3 of 16 800 µs after the others: the job loses exactly that."""
    from pipeline import synthetic as synth
    from pipeline.runs.report import measure, runs_json

    synth.write_run(tmp_path / "run", 4, 16, straggler=2, delay_us=800.0, delayed=3)
    found = {f["id"]: f for f in runs_json(measure(tmp_path / "run", use_cache=False))["runs"][0]["findings"]}
    s = found["straggler"]
    assert s["gain_us"] == [400.0, 800.0]
    assert s["title"].startswith("Rank 2 is the straggler: last to arrive in 1 of 16")
    assert s["section"] == "stragglers" and s["window_us"] > 0


def test_run_facts_sum_each_ranks_steps_from_the_columns():
    """`per_rank_of` sums a run's steps per rank from the steps table's numpy columns, as a loop
    over each step would (nulls count 0, a rank has a device when any step has compute, ranks in
    the order they come), and only the asked run's rows; a run of 1,024 ranks held a dict per step
    (1.3 M) and peaked at 2.2 GB."""
    from pipeline.findings.run.facts import SUMMED, per_rank_of
    from pipeline.render.rows import Rows

    rng = np.random.default_rng(7)
    n = 400
    run = np.array(["b" if i % 5 == 0 else "a" for i in range(n)], dtype=object)
    rank = rng.permutation(np.repeat([5, 0, 3, 9], n // 4)).astype(np.int64)
    cols = {k[:-3] + "_ns": rng.integers(0, 10**9, n).astype(np.float64) for k in SUMMED}
    cols["compute_ns"][rank == 3] = np.nan  # rank 3 has no device
    cols["exposed_comm_ns"][rank == 3] = np.nan
    cols["wait_ns"][::7] = np.nan
    steps = Rows({"run": run, "rank": rank, **cols})
    for name in ("a", "b"):
        want: dict[int, dict] = {}
        for i in np.flatnonzero(run == name):
            d = want.setdefault(int(rank[i]), {"steps": 0, **dict.fromkeys(SUMMED, 0.0), "device": False})
            d["steps"] += 1
            for k in SUMMED:
                v = cols[k[:-3] + "_ns"][i]
                d[k] += 0.0 if v != v else float(v) / 1e3
            d["device"] = d["device"] or cols["compute_ns"][i] == cols["compute_ns"][i]
        got = per_rank_of(steps, name)
        assert got == want and list(got) == list(want) and not got[3]["device"] and got[5]["device"]
    assert per_rank_of(steps, "c") == {} and per_rank_of(Rows({"run": [], "rank": []}), "a") == {}


def test_no_findings_line_keeps_to_the_width():
    """The one line a trace without findings gets: within --width in a table, as the findings
    are; the same sentence, on one line, at the default width and in Markdown."""
    from pipeline.render.findings import NONE, findings_lines

    said = NONE.format("the window")
    narrow = findings_lines([], "table", 80).splitlines()
    assert len(narrow) > 1 and all(len(line) <= 80 for line in narrow)
    assert " ".join(narrow) == said
    assert findings_lines([], "table") == findings_lines([], "md") == said + "\n"
