"""Archives of many traces: small traces flattened together (`dataset.group`) give each trace exactly
the rows `flatten` gives it alone; few files per 1,000 traces; queries read only committed parts."""

from __future__ import annotations

import gzip
import json
import re
import shutil
from pathlib import Path

import duckdb
import polars as pl
import pyarrow.parquet as pq
import pytest
from test_batch import tiny_trace, write

import pipeline.dataset.group as G
import pipeline.dataset.group.task as GT
import pipeline.dataset.members as members
from pipeline import schema
from pipeline import synthetic as synth
from pipeline.dataset import batch as B
from pipeline.dataset import layout
from pipeline.dataset import query as Q
from pipeline.dataset.inputs import file_hash
from pipeline.dataset.parts import part_schema
from pipeline.dataset.tables import tables
from pipeline.flatten import flatten
from pipeline.runs import tables as run_tables_module
from pipeline.synthetic.runs import write_run

TABLES = schema.TABLES
VOLATILE = ("trace_id", "source_path", "flattened_at")  # of the trace table: differ by design


def tasks_of(paths: list[Path]) -> list[tuple[str, str, str]]:
    return [(str(p), str(p), "t" + file_hash(str(p))[0][:16]) for p in paths]


def alone_tables(path: Path, out: Path) -> tuple[dict[str, pl.DataFrame], object]:
    r = flatten(path, out, workers=1)
    return {t: pl.read_parquet(r.out_dir / f"{t}.parquet") for t in TABLES}, r


def assert_group_equals_alone(paths: list[Path], tmp: Path, monkeypatch, expect_alone: set[str] = frozenset()):
    """Flatten `paths` as one group and each alone; every table of every trace must be equal (the
    trace table but for its volatile columns), and only `expect_alone` may leave the group."""
    monkeypatch.setenv("TRACEPIPE_GROUP_STRICT", "1")
    went_alone = []
    real = G.flatten_alone
    monkeypatch.setattr(GT, "flatten_alone", lambda m, *a: (went_alone.append(Path(m.path).name), real(m, *a))[1])
    tasks = tasks_of(paths)
    facts = G.run_group(tasks, str(tmp / "stage"))
    assert set(went_alone) == set(expect_alone)
    parts = {t: pl.read_parquet(tmp / "stage" / f"{t}.parquet") for t in TABLES}
    for t in TABLES:  # whole traces in trace_id order, each trace's rows together
        ids = parts[t]["trace_id"]
        assert ids.is_sorted() and ids.rle_id().n_unique() == ids.n_unique(), t
    for (path, _, tid), f in zip(tasks, facts):
        if f["status"] == "quarantined":
            assert not any((parts[t]["trace_id"] == tid).any() for t in TABLES)
            continue
        want, r = alone_tables(Path(path), tmp / "alone")
        assert (f["n_events"], f["n_gpu_ops"], f["n_flows"]) == (r.n_events, r.n_gpu_ops, r.n_flows)
        for t in TABLES:
            got = parts[t].filter(pl.col("trace_id") == tid)
            a, g = want[t], got.drop("trace_id") if t != "trace" else got
            if t == "trace":
                a, g = a.drop(VOLATILE), g.drop(VOLATILE)
            assert a.columns == g.select(a.columns).columns and set(a.columns) == set(g.columns), (path, t)
            g = g.select(a.columns)
            assert a.schema == g.schema, (path, t)
            assert a.equals(g, null_equal=True), (path, t, a.height, g.height)
        shutil.rmtree(r.out_dir)


# ------------------------------------------------------------------ one group = each alone
def synthetic_traces(d: Path) -> list[Path]:
    """Small traces of every layout and kind the group must give exactly as `flatten` does."""
    d.mkdir(parents=True, exist_ok=True)
    out = []
    for i, kw in enumerate(
        [
            {},
            {"layout": "old"},
            {"layout": "oldest"},
            {"metadata_after": True, "tricky": True},
            {"ns_digits": True, "gpu_devices": (0, 1)},
            {"device_props": False},
            {"n_steps": 3, "ops_per_step": 5, "with_flows": False},
            {"gpu_devices": (0, 1, 2), "prop_ids": (0,)},  # devices seen only on GPU events
        ]
    ):
        name = f"s{i}.json.gz" if i % 2 else f"s{i}.json"
        out.append(synth.write_trace(synth.make_trace(**kw), d / name, gz=i % 2 == 1))
    for r in range(3):
        out.append(write(d / f"tiny{r}.json.gz", tiny_trace(r)))
    write_run(d / "run", world=2, collectives=6)  # NCCL kernels: collectives from write_run_tables
    out += sorted((d / "run").glob("*.json.gz"))
    odd = tiny_trace(7)
    odd["traceEvents"][3]["ts"] = "1200.5"  # a string timestamp: coerced and counted, decoded on its own
    out.append(write(d / "odd.json", odd))
    out.append(write(d / "empty.json", {"traceEvents": [], "traceName": "nothing"}))
    bare = tiny_trace(8)["traceEvents"]
    (d / "bare.json").write_text(json.dumps(bare))  # a bare list of events
    out.append(d / "bare.json")
    (d / "nan.json").write_text(json.dumps(tiny_trace(9))[:-1] + ', "x": NaN}')  # NaN in metadata
    out.append(d / "nan.json")
    return out


def test_a_group_gives_each_synthetic_trace_what_flatten_gives_it(tmp_path, monkeypatch):
    assert_group_equals_alone(synthetic_traces(tmp_path / "src"), tmp_path, monkeypatch)


def test_the_ranks_of_a_run_measured_together_as_each_alone(tmp_path, monkeypatch):
    """NCCL ranks of one run in a group: their collectives are made together (`group.run_tables`),
    each rank's numbered, stepped and counted as alone, though their clocks, steps and kernels
    overlap (rank 1 late, clocks apart by less than a step)."""
    write_run(tmp_path / "run", world=3, collectives=12, straggler=1, delay_us=900, delayed=4,
              offsets_us=[0.0, 350.0, -200.0], per_step=3)  # fmt: skip
    assert_group_equals_alone(sorted((tmp_path / "run").glob("*.json.gz")), tmp_path, monkeypatch)


def test_gloo_ranks_measured_together_as_each_alone(tmp_path, monkeypatch):
    """CPU-only gloo ranks in one group (real recorded runs: four ranks of one world, a run with a
    subgroup, a run with a rank missing): their collectives are made together
    (`group.run_tables._gloo_together`), each rank's threads given its own process groups, its
    collectives numbered, stepped and counted as alone, its steps measured by its own work; one
    rank's process groups left unknown, its work counted unowned as alone."""
    runs = Path(__file__).parent / "data" / "runs"
    by_content = {file_hash(str(p))[0]: p for p in sorted(runs.glob("gloo4*/*.json.gz"))}  # runs share ranks
    paths = sorted(by_content.values())
    assert len(paths) >= 8
    text = json.loads(gzip.open(paths[0]).read())
    text["distributedInfo"].pop("pg_config")  # no group to give its threads: its work unowned
    paths.append(write(tmp_path / "src" / "no_groups.json.gz", text))

    def one_at_a_time(*_):
        raise AssertionError("a gloo rank's run tables made alone")

    monkeypatch.setattr(run_tables_module, "run_tables", one_at_a_time)
    assert_group_equals_alone(paths, tmp_path, monkeypatch)
    trace = pl.read_parquet(tmp_path / "stage" / "trace.parquet")
    said = trace.filter(pl.col("trace_id") == tasks_of(paths[-1:])[0][2])["problems_json"].item()
    assert json.loads(said)["collectives:gloo_work_without_process_group"] > 0


def test_a_gloo_rank_with_hccl_ops_is_measured_alone_in_its_group(tmp_path, monkeypatch):
    """HCCL collectives come before gloo work in a trace's collectives: a gloo rank that also holds
    an HCCL op (an event without a cat holding `count` and `data_type`) is left out of the gloo
    ranks made together, and measured alone, as flatten would."""
    runs = Path(__file__).parent / "data" / "runs"
    paths = sorted(runs.glob("gloo4/*.json.gz"))
    text = json.loads(gzip.open(paths[0]).read())
    first = next(e for e in text["traceEvents"] if e.get("ph") == "X")
    hccl = {"ph": "X", "name": "hcom_allReduce_", "pid": first["pid"], "tid": 999, "ts": first["ts"], "dur": 5}
    text["traceEvents"].append({**hccl, "args": {"count": 8, "data_type": "fp32"}})
    paths.append(write(tmp_path / "src" / "with_hccl.json.gz", text))
    alone = []
    real = run_tables_module.run_tables
    monkeypatch.setattr(run_tables_module, "run_tables", lambda tables, row: (alone.append(row), real(tables, row))[1])
    assert_group_equals_alone(paths, tmp_path, monkeypatch)
    assert len(alone) == 1


def test_traces_that_cannot_be_grouped_go_alone_with_the_same_result(tmp_path, monkeypatch):
    d = tmp_path / "src"
    paths = [write(d / f"ok{i}.json", tiny_trace(i)) for i in range(2)]
    big = tiny_trace(3)
    for e in big["traceEvents"]:
        if "correlation" in e.get("args", {}):
            e["args"]["correlation"] += 1 << 45  # ids beyond a band
    paths.append(write(d / "bigids.json", big))
    raw = json.dumps(tiny_trace(4, steps=6)).encode()
    (d / "cut.json").write_bytes(raw[: int(len(raw) * 0.6)])  # truncated: salvaged by flatten
    paths.append(d / "cut.json")
    (d / "garbage.json").write_text("not a trace")
    paths.append(d / "garbage.json")
    assert_group_equals_alone(paths, tmp_path, monkeypatch, {"bigids.json", "cut.json", "garbage.json"})
    facts = G.run_group(tasks_of(paths), str(tmp_path / "again"))
    assert [f["status"] for f in facts] == ["ok", "ok", "ok", "truncated", "quarantined"]


@pytest.mark.real
def test_a_group_gives_each_real_trace_what_flatten_gives_it(shared_traces, tmp_path, monkeypatch):
    monkeypatch.setattr(members, "SMALL_TEXT_BYTES", 1 << 30)  # every trace in the group, large ones too
    paths = sorted(shared_traces.glob("*/*.json.gz"))
    # a trace launching CUDA/HIP graphs goes alone: its replays are paired per trace (link.graphs)
    graphs = {p.name for p in paths if re.search(rb'"name": ?"(cuda|hip|cu)GraphLaunch"', gzip.open(p).read())}
    # so does a torch_npu trace: its device ids and HCCL collectives are read per trace (read.device_tasks)
    npu = {p.name for p in paths if b'"Ascend Hardware"' in gzip.open(p).read()}
    assert npu or not (shared_traces / "ascend").is_dir()
    assert_group_equals_alone(paths, tmp_path, monkeypatch, expect_alone=graphs | npu)


@pytest.mark.real
def test_copies_of_a_real_trace_in_one_group(shared_traces, tmp_path, monkeypatch):
    """Traces that share every id and timestamp (ranks of one job look like this) stay apart."""
    src = shared_traces / "hta" / "mi250_rocm62_minitoy.json.gz"
    if not src.exists():
        pytest.skip("no minitoy trace")
    text = gzip.open(src).read()
    head = text.index(b"{") + 1
    paths = []
    for i in range(12):
        p = tmp_path / "src" / f"rank-{i}.json.gz"
        p.parent.mkdir(exist_ok=True)
        p.write_bytes(gzip.compress(text[:head] + b'"variant": %d, ' % i + text[head:], 1))
        paths.append(p)
    assert_group_equals_alone(paths, tmp_path, monkeypatch)


# ------------------------------------------------------------------ the dataset of many traces
def many(d: Path, n: int) -> list[Path]:
    return [write(d / f"run{i % 5}" / f"rank{i // 5}.json.gz", tiny_trace(i, steps=2, kernels=2)) for i in range(n)]


@pytest.fixture(scope="module")
def big_ds(tmp_path_factory):
    root = tmp_path_factory.mktemp("many")
    paths = many(root / "src", 300)
    r = B.run_batch(root / "src", root / "ds", jobs=2, group_bytes=200_000)
    return root, paths, r


def files_of(ds: Path) -> list[Path]:
    return [p for p in ds.rglob("*") if p.is_file() and "_staging" not in p.parts]


def test_few_files_per_thousand_traces(big_ds):
    root, paths, r = big_ds
    assert (r.added, r.exit_code) == (300, 0)
    assert r.compacted is not None and r.compacted.merged > 1  # many tasks' parts merged at the end
    files = files_of(root / "ds")
    assert len(files) * 1000 / 300 <= 50
    assert len(list((root / "ds" / "traces").iterdir())) == 1  # one manifest file
    for t in TABLES:  # one part per table, sorted by trace_id, whole traces
        (f,) = (root / "ds" / t).iterdir()
        ids = pl.read_parquet(f, columns=["trace_id"])["trace_id"]
        assert ids.is_sorted() and ids.rle_id().n_unique() == ids.n_unique()


def test_every_reader_sees_every_trace_once(big_ds):
    root, paths, _ = big_ds
    ds = root / "ds"
    rows = layout.manifest(ds)
    for t, n in (("events", "n_events"), ("gpu_ops", "n_gpu_ops"), ("flows", "n_flows"), ("devices", "n_devices")):
        got = dict(
            duckdb.sql(
                f"select trace_id, count(*) from read_parquet('{ds}/{t}/**/*.parquet', hive_partitioning=true) "
                "group by 1"
            ).fetchall()
        )
        assert got == dict(rows.select("trace_id", n).iter_rows()), t
        lf = pl.scan_parquet(ds / t / "*.parquet")
        assert lf.select(pl.len()).collect().item() == rows[n].sum()
    assert Q.run(ds, "select count(distinct trace_id) as n from trace")["n"][0] == 300


def test_queries_read_only_committed_parts(big_ds, tmp_path):
    root, _, _ = big_ds
    ds = tmp_path / "ds"
    shutil.copytree(root / "ds", ds)
    before = Q.run(ds, "select count(*) as n, sum(dur_ns) as t from gpu_ops")
    # a part of a commit that never finished (no manifest names it): readers do not see it
    (f,) = (ds / "gpu_ops").iterdir()
    shutil.copy(f, ds / "gpu_ops" / layout.part_name(layout.commit_id()))
    assert Q.run(ds, "select count(*) as n, sum(dur_ns) as t from gpu_ops").equals(before)
    plan = tables(ds, ["gpu_ops"])["gpu_ops"].explain()
    assert plan.count(".parquet") <= 2  # the one committed part (named once or twice in the plan)
    # one trace's rows (its part found by the manifest, its row groups by their trace_id statistics)
    rows = layout.manifest(ds)
    tid = rows["trace_id"].sort()[150]
    one = Q.run(ds, "select count(*) as n from events", trace=tid)
    assert one["n"][0] == rows.filter(pl.col("trace_id") == tid)["n_events"][0]


@pytest.mark.parametrize("ranges", ["one", "some", "each"])  # all in memory; ranges of traces; each trace streamed
def test_compact_merges_small_parts_and_changes_no_row(tmp_path, monkeypatch, ranges):
    import pipeline.dataset.compact as C

    src, ds = tmp_path / "src", tmp_path / "ds"
    many(src, 40)
    r = B.run_batch(src, ds, jobs=2, group_bytes=20_000, compact=False)
    assert r.added == 40 and len(list((ds / "events").iterdir())) > 3
    rows = layout.manifest(ds)
    per_event = C._event_bytes(ds, layout.live_parts(rows))
    assert set(per_event) == set(layout.live_parts(rows)) and all(50 < b < 1000 for b in per_event.values())
    largest = max(n * per_event[p] for n, p in rows.select("n_events", layout.PART_COLUMN).iter_rows())
    budget = {"one": C.RANGE_BYTES, "some": 4 * largest, "each": largest / 2}[ranges]
    monkeypatch.setattr(C, "RANGE_BYTES", budget)
    cut = len(C._ranges(rows, per_event))
    assert {"one": cut == 1, "some": 1 < cut < 40, "each": cut == 40}[ranges], cut
    view = {t: lf.collect().sort("trace_id", maintain_order=True) for t, lf in tables(ds).items()}
    res = C.compact(ds)
    assert res.merged > 3 and res.parts_after == 1
    assert all(len(list((ds / t).iterdir())) == 1 for t in (*TABLES, "traces"))
    for t in TABLES:  # the merged part has the part's declared types, whichever way it was merged
        (f,) = (ds / t).iterdir()
        assert pq.read_schema(f) == part_schema(t), t
    after = {t: lf.collect().sort("trace_id", maintain_order=True) for t, lf in tables(ds).items()}
    for t in TABLES:
        assert after[t].equals(view[t], null_equal=True), t
    assert C.compact(ds).summary() == "nothing to compact"
    # the merged part's footer says less than an event takes in polars (similar traces encode
    # small): ranges of it are sized by the floor, not by the footer
    merged = layout.live_parts(layout.manifest(ds))
    meta = pq.ParquetFile(ds / "events" / merged[0]).metadata
    footer = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups)) / meta.num_rows
    assert C.FOOTER_TO_MEMORY * footer < C.MIN_EVENT_BYTES
    assert C._event_bytes(ds, merged) == {merged[0]: C.MIN_EVENT_BYTES}
    # parts on the floor beside parts sized by their footer (an int beside floats failed in polars)
    parts = layout.live_parts(rows)
    mixed = {p: (C.MIN_EVENT_BYTES if k % 2 == 0 else per_event[p] + 0.5) for k, p in enumerate(parts)}
    assert len(C._ranges(rows, mixed)) >= 1
