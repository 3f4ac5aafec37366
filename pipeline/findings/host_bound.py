"""host_bound: the device waits for the CPU.

Premise: the device is busy less than [host_bound] max_busy of the window, and its host wait
(idle gaps whose next activity was launched after the gap began, HTA's rule) that no narrower
cause explains (`sync`, `dataloader`, and the launches `small_kernels` claims) is at least
[host_bound] min_span of the window. Saving: [low, high] of that wait (CUDA graphs and
torch.compile take back most of the launch and Python overhead, not the host work the model
needs), within the host's time on the critical path.
"""

from __future__ import annotations

from pipeline.findings.facts import Facts
from pipeline.findings.finding import Evidence, Finding, ms, pct, scaled

ID = "host_bound"
PATH_PARTS = {  # the critical path's host-side categories, as a reader needs them said
    "cpu": "CPU ops",
    "launch": "launch calls and the delays to their kernels",
    "waiting": "nothing traced ran: Python, or waits the trace does not show",
    "sync": "synchronising calls",
}


def host_bound(t: Facts) -> Finding | None:
    if not t.has_device or not t.span_us:
        return None
    lim = t.limits(ID)
    busy = t.busy_us / t.span_us
    if busy >= lim["max_busy"] or t.host_idle_us < lim["min_span"] * t.span_us:
        return None
    waited = t.host_idle_us * (1.0 - t.launch_share)
    if waited < lim["min_span"] * t.span_us:
        return None
    wall, _ = t.bounded(t.on_host(scaled(waited, lim["low"], lim["high"])))
    if not t.worth(wall):
        return None
    b = t.path["breakdown_us"]
    length = float(t.path["length_us"]) or 1.0
    evidence = [
        Evidence("device", "device busy", None, t.busy_us, 100 * busy, of="the window"),
        Evidence(
            "device",
            "host wait (device idle, next work launched late)",
            None,
            waited,
            pct(waited, t.span_us),
            of="the window",
        ),
        *(
            Evidence("path", f"critical path: {k}", None, v, pct(v, length), of="the critical path", note=PATH_PARTS[k])
            for k, v in sorted(b.items(), key=lambda kv: -(kv[1] or 0))
            if k in PATH_PARTS and v
        ),
    ]
    top = t.section("critical-path")
    if top.height:
        names = top.row(0, named=True).get("top") or []
        evidence += [
            Evidence("op", x["name"], None, x["us"], pct(x["us"], length), of="the critical path")
            for x in names
            if x.get("category") in ("cpu", "launch")
        ][:5]
    return Finding(
        ID,
        f"Host-bound: the device is busy {100 * busy:.0f}% of the window and waits {ms(waited)} "
        f"({pct(waited, t.span_us):.0f}%) for the CPU to launch its work",
        wall,
        None,
        t.worded(ID, "remedy"),
        "critical-path",
        tuple(evidence),
        f"{lim['low']:.0%}-{lim['high']:.0%} of the host wait no narrower finding explains, at most "
        "the host's time on the critical path",
    )
