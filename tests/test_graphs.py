"""CUDA/HIP graphs: replays paired with the trace of their capture (pipeline.link.graphs), on
synthetic pairs for each hard case (pipeline.synthetic.graphs) and on the real vLLM pair; the
analyses with graphs (graph view, launch overhead, op table, critical path); batch pairing."""

from __future__ import annotations

import gzip
import json
import time
from collections import Counter
from pathlib import Path

import polars as pl
import pytest

from pipeline import report
from pipeline.analyses.graphs import graph_view
from pipeline.dataset.batch import run_batch
from pipeline.dataset.tables import tables
from pipeline.flatten import flatten
from pipeline.link import graphs as graphs_mod
from pipeline.link.graphs import PROBLEM, graph_hint
from pipeline.read.metadata import sampled_content_id
from pipeline.synthetic.graphs import GraphCase, capture_trace, memset, mm, pointwise, replay_trace
from pipeline.synthetic.traces import write_trace

AMBIGUOUS = PROBLEM["graph_replay_ambiguous"]
NO_CAPTURE = PROBLEM["graph_replay"]
UNMATCHED = PROBLEM["graph_replay_unmatched"]
ORDER = "graphs:kernel_order_ambiguous (one key on several streams, captured by different ops)"
BY_KIND = "graphs:paired_by_kind_and_order (the capture records no kernel names)"

LAYER = [pointwise(4096), mm(64, 128, 256), pointwise(16384, kernel="triton_poi_fused_relu_1", op="aten::relu")]


def run(case: GraphCase, tmp: Path, capture: bool = True):
    """Flatten the case's replay trace (with its capture trace): (gpu_ops, problems, truth, result)."""
    tmp.mkdir(parents=True, exist_ok=True)
    rep, truth = replay_trace(case)
    write_trace(rep, tmp / "replay.json")
    caps = [write_trace(capture_trace(case), tmp / "capture.json")] if capture else []
    r = flatten(tmp / "replay.json", tmp / "out", graph_captures=caps)
    return pl.read_parquet(r.out_dir / "gpu_ops.parquet"), r.problems, truth, r


def replayed(g: pl.DataFrame, truth: dict) -> pl.DataFrame:
    return g.filter(pl.col("event_idx").is_in(list(truth)))


def right(g: pl.DataFrame, case: GraphCase, truth: dict) -> int:
    """Replayed kernels given the op (name and shapes) of the node that captured them."""
    n = 0
    for row in replayed(g, truth).iter_rows(named=True):
        node = case.graphs[truth[row["event_idx"]][0]][truth[row["event_idx"]][1]]
        args = json.loads(row["cpu_op_args_json"] or "{}")
        n += row["cpu_op_name"] == node.op and args.get("Input Dims") == [list(d) for d in node.dims]
    return n


def test_every_replay_of_a_graph_gets_the_ops_that_captured_it(tmp_path):
    case = GraphCase([LAYER], replays=[0, 0, 0])
    g, problems, truth, r = run(case, tmp_path)
    assert right(g, case, truth) == 9
    rep = replayed(g, truth)
    assert rep["cpu_op_link"].unique().to_list() == ["graph_capture"]
    assert rep["graph_id"].unique().to_list() == ["capture#0"]
    assert rep["capture_trace_id"].unique().to_list() == [sampled_content_id(str(tmp_path / "capture.json"))]
    assert rep["launch_name"].unique().to_list() == ["hipGraphLaunch"]  # the launch stays the graph launch
    assert rep["annotation"].unique().to_list() == ["execute_model"]  # the context stays the replay's
    # each replay does the op's work again: 2*M*N*K per replay, not split over the replays
    assert rep.filter(pl.col("cpu_op_name") == "aten::mm")["flops"].to_list() == [2 * 64 * 128 * 256] * 3
    assert problems["graphs:replays_paired"] == 3 and problems["link:cpu_op_by_graph_capture"] == 9
    assert graph_hint(problems) is None
    # cpu_op_event_idx is the op's event in the capture trace
    cap = flatten(tmp_path / "capture.json", tmp_path / "cap")
    ev = pl.read_parquet(cap.out_dir / "events.parquet")
    for idx, name, args in rep.select("cpu_op_event_idx", "cpu_op_name", "cpu_op_args_json").iter_rows():
        assert ev.row(idx, named=True)["name"] == name and ev.row(idx, named=True)["args_json"] == args


def test_a_graph_launch_written_as_a_begin_end_pair_is_paired_too(tmp_path):
    """A graph launch written as a B/E pair (a slice once paired) has its replays paired as one
    written as a complete event."""
    case = GraphCase([LAYER], replays=[0, 0, 0])
    rep, _ = replay_trace(case)
    events = []
    for e in rep["traceEvents"]:
        if e.get("ph") == "X" and e.get("name") == "hipGraphLaunch":
            events.append({k: v for k, v in e.items() if k != "dur"} | {"ph": "B"})
            events.append({k: e[k] for k in ("name", "cat", "pid", "tid")} | {"ph": "E", "ts": e["ts"] + e["dur"]})
        else:
            events.append(e)
    assert len(events) == len(rep["traceEvents"]) + 3
    write_trace(rep | {"traceEvents": events}, tmp_path / "replay.json")
    caps = [write_trace(capture_trace(case), tmp_path / "capture.json")]
    r = flatten(tmp_path / "replay.json", tmp_path / "out", graph_captures=caps)
    assert r.problems["graphs:replays_paired"] == 3 and r.problems["link:cpu_op_by_graph_capture"] == 9


def test_pairing_in_small_batches_gives_the_same_pairs(tmp_path, monkeypatch):
    """Replays are paired a bounded number at a time; what one replay tells the next (capture
    order) crosses the batches."""
    head = [pointwise(64, kernel="embed", op="aten::embedding")]
    small, large = [mm(64, 128, 256, kernel="gemm")] * 2, [mm(128, 128, 256, kernel="gemm")] * 2
    case = GraphCase([head, small, large], replays=[0, 1, 2] * 5)
    whole = run(case, tmp_path / "whole")[0]
    monkeypatch.setattr(graphs_mod, "REPLAY_KERNELS", 3)
    g, problems, truth, _ = run(case, tmp_path / "small")
    assert right(g, case, truth) == len(truth) == 25 and problems["graphs:replays_paired"] == 15
    assert g.drop("event_idx").equals(whole.drop("event_idx"), null_equal=True)


def test_pairing_that_ends_after_linking_began_gives_the_same_table(tmp_path, monkeypatch):
    """Replays are paired in a thread of their own while the first batch is linked: a pairing
    that ends late gives the same table and problem counts, in the same order (its own first)."""
    case = GraphCase([LAYER], replays=[0, 0, 0])
    g, problems, _, _ = run(case, tmp_path / "first")
    pair = graphs_mod.GraphLinks.of.__func__
    began = []

    def late(cls, *args):
        began.append(True)
        time.sleep(0.5)  # the first batch's launch lookup (a few ms here) ends long before
        return pair(cls, *args)

    monkeypatch.setattr(graphs_mod.GraphLinks, "of", classmethod(late))
    late_g, late_problems, _, _ = run(case, tmp_path / "late")
    assert began and late_problems["graphs:replays_paired"] == 3
    assert g.equals(late_g, null_equal=True)
    assert list(late_problems.items()) == list(problems.items())
    assert list(problems)[:2] == ["graphs:replays", "graphs:replays_paired"]  # as when paired first


def test_graphs_captured_and_never_replayed_are_counted(tmp_path):
    other = [pointwise(128, kernel="k_a"), pointwise(128, kernel="k_b")]
    case = GraphCase([other, LAYER, other[::-1]], replays=[1])
    g, problems, truth, _ = run(case, tmp_path)
    assert right(g, case, truth) == 3
    assert problems["graphs:captured_graphs"] == 3 and problems["graphs:captured_graphs_not_replayed"] == 2


def test_identical_graphs_follow_their_capture_order(tmp_path):
    """vLLM's piecewise graphs: one per layer, the same kernels and ops, replayed in capture order."""
    head = [pointwise(64, kernel="embed", op="aten::embedding")]
    case = GraphCase([head, LAYER, LAYER, LAYER], replays=[0, 1, 2, 3, 0, 1, 2, 3])
    g, problems, truth, _ = run(case, tmp_path)
    assert right(g, case, truth) == len(truth)
    ids = replayed(g, truth).group_by("graph_id", maintain_order=True).len()
    assert ids["graph_id"].to_list() == [f"capture#{i}" for i in range(4)] and set(ids["len"]) == {2, 6}
    assert problems.get(AMBIGUOUS) is None


def test_same_kernels_different_ops_paired_by_capture_order_or_counted(tmp_path):
    """Two graphs with the same kernels but other shapes (HIP replays record no grid): the one
    captured after the previous replay's graph is taken; with no previous replay, it is ambiguous."""
    small, large = [mm(64, 128, 256, kernel="gemm")] * 2, [mm(128, 128, 256, kernel="gemm")] * 2
    head = [pointwise(64, kernel="embed", op="aten::embedding")]
    case = GraphCase([head, small, large], replays=[0, 1, 2, 2])
    g, problems, truth, _ = run(case, tmp_path)
    rep = replayed(g, truth)
    flops = rep.filter(pl.col("cpu_op_name") == "aten::mm")["flops"].to_list()
    assert flops == [2 * 64 * 128 * 256] * 2 + [2 * 128 * 128 * 256] * 2  # replays 1 and 2
    last = rep.tail(2)  # replay 3 follows graph 2, which has no successor: small or large?
    assert last["cpu_op_name"].null_count() == 2 and last["flops"].null_count() == 2
    assert set(last["unmodelled_reason"]) == {"graph_replay_ambiguous"}
    assert last["graph_id"].unique().to_list()[0].startswith("uncaptured#")
    assert problems[AMBIGUOUS] == 2 and "different ops" in (graph_hint(problems) or "")


def test_grids_tell_same_named_kernels_apart_when_both_sides_record_them(tmp_path):
    small = [mm(64, 128, 256, kernel="gemm", grid=(4, 1, 1))]
    large = [mm(128, 128, 256, kernel="gemm", grid=(8, 1, 1))]
    case = GraphCase([small, large], replays=[1, 0])
    rep, truth = replay_trace(case)
    for i in truth:  # a replay trace that records launch geometry on its graph kernels
        graph, node = truth[i]
        rep["traceEvents"][i]["args"] |= {"grid": list(case.graphs[graph][node].grid), "block": [256, 1, 1]}
    write_trace(rep, tmp_path / "replay.json")
    write_trace(capture_trace(case), tmp_path / "capture.json")
    r = flatten(tmp_path / "replay.json", tmp_path / "out", graph_captures=[tmp_path / "capture.json"])
    g = pl.read_parquet(r.out_dir / "gpu_ops.parquet")
    assert right(g, case, truth) == 2 and replayed(g, truth)["graph_id"].to_list() == ["capture#1", "capture#0"]


def test_multi_stream_graph_whose_kernels_start_in_another_order(tmp_path):
    branches = [
        mm(64, 128, 256, kernel="gemm_a", stream=0),
        pointwise(4096, kernel="add_b", stream=1),
        mm(32, 32, 32, kernel="gemm_c", stream=0),
    ]
    case = GraphCase([branches], replays=[0, 0], start_order={0: [1, 0, 2], 1: [2, 1, 0]})
    g, problems, truth, _ = run(case, tmp_path)
    assert right(g, case, truth) == 6 and problems.get(ORDER) is None
    # the same kernel on two streams, captured by ops of different shapes: their order is unknown
    twins = [mm(64, 128, 256, kernel="gemm", stream=0), mm(128, 128, 256, kernel="gemm", stream=1)]
    case = GraphCase([twins], replays=[0], start_order={0: [1, 0]})
    g, problems, truth, _ = run(case, tmp_path / "twins")
    assert problems[ORDER] == 2 and replayed(g, truth)["cpu_op_name"].to_list() == ["aten::mm"] * 2


def test_replays_without_capture_keep_their_context_and_are_counted(tmp_path, run_cli):
    case = GraphCase([LAYER, [pointwise(8, kernel="other")]], replays=[0, 1, 0])
    g, problems, truth, _ = run(case, tmp_path, capture=False)
    rep = replayed(g, truth)
    assert rep["cpu_op_name"].null_count() == rep.height and rep["graph_node"].null_count() == rep.height
    assert set(rep["annotation"]) == {"execute_model"}
    assert set(rep["unmodelled_reason"]) == {"graph_replay"}
    ids = rep["graph_id"].to_list()  # one id per distinct graph, the same for each of its replays
    assert ids[:3] == ids[4:] and ids[3] != ids[0] and ids[0].startswith("uncaptured#")
    assert problems[NO_CAPTURE] == 7 and problems["graphs:replays"] == 3
    p = run_cli(["flatten", tmp_path / "replay.json", "-o", tmp_path / "cli"])
    assert p.returncode == 0 and "--graph-capture" in p.stderr and "3 CUDA/HIP graph replays" in p.stderr
    # replays of a graph no capture holds
    case = GraphCase([LAYER, [pointwise(8, kernel="x")]], captured=[1], replays=[0])
    g, problems, truth, _ = run(case, tmp_path / "u")
    assert problems[UNMATCHED] == 3 and set(replayed(g, truth)["unmodelled_reason"]) == {"graph_replay_unmatched"}


def _both_ways(flat_dir: Path) -> tuple:
    """A trace's replays paired without captures, by the short way (`_uncaptured_batch`) and the
    whole pairing (`_pair_batch` with no captured graph): (rows, problems) of each."""
    launches = graphs_mod._graph_launches(flat_dir / "events.parquet")
    kernels = (
        pl.read_parquet(flat_dir / "gpu_ops.parquet", columns=graphs_mod._GPU)
        .filter(pl.col("correlation").is_in(launches["correlation"].implode()))
        .with_columns(pl.col("name").cast(pl.String), graphs_mod._node_kind(pl.col("kind").cast(pl.String)))
    )
    assert kernels.height and launches.height
    hashes = graphs_mod._KeyHashes()
    none = graphs_mod._Graphs([], hashes)
    short, whole = Counter(), Counter()
    fast = graphs_mod._uncaptured_batch(kernels, hashes, short)
    keyed = graphs_mod._hashed(graphs_mod._keys(kernels), hashes)
    slow = graphs_mod._pair_batch(launches, keyed, none, graphs_mod._Chooser(none), whole, set())
    return (fast, short), (slow, whole)


def test_replays_without_a_capture_take_a_short_way_to_the_same_rows(tmp_path, shared_traces):
    """Without a capture trace no replay can be paired: the short way skips the keys at grid
    level and the joins (0.5 s on 1 GB of hta/diff_test_v100) and must give the rows and counts
    the whole pairing gives, on memsets, several streams and a real V100 trace's replays."""
    case = GraphCase([LAYER, [memset(64), pointwise(8, kernel="other")]], replays=[0, 1, 0, 1], start_order={1: [1, 0]})
    synthetic = run(case, tmp_path / "synthetic", capture=False)[3].out_dir
    v100 = flatten(shared_traces / "hta" / "diff_test_v100.json.gz", tmp_path / "v100").out_dir
    for flat_dir in (synthetic, v100):
        (fast, short), (slow, whole) = _both_ways(flat_dir)
        assert fast.equals(slow) and short == whole, flat_dir.name
        assert fast["graph_id"].n_unique() > 1 and short[NO_CAPTURE] == fast.height


def test_kineto_graph_ids_group_replays_without_a_capture(tmp_path):
    """CUDA 12+ kernels carry Kineto's `graph id` / `graph node id` (2026-02): without a capture
    trace each replay is its graph, its kernels that graph's nodes in order, in the context of its
    graph launch; with a capture the captured graph wins."""
    case = GraphCase([LAYER, [mm(8, 8, 8, kernel="tiny")]], replays=[0, 1, 0], api="cuda", kineto_graph_ids=True)
    g, problems, truth, r = run(case, tmp_path, capture=False)
    rep = replayed(g, truth)
    assert rep["graph_id"].to_list() == ["graph id 10"] * 3 + ["graph id 11"] + ["graph id 10"] * 3
    assert rep["graph_node"].to_list() == [truth[i][1] for i in rep["event_idx"]]  # its node, in creation order
    assert set(rep["annotation"]) == {"execute_model"} and set(rep["launch_name"]) == {"cudaGraphLaunch"}
    eager = g.filter(~pl.col("event_idx").is_in(list(truth)))
    assert eager.height == 2 and eager["graph_id"].null_count() == 2 and eager["kineto_graph_id"].to_list() == [0, 0]
    view = graph_view(r.out_dir)
    assert sorted(view.select("graph", "replays", "kernels_per_replay").rows()) == [
        ("graph id 10", 2, 3.0),
        ("graph id 11", 1, 1.0),
    ]
    assert view["capture"].null_count() == view.height
    g, _, truth, _ = run(case, tmp_path / "captured")  # a capture trace pairs them: its graphs win
    assert set(replayed(g, truth)["graph_id"]) == {"capture#0", "capture#1"}
    assert right(g, case, truth) == 7


def test_cuda_captures_without_kernel_names_pair_by_kind_and_order(tmp_path):
    case = GraphCase([LAYER, [mm(8, 8, 8, kernel="tiny")]], replays=[0, 1, 0], api="cuda")
    g, problems, truth, _ = run(case, tmp_path)
    assert right(g, case, truth) == 7
    assert problems[BY_KIND] == 7 and replayed(g, truth)["launch_name"][0] == "cudaGraphLaunch"


@pytest.mark.parametrize("api", ["hip", "cuda"])
def test_a_captured_memset_is_replayed_as_a_memset_or_a_fill_kernel(tmp_path, api):
    """HIP runs a graph's memset node as a blit kernel (__amd_rocclr_fillBuffer...), CUDA as a memset."""
    case = GraphCase([[memset(1024), *LAYER]], replays=[0, 0], api=api)
    g, problems, truth, _ = run(case, tmp_path)
    assert right(g, case, truth) == 8 and problems["graphs:replays_paired"] == 2
    assert set(replayed(g, truth).filter(pl.col("cpu_op_name") == "aten::zero_")["kind"]) == {
        "kernel" if api == "hip" else "memset"
    }


def test_bad_capture_trace_is_one_line(tmp_path, run_cli):
    case = GraphCase([LAYER], replays=[0])
    write_trace(replay_trace(case)[0], tmp_path / "replay.json")
    (tmp_path / "bad.json").write_text("not a trace")
    p = run_cli(["flatten", tmp_path / "replay.json", "--graph-capture", tmp_path / "bad.json", "-o", tmp_path / "o"])
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "bad.json" in p.stderr
    assert not (tmp_path / "o" / "replay").exists()
    p = run_cli(["flatten", tmp_path / "replay.json", "--graph-capture", tmp_path / "bad.json", "--no-link", "-o", "x"])
    assert p.returncode == 2 and "--no-link" in p.stderr


# ------------------------------------------------------------------ analyses
def test_graph_view_launch_overhead_and_op_table(tmp_path):
    case = GraphCase([LAYER, [pointwise(8, kernel="k")]], replays=[0, 0, 1, 0])
    _, _, _, r = run(case, tmp_path)
    view = graph_view(r.out_dir)
    top = view.row(0, named=True)
    assert (top["graph"], top["capture"], top["replays"], top["kernels_per_replay"]) == ("#0", "capture", 3, 3.0)
    assert top["gpu_us_per_replay"] == pytest.approx(60.0) and top["launch_us"] == pytest.approx(30.0)
    assert top["replaced_launch_us"] == pytest.approx(3 * 3.5)  # the capture's three launch calls
    assert sorted(top["ops"]) == ["aten::add", "aten::mm", "aten::relu"]
    assert top["launched_from"] is None  # only plumbing frames (torch.cuda.graphs replay) around the launch
    launch = report.launch_overhead(r.out_dir).row(0, named=True)
    assert (launch["graph_launches"], launch["graph_kernels"], launch["kernels"]) == (4, 10, 2)  # 2 eager kernels
    assert launch["graph_launch_p50_us"] == pytest.approx(30.0)
    assert launch["replaced_launch_p50_us"] == pytest.approx(10.5)
    ops = report.op_table(r.out_dir)
    mm_row = ops.filter(pl.col("name") == "aten::mm").row(0, named=True)
    # 2 eager calls and 3 replays: the replayed ones ran no CPU time here
    assert mm_row["calls"] == 5 and mm_row["kernels"] == 5
    assert mm_row["flops"] == pytest.approx(2 * 128 * 256 * 512 * 2 + 2 * 64 * 128 * 256 * 3)
    relu = ops.filter(pl.col("name") == "aten::relu").row(0, named=True)
    assert relu["calls"] == 3 and relu["self_cpu_us"] == 0 and relu["self_device_us"] == pytest.approx(60.0)
    shapes = report.op_table(r.out_dir, group_by="input-shape").filter(pl.col("name") == "aten::mm")
    assert sorted(shapes["input_shape"]) == ["[[128,256],[256,512]]", "[[64,128],[128,256]]"]
    assert sorted(shapes["calls"]) == [2, 3]


def test_idle_and_queue_where_one_launch_starts_many_kernels(tmp_path):
    """Inside a replay the next kernel was launched long before: kernel wait, never host wait; a
    replay launched after the previous one ended waited for the host. A graph launch puts all
    its kernels in the queue at once."""
    case = GraphCase([LAYER], replays=[0, 0], eager=0, gpu_lag_us=0)
    _, _, _, r = run(case, tmp_path)
    idle = report.idle(r.out_dir).row(0, named=True)
    # replay 0 runs 40..102 µs (gaps of 1 µs), replay 1 is launched at 105 and runs from 140
    assert idle["kernel_wait_us"] == pytest.approx(4.0) and idle["host_wait_us"] == pytest.approx(140 - 102)
    queue = report.queue(r.out_dir).row(0, named=True)
    assert queue["max"] == 3 and queue["launched"] == 6
    late = GraphCase([LAYER], replays=[0, 0], eager=0)  # the GPU 1 ms behind: both launched first
    _, _, _, r = run(late, tmp_path / "late")
    assert report.queue(r.out_dir).row(0, named=True)["max"] == 6
    assert report.idle(r.out_dir).row(0, named=True)["host_wait_us"] == 0


def test_critical_path_goes_through_a_graph_launch_to_its_kernels(tmp_path):
    case = GraphCase([LAYER], replays=[0], eager=0)
    _, _, truth, r = run(case, tmp_path)
    with report.opened(r.out_dir) as f:
        items = report.critical_path_items(f)
        path = report.critical_path(f)
    # the graph launch (left at its start: the delay to its first kernel is `launch`), then its
    # three kernels one after the other on the stream
    named = items.filter(pl.col("event_idx").is_not_null())
    assert named["name"].cast(pl.String).to_list() == ["hipGraphLaunch", *(n.kernel for n in LAYER)]
    assert items.filter(pl.col("event_idx").is_null())["category"].to_list() == ["launch", "waiting", "waiting"]
    assert path["breakdown_us"]["kernel"] == pytest.approx(3 * 20.0)


def test_analyze_shows_graphs_in_every_format(tmp_path, run_cli):
    case = GraphCase([LAYER], replays=[0, 0])
    _, _, _, r = run(case, tmp_path)
    p = run_cli(["analyze", r.out_dir, "--section", "graphs", "--width", "80"])
    assert p.returncode == 0 and "#0" in p.stdout
    assert all(len(line) <= 80 for line in p.stdout.splitlines())
    doc = json.loads(run_cli(["analyze", r.out_dir, "--section", "graphs", "--format", "json"]).stdout)
    assert doc["graphs"][0]["replays"] == 2 and doc["graphs"][0]["ops"]


# ------------------------------------------------------------------ batch
def test_batch_pairs_the_capture_traces_beside_a_run(tmp_path):
    case = GraphCase([LAYER], replays=[0, 0])
    run_dir = tmp_path / "src" / "run1"
    (run_dir / "capture_traces").mkdir(parents=True)
    write_trace(replay_trace(case)[0], run_dir / "rank0.json")
    write_trace(capture_trace(case), run_dir / "capture_traces" / "graph_capture_rank_0.json")
    r = run_batch(tmp_path / "src", tmp_path / "ds", jobs=1)
    assert r.added == 2 and r.exit_code == 0
    t = tables(tmp_path / "ds")
    traces = t["trace"].select("trace_id", "stem").collect()
    cap_id = traces.filter(pl.col("stem") == "graph_capture_rank_0")["trace_id"].item()
    g = t["gpu_ops"].filter(pl.col("graph_id").is_not_null()).collect()
    assert g.height == 6 and set(g["cpu_op_link"]) == {"graph_capture"} and set(g["capture_trace_id"]) == {cap_id}
    ev = t["events"].filter(pl.col("trace_id") == cap_id).collect()
    names = ev.join(g.select(event_idx="cpu_op_event_idx"), on="event_idx", how="semi")["name"]
    assert set(names) == {"aten::add", "aten::mm", "aten::relu"}
    # --capture-dir '' pairs nothing
    r = run_batch(tmp_path / "src", tmp_path / "ds2", jobs=1, capture_dir=None)
    g = tables(tmp_path / "ds2")["gpu_ops"].filter(pl.col("graph_id").is_not_null()).collect()
    assert set(g["unmodelled_reason"]) == {"graph_replay"}


def test_batch_keeps_a_replay_whose_capture_trace_is_bad(tmp_path):
    run_dir = tmp_path / "src" / "run1"
    (run_dir / "capture_traces").mkdir(parents=True)
    write_trace(replay_trace(GraphCase([LAYER], replays=[0]))[0], run_dir / "rank0.json")
    (run_dir / "capture_traces" / "broken.json").write_text('{"traceEvents": 7}')
    r = run_batch(tmp_path / "src", tmp_path / "ds", jobs=1)
    assert r.added == 1 and r.quarantined == 1  # the broken capture trace, not the replay
    man = tables(tmp_path / "ds")["traces"].collect()
    ok = man.filter(pl.col("status") == "ok").row(0, named=True)
    assert "not paired with graph capture trace" in (ok["warnings"] or "") and "broken.json" in ok["warnings"]


# ------------------------------------------------------------------ the real pair
def _truth(cap: list, rep: list) -> dict[int, str | None]:
    """Independently: each replayed kernel's capturing op (innermost cpu_op around the launch in
    the capture trace), replays matched to captured graphs by their kernel names in order."""
    ops: dict = {}
    for e in cap:
        if e.get("cat") == "cpu_op" and e.get("ph") == "X":
            ops.setdefault(e["tid"], []).append(e)
    graphs, cur = [], None
    for e in sorted((e for e in cap if e.get("cat") == "cuda_runtime"), key=lambda e: e["ts"]):
        if e["name"].endswith("BeginCapture"):
            cur = []
        elif e["name"].endswith("EndCapture") and cur is not None:
            graphs.append(cur)
            cur = None
        elif cur is not None and "kernel" in e["args"]:
            cur.append(e)
    corr = {e["args"]["correlation"] for e in rep if e.get("name") == "hipGraphLaunch"}
    runs: dict = {}
    for i, e in enumerate(rep):
        if e.get("cat") == "kernel" and e["args"].get("correlation") in corr:
            runs.setdefault(e["args"]["correlation"], []).append((e["ts"], i, e))
    out = {}
    for ks in runs.values():
        ks.sort()
        g = next(g for g in graphs if [x["args"]["kernel"] for x in g] == [e["name"] for _, _, e in ks])
        for (_, i, _), launch in zip(ks, g):
            inside = [o for o in ops[launch["tid"]] if o["ts"] <= launch["ts"] <= o["ts"] + o["dur"]]
            out[i] = min(inside, key=lambda o: o["dur"])["name"] if inside else None
    return out


@pytest.mark.real
def test_the_real_vllm_pair(shared_traces, tmp_path):
    rep_path = shared_traces / "tracelens" / "mi300x_vllm_graph_replay.json.gz"
    cap_path = shared_traces / "tracelens" / "mi300x_vllm_graph_capture.json.gz"
    if not rep_path.exists():
        pytest.skip("no vLLM graph pair")
    want = _truth(json.load(gzip.open(cap_path))["traceEvents"], json.load(gzip.open(rep_path))["traceEvents"])
    r = flatten(rep_path, tmp_path, graph_captures=[cap_path])
    g = pl.read_parquet(r.out_dir / "gpu_ops.parquet").filter(pl.col("event_idx").is_in(list(want)))
    assert len(want) == 361 and g.height == 361
    got = dict(zip(g["event_idx"], g["cpu_op_name"]))
    assert got == want
    addmm = g.filter(pl.col("cpu_op_name") == "aten::addmm")
    assert addmm.height == 72 and addmm["flops"].null_count() == 0
    assert r.problems["graphs:replays_paired"] == 25 and graph_hint(r.problems) is None
    view = graph_view(r.out_dir)
    assert view.height == 25 and view["replays"].sum() == 25 and view["kernels_per_replay"].sum() == 361
    assert set(view["launched_from"]) == {"<eval_with_key>.50(4): forward"}
