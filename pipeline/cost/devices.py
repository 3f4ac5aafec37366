"""The device-spec table (`data/device_specs.csv`) and the matching of trace devices to it.

Peaks are dense datasheet figures (no 2:4 sparsity): the denominators of every achieved-% figure.
`peak_fp32_tflops` is the best FP32 rate without TF32: CUDA cores on NVIDIA, packed/matrix FP32
on AMD Instinct (where FP32 GEMMs run on it). `peak_fp64_tflops` uses FP64 tensor/matrix cores
where the device has them. A blank peak means the device has no such path.

Matching is data: each row's `name_regex`, `arch` and properties (`sm_count`, `memory_gb`,
`compute_major`/`compute_minor`). A device is matched by (first that applies):
1. `force`: a spec name, or a name the rows' regexes recognise;
2. its name, against `name_regex`: among the rows that match, the first whose properties fit the
   device's (`_fit`) wins, else the first in table order (e.g. "AMD Instinct MI250X / MI250" with
   104 CUs is an MI250 GCD);
3. its properties alone (an empty or generic name such as "" or "AMD Radeon Graphics"), among
   the rows whose `arch` the name spells (`gfx942`) or else all rows: the rows whose SM count,
   memory and compute capability fit; when they are not one device (their peaks differ, e.g. an
   RTX A6000 and an A40 have the same SMs and memory), none is chosen: `unknown`, never a guess.
"""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl

from pipeline.cost.peaks import PEAK_COLS, peak_for_mode
from pipeline.cost.peaks import dtype_mode as _dtype_mode
from pipeline.errors import UsageError
from pipeline.schema import DATA_DIR

SPECS_CSV = DATA_DIR / "device_specs.csv"
SPEC_SCHEMA = {
    "spec_name": pl.String,
    "vendor": pl.String,
    "name_regex": pl.String,
    "arch": pl.String,
    "compute_major": pl.Int64,
    "compute_minor": pl.Int64,
    "sm_count": pl.Int64,
    "memory_gb": pl.Float64,
    **{c: pl.Float64 for c in PEAK_COLS},
    "source": pl.String,
}
OUT_SCHEMA = {
    "spec_name": pl.String,
    "spec_match": pl.String,
    **{c: pl.Float64 for c in PEAK_COLS},
    "spec_source": pl.String,
}
# columns a user's spec file may leave out (blank): those added after the format was first published
OPTIONAL_COLS = ("peak_fp4_tflops",)
MEM_TOLERANCE = 0.10  # relative, totalGlobalMem (GiB) against memory_gb (datasheets give GB or GiB)
PEAK_TOLERANCE = 0.02  # relative: rows whose peaks all agree within it are one device for matching


# ---- the table


def _blank_to_null(col: str) -> pl.Expr:
    cell = pl.col(col).str.strip_chars()
    return pl.when(cell != "").then(cell)


def _read_specs(path: Path) -> pl.DataFrame:
    """Read a spec CSV that has (at least) the table's columns, typed; blank cells are null."""
    df = pl.read_csv(path, infer_schema=False)
    df = df.with_columns(pl.lit("").alias(c) for c in OPTIONAL_COLS if c not in df.columns)
    missing = [c for c in SPEC_SCHEMA if c not in df.columns]
    if missing:
        raise ValueError(f"missing column(s) {', '.join(missing)}")
    df = df.select(_blank_to_null(c).cast(t).alias(c) for c, t in SPEC_SCHEMA.items())
    if df["spec_name"].null_count() or df["name_regex"].null_count():
        raise ValueError("every row needs a spec_name and a name_regex")
    for rx in df["name_regex"]:
        re.compile(rx)
    return df


def load_specs(extra: str | None = None) -> pl.DataFrame:
    """The bundled spec table, with the rows of a user CSV `extra` first (overriding same spec_name)."""
    specs = _read_specs(SPECS_CSV)
    if extra is None:
        return specs
    try:
        user = _read_specs(Path(extra))
    except (OSError, ValueError, re.error, pl.exceptions.PolarsError) as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UsageError(f"bad device-spec file {extra}: {reason}") from None
    return pl.concat([user, specs.filter(~pl.col("spec_name").is_in(user["spec_name"].implode()))])


def specs_markdown(specs: pl.DataFrame) -> str:
    """The spec table as a markdown table for the documentation."""
    cols = {
        "spec_name": "device",
        "peak_bw_gbps": "GB/s",
        "peak_fp32_tflops": "FP32",
        "peak_tf32_tflops": "TF32",
        "peak_bf16_tflops": "BF16",
        "peak_fp16_tflops": "FP16",
        "peak_fp8_tflops": "FP8",
        "peak_fp4_tflops": "FP4",
        "sm_count": "SMs/CUs",
        "memory_gb": "GB",
        "source": "source",
    }
    lines = ["| " + " | ".join(cols.values()) + " |", "|" + "---|" * len(cols)]
    lines += [
        "| " + " | ".join(_cell(r[c]) for c in cols) + " |" for r in specs.select(list(cols)).iter_rows(named=True)
    ]
    return "\n".join(lines) + "\n"


def _cell(v) -> str:
    return "" if v is None else f"{v:g}" if isinstance(v, (int, float)) else str(v)


# ---- matching


def _fit(row: dict, props: dict) -> int | None:
    """How many of the device's properties the row was checked against (SM count, memory within
    MEM_TOLERANCE, compute capability), or None when one of them disagrees."""
    checks = 0
    sms, mem = props.get("numSms"), props.get("totalGlobalMem")
    if sms is not None and row["sm_count"] is not None:
        if sms != row["sm_count"]:
            return None
        checks += 1
    if mem is not None and row["memory_gb"] is not None:
        if abs(mem / 2**30 - row["memory_gb"]) > MEM_TOLERANCE * row["memory_gb"]:
            return None
        checks += 1
    major, minor = props.get("computeMajor"), props.get("computeMinor")
    if major is not None and minor is not None and row["compute_major"] is not None:
        if (major, minor) != (row["compute_major"], row["compute_minor"]):
            return None
    return checks


def _props_fit(row: dict, props: dict) -> bool:
    """Enough to recognise a device without its name: SM count and memory both agree (and the
    compute capability where both give it)."""
    return _fit(row, props) == 2


def _same_peaks(a: dict, b: dict) -> bool:
    """Two rows are one device for matching when every peak agrees within PEAK_TOLERANCE."""

    def close(x, y) -> bool:
        return x is None and y is None or (x is not None and y is not None and abs(x - y) <= PEAK_TOLERANCE * max(x, y))

    return all(close(a[c], b[c]) for c in PEAK_COLS)


def _by_name(name: str | None, rows: list[dict]) -> list[dict]:
    return [r for r in rows if name and re.search(r["name_regex"], name, re.IGNORECASE)]


def _by_arch(name: str | None, rows: list[dict]) -> list[dict]:
    """The rows whose arch the name spells as a word (`gfx942`, `gfx90a:sramecc+:xnack-`)."""
    return [
        r for r in rows if name and r["arch"] and re.search(rf"(?<![\w]){re.escape(r['arch'])}(?![\w])", name, re.I)
    ]


def _forced(force: str, rows: list[dict]) -> dict:
    exact = [r for r in rows if r["spec_name"].casefold() == force.strip().casefold()]
    found = exact or _by_name(force, rows)
    if not found:
        raise UsageError(
            f"unknown device {force!r}: not a spec_name of data/device_specs.csv nor a name its patterns recognise"
        )
    return found[0]


def _result(row: dict | None, how: str) -> dict:
    row = row or {}
    return {
        "spec_name": row.get("spec_name"),
        "match": how,
        "spec_source": row.get("source"),
        **{c: row.get(c) for c in PEAK_COLS},
    }


def match_device(name: str | None, props: dict, specs: pl.DataFrame, force: str | None = None) -> dict:
    """{"spec_name", "match" (forced/name/properties/unknown), "spec_source", peak columns...,
    "ambiguous" (the spec names whose properties fit when they are not one device)}."""
    rows = specs.to_dicts()
    if force is not None:
        return _result(_forced(force, rows), "forced")
    named = _by_name(name, rows)
    if named:
        return _result(next((r for r in named if _fit(r, props)), named[0]), "name")
    fits = [r for r in _by_arch(name, rows) or rows if _props_fit(r, props)]
    if fits and all(_same_peaks(fits[0], r) for r in fits[1:]):
        return _result(fits[0], "properties")
    return {**_result(None, "unknown"), "ambiguous": [r["spec_name"] for r in fits]}


def one_model(devices: pl.DataFrame) -> dict | None:
    """The deviceProperties row of the machine's model when every listed device is of one model
    (by name), else None: device ids seen only on GPU events (not listed) are taken to be of it."""
    listed = devices.filter(pl.col("source") == "deviceProperties")
    names = listed["name"].drop_nulls().unique()
    if names.len() != 1:
        return None
    return listed.filter(pl.col("name") == names[0]).row(0, named=True)


def match_specs(devices: pl.DataFrame, specs: pl.DataFrame, force: str | None = None) -> tuple[pl.DataFrame, list[str]]:
    """Add spec_name, spec_match, peak columns and spec_source to each device row; warn on unknowns."""
    matches, warnings = [], []
    for d in devices.iter_rows(named=True):
        props = {
            "numSms": d.get("num_sms"),
            "totalGlobalMem": d.get("total_global_mem"),
            "computeMajor": d.get("compute_major"),
            "computeMinor": d.get("compute_minor"),
        }
        m = match_device(d.get("name"), props, specs, force)
        ambiguous = m.pop("ambiguous", None)
        if m["match"] == "unknown":
            what = f"its properties fit {' and '.join(ambiguous)}" if ambiguous else "not in the device-spec table"
            warnings.append(
                f"device {d['device']} ({d.get('name') or 'no name'}): {what}, achieved-% left empty "
                "(use --device or --device-specs)"
            )
        matches.append({**m, "spec_match": m.pop("match")})
    out = pl.DataFrame(matches, schema=OUT_SCHEMA)
    return pl.concat([devices.drop(list(OUT_SCHEMA), strict=False), out], how="horizontal"), warnings


def peak_for_dtype(row: dict, dtype: str | None) -> float | None:
    """Peak TFLOP/s (TOP/s for int8) a kernel of op dtype `dtype` can reach on the device `row` (a
    matched spec) when its name says nothing of its math: the peak of the dtype's math mode
    (`peaks.DTYPE_MODE`, `peaks.mode_peak`)."""
    mode = pl.select(_dtype_mode(pl.lit(dtype, pl.String))).item()
    return peak_for_mode(row, mode)
