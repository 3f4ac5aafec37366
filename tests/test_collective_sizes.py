"""Collective sizes from every layout (`messages.SIZE_SOURCES`): one hand-made trace per source, the
nccl-tests rule per kind, dtype spellings, coalesced calls and uneven alltoalls; and the real
DLRM run on 8 V100s (torch 2.0: sizes only in the `nccl:*` annotations)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from pipeline.cost.formulas import op_cost
from pipeline.cost.formulas.messages import SIZE_SOURCES, Message, message_nelems, op_message
from pipeline.flatten import flatten
from pipeline.runs.calls import KIND_CODE, KIND_NAMES
from pipeline.runs.match import desyncs, window

PID, TID = 100, 100
NCCL_AR = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"
NCCL_SR = "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)"
NCCL_GENERIC = "ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)"


def x(name, ts, dur, cat="cpu_op", **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": PID, "tid": TID, "ts": ts, "dur": dur, "args": args}


def collective(t, kernel, ops, kernel_args=None, corr=None):
    """CPU events nested at t (each `(name, cat, args)` inside the one before), a launch inside
    the innermost and its kernel on stream 20 of device 0."""
    corr = corr if corr is not None else t
    ev = [x(name, t + i, 100 - 2 * i, cat, **args) for i, (name, cat, args) in enumerate(ops)]
    ev.append(x("cudaLaunchKernel", t + 20, 5, "cuda_runtime", correlation=corr))
    k_args = {"device": 0, "stream": 20, "correlation": corr, **(kernel_args or {})}
    ev.append(
        {"ph": "X", "cat": "kernel", "name": kernel, "pid": 0, "tid": 20, "ts": t + 40, "dur": 30, "args": k_args}
    )
    return ev


def collectives_of(tmp_path: Path, events: list, world: int = 4) -> list[dict]:
    src = tmp_path / "t.json"
    dist = {"backend": "nccl", "rank": 0, "world_size": world}
    src.write_text(json.dumps({"schemaVersion": 1, "distributedInfo": dist, "traceEvents": events}))
    flat = flatten(src, tmp_path / "flat").out_dir
    return pl.read_parquet(flat / "collectives.parquet").sort("ts_ns").to_dicts()


def picked(row):
    return row["kind"], row["bytes"], row["dtype"], row["size_from"]


# ------------------------------------------------------------------ one trace per source
def test_the_kernels_own_args_come_first(tmp_path):
    args = {"Collective name": "_allgather_base", "In msg nelems": 25136, "Out msg nelems": 201088, "dtype": "BFloat16"}
    ann = ("nccl:_all_gather_base", "user_annotation", {"Input Dims": [[7]], "Input type": ["float"]})
    (row,) = collectives_of(tmp_path, collective(1000, NCCL_GENERIC, [ann], {**args, "Group size": 8}))
    assert picked(row) == ("allgather", 201088 * 2, "bf16", "the kernel's args")  # the gathered output


def test_the_annotation_around_the_launch(tmp_path):
    """runs/dlrm8_v100's layout (torch 2.0): c10d::allreduce_ > record_param_comms > nccl:all_reduce,
    the TensorList's shapes not recorded; only the annotation says [[394241]] float."""
    ops = [
        (
            "c10d::allreduce_",
            "cpu_op",
            {"Input Dims": [[], [], [], []], "Input type": ["TensorList", "", "", "Scalar"]},
        ),
        (
            "record_param_comms",
            "cpu_op",
            {"Input Dims": [[], [], []], "Input type": ["TensorList", "Scalar", "Scalar"]},
        ),
        ("nccl:all_reduce", "user_annotation", {"Input Dims": [[394241]], "Input type": ["float"]}),
    ]
    (row,) = collectives_of(tmp_path, collective(1000, NCCL_AR, ops))
    assert picked(row) == ("allreduce", 394241 * 4, "fp32", "the nccl:/gloo: annotation")
    assert row["op_name"] == "nccl:all_reduce" and row["in_nelems"] == 394241


def test_the_2021_layouts_input_dims(tmp_path):
    """torch 1.8 writes `Input dims` and no `Input type`: the count from the annotation, the dtype
    of a reduction from the kernel's name."""
    ann = ("nccl:all_reduce", "user_annotation", {"Input dims": [[100]]})
    (row,) = collectives_of(tmp_path, collective(1000, NCCL_AR, [ann]))
    assert picked(row) == ("allreduce", 400, "fp32", "the nccl:/gloo: annotation")


def test_record_param_comms_args_and_its_input_dims(tmp_path):
    rs = {"Collective name": "_reduce_scatter_base", "In msg nelems": 800, "Out msg nelems": 200, "dtype": "Half"}
    old = {"Input Dims": [[6144], [], []], "Input type": ["float", "Scalar", "Scalar"]}  # torch 2.0
    ev = collective(1000, NCCL_GENERIC, [("record_param_comms", "cpu_op", {**rs, "Group size": 4})])
    ev += collective(2000, NCCL_SR, [("c10d::alltoall_base_", "cpu_op", {}), ("record_param_comms", "cpu_op", old)])
    a, b = collectives_of(tmp_path, ev)
    assert picked(a) == ("reducescatter", 800 * 2, "fp16", "record_param_comms")  # the scattered input
    assert picked(b) == ("alltoall", 6144 * 4, "fp32", "record_param_comms")


def test_the_c10d_ops_arguments(tmp_path):
    """alltoall_base_ with uneven splits: the send buffer is the input (2nd argument), not the
    output; allgather_ records its input shard in a TensorList: x the group size."""
    uneven = {"Input Dims": [[768], [3392], [], [], [], []], "Input type": ["int", "int", "", "", "", "Scalar"]}
    shard = {"Input Dims": [[], [[5]], [], []], "Input type": ["", "TensorList", "", "Scalar"]}
    ev = collective(1000, NCCL_SR, [("c10d::alltoall_base_", "cpu_op", uneven)])
    ev += collective(2000, "ncclKernel_AllGather_RING_LL_Sum_int8_t", [("c10d::allgather_", "cpu_op", shard)])
    a, b = collectives_of(tmp_path, ev, world=4)
    assert picked(a) == ("alltoall", 3392 * 4, "int32", "the c10d op")
    assert (b["kind"], b["in_nelems"], b["size_from"], b["dtype"], b["bytes"]) == (
        "allgather",
        5,
        "the c10d op",
        None,
        None,
    )


def test_the_kernel_name_gives_a_reductions_dtype_last(tmp_path):
    lists = {"Input Dims": [[[256], [256]], []], "Input type": ["TensorList", ""]}  # two tensors, no dtype
    ev = collective(
        1000, "ncclKernel_AllReduce_RING_LL_Sum_half(ncclDevComm*)", [("c10d::allreduce_", "cpu_op", lists)]
    )
    ev += collective(
        2000, "ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclDevComm*)", [("c10d::broadcast_", "cpu_op", lists)]
    )
    a, b = collectives_of(tmp_path, ev)
    assert picked(a) == ("allreduce", 512 * 2, "fp16", "the c10d op")
    assert picked(b) == ("broadcast", None, None, "the c10d op")  # int8_t names a byte-wise copy, not the dtype


def test_a_coalesced_group_sums_its_calls(tmp_path):
    """ProcessGroupNCCL::endCoalescing launches one kernel inside `nccl:coalesced`, which records
    nothing; each coalesced call recorded its record_param_comms before (ended before the launch)."""
    call = {"Collective name": "all_gather_into_tensor", "In msg nelems": 10, "Out msg nelems": 40, "dtype": "Float"}
    ev = [x("record_param_comms", 990, 3, **call), x("record_param_comms", 995, 3, **{**call, "Out msg nelems": 80})]
    ev += collective(1000, NCCL_GENERIC, [("nccl:coalesced", "user_annotation", {})])
    ev += collective(2000, NCCL_GENERIC, [("nccl:coalesced", "user_annotation", {})])  # no calls since: unknown
    a, b = collectives_of(tmp_path, ev)
    assert picked(a) == ("allgather", 120 * 4, "fp32", "the coalesced calls")
    assert (b["bytes"], b["size_from"]) == (None, None)


def test_no_source_leaves_the_size_unknown(tmp_path):
    (row,) = collectives_of(tmp_path, collective(1000, NCCL_GENERIC, []))
    assert (row["kind"], row["bytes"], row["size_from"]) == ("unknown", None, None)


def test_sources_are_documented_data():
    assert [s.on for s in SIZE_SOURCES][:4] == ["kernel", "launch", "launch", "launch"]
    assert SIZE_SOURCES[-1].name == "the kernel's name"
    assert all(s.taught_by and s.name for s in SIZE_SOURCES)


# ------------------------------------------------------------------ the rule and the readers
@pytest.mark.parametrize(
    "kind, m, group, want",
    [
        ("allreduce", Message(100, 100), None, 100),
        ("allgather", Message(25, 100), None, 100),  # the gathered output
        ("allgather", Message(25, None), 4, 100),  # a shard x the group
        ("allgather", Message(25, None), None, None),
        ("reducescatter", Message(100, 25), None, 100),  # the input
        ("reducescatter", Message(None, 25, group_size=4), None, 100),
        ("alltoall", Message(3392, 768), None, 3392),  # the whole send buffer, uneven splits
        ("broadcast", Message(None, 7), None, 7),
        ("barrier", Message(1, 1), None, None),
    ],
)
def test_nccl_tests_size_rule(kind, m, group, want):
    assert message_nelems(kind, m, group) == want


@pytest.mark.parametrize(
    "typ, want",
    [("float", "fp32"), ("c10::Half", "fp16"), ("c10::BFloat16", "bf16"), ("long int", "int64"), ("int", "int32")],
)
def test_dtype_spellings_of_input_type(typ, want):
    assert op_message("nccl:all_reduce", {"Input Dims": [[8]], "Input type": [typ]}) == Message(8, None, want)


@pytest.mark.parametrize(
    "spelling, want", [("Float", "fp32"), ("BFloat16", "bf16"), ("Half", "fp16"), ("Long", "int64")]
)
def test_dtype_spellings_of_record_param_comms(spelling, want):
    m = op_message("record_param_comms", {"In msg nelems": 3, "Out msg nelems": 3, "dtype": spelling})
    assert m == Message(3, 3, want)


def test_tensor_lists_are_summed_and_unrecorded_ones_unknown():
    assert op_message(
        "nccl:allreduce_coalesced", {"Input Dims": [[10], [20, 2]], "Input type": ["float", "float"]}
    ) == Message(50, None, "fp32")
    nested = {"Input Dims": [[[4, 4], [8]], [], []], "Input type": ["TensorList", "", "Scalar"]}
    assert op_message("c10d::allreduce_coalesced_", nested) == Message(24, None, None)
    assert op_message("record_param_comms", {"Input Dims": [[], []], "Input type": ["TensorList", "Scalar"]}) is None


def test_the_cost_formulas_read_sizes_by_the_same_rule():
    uneven = {"Input Dims": [[768], [3392], [], [], [], []], "Input type": ["int", "int", "", "", "", "Scalar"]}
    assert op_cost("c10d::alltoall_base_", uneven).bytes == 3392 * 4
    assert op_cost("nccl:all_to_all", {"Input Dims": [[24]], "Input type": ["long int"]}).bytes == 24 * 8
    rpc = {"Collective name": "allgather", "In msg nelems": 10, "Out msg nelems": 40, "dtype": "Float"}
    assert op_cost("record_param_comms", rpc).bytes == 160


def test_an_uneven_alltoall_is_not_a_desync():
    kinds = ["alltoall", "alltoall", "allreduce", "allreduce"]
    calls = window(
        {
            "seq": np.array([0, 0, 1, 1]),
            "rank": np.array([0, 1, 0, 1]),
            "kind": np.array([KIND_CODE[k] for k in kinds]),
            "bytes": np.array([13568, 9000, 400, 800]),
        }
    )
    bad, rows = desyncs(calls, list(KIND_NAMES))
    assert bad.tolist() == [False, True]  # each rank sends its own split in an alltoall
    assert {(seq, kind) for _, seq, kind, *_ in rows} == {(1, "allreduce")}


# ------------------------------------------------------------------ the real run
@pytest.mark.real
@pytest.mark.slow
def test_dlrm8_v100_sizes_as_its_annotations_give_them(shared_traces, tmp_path):
    from pipeline.dataset.batch import run_batch
    from pipeline.runs.report import analyze_runs, runs_json

    src = shared_traces.parent / "runs" / "dlrm8_v100"
    truth_path = src.parent / "dlrm8_v100.truth.json"
    if not truth_path.is_file():
        pytest.skip("the dlrm8_v100 run is not in ../shared/runs")
    truth = json.loads(truth_path.read_text())
    run_batch(src, tmp_path / "ds", jobs=1)
    (run,) = runs_json(analyze_runs(tmp_path / "ds"))["runs"]
    got: dict[str, int] = {}
    for c in run["collectives"]:
        key = f"{c['name']}:{c['bytes']}"
        got[key] = got.get(key, 0) + 1
        assert c["busbw_gbps"] and c["algbw_gbps"] and c["n_ranks"] == 8
    assert got == dict(truth["sizes"]) and not run["desyncs"]


@pytest.mark.real
def test_shared_traces_of_three_layouts(shared_traces, tmp_path):
    """torch 2.3 kernels with their own args (b200_eager: `_allgather_base` of 25136 x 8 bf16);
    an older DLRM rank whose SendRecv kernels are sized by `nccl:all_to_all` (a100_old_format: 5
    kernels launched before the profiler started have no launch, so no size)."""
    b200 = pl.read_parquet(
        flatten(shared_traces / "tracelens/b200_eager.json.gz", tmp_path).out_dir / "collectives.parquet"
    )
    assert picked(b200.row(0, named=True)) == ("allgather", 201088 * 2, "bf16", "the kernel's args")
    old = pl.read_parquet(
        flatten(shared_traces / "hta/a100_old_format_rank0.json.gz", tmp_path).out_dir / "collectives.parquet"
    )
    assert dict(old.group_by("size_from").len().rows()) == {"the nccl:/gloo: annotation": 75, None: 5}
    assert old.filter(pl.col("size_from").is_null())["kind"].unique().to_list() == ["sendrecv"]
    first = old.filter(pl.col("kind") == "alltoall").row(0, named=True)
    assert (first["in_nelems"], first["dtype"], first["bytes"]) == (48, "int64", 384)
