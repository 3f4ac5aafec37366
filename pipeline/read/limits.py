"""limits: how far tracepipe lets hostile input go before it stops reading it.

Only regular files are read (`not_regular`): a FIFO named like a trace would block a reader
forever, a device would never end.

A compressed trace or archive member may inflate to at most `inflate_limit(its size)`: 200 times
its compressed size, and never less than 1 GiB (real traces compress 7-21x; a zip of 2 MB that
inflates to 2 GB is a bomb). `--max-inflate RATIO` raises the ratio (0: no limit).
"""

from __future__ import annotations

import os
import stat

INFLATE_RATIO = 200.0
INFLATE_FLOOR = 1 << 30


def inflate_limit(compressed_bytes: int, ratio: float | None = None) -> int | None:
    """The most bytes `compressed_bytes` may inflate to; None when `ratio` is 0 (no limit)."""
    ratio = INFLATE_RATIO if ratio is None else ratio
    if ratio <= 0:
        return None
    return max(INFLATE_FLOOR, int(ratio * compressed_bytes))


def too_inflated(limit: int, compressed_bytes: int) -> str:
    """The reason an input that inflates past `limit` is refused."""
    return (
        f"inflates past {limit / 2**30:.1f} GiB, over {limit / max(compressed_bytes, 1):.0f}x its "
        f"{compressed_bytes:,} compressed bytes (a decompression bomb? --max-inflate raises the limit)"
    )


def not_regular(path: str) -> str | None:
    """Why `path` is no file to read (a FIFO would block the reader forever, a device never end),
    or None for a regular file (or a link to one)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "no such file"
    except OSError as e:
        return f"cannot read: {e.strerror or e}"
    if stat.S_ISREG(mode):
        return None
    kinds = (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a device"),
        (stat.S_ISBLK, "a device"),
        (stat.S_ISDIR, "a directory"),
    )
    kind = next((name for test, name in kinds if test(mode)), "something else")
    return f"not a regular file ({kind})"
