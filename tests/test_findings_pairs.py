"""Findings' estimates against real before/after pairs (tests/data/pairs, scripts/record_pairs.py).

Each pair is one fix applied to one small loop, both sides profiled on a CPU with torch 2.13; its
MANIFEST.toml names the finding the "before" trace must have (`expected = "absent"`: a CPU trace
cannot show its premise, so neither side may have it), the realized saving (median before step -
median after step, times the steps: what the acceptance check `findings` computes) and whether it is
noise (the three recordings disagreed by more than the saving). For each pair: the manifest's saving
is what the traces say; the finding is on the before trace with a range holding the realized saving
(unless noisy) that is narrow enough to act on; once the fix is applied the finding is gone or at
most half its size.
"""

from __future__ import annotations

import statistics
from functools import cache
from pathlib import Path

import pytest
import tomllib
from test_findings import _steps_us as steps_us  # the CPU-side ProfilerStep#N durations (µs)

from pipeline import report as rp

PAIRS = Path(__file__).resolve().parent / "data" / "pairs"
MANIFESTS = sorted(PAIRS.glob("*/MANIFEST.toml"))
NAMES = [m.parent.name for m in MANIFESTS]


def manifest(name: str) -> dict:
    return tomllib.loads((PAIRS / name / "MANIFEST.toml").read_text())


def trace(name: str, side: str) -> Path:
    return PAIRS / name / f"{name}_{side}.json.gz"


@pytest.fixture(scope="module")
def findings(tmp_path_factory):
    """name -> side -> {id: finding}: each pair's traces flattened and analysed once, on demand."""
    from pipeline.flatten import flatten

    out = tmp_path_factory.mktemp("pairs")

    @cache
    def of(name: str, side: str) -> dict[str, dict]:
        flat = flatten(trace(name, side), out / name / side).out_dir
        return {f["id"]: f for f in rp.analyze(rp.Flat(flat), only=["findings"])["findings"].to_dicts()}

    return of


def test_the_pairs_are_there_and_small():
    assert {"optimizer", "dataloader", "sync", "copies"} <= set(NAMES), NAMES
    assert len(NAMES) >= 5
    size = sum(p.stat().st_size for p in PAIRS.glob("*/*.json.gz"))
    assert size <= 3.2e6, f"{size / 1e6:.1f} MB of pair traces"
    for name in NAMES:
        m = manifest(name)
        assert m["pair"] == name and m["finding"] and m["how"] and m["recorded"], name
        assert trace(name, "before").is_file() and trace(name, "after").is_file(), name


@pytest.mark.parametrize("name", NAMES)
def test_the_manifest_says_what_the_traces_say(name):
    m = manifest(name)
    before, after = steps_us(trace(name, "before")), steps_us(trace(name, "after"))
    assert len(before) == m["steps"] >= 5 and len(after) >= 5
    assert statistics.median(before) == pytest.approx(m["before_median_step_us"], abs=0.1)
    assert statistics.median(after) == pytest.approx(m["after_median_step_us"], abs=0.1)
    realized = (statistics.median(before) - statistics.median(after)) * len(before)
    assert realized == pytest.approx(m["realized_us"], abs=1.0)
    # noisy exactly when the three recordings' savings disagree by more than the saving
    rounds = m["rounds_realized_us"]
    assert m["noisy"] == (abs(realized) < max(rounds) - min(rounds) or min(rounds) * max(rounds) < 0), rounds


@pytest.mark.parametrize("name", NAMES)
def test_the_estimate_holds_on_the_real_pair(name, findings):
    m = manifest(name)
    fid, realized = m["finding"], m["realized_us"]
    before, after = findings(name, "before"), findings(name, "after")
    if m["expected"] == "absent":
        # the fix's premise cannot show on these traces (a CPU has no device queue to drain): no
        # finding of its kind on either side
        assert fid not in before and fid not in after, (sorted(before), sorted(after))
        return
    assert m["expected"] == "present"
    assert fid in before, f"{name}: no '{fid}' finding on the before trace (has {sorted(before)})"
    lo, hi = before[fid]["gain_us"]
    assert hi <= 5.001 * lo, (lo, hi)  # a range a reader can act on
    if not m["noisy"]:
        assert lo <= realized <= hi, (
            f"{name}: estimated {lo / 1e3:.1f}-{hi / 1e3:.1f} ms, realized {realized / 1e3:.1f} ms"
        )
    # once fixed the finding is gone, or at most half the size (a further fix may remain)
    if fid in after:
        assert after[fid]["gain_us"][1] <= 0.5 * hi, (after[fid]["gain_us"], hi)
