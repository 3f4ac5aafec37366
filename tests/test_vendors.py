"""Kineto's other device backends, on traces built from their sources (no real trace of them yet):
Intel GPUs (XPU, libkineto/src/plugin/xpupti), PrivateUse1 backends and Intel Gaudi (`hpu_op`).
Each is recognised as its layout, its device activity read as device ops on their device and
queue, linked to its launch and op, and costed against the device's spec where there is one."""

from __future__ import annotations

import json

import polars as pl
import pytest

from pipeline import kineto
from pipeline.flatten import flatten

HOST_PID, HOST_TID = 4100, 4101


def _x(cat, name, pid, tid, ts, dur, args=None) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args or {}}


def _flow(ph, corr, pid, tid, ts) -> dict:
    e = {"ph": ph, "id": corr, "pid": pid, "tid": tid, "ts": ts, "cat": "ac2g", "name": "ac2g"}
    return {**e, "bp": "e"} if ph == "f" else e


def _mm(ts: float, ext: int) -> dict:
    args = {"External id": ext, "Input Dims": [[1024, 2048], [2048, 512]], "Input type": ["c10::BFloat16"] * 2}
    return _x("cpu_op", "aten::mm", HOST_PID, HOST_TID, ts, 40.0, args)


def xpu_trace() -> dict:
    """An Intel GPU trace as the XPU plugin writes it (XpuptiActivityHandlers.cpp): runtime calls
    `urEnqueueKernelLaunch` / `urEnqueueMemBufferWrite` (cat `xpu_runtime`, args.correlation), a
    Level Zero call (`xpu_driver`), kernels and copies in the device's process on the SYCL queue's
    thread with args `device`, `sycl queue`, `correlation`, `kernel_id`, the appended/submitted
    times as quoted text; `ac2g` flows by correlation id; a `xpu_sync` barrier; deviceProperties
    as getXpuDeviceProperties writes them."""
    queue = 7
    ev = [
        {"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "Intel(R) Data Center GPU Max 1550"}},
        _mm(100.0, 11),
        _x("xpu_runtime", "urEnqueueKernelLaunch", HOST_PID, HOST_TID, 105.0, 8.0, {"correlation": 301}),
        _x("xpu_driver", "zeCommandListAppendLaunchKernel", HOST_PID, HOST_TID, 106.0, 3.0, {"correlation": 302}),
        _flow("s", 301, HOST_PID, HOST_TID, 105.0),
        _x("xpu_runtime", "urEnqueueMemBufferWrite", HOST_PID, HOST_TID, 150.0, 5.0, {"correlation": 303}),
        _flow("s", 303, HOST_PID, HOST_TID, 150.0),
        _x(
            "kernel",
            "gemm_kernel<bf16>",
            0,
            queue,
            120.0,
            30.0,
            {
                "correlation": 301,
                "appended": "119.500",
                "submitted": "119.800",
                "device": 0,
                "context": "0x0000000000a1b2c3",
                "sycl queue": queue,
                "l0 queue": "0x0000000000d4e5f6",
                "kernel_id": 17,
                "sycl_node_id": 0,
                "sycl_invocation_id": 3,
            },
        ),
        _flow("f", 301, 0, queue, 120.0),
        _x(
            "gpu_memcpy",
            "Memcpy M2D (Host -> Device)",
            0,
            queue,
            160.0,
            4.0,
            {
                "correlation": 303,
                "l0 call": "zeCommandListAppendMemoryCopy",
                "device": 0,
                "sycl queue": queue,
                "memory opration id": 5,
                "bytes": 1 << 20,
                "memory bandwidth (GB/s)": 262.1,
            },
        ),
        _flow("f", 303, 0, queue, 160.0),
        _x("xpu_sync", "zeEventHostSynchronize", -1, HOST_TID, 170.0, 2.0, {"correlation": 304, "Type": "HOST_EVENT"}),
    ]
    props = {
        "id": 0,
        "name": "Intel(R) Data Center GPU Max 1550",
        "totalGlobalMem": 68719476736,
        "maxComputeUnits": 448,
        "maxWorkGroupSize": 1024,
        "maxClockFrequency": 1600,
        "maxMemAllocSize": 68719476736,
        "localMemSize": 131072,
        "vendor": "Intel(R) Corporation",
        "driverVersion": "1.3.29735",
    }
    return {"schemaVersion": 1, "deviceProperties": [props], "traceEvents": ev}


def privateuse1_trace() -> dict:
    """A PrivateUse1 backend's trace: launches of cat `privateuse1_runtime` / `privateuse1_driver`,
    its plugin's kernels (CONCURRENT_KERNEL) with device, stream and correlation, `ac2g` flows
    (output_json.cpp writes every backend's activity the same way)."""
    ev = [
        _mm(100.0, 21),
        _x("privateuse1_runtime", "LaunchKernel", HOST_PID, HOST_TID, 104.0, 6.0, {"correlation": 401}),
        _x("privateuse1_driver", "drvLaunchKernel", HOST_PID, HOST_TID, 105.0, 2.0, {"correlation": 402}),
        _flow("s", 401, HOST_PID, HOST_TID, 104.0),
        _x("kernel", "matmul_bf16", 1, 3, 115.0, 25.0, {"device": 1, "stream": 3, "correlation": 401}),
        _flow("f", 401, 1, 3, 115.0),
    ]
    return {"schemaVersion": 1, "deviceProperties": [{"id": 1, "name": "MyAccel X1"}], "traceEvents": ev}


def hpu_trace() -> dict:
    """An Intel Gaudi trace as Habana's Kineto plugin writes it (KinetoActivityProfiler::addActivity):
    the device's engines' work as `hpu_op` (and `kernel` with args.device for nodes) in the device's
    process (pid = device, tid = engine); the bridge's host work as `hpu_op` in the host process;
    no launch flows."""
    ev = [
        {"ph": "M", "name": "process_name", "pid": 2, "args": {"name": "HPU"}},
        _mm(100.0, 31),
        _x("hpu_op", "graph_compile", HOST_PID, HOST_TID, 101.0, 20.0),  # host work
        _x("hpu_op", "TPC0 add_fwd_bf16", 2, 10, 130.0, 12.0),
        _x("hpu_op", "DMA down", 2, 20, 125.0, 4.0),
        _x("kernel", "MME gemm", 2, 30, 140.0, 30.0, {"device": 2}),
    ]
    return {"schemaVersion": 1, "traceEvents": ev}


def _flat(tmp_path, name: str, doc: dict):
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(doc))
    r = flatten(path, tmp_path / "out")
    g = pl.read_parquet(r.out_dir / "gpu_ops.parquet")
    trace = pl.read_parquet(r.out_dir / "trace.parquet").row(0, named=True)
    devs = pl.read_parquet(r.out_dir / "devices.parquet")
    return r, g, trace, devs


def test_xpu_trace(tmp_path):
    r, g, trace, devs = _flat(tmp_path, "xpu", xpu_trace())
    assert trace["layout"] == "xpu"
    assert g.select("name", "kind", "device", "stream").rows() == [
        ("gemm_kernel<bf16>", "kernel", 0, 7),  # the SYCL queue as its stream
        ("Memcpy M2D (Host -> Device)", "memcpy", 0, 7),
    ]
    assert g["launch_link"].to_list() == ["flow", "flow"]
    assert g["launch_name"].to_list() == ["urEnqueueKernelLaunch", "urEnqueueMemBufferWrite"]
    kernel = g.row(0, named=True)
    assert kernel["cpu_op_name"] == "aten::mm" and kernel["flops"] == 2 * 1024 * 2048 * 512
    assert kernel["spec_name"] == "Intel Data Center GPU Max 1550 (one stack)"  # 64 GB: a stack in FLAT mode
    assert 0 < kernel["achieved_flops_pct"] < 100
    assert g.row(1, named=True)["copy_bytes"] == 1 << 20
    props = json.loads(devs.filter(pl.col("device") == 0)["props_json"][0])
    assert props["maxComputeUnits"] == 448 and props["driverVersion"] == "1.3.29735"
    assert not r.warnings and "lost:device_activity" not in r.problems


def test_privateuse1_trace(tmp_path):
    r, g, trace, _ = _flat(tmp_path, "pu1", privateuse1_trace())
    assert trace["layout"] == "privateuse1"
    assert g.select("name", "device", "stream", "launch_name", "launch_link", "cpu_op_name").rows() == [
        ("matmul_bf16", 1, 3, "LaunchKernel", "flow", "aten::mm")
    ]
    assert g["flops"][0] == 2 * 1024 * 2048 * 512 and g["spec_name"][0] is None  # no spec for MyAccel X1
    assert any("MyAccel X1" in w for w in r.warnings)


def test_hpu_trace(tmp_path):
    _, g, trace, devs = _flat(tmp_path, "hpu", hpu_trace())
    assert trace["layout"] == "hpu"
    # the engines' work on the device's process is device activity; the bridge's on the host is not
    assert sorted(g.select("name", "device", "stream").rows()) == [
        ("DMA down", 2, None),
        ("MME gemm", 2, None),
        ("TPC0 add_fwd_bf16", 2, None),
    ]
    assert g["tid"].sort().to_list() == [10, 20, 30]  # each engine its lane
    assert devs["device"].to_list() == [2]


@pytest.mark.parametrize("build", [xpu_trace, privateuse1_trace, hpu_trace])
def test_vendor_traces_analyse_with_their_device_tables(tmp_path, build):
    from pipeline import report

    path = tmp_path / f"{build.__name__}.json"
    path.write_text(json.dumps(build()))
    with report.opened(path) as f:
        devices = f.activity_devices["device"].to_list()
        table = report.kernel_table(f)
    assert devices and -1 not in devices
    assert table.height and set(table["device"]) == set(devices)


def test_layouts_learned_from_sources_name_them_and_their_test():
    built = [x for x in kineto.LAYOUTS if not x.traces and x.cats]
    assert {x.id for x in built} >= {"xpu", "privateuse1", "hpu"}
    for x in built:
        assert x.source and x.built_by.startswith("tests/test_vendors.py::")
        assert x.built_by.split("::")[1] in globals()
