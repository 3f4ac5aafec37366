"""math_modes: the precision a kernel's math really ran at, from its name (`gpu_ops.math_mode`).

The naming schemes are data (`data/math_modes.toml`): families of kernels (Tensile / hipBLASLt
`Cijk_*`, cuBLAS `nvjet_*`, the other matrix libraries), each with ordered type tokens. The first
family whose `kernels` regex matches a name decides: its first matching token gives the mode, or,
when none does, the name says nothing (null) and costing falls back to the op's input dtype
(`peaks.DTYPE_MODE`). A kernel of no family (an elementwise or reduction kernel) says nothing either.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import polars as pl

from pipeline.cost.memo import Memo, classified
from pipeline.cost.peaks import MATH_MODES
from pipeline.resources import read_toml
from pipeline.schema import DATA_DIR

TABLE = DATA_DIR / "math_modes.toml"
NAMED = "named_mode"  # the column `with_named_mode` adds: the mode the name gives (null: none)


@dataclass(frozen=True)
class Mode:
    mode: str
    token: str
    example: str
    taught_by: str


@dataclass(frozen=True)
class Family:
    id: str
    library: str
    kernels: str
    modes: tuple[Mode, ...]


@cache
def families() -> tuple[Family, ...]:
    out = []
    for f in read_toml(TABLE)["families"]:
        modes = tuple(Mode(**m) for m in f.pop("modes"))
        for m in modes:
            if m.mode not in MATH_MODES:
                raise ValueError(f"{TABLE.name}: family {f['id']} gives unknown mode {m.mode!r}")
        out.append(Family(**f, modes=modes))
    return tuple(out)


def named_mode_expr(name: pl.Expr) -> pl.Expr:
    """The math mode a kernel's name gives (null when it says nothing)."""
    out = pl.lit(None, pl.String)
    for f in reversed(families()):  # the first family that matches decides
        by_token = pl.coalesce(
            *(pl.when(name.str.contains(m.token)).then(pl.lit(m.mode)) for m in f.modes), pl.lit(None, pl.String)
        )
        out = pl.when(name.str.contains(f.kernels)).then(by_token).otherwise(out)
    return out


def with_named_mode(frame: pl.DataFrame, memo: Memo | None = None) -> pl.DataFrame:
    """`frame` with NAMED from its `name`, each distinct name classified once (`memo.classified`)."""
    return classified(frame, ["name"], lambda text: {NAMED: named_mode_expr(text("name"))}, memo)
