"""native: whether tracepipe may use its optional compiled module (`native/`, `tracepipe_native`)
where it is built. TRACEPIPE_NATIVE=0 turns every part of it off at run time: the chunk builder
(`read.by_native`) and the nesting sweep (`link.nesting`); Python and polars answer instead."""

from __future__ import annotations

import os


def allowed() -> bool:
    """Not turned off by TRACEPIPE_NATIVE=0 (read at each call: tests and users switch it)."""
    return os.environ.get("TRACEPIPE_NATIVE", "1") != "0"
