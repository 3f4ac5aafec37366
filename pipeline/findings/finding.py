"""finding: what one rule says about a trace or a run: the record every format writes.

A `Finding` has an `id` from the vocabulary (docs/guides/reading-findings.md), a one-line `title`
with its numbers, the `evidence` behind it (rows: what, name, count, time, share, a note), its
saving as ranges of µs (`gain_us`: wall time of the profiled window; `gpu_gain_us`: device busy
time, None for a host-side fix), the `remedy` (the change to make), `section` (where to look next
in `analyze` / `ranks`) and `basis` (how the range was estimated).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.render.findings import duration

ms = duration  # µs as a title says it: 812 µs, 4.2 ms, 1.35 s


def counted(n: int, noun: str) -> str:
    """A count with its noun, singular for one: 1 step, 2,048 kernels."""
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {noun}s"


Range = tuple[float, float]  # [low, high] µs


@dataclass(frozen=True)
class Evidence:
    """One row behind a finding: a kernel, an op, an annotation, a chain of kernels, a rank, a
    measure; `pct` is a share of what `of` names."""

    what: str  # kernel, op, annotation, chain, call, rank, device, path, ...
    name: str
    count: int | None = None
    time_us: float | None = None
    pct: float | None = None
    of: str | None = None  # what pct is a share of: "kernel time", "the window", ...
    note: str | None = None

    def as_dict(self) -> dict:
        return {
            "what": self.what,
            "name": self.name,
            "count": self.count,
            "time_us": _round(self.time_us),
            "pct": _round(self.pct, 2),
            "pct_of": self.of if self.pct is not None else None,
            "note": self.note,
        }


@dataclass(frozen=True)
class Finding:
    id: str
    title: str
    gain_us: Range
    gpu_gain_us: Range | None
    remedy: str
    section: str
    evidence: tuple[Evidence, ...] = field(default_factory=tuple)
    basis: str = ""
    window_us: float | None = None  # what gain_pct is a share of: the window's span (a run: its steps)

    def as_dict(self) -> dict:
        w = self.window_us
        return {
            "id": self.id,
            "title": self.title,
            "gain_us": [_round(x) for x in self.gain_us],
            "gain_pct": [_round(100 * x / w, 2) for x in self.gain_us] if w else None,
            "gpu_gain_us": None if self.gpu_gain_us is None else [_round(x) for x in self.gpu_gain_us],
            "remedy": self.remedy,
            "section": self.section,
            "evidence": [e.as_dict() for e in self.evidence],
            "basis": self.basis,
            "window_us": _round(w),
        }


def _round(v: float | None, digits: int = 1) -> float | None:
    return None if v is None else round(float(v), digits)


def scaled(amount: float, low: float, high: float) -> Range:
    """[low, high] shares of an amount (µs)."""
    return (max(amount, 0.0) * low, max(amount, 0.0) * high)


def capped(r: Range, limit: float) -> Range:
    """A range no higher than `limit` (both ends)."""
    limit = max(limit, 0.0)
    return (min(r[0], limit), min(r[1], limit))


def narrowed(r: Range, max_ratio: float) -> Range:
    """A range whose high is at most `max_ratio` x its low: the low raised (a range is only as
    useful as it is narrow; the high is the better-founded end: what can move at most)."""
    low, high = r
    return (max(low, high / max_ratio), high) if high > 0 else (0.0, 0.0)


def us(ns: float | int | None) -> float:
    return 0.0 if ns is None else float(ns) / 1e3


def pct(part: float, whole: float) -> float:
    return 100.0 * part / whole if whole else 0.0


# findings about the window itself rather than a saving (`warmup`: it holds a start-up): read first,
# since every other finding's share is of that window
ABOUT_THE_WINDOW = ("warmup",)


def ranked(found: list[Finding]) -> list[Finding]:
    """Findings about the window first (ABOUT_THE_WINDOW), then the largest saving first (the high
    end of gain_us, then its low end, then the id)."""
    return sorted(found, key=lambda x: (x.id not in ABOUT_THE_WINDOW, -x.gain_us[1], -x.gain_us[0], x.id))
