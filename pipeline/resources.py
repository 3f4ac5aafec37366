"""resources: where tracepipe's declared files live (`schemas/`, `data/`), and reading their TOML.

Imports nothing heavy: the trace vocabulary (`pipeline.kineto`) loads its layout table from here.
"""

from __future__ import annotations

import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10
    import tomli as tomllib

_HERE = Path(__file__).resolve().parent


def find_dir(name: str) -> Path:
    """`schemas/` and `data/` sit beside the package in a checkout, inside it in a wheel."""
    for cand in (_HERE / f"_{name}", _HERE.parent / name):
        if cand.is_dir():
            return cand
    raise FileNotFoundError(f"tracepipe cannot find its {name}/ folder")


def read_toml(path: Path) -> dict:
    with open(path, "rb") as f:
        return tomllib.load(f)
