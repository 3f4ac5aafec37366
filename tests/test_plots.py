"""Figures (pipeline.render.plots, pipeline.runs.plots): what a person reads in them.

Small synthetic traces: an A100 running bf16 matmuls (with shapes: costed, or without: not), one
with [memory] events and a deep launch queue, and a synthetic NCCL run. The figures' text is read
back from the matplotlib objects.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

pytest.importorskip("matplotlib")

from matplotlib.text import Text

from pipeline import report as rp
from pipeline import synthetic as synth
from pipeline.analyses import memory as memory_mod
from pipeline.analyses import queue as queue_mod
from pipeline.flatten import flatten
from pipeline.render import plots
from pipeline.render.tables import shorten
from pipeline.runs import plots as run_plots

KERNELS = 12  # more than plots.TOP_LABELS
DEVICE = synth.DEVICE_PROPS["name"]  # "NVIDIA A100-SXM4-80GB"


def kernel_name(i: int) -> str:
    return f"sm80_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize{i}x128x32_stage3_warpsize2x2x1_tensor16x8x16_kernel"


def mm_events(i: int, t: float, shapes: bool) -> list[dict]:
    """aten::mm of (64·(i+1)) x 1024 by 1024 x 1024 in bf16 at t µs, its launch and its kernel."""
    args = {"Input Dims": [[64 * (i + 1), 1024], [1024, 1024]], "Input type": ["c10::BFloat16"] * 2} if shapes else {}
    kernel = kernel_name(i)
    return [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": t, "dur": 10, "args": args},
        {
            "ph": "X",
            "cat": "cuda_runtime",
            "name": "cudaLaunchKernel",
            "pid": 1,
            "tid": 1,
            "ts": t + 2,
            "dur": 4,
            "args": {"correlation": i + 1},
        },
        {
            "ph": "X",
            "cat": "kernel",
            "name": kernel,
            "pid": 0,
            "tid": 7,
            "ts": t + 20,
            "dur": 5 + 3 * i,
            "args": {"device": 0, "stream": 7, "correlation": i + 1},
        },
    ]


def a100_trace(tmp_path: Path, name: str, shapes: bool = True) -> rp.Flat:
    events = [e for i in range(KERNELS) for e in mm_events(i, 100.0 * i, shapes)]
    src = tmp_path / f"{name}.json"
    src.write_text(json.dumps({"deviceProperties": [{"id": 0, **synth.DEVICE_PROPS}], "traceEvents": events}))
    return rp.Flat(flatten(src, tmp_path / "flat").out_dir)


@pytest.fixture
def costed(tmp_path):
    return a100_trace(tmp_path, "costed_a100")


@pytest.fixture
def uncosted(tmp_path):
    return a100_trace(tmp_path, "shapeless_a100", shapes=False)


def text_of(fig) -> str:
    """Every text the figure shows (drawn first: tick labels are made when drawing)."""
    fig.canvas.draw()
    return "\n".join(t.get_text() for t in fig.findobj(Text))


def roofline_of(flat):
    plt = plots.pyplot()
    with plt.rc_context(plots.STYLE):
        return plots.roofline_figure(flat, rp.analyze(flat, only=["kernels"])["kernels"])


def test_roofline_title_names_trace_device_and_dtype_peaks(costed):
    fig = roofline_of(costed)
    text = text_of(fig)
    assert "costed_a100" in fig.get_suptitle()
    assert DEVICE in fig.axes[0].get_title(loc="left") and "device 0" in fig.axes[0].get_title(loc="left")
    assert "bf16 peak 312 TFLOP/s" in text and "memory 2.039 TB/s" in text
    assert "area: share of the device's kernel time" in text and "colour: kernel category" in text


def test_roofline_labels_at_most_top_n_and_none_overlap(costed):
    fig = roofline_of(costed)
    ax = fig.axes[0]
    labels = [t for t in ax.texts if t.get_gid() == "kernel-label"]
    assert len(ax.collections[0].get_offsets()) == KERNELS
    assert len(labels) == plots.TOP_LABELS < KERNELS
    assert all(len(t.get_text().split("  ")[0]) <= plots.LABEL_CHARS for t in labels)  # shortened names
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    boxes = [Text.get_window_extent(t, renderer) for t in labels]  # the text, not the leader line
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1 :])
    longest = shorten(kernel_name(KERNELS - 1), plots.LABEL_CHARS)  # the kernel with the most time
    assert any(t.get_text().startswith(longest) for t in labels)
    assert not any(t.get_text().startswith(shorten(kernel_name(0), plots.LABEL_CHARS)) for t in labels)


def test_uncosted_trace_says_why_in_the_figure(uncosted):
    fig = roofline_of(uncosted)
    text = text_of(fig)
    assert "no kernel on device 0 has a FLOP and byte model" in text
    assert "record_shapes=False" in text and "record_shapes=True" in text  # why, and the fix
    assert not fig.axes[0].axison  # no empty axes


def test_breakdown_labels_single_device_bars(costed):
    plt = plots.pyplot()
    sections = rp.analyze(costed, only=["categories", "ops"])
    with plt.rc_context(plots.STYLE):
        fig = plots.breakdown_figure(costed, sections["categories"], sections["ops"])
    text = text_of(fig)
    assert "costed_a100" in fig.get_suptitle() and DEVICE in text
    assert "gemm" in text and "100.0%" in text  # the one category: its name and value on the figure
    assert "aten::mm" in text and "top 1 CPU ops by self device time" in text


def test_spread_keeps_order_gap_and_bounds():
    ys = [10.0, 11.0, 11.5, 50.0, 12.0, 99.0]
    out = plots.spread(ys, 5.0, 0.0, 100.0)
    ranked = sorted(range(len(ys)), key=lambda i: ys[i])
    assert [out[i] for i in ranked] == sorted(out)
    assert all(b - a >= 5.0 - 1e-9 for a, b in zip(sorted(out), sorted(out)[1:], strict=False))
    assert min(out) >= 0.0 and max(out) <= 100.0
    assert out[0] == 10.0 and out[3] == 50.0  # labels with room stay where they are


def test_write_plots_writes_png_and_svg_atomically(costed, tmp_path, monkeypatch):
    out = tmp_path / "plots"
    paths = plots.write_plots(costed, rp.analyze(costed, only=["kernels", "categories", "ops"]), out)
    assert sorted(p.name for p in paths) == sorted(
        f"costed_a100_{k}.{e}" for k in ("breakdown", "roofline", "queue") for e in ("png", "svg")
    )  # no [memory] events: no memory timeline
    assert all(p.stat().st_size > 1000 for p in paths)
    assert "costed_a100" in (out / "costed_a100_roofline.svg").read_text()  # text stays text
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in paths)  # no temporary left
    before = {p.name: p.read_bytes() for p in paths}

    def broken(self, fname, *args, **kwargs):
        if kwargs.get("format") == "svg":
            Path(fname).write_text("<svg half")
            raise OSError("disk full")
        return real(self, fname, *args, **kwargs)

    from matplotlib.figure import Figure

    real = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", broken)
    with pytest.raises(OSError):
        plots.write_plots(costed, rp.analyze(costed, only=["kernels", "categories", "ops"]), out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # the old files whole, nothing half


def test_units():
    assert plots.bytes_text(16) == "16 B" and plots.bytes_text(10528) == "10.3 KiB"
    assert plots.bytes_text(2 * 1024**2) == "2 MiB"
    assert plots.duration_text(950) == "950 µs" and plots.duration_text(27_700) == "27.7 ms"
    assert plots.bandwidth_text(2039) == "2.039 TB/s" and plots.bandwidth_text(900) == "900 GB/s"
    assert run_plots.rate_text(300) == "300 GB/s" and run_plots.rate_text(0.0019) == "1.9 MB/s"
    assert plots.pct_text(0.01) == "<1%" and plots.pct_text(0) == "0%" and plots.pct_text(28.2) == "28%"


# ------------------------------------------------------------------ timelines
MEMORY_EVENTS = 600
PEAK_AT = 1234  # µs: the one event holding device 0's peak, inside aten::peak
PEAK = 3 * 1024**3


def launches(stream: int, n: int, first: int, t0: float, every: float, dur: float) -> list[dict]:
    """n kernels on `stream`, launched every `every` µs from t0, each running `dur` µs back to back
    from t0 + 20: when dur > every they queue up."""
    out = []
    for i in range(n):
        c = first + i
        out.append(
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
             "ts": t0 + every * i, "dur": 0.5, "args": {"correlation": c}}
        )  # fmt: skip
        out.append(
            {"ph": "X", "cat": "kernel", "name": f"k{stream}", "pid": 0, "tid": stream,
             "ts": t0 + 20 + dur * i, "dur": dur, "args": {"device": 0, "stream": stream, "correlation": c}}
        )  # fmt: skip
    return out


def timeline_flat(tmp_path: Path) -> rp.Flat:
    """Device 0: Total Allocated saw-toothing up to 2 GiB but for one event at PEAK_AT (3 GiB, in
    aten::peak); the CPU (-1) small; stream 7 a queue up to 160 deep, stream 9 one kernel, late."""
    ev = [{"ph": "X", "cat": "cpu_op", "name": "aten::peak", "pid": 1, "tid": 1, "ts": PEAK_AT - 1, "dur": 3,
           "args": {}}]  # fmt: skip
    for i in range(MEMORY_EVENTS):
        ts = 2.0 * i + 0.5
        ev.append(synth.memory_event(ts, (i % 50 + 1) * 40 * 1024**2, 2 * 1024**3 + (i // 100) * 1024**2, 0))
        ev.append(synth.memory_event(ts + 0.25, (i % 7) * 64, 0, -1))
    ev.append(synth.memory_event(PEAK_AT, PEAK, 4 * 1024**3, 0))
    ev += launches(7, 300, 1, 0.0, 1.0, 2.0) + launches(9, 1, 1000, 900.0, 5.0, 1.0)
    src = tmp_path / "timeline.json"
    src.write_text(json.dumps({"deviceProperties": [{"id": 0, **synth.DEVICE_PROPS}], "traceEvents": ev}))
    return rp.Flat(flatten(src, tmp_path / "flat").out_dir)


@pytest.fixture
def timeline_trace(tmp_path):
    return timeline_flat(tmp_path)


def test_memory_series_keeps_the_peaks_in_at_most_max_points(timeline_trace, monkeypatch):
    peaks = {r["device"]: r for r in memory_mod.memory(timeline_trace).iter_rows(named=True)}
    whole = memory_mod.memory_series(timeline_trace)
    assert whole.group_by("device").len().sort("device")["len"].to_list() == [MEMORY_EVENTS, MEMORY_EVENTS + 1]
    monkeypatch.setattr(memory_mod, "PER_WINDOW", 50)  # many windows: the same answer
    for max_points in (40, 9):
        s = memory_mod.memory_series(timeline_trace, max_points=max_points)
        assert s.group_by("device").len()["len"].max() <= max_points
        for dev, p in peaks.items():
            d = s.filter(pl.col("device") == dev)
            top = d.filter(pl.col("allocated_bytes") == d["allocated_bytes"].max()).row(0, named=True)
            assert top["allocated_bytes"] == p["peak_allocated_bytes"] and top["t_us"] == pytest.approx(p["peak_at_us"])
            assert d["reserved_bytes"].max() == p["peak_reserved_bytes"]
    assert peaks[0]["peak_allocated_bytes"] == PEAK and peaks[0]["peak_op"] == "aten::peak"
    assert memory_mod.memory_series(timeline_trace, max_points=40).equals(
        memory_mod.memory_series(timeline_trace.path, max_points=40)
    )


def maxima(t: pl.DataFrame, column: str = "max") -> dict:
    """(device, stream) -> the column's largest value."""
    return {(d, s): m for d, s, m in t.group_by("device", "stream").agg(pl.col(column).max()).iter_rows()}


def test_queue_series_max_is_queues_in_at_most_max_points(timeline_trace, monkeypatch):
    q = maxima(queue_mod.queue(timeline_trace))
    assert q[(0, 7)] > 100 and q[(0, 9)] == 1
    full = queue_mod.queue_series(timeline_trace)
    assert full.group_by("stream").len().sort("stream")["len"].to_list() == [600, 2]  # every launch and start
    monkeypatch.setattr(queue_mod, "PER_WINDOW", 16)  # stream 9 first seen in a later window: still max 1
    assert maxima(queue_mod.queue(timeline_trace)) == q
    for max_points in (30, 2):
        s = queue_mod.queue_series(timeline_trace, max_points=max_points)
        assert s.group_by("device", "stream").len()["len"].max() <= max_points
        assert maxima(s, "depth") == q


def test_memory_timeline_marks_memorys_peak(timeline_trace):
    plt = plots.pyplot()
    with plt.rc_context(plots.STYLE):
        fig = plots.memory_figure(timeline_trace, max_points=40)
    text = text_of(fig)
    assert "timeline" in fig.get_suptitle() and "memory over time" in fig.get_suptitle()
    gpu, cpu = fig.axes[0], fig.axes[1]
    assert gpu.get_title(loc="left") == f"device 0: {DEVICE}" and cpu.get_title(loc="left") == "CPU (device -1)"
    assert gpu.get_ylabel() == "bytes (GiB)" and cpu.get_ylabel() == "bytes (B)"
    assert cpu.get_xlabel() == "time from the trace's first event (ms)"
    (mark,) = [t for t in gpu.texts if t.get_gid() == "memory-peak"]
    assert mark.get_text() == f"peak {plots.bytes_text(PEAK)} at 1.23 ms\nin aten::peak"
    assert mark.xy == pytest.approx((PEAK_AT / 1e3, PEAK / 1024**3))
    (line,) = [ln for ln in gpu.lines if ln.get_gid() == "allocated_bytes"]
    assert max(line.get_ydata()) == PEAK / 1024**3  # the drawn series reaches the peak
    assert "Total Allocated (peak 3 GiB)" in text and "Total Reserved (peak 4 GiB)" in text


def test_queue_timeline_legend_and_queue_full(timeline_trace):
    plt = plots.pyplot()
    stats = queue_mod.queue(timeline_trace)
    deepest = stats.filter(pl.col("stream") == 7)
    with plt.rc_context(plots.STYLE):
        far = plots.queue_figure(timeline_trace, max_points=40)
        near = plots.queue_figure(timeline_trace, queue_full=200, max_points=40)
    text = text_of(far)
    assert "timeline" in far.get_suptitle() and far.axes[0].get_title(loc="left") == f"device 0: {DEVICE}"
    assert f"stream 7: max {deepest['max'].item()}, mean {deepest['mean'].item():.3g}" in text
    assert "--queue-full 1024 not drawn" in text and "time-weighted mean" in text
    assert far.axes[0].get_xlabel() == "time from the trace's first event (µs)"
    assert "--queue-full 200: the launching thread blocks" in text_of(near)
    assert any(list(ln.get_ydata()) == [200, 200] for ln in near.axes[0].lines)


def test_timelines_with_nothing_to_show_say_why(costed, tmp_path):
    plt = plots.pyplot()
    cpu = tmp_path / "cpu.json"
    cpu.write_text(json.dumps({"traceEvents": [mm_events(0, 0.0, True)[0]]}))
    with plt.rc_context(plots.STYLE):
        no_memory = plots.memory_figure(costed)
        no_gpu = plots.queue_figure(rp.Flat(flatten(cpu, tmp_path / "cpu").out_dir))
    assert "No [memory] events in this trace" in text_of(no_memory) and "profile_memory=True" in text_of(no_memory)
    assert "CPU only" in text_of(no_gpu) and "ProfilerActivity.CUDA" in text_of(no_gpu)
    assert not no_memory.axes[0].axison and not no_gpu.axes[0].axison


def test_write_plots_writes_the_timelines(timeline_trace, tmp_path):
    out = tmp_path / "plots"
    paths = plots.write_plots(timeline_trace, rp.analyze(timeline_trace, only=["kernels", "categories", "ops"]), out)
    assert sorted(p.name for p in paths) == sorted(
        f"timeline_{k}.{e}" for k in ("breakdown", "roofline", "queue", "memory") for e in ("png", "svg")
    )
    assert all(p.stat().st_size > 1000 for p in paths)


# ------------------------------------------------------------------ runs
def test_run_plots_name_run_world_size_and_units(run_report, tmp_path):
    plt = plots.pyplot()
    run = run_report.runs["run"].cast(str)[0]
    with plt.rc_context(plots.STYLE):
        waits = run_plots.wait_heatmap_figure(run_report, run)
        busbw = run_plots.busbw_figure(run_report, run)
    for fig in (waits, busbw):
        assert "demo_run" in fig.get_suptitle() and "world size 4" in text_of(fig)
    assert "rank 2 made the others wait most" in text_of(waits)
    assert any("time waited" in a.get_ylabel() and "(µs)" in a.get_ylabel() for a in waits.axes)  # the colour bar
    assert waits.axes[0].get_xlabel() and waits.axes[0].get_ylabel() == "rank"
    busbw.canvas.draw()
    ticks = [t.get_text() for t in busbw.axes[0].get_xticklabels() if t.get_text()]
    assert ticks and all(t.endswith(("B", "KiB", "MiB", "GiB")) for t in ticks)
    paths = run_plots.write_run_plots(run_report, tmp_path / "plots")
    assert sorted(p.name for p in paths) == [f"demo_run_{k}.{e}" for k in ("busbw", "waits") for e in ("png", "svg")]
    assert all(p.stat().st_size > 1000 for p in paths)


def test_run_without_steps_says_why(run_report):
    import dataclasses

    plt = plots.pyplot()
    empty = dataclasses.replace(run_report, steps=run_report.steps.clear(), collectives=run_report.collectives.clear())
    run = run_report.runs["run"].cast(str)[0]
    with plt.rc_context(plots.STYLE):
        assert "No ProfilerStep annotations" in text_of(run_plots.wait_heatmap_figure(empty, run))
        assert "No collective" in text_of(run_plots.busbw_figure(empty, run))
