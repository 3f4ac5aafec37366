"""Link and cost in bounded memory: batch by batch and one time cell at a time they must give the
same tables as in one go; the windows, spill files and nesting ties they rely on."""

from __future__ import annotations

import gzip
import random
import shutil
from pathlib import Path

import orjson
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from pipeline import store
from pipeline import synthetic as synth
from pipeline.cost import enrich as cost
from pipeline.flatten import flatten
from pipeline.link import links as link
from pipeline.link import nesting
from pipeline.link.windows import EventReach, TimeBins, TimeCells


def _flat(tmp_path: Path, trace: dict, name: str = "t") -> Path:
    """A trace flattened without linking."""
    path = synth.write_trace(trace, tmp_path / f"{name}.json")
    return flatten(path, tmp_path / "flat", link=False).out_dir


def _enrich(flat_dir: Path, dst: Path, monkeypatch, **sizes) -> tuple[pl.DataFrame, dict]:
    """gpu_ops and the trace row after `cost.enrich` on a copy of `flat_dir`, with link.BATCH_ROWS,
    link.CELL_SLICES, cost.COST_BLOCK_ROWS and cost.WRITE_BATCH_ROWS set from `sizes`."""
    shutil.copytree(flat_dir, dst)
    row = pq.read_table(dst / "trace.parquet").to_pylist()[0]
    with monkeypatch.context() as m:
        for name, value in sizes.items():
            m.setattr(cost if hasattr(cost, name) else link, name, value)
        cost.enrich(dst, row)
    row.pop("flattened_at", None)
    row["problems_json"] = orjson.loads(row["problems_json"])
    return pl.read_parquet(dst / "gpu_ops.parquet"), row


@pytest.mark.parametrize("layout", ["new", "old", "oldest", "2021"])
def test_batches_and_time_cells_give_the_same_tables(tmp_path, monkeypatch, layout):
    flat = _flat(tmp_path, synth.make_trace(n_steps=6, ops_per_step=5, layout=layout))
    whole, whole_row = _enrich(flat, tmp_path / "whole", monkeypatch)
    parts, parts_row = _enrich(
        flat, tmp_path / "parts", monkeypatch, BATCH_ROWS=3, CELL_SLICES=4, COST_BLOCK_ROWS=7, WRITE_BATCH_ROWS=5
    )
    assert whole["launch_event_idx"].is_not_null().sum() > 0 and whole["cpu_op_event_idx"].is_not_null().sum() > 0
    assert whole["flops"].is_not_null().sum() > 0
    # every launch is inside its ProfilerStep (an Operator event in the oldest layouts)
    assert whole["step"].is_not_null().sum() == whole["launch_event_idx"].is_not_null().sum()
    assert parts.equals(whole)
    assert parts_row == whole_row


def test_relinking_a_linked_directory_gives_the_same_tables(tmp_path, monkeypatch):
    flat = _flat(tmp_path, synth.make_trace(n_steps=3, ops_per_step=4))
    once, once_row = _enrich(flat, tmp_path / "once", monkeypatch)
    twice, twice_row = _enrich(tmp_path / "once", tmp_path / "twice", monkeypatch, BATCH_ROWS=2)
    assert twice.equals(once)
    assert twice_row["n_cpu_op_linked"] == once_row["n_cpu_op_linked"] > 0


def _events(*rows):
    """Complete events (cat, name, tid, ts, dur, args) on pid 1 and kernels on pid 0."""
    return {
        "traceEvents": [
            {
                "ph": "X",
                "cat": cat,
                "name": name,
                "pid": 0 if cat == "kernel" else 1,
                "tid": tid,
                "ts": ts,
                "dur": dur,
                "args": args,
            }
            for cat, name, tid, ts, dur, args in rows
        ]
    }


def test_a_zero_length_op_at_the_start_of_a_longer_one_is_inside_it(tmp_path, monkeypatch):
    """Slices starting at one instant nest longer first: the zero-length op (earlier in the file)
    is inside the longer one, which encloses the launches after that instant (they were left
    without a cpu_op when ties nested in file order only)."""
    trace = _events(
        ("cpu_op", "aten::empty", 1, 10, 0, {}),
        ("cpu_op", "aten::outer", 1, 10, 50, {}),
        ("cuda_runtime", "cudaLaunchKernel", 1, 10, 3, {"correlation": 5}),
        ("cuda_runtime", "cudaLaunchKernel", 1, 20, 3, {"correlation": 6}),
        ("kernel", "k_at_start", 7, 30, 5, {"device": 0, "stream": 7, "correlation": 5}),
        ("kernel", "k_inside", 7, 40, 5, {"device": 0, "stream": 7, "correlation": 6}),
    )
    g, _ = _enrich(_flat(tmp_path, trace), tmp_path / "linked", monkeypatch)
    assert dict(zip(g["name"], g["cpu_op_name"])) == {"k_at_start": "aten::empty", "k_inside": "aten::outer"}


def test_an_external_id_of_zero_names_no_op(tmp_path, monkeypatch):
    """Rule 4 (cpu_op by External id, where kernels' External ids are not their correlation ids)
    pairs a launch outside every op with the op of its External id, but not by 0: Kineto writes
    0 for a runtime call without a linked op (the 2021 layout). The op here carries 0 too, as no
    real op does: only the rule can tell them apart."""
    trace = _events(
        ("cpu_op", "aten::zero_id", 1, 0, 10, {"External id": 0}),
        ("cpu_op", "aten::mm", 1, 100, 10, {"External id": 7}),
        ("cuda_runtime", "cudaLaunchKernel", 1, 50, 3, {"correlation": 52, "External id": 0}),
        ("cuda_runtime", "cudaLaunchKernel", 2, 120, 3, {"correlation": 51, "External id": 7}),
        ("kernel", "k_no_op", 7, 60, 5, {"device": 0, "stream": 7, "correlation": 52, "External id": 0}),
        ("kernel", "k_of_mm", 7, 130, 5, {"device": 0, "stream": 7, "correlation": 51, "External id": 7}),
    )
    g, _ = _enrich(_flat(tmp_path, trace), tmp_path / "linked", monkeypatch)
    got = {r["name"]: (r["cpu_op_name"], r["cpu_op_link"]) for r in g.iter_rows(named=True)}
    assert got == {"k_no_op": (None, None), "k_of_mm": ("aten::mm", "external_id")}


def test_a_flow_start_found_by_time_when_its_call_has_no_correlation(tmp_path, monkeypatch):
    """Rule 1 binds a flow's start to the launch call at its (pid, tid, ts). Launch calls are read
    by the batch's correlation ids first, and by time only for flow starts none of those calls
    sits at: kA and its call carry no correlation id (as a layout may write them), and the call
    is still found by its flow."""
    trace = _events(
        ("cuda_runtime", "cudaLaunchKernel", 1, 10, 3, {}),
        ("cuda_runtime", "cudaLaunchKernel", 1, 20, 3, {"correlation": 6}),
        ("cuda_runtime", "cudaLaunchKernel", 1, 25, 3, {"correlation": 8}),
        ("kernel", "kA", 7, 30, 5, {"device": 0, "stream": 7}),
        ("kernel", "kB", 7, 40, 5, {"device": 0, "stream": 7, "correlation": 6}),
        ("kernel", "kC", 7, 50, 5, {"device": 0, "stream": 7, "correlation": 8}),
    )
    flow = lambda ph, flow_id, pid, tid, ts: {
        "ph": ph, "cat": "ac2g", "name": "ac2g", "id": flow_id, "pid": pid, "tid": tid, "ts": ts,
        **({"bp": "e"} if ph == "f" else {}),
    }  # fmt: skip
    trace["traceEvents"] += [
        flow("s", 5, 1, 1, 10),
        flow("f", 5, 0, 7, 30),
        flow("s", 6, 1, 1, 20),
        flow("f", 6, 0, 7, 40),
    ]
    g, _ = _enrich(_flat(tmp_path, trace), tmp_path / "linked", monkeypatch)
    got = {r["name"]: (r["launch_event_idx"], r["launch_link"]) for r in g.iter_rows(named=True)}
    assert got == {"kA": (0, "flow"), "kB": (1, "flow"), "kC": (2, "correlation")}


def _launch_rows(n: int) -> list:
    """n ops 20 µs apart on thread 1 (aten::op0, ...), each launching a kernel (k0, ...) on stream 7."""
    rows = []
    for i in range(n):
        t = 10 + 20 * i
        rows += [
            ("cpu_op", f"aten::op{i}", 1, t, 10, {}),
            ("cuda_runtime", "cudaLaunchKernel", 1, t + 1, 2, {"correlation": 100 + i}),
            ("kernel", f"k{i}", 7, t + 5, 3, {"device": 0, "stream": 7, "correlation": 100 + i}),
        ]
    return rows


def test_context_of_launches_across_cells(tmp_path, monkeypatch):
    """A step, an outermost annotation and module, and the innermost op, read one small time cell
    at a time: slices that started cells earlier still enclose the launches."""
    rows = [
        ("user_annotation", "ProfilerStep#7", 1, 0, 1000, {}),
        ("user_annotation", "outer_region", 1, 1, 998, {}),
        ("user_annotation", "inner_region", 1, 2, 996, {}),
        ("python_function", "nn.Module: Net", 1, 3, 990, {}),
        ("python_function", "nn.Module: Linear", 1, 4, 980, {}),
        *_launch_rows(40),
    ]
    flat = _flat(tmp_path, _events(*rows))
    g, _ = _enrich(flat, tmp_path / "cells", monkeypatch, BATCH_ROWS=7, CELL_SLICES=3)
    assert g["cpu_op_name"].to_list() == [f"aten::op{i}" for i in range(40)]
    assert set(g["step"]) == {7} and set(g["annotation"]) == {"outer_region"} and set(g["module"]) == {"Net"}


def test_context_where_some_kinds_of_slices_are_missing(tmp_path, monkeypatch):
    """No steps or annotations anywhere and a module around the first launches only: each cell
    nests the kinds it has, and every answer lands in its own column."""
    rows = [("python_function", "nn.Module: Net", 1, 0, 395, {}), *_launch_rows(40)]
    flat = _flat(tmp_path, _events(*rows))
    for name, sizes in (("whole", {}), ("cells", {"BATCH_ROWS": 7, "CELL_SLICES": 3})):
        g, _ = _enrich(flat, tmp_path / name, monkeypatch, **sizes)
        assert g["cpu_op_name"].to_list() == [f"aten::op{i}" for i in range(40)]
        assert g["module"].to_list() == ["Net"] * 20 + [None] * 20
        assert g["step"].null_count() == 40 and g["annotation"].null_count() == 40


def test_nesting_several_kinds_apart_in_one_call():
    """`nesting.around` with an extra thread column equals one `enclosing` call per kind."""
    rng = random.Random(7)
    for _ in range(30):
        intervals = [
            (i, 1, rng.randint(1, 2), rng.randint(0, 1), a, a + rng.choice([0, rng.randint(0, 20)]))
            for i, a in enumerate(rng.randint(0, 40) for _ in range(rng.randint(1, 30)))
        ]
        points = [(100 + j, 1, rng.randint(1, 2), rng.randint(-1, 60)) for j in range(rng.randint(1, 15))]
        iv = pl.DataFrame(intervals, schema=["iv_idx", "pid", "tid", "kind", "ts_ns", "end_ns"], orient="row")
        pts = pl.DataFrame(points, schema=["point_id", "pid", "tid", "t"], orient="row")
        found = nesting.around(
            pts.join(pl.DataFrame({"kind": [0, 1]}), how="cross"), iv, nesting.LONGER_FIRST, by=("pid", "tid", "kind")
        )
        for kind in (0, 1):
            for which in ("innermost", "outermost"):
                want = nesting.enclosing(
                    pts,
                    iv.filter(pl.col("kind") == kind).drop("kind"),
                    nesting.LONGER_FIRST,
                    outermost=which == "outermost",
                )
                got = found.filter((pl.col("kind") == kind) & pl.col(which).is_not_null())
                assert dict(zip(got["point_id"], got[which])) == dict(want.iter_rows())


def test_event_reach_bounds_the_start_of_every_event_still_running(tmp_path):
    rng = random.Random(3)
    ts = [rng.randint(0, 10_000) for _ in range(2_000)]
    dur = [rng.choice([None, 0, rng.randint(0, 50), rng.randint(0, 5_000)]) for _ in ts]
    path = tmp_path / "events.parquet"
    pq.write_table(pa.table({"ts_ns": ts, "dur_ns": pa.array(dur, pa.int64())}), path, row_group_size=100)
    reach = EventReach.of(path)
    for a in range(-10, 16_000, 97):
        running = [t for t, d in zip(ts, dur) if t + (d or 0) >= a]
        earliest = reach.earliest_start(a)
        assert all(t >= earliest for t in running)


def test_time_cells_hold_about_the_asked_count():
    bins = TimeBins.over((0, 10_000))
    starts = pl.DataFrame({"ts_ns": list(range(0, 10_000, 10))})  # 1000 starts, evenly spread
    histogram = starts.group_by(bin=bins.of(pl.col("ts_ns"))).agg(n=pl.len())
    cells = TimeCells.of(histogram, bins, per_cell=100)
    counts = starts.group_by(cell=cells.cell(starts["ts_ns"])).len()["len"]
    assert 9 <= counts.len() <= 11 and counts.max() <= 110


@pytest.mark.parametrize(
    ("starts", "cells"), [(1040, 10), (1060, 11), (1000, 10), (120, 1), (149, 1), (150, 2), (30, 1)]
)
def test_time_cells_whole_tail_joins_a_small_last_cell(starts, cells):
    """With `whole_tail` (the analyses' windows, each of which costs ~100 small queries), a last
    cell of under half `per_cell` joins the one before: 1,040 starts make 10 cells of 100 and 140
    rather than 11 (the last of 40); 1,060 still make 11 (the last of 60, over half). Every cell
    holds 50 to 150, and no start is lost."""
    bins = TimeBins.over((0, starts * 10))
    ts = pl.DataFrame({"ts_ns": list(range(0, starts * 10, 10))})
    histogram = ts.group_by(bin=bins.of(pl.col("ts_ns"))).agg(n=pl.len())
    plain = TimeCells.of(histogram, bins, per_cell=100)
    whole = TimeCells.of(histogram, bins, per_cell=100, whole_tail=True)
    counts = ts.group_by(cell=whole.cell(ts["ts_ns"])).len()["len"]
    assert counts.len() == cells and counts.sum() == starts
    assert counts.max() <= 150 and (cells == 1 or counts.min() >= 50)
    assert whole.cuts.to_list() == plain.cuts.to_list()[: cells - 1]  # the same cuts, but a last one


def test_spill_hands_rows_back_in_slices_of_any_length(tmp_path):
    fields = [pa.field("event_idx", pa.int64()), pa.field("name", pa.string())]
    with store.spill_file(tmp_path, "test") as path:
        assert path.stat().st_size == 0 and store._write_anew(str(path)) == "ab"  # appended to, not truncated
        with store.SpillWriter(path, fields) as out:
            for start in (0, 5, 12):
                out.write(
                    pl.DataFrame(
                        {"name": [f"n{i}" for i in range(start, start + 7)], "event_idx": range(start, start + 7)}
                    )
                )
        with store.SpillReader(path) as back:
            got = [back.take(n) for n in (3, 9, 0, 6, 5)]
        with store.SpillWriter(path, fields) as out:  # a file written already is written anew
            out.write(pl.DataFrame({"name": ["again"], "event_idx": [99]}))
        with store.SpillReader(path) as back:
            assert back.take(5)["event_idx"].to_list() == [99]
    assert [f.height for f in got] == [3, 9, 0, 6, 3]
    assert pl.concat(got)["event_idx"].to_list() == [*range(0, 7), *range(5, 12), *range(12, 19)]
    assert not path.exists()


def test_write_extended_refuses_rows_that_do_not_line_up(tmp_path):
    src = tmp_path / "gpu_ops.parquet"
    store.write_table(pa.table({"event_idx": [1, 2, 3]}), src, "gpu_ops", ("flatten",))
    shifted = lambda batch: pl.DataFrame({"event_idx": batch["event_idx"] + 1})
    with pytest.raises(ValueError, match="line up"):
        store.write_extended(src, tmp_path / "out.parquet", "gpu_ops", shifted, inputs=["event_idx"])


def test_gpu_ops_out_of_order_are_sorted_first(tmp_path):
    src = tmp_path / "gpu_ops.parquet"
    store.write_table(pa.table({"event_idx": [3, 1, 2], "name": ["c", "a", "b"]}), src, "gpu_ops", ("flatten",))
    store.sort_by_key(src, "gpu_ops")
    assert pl.read_parquet(src, columns=["event_idx", "name"]).rows() == [(1, "a"), (2, "b"), (3, "c")]


def _running_slices_file(tmp_path: Path, rng: random.Random) -> tuple[Path, pl.DataFrame]:
    """An events file of slices on three threads, roughly in time order (as Kineto writes them),
    some long, in small row groups; and the slices as a frame (with end_ns)."""
    rows = []
    for i in range(3_000):
        ts = i * 10 + rng.randint(-40, 40)
        dur = rng.choice([None, 0, rng.randint(0, 50), rng.randint(0, 3_000)])
        rows.append({"event_idx": i, "pid": 1, "tid": rng.randint(1, 3), "ts_ns": ts, "dur_ns": dur})
    table = pa.Table.from_pylist(rows, schema=pa.schema([(c, pa.int64()) for c in rows[0]]))
    path = tmp_path / "events.parquet"
    pq.write_table(table, path, row_group_size=200)
    frame = pl.from_arrow(table).with_columns(end_ns=pl.col("ts_ns") + pl.col("dur_ns").fill_null(0))
    return path, frame


def test_running_slices_give_what_a_fresh_read_of_each_window_gives(tmp_path):
    """Windows moving forward (carrying the rows still running), backward and onto new threads
    (read afresh) get the slices with ts_ns <= b and end >= a on their threads."""
    from pipeline.link.windows import RunningSlices

    rng = random.Random(11)
    path, frame = _running_slices_file(tmp_path, rng)
    reads = []

    def read(where: pl.Expr, threads: pl.DataFrame) -> pl.DataFrame:
        reads.append(where)
        got = pl.scan_parquet(path).filter(where).collect()
        return got.with_columns(end_ns=pl.col("ts_ns") + pl.col("dur_ns").fill_null(0)).join(
            threads, on=["pid", "tid"], how="semi"
        )

    running = RunningSlices(read, EventReach.of(path))
    fresh, fresh_read = [], running._fresh
    running._fresh = lambda *args: (fresh.append(args), fresh_read(*args))
    a, backward = 0, 0
    for step in range(60):
        previous, a = a, max(-100, a + rng.randint(-300, 800))
        backward += a < previous
        b = a + rng.randint(0, 900)
        threads = pl.DataFrame({"pid": [1] * 2, "tid": rng.sample([1, 2, 3], 2)})
        got = running.between(threads, a, b)
        want = frame.filter((pl.col("ts_ns") <= b) & (pl.col("end_ns") >= a)).join(
            threads, on=["pid", "tid"], how="semi"
        )
        assert sorted(got["event_idx"]) == sorted(want["event_idx"]), (step, a, b)
    assert backward > 0 and len(fresh) <= backward + 3  # afresh only backward and onto new threads (3)
    assert len(reads) < 60  # forward: only what was not held, if anything


@pytest.mark.parametrize("native", ["1", "0"], ids=["compiled", "regexes"])
def test_op_shapes_share_costs_only_with_the_same_signature(monkeypatch, native):
    """`_shape` drops the members whose values are scalars (per-op ids) but for signature members;
    ops with one shape have one signature, and collectives alike but for their ids share one. The
    same by the compiled module's pass and by the regexes."""
    monkeypatch.setenv("TRACEPIPE_NATIVE", native)
    args = pl.Series(
        "args",
        [
            '{"External id": 5, "Ev Idx": 4, "Input Dims": [[4, 8], [8, 2]], "Input type": ["float", "float"]}',
            '{"External id": 9, "Ev Idx": 8, "Input Dims": [[4, 8], [8, 2]], "Input type": ["float", "float"]}',
            '{"External id": 9, "Ev Idx": 8, "Input Dims": [[4, 8], [8, 3]], "Input type": ["float", "float"]}',
            '{"External id": 1, "Group size": 8, "dtype": "Float", "In msg nelems": 1024}',
            '{"External id": 2, "Group size": 4, "dtype": "Float", "In msg nelems": 1024}',
            '{"External id": 3, "Group size": 4, "dtype": "Float", "In msg nelems": 1024}',
            '{"External id": 4, "Group size": 4, "dtype": "Float", "In msg nelems": 2048}',
            '{"Record function id": 3, "Concrete Inputs": ["", "2.5"], "Input Dims": [[2], []], "x": true, "y": 1e-3}',
            '{"Record function id": 7, "Concrete Inputs": ["", "3.5"], "Input Dims": [[2], []], "x": false, "y": 2}',
            '{"Sequence number": 1, "Input Dims": [[2]], "note": "a\\": 5, \\"b"}',
            None,
        ],
    )
    frame = pl.DataFrame(args).with_columns(shape=cost.shape_keys(args))
    signatures = frame.select("shape", *cost._signature(pl.col("args")))
    assert signatures.unique().height == signatures.select("shape").unique().height  # one signature per shape
    shapes = frame["shape"].to_list()
    assert shapes[0] == shapes[1] != shapes[2]
    assert shapes[3] != shapes[4] == shapes[5] != shapes[6]  # scalar signature members kept, ids not
    assert "External id" not in shapes[4] and '"Group size"=4' in shapes[4]
    assert shapes[7] != shapes[8] and '"Concrete Inputs": ["", "2.5"]' in shapes[7]


def _random_args(rng: random.Random, depth: int = 0) -> str:
    """A JSON object as Kineto writes args (`"key": value`), with whitespace of every JSON kind,
    nested values, signature keys, and scalars of every JSON form."""
    scalars = ["0", "-0", "7", "-12", "3.25", "1e-3", "2E+8", "-0.5e10", "true", "false", "null"]
    texts = ['""', '"Float"', '"a\\": 5"', '"x, \\"y\\": 1"', '"é ∑"', '"[1, 2]"']
    keys = [*cost.SIGNATURE_KEYS, "External id", "Ev Idx", "note", "a\\b", "é", "x"]

    def value(d: int) -> str:
        roll = rng.random()
        if roll < 0.45 or d > 2:
            return rng.choice(scalars + texts)
        if roll < 0.75:
            return "[" + rng.choice([", ", ","]).join(value(d + 1) for _ in range(rng.randint(0, 3))) + "]"
        return _random_args(rng, d + 1)

    space = lambda: rng.choice(["", " ", "  ", "\t", "\n", "\r\n "])
    members = [f'"{rng.choice(keys)}":{space()}{value(depth)}' for _ in range(rng.randint(0, 6))]
    return "{" + space() + ("," + space()).join(members) + space() + "}"


@pytest.mark.skipif(cost._native_shape_keys is None, reason="the native module is not built")
def test_compiled_shape_keys_are_the_regexes_keys(monkeypatch):
    """The compiled pass (native/shape_keys.cpp) gives the keys the two regex replacements give, on
    10,000 random args of every JSON form (nested, escaped, any whitespace, non-ASCII), and on
    texts no parser wrote (numbers cut short, keys with backslashes); a null stays null. Where a
    string that begins with `:` follows a scalar signature member with no quote between, the
    compiled key keeps what the regexes' second pass drops (it starts at the quote that closes
    the rewritten member): finer, never coarser."""
    rng = random.Random(7)
    odd = ['{"a": 1.5x, "b": 01, "c": -, "d": 1e, "e": truex, "f": 2}', '{"k\\": 1, "Group size":8}']
    args = pl.Series("args", [*(_random_args(rng) for _ in range(10_000)), *odd, None], dtype=pl.String)
    monkeypatch.setenv("TRACEPIPE_NATIVE", "1")
    compiled = cost.shape_keys(args)
    monkeypatch.setenv("TRACEPIPE_NATIVE", "0")
    assert compiled.to_list() == cost.shape_keys(args).to_list()
    assert compiled[-1] is None and compiled[-3] == '{.5x, "b": 01, "c": -, "d": 1e, "e": truex, }'
    finer = pl.Series("args", ['{"a": [{"Group size": 8}, ": 5"]}'])
    assert cost.shape_keys(finer)[0] == '{"a": [{"Group size"]}'  # the regexes: the second starts at `"=8}, "`
    monkeypatch.setenv("TRACEPIPE_NATIVE", "1")
    assert cost.shape_keys(finer)[0] == '{"a": [{"Group size"=8}, ": 5"]}'


@pytest.mark.real
@pytest.mark.skipif(cost._native_shape_keys is None, reason="the native module is not built")
def test_compiled_shape_keys_on_every_shared_traces_ops(shared_traces, tmp_path, monkeypatch):
    """The compiled keys equal the regexes' on the args of every event of the shared real traces."""
    seen = 0
    for path in sorted(shared_traces.glob("*/*.json.gz")):
        flat = flatten(path, tmp_path / path.parent.name, link=False, run_tables=False).out_dir
        args = pl.read_parquet(flat / "events.parquet", columns=["args_json"])["args_json"]
        monkeypatch.setenv("TRACEPIPE_NATIVE", "1")
        compiled = cost.shape_keys(args)
        monkeypatch.setenv("TRACEPIPE_NATIVE", "0")
        assert compiled.to_list() == cost.shape_keys(args).to_list(), path.name
        seen += args.len()
    assert seen > 1_000_000


def test_batches_read_back_in_the_asked_sizes_across_row_groups(tmp_path):
    path = tmp_path / "t.parquet"
    names = [f"kernel_{i % 7}" for i in range(1_000)]
    pq.write_table(pa.table({"event_idx": range(1_000), "name": names}), path, row_group_size=130)
    batches = list(store.read_batches(path, 300, ["event_idx", "name"], read_dictionary=["name"]))
    assert [b.num_rows for b in batches] == [300, 300, 300, 100]
    back = pl.concat([pl.from_arrow(b) for b in batches])
    assert back["event_idx"].to_list() == list(range(1_000))
    assert back["name"].cast(pl.String).to_list() == names


@pytest.mark.real
@pytest.mark.slow
@pytest.mark.parametrize("trace", ["hta/a100_old_format_rank0", "tracelens/h100_qwen1.5_0.5b"])
def test_one_long_runs_layout_links_as_its_copies(shared_traces, tmp_path, monkeypatch, trace):
    """Copies of a real trace laid out as one long Kineto run writes it (every CPU op first, then
    every runtime call, flow and kernel: what a batch reads lies far apart in the file) link
    exactly as the trace itself, copy for copy, in small batches and time cells."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench", Path(__file__).resolve().parents[1] / "bench" / "bench.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    src = shared_traces / f"{trace}.json.gz"
    one = flatten(src, tmp_path / "one").out_dir
    copy_mb = len(orjson.dumps(orjson.loads(gzip.decompress(src.read_bytes()))["traceEvents"])) / 1e6
    long_run = tmp_path / "long_run.json"
    bench.write_replicated(str(src), long_run, 2.5 * copy_mb, sectioned=True)  # 3 copies
    flat = flatten(long_run, tmp_path / "flat", link=False).out_dir
    g, row = _enrich(flat, tmp_path / "linked", monkeypatch, BATCH_ROWS=4096, CELL_SLICES=8192)
    want = pq.read_table(one / "trace.parquet").to_pylist()[0]
    assert row["n_gpu_ops"] == 3 * want["n_gpu_ops"]
    assert (row["n_launch_linked"], row["n_cpu_op_linked"]) == (
        3 * want["n_launch_linked"],
        3 * want["n_cpu_op_linked"],
    )
    names = pl.read_parquet(one / "gpu_ops.parquet", columns=["name", "cpu_op_name"])
    assert g.group_by("name", "cpu_op_name").len().sort("name", "cpu_op_name", nulls_last=True)["len"].to_list() == [
        3 * n for n in names.group_by("name", "cpu_op_name").len().sort("name", "cpu_op_name", nulls_last=True)["len"]
    ]


def _regrouped(flat: Path, dst: Path, rows: int) -> Path:
    """A copy of a flattened directory whose gpu_ops.parquet has row groups of `rows` rows."""
    shutil.copytree(flat, dst)
    pq.write_table(pq.read_table(dst / "gpu_ops.parquet"), dst / "gpu_ops.parquet", row_group_size=rows)
    return dst


@pytest.mark.parametrize("layout", ["new", "oldest"])
def test_parts_linked_side_by_side_give_the_same_tables(tmp_path, monkeypatch, layout):
    """GPU ops linked in parts, each in a thread of its own (`enrich.link_pass`), give the tables
    of one pass over them, counts and per-op kernel shares included (an op's kernels may lie in
    two parts)."""
    flat = _flat(tmp_path, synth.make_trace(n_steps=6, ops_per_step=5, layout=layout))
    grouped = _regrouped(flat, tmp_path / "grouped", 7)
    assert pq.ParquetFile(grouped / "gpu_ops.parquet").metadata.num_row_groups >= 3
    one, one_row = _enrich(grouped, tmp_path / "one", monkeypatch, LINK_PARTS=1, BATCH_ROWS=5)
    three, three_row = _enrich(grouped, tmp_path / "three", monkeypatch, LINK_PARTS=3, BATCH_ROWS=5)
    assert len(link.gpu_parts(grouped, 3)) == 3
    assert one["flops"].is_not_null().sum() > 0 and one["cpu_op_event_idx"].is_not_null().sum() > 0
    assert three.equals(one)
    assert three_row == one_row


@pytest.mark.real
def test_parts_of_a_real_trace_with_graph_replays(shared_traces, tmp_path, monkeypatch):
    """The same on a real trace whose kernels are replayed by graph launches (pairing read in parts)."""
    flat = flatten(shared_traces / "tracelens/mi300x_vllm_graph_replay.json.gz", tmp_path / "flat", link=False).out_dir
    grouped = _regrouped(flat, tmp_path / "grouped", 50)
    one, one_row = _enrich(grouped, tmp_path / "one", monkeypatch, LINK_PARTS=1)
    two, two_row = _enrich(grouped, tmp_path / "two", monkeypatch, LINK_PARTS=2)
    assert one["graph_id"].is_not_null().sum() > 0
    assert two.equals(one)
    assert two_row == one_row


def test_gpu_parts_cover_the_row_groups_in_order(tmp_path):
    path = tmp_path / "gpu_ops.parquet"
    pq.write_table(pa.table({"event_idx": range(100)}), path, row_group_size=30)  # 30, 30, 30, 10
    assert link.gpu_parts(tmp_path, 2) == [[0, 1], [2, 3]]
    assert link.gpu_parts(tmp_path, 8) == [[0], [1], [2], [3]]
    assert link.gpu_parts(tmp_path, 1) == [[0, 1, 2, 3]]


def _column_bytes(path: Path, column: str) -> list[int]:
    """The uncompressed bytes of `column` in each row group of a Parquet file."""
    meta = pq.ParquetFile(path).metadata
    j = [meta.row_group(0).column(k).path_in_schema for k in range(meta.num_columns)].index(column)
    return [meta.row_group(i).column(j).total_uncompressed_size for i in range(meta.num_row_groups)]


def test_a_batch_of_two_dictionaries_stays_dictionary_encoded(tmp_path):
    """Pass 2 reads gpu_ops in batches that span two of its row groups, so a batch's name column
    comes in two chunks with dictionaries of their own. Written as they were, Arrow's writer fell
    back to PLAIN at the second dictionary for the rest of the row group: every row group of a
    rewritten gpu_ops but the first held its kernel names whole (9.6 MB instead of 58 KB before
    compression on a 1 GB trace), which every later read of the names decodes."""
    # the same names in another order: each row group's dictionary lists them as they come
    names = [f"void kernel_{i % 4 if i < 2000 else 3 - i % 4}<float, {'x' * 200}>" for i in range(4000)]
    rows = pa.table({"event_idx": range(4000), "name": names, "kind": ["kernel"] * 4000})
    halves = [rows.slice(0, 2000), rows.slice(2000)]
    halves = [h.set_column(1, "name", pc.dictionary_encode(h.column("name"))) for h in halves]
    two_chunks = pa.concat_tables(halves)  # as `store.read_batches` puts a batch back together
    dictionaries = [c.dictionary for c in two_chunks.column("name").chunks]
    assert len(dictionaries) == 2 and not dictionaries[0].equals(dictionaries[1])
    path = tmp_path / "gpu_ops.parquet"
    w = store.TableWriter(path, "gpu_ops", buffer_rows=1 << 16, dictionaries=True)
    w.write(two_chunks)
    w.close()
    assert pq.read_table(path).column("name").to_pylist() == names
    (size,) = _column_bytes(path, "name")
    assert size < 20_000  # a dictionary of 4 names and 4,000 indexes; PLAIN: ~850 KB


@pytest.mark.parametrize("view_kernel", [True, False], ids=["views encoded", "an Arrow without the kernel"])
def test_dictionaries_written_as_they_are_read_back_as_plain_strings(tmp_path, monkeypatch, view_kernel):
    """Pass 2 hands the writer its text columns as Arrow dictionaries (as read), string views (from
    polars, with nulls) and plain strings, in batches with different dictionaries: the file reads
    back exactly as the one the plain writer makes, strings as strings; where Arrow cannot
    dictionary-encode string views, they are cast through plain strings."""
    if not view_kernel:

        def no_view_kernel(column, *args, **kwargs):
            if pa.types.is_string_view(column.type):
                raise pa.ArrowNotImplementedError("no kernel for string_view")
            return encode(column, *args, **kwargs)

        encode = pc.dictionary_encode
        monkeypatch.setattr(store.pc, "dictionary_encode", no_view_kernel)
    names = [f"kernel_{i % 5}" for i in range(40)]
    cats = [("kernel", None, "gpu_memcpy")[i % 3] for i in range(40)]
    rows = pa.table({"event_idx": range(40), "name": names, "kind": ["kernel"] * 40, "cat": cats})
    plain, coded = tmp_path / "plain.parquet", tmp_path / "coded.parquet"
    w = store.TableWriter(plain, "gpu_ops", buffer_rows=16)
    for k in range(0, 40, 8):
        w.write(rows.slice(k, 8))
    w.close()
    w = store.TableWriter(coded, "gpu_ops", buffer_rows=16, dictionaries=True)
    for k in range(0, 40, 8):
        part = rows.slice(k, 8)
        part = part.set_column(1, "name", pc.dictionary_encode(part.column("name")))  # a dictionary per batch
        part = part.set_column(2, "kind", part.column("kind").cast(pa.string_view()))
        part = part.set_column(3, "cat", part.column("cat").cast(pa.string_view()))
        w.write(part)
    w.close()
    back = pq.read_table(coded)
    assert back.equals(pq.read_table(plain))
    assert back.schema.field("name").type == pa.string()
    assert pl.read_parquet(coded).equals(pl.read_parquet(plain))
    assert pq.ParquetFile(coded).metadata.num_row_groups == 3  # 16 + 16 + 8 rows
