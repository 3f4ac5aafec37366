"""kernel_roles: what a kernel does for the op that launched it (`gpu_ops.kernel_role`).

The table is data (`data/kernel_roles.toml`): the roles (`ROLES`, each saying whether it does the
op's FLOPs) and ordered rules, a regular expression over the kernel name each; the first that
matches gives the role, and a kernel none matches does its op's math (`MATH`). Costing gives an
op's FLOPs to its math kernels only (`FLOP_ROLES`), so a layout conversion, copy, fill, split-K
reduction or epilogue around a GEMM or convolution never shows the GEMM's FLOPs.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import polars as pl

from pipeline.cost.memo import Memo, classified
from pipeline.resources import read_toml
from pipeline.schema import DATA_DIR

TABLE = DATA_DIR / "kernel_roles.toml"
MATH = "math"


@dataclass(frozen=True)
class Role:
    role: str
    meaning: str
    flops: bool  # whether a kernel of this role gets its op's FLOPs


@dataclass(frozen=True)
class Rule:
    role: str
    pattern: str
    library: str
    example: str
    taught_by: str


@cache
def table() -> tuple[tuple[Role, ...], tuple[Rule, ...]]:
    raw = read_toml(TABLE)
    roles = tuple(Role(**r) for r in raw["roles"])
    rules = tuple(Rule(**r) for r in raw["rules"])
    known = {r.role for r in roles}
    for r in rules:
        if r.role not in known:
            raise ValueError(f"{TABLE.name}: rule {r.pattern!r} gives unknown role {r.role!r}")
    return roles, rules


ROLES = {r.role: r for r in table()[0]}
FLOP_ROLES = tuple(r.role for r in table()[0] if r.flops)  # the roles that do an op's math


def role_expr(name: pl.Expr) -> pl.Expr:
    """The role of a kernel from its name: the first rule that matches, else MATH."""
    return pl.coalesce(*(pl.when(name.str.contains(r.pattern)).then(pl.lit(r.role)) for r in table()[1]), pl.lit(MATH))


def with_kernel_role(frame: pl.DataFrame, memo: Memo | None = None) -> pl.DataFrame:
    """`frame` with `kernel_role` from its `name`, for its kernels (`kind` = kernel; null for memcpy
    and memset), each distinct name classified once (`memo.classified`)."""
    out = classified(frame, ["name"], lambda text: {"kernel_role": role_expr(text("name"))}, memo)
    return out.with_columns(kernel_role=pl.when(pl.col("kind") == "kernel").then(pl.col("kernel_role")))
