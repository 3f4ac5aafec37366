"""stream: a trace file as a stream of bytes, plain, gzip or zstd, never read whole.

Compressed streams return every byte they inflated before they break off (a truncated gzip
still yields its complete events), and their size is estimated without reading them (to pick
the number of parsing workers).
"""

from __future__ import annotations

import os
import zlib
from types import ModuleType

from pipeline.errors import BadTrace

GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
READ_BYTES = 4 << 20


def open_stream(path: str):
    """Open a trace file as a binary stream, decompressing gzip or zstd by magic bytes."""
    return open_stream_and_file(path)[0]


def open_stream_and_file(path: str):
    """`open_stream`'s stream and the file it reads, whose `tell()` says how far into the file (in
    its own bytes: compressed ones for gzip and zstd) reading has come."""
    try:
        raw = open(path, "rb")  # noqa: SIM115 - returned, open, to the caller
    except OSError as e:
        raise BadTrace(f"{path}: cannot open: {e.strerror or e}") from None
    magic = raw.read(4)
    raw.seek(0)
    if magic[:2] == GZIP_MAGIC:
        return GzipStream(raw), raw
    if magic == ZSTD_MAGIC:
        try:
            import zstandard
        except ImportError:
            raw.close()
            raise BadTrace(
                f"{path}: zstd-compressed; install zstandard: pip install zstandard (or -e '.[zstd]' in a clone)"
            ) from None
        return zstandard.ZstdDecompressor().stream_reader(raw, closefd=True), raw
    return raw, raw


MIN_COMPRESSION_RATIO = 4  # traces compress 7-21x (gzip, measured on the shared ones): a floor


def json_bytes_estimate(path: str) -> int:
    """About how many bytes of JSON a trace file holds, without reading it: its size when plain;
    for gzip the size its trailer records (ISIZE, the last member's size modulo 2**32), for zstd
    the size its frame header declares, each at least MIN_COMPRESSION_RATIO x the file's size
    (which covers ISIZE wrapping past 4 GiB, several members, and an undeclared size)."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(18)
        if head[:2] == GZIP_MAGIC and size >= 18:
            f.seek(-4, os.SEEK_END)
            return max(int.from_bytes(f.read(4), "little"), MIN_COMPRESSION_RATIO * size)
        if head[:4] == ZSTD_MAGIC:
            return max(_zstd_declared_size(head), MIN_COMPRESSION_RATIO * size)
    return size


def _zstd_declared_size(head: bytes) -> int:
    """The content size a zstd frame header declares; 0 when it declares none or cannot be read."""
    try:
        import zstandard
    except ImportError:
        return 0
    try:
        declared = zstandard.get_frame_parameters(head).content_size
    except zstandard.ZstdError:
        return 0
    return 0 if declared == zstandard.CONTENTSIZE_UNKNOWN else declared


_inflate: ModuleType  # zlib or ISA-L's isal_zlib, which has zlib's interface
try:  # ISA-L inflates ~1.8x faster than zlib (measured: 1.3 vs 2.3 s per GB of JSON): the `fast` extra
    from isal import isal_zlib as _inflate
except ImportError:  # pragma: no cover - depends on what is installed
    _inflate = zlib


class GzipStream:
    """A gzip file decompressed as it is read (`read1`), with ISA-L where it is installed.

    Like gzip.GzipFile (several members, NUL padding after the last one), but every byte inflated
    before the stream breaks off is returned before the error is raised: EOFError when it ends
    early, zlib.error / OSError when it is corrupt.
    """

    IN_BYTES = 1 << 20

    def __init__(self, raw):
        self._raw, self._dec, self._input = raw, _inflate.decompressobj(31), b""

    def read1(self, n: int) -> bytes:
        while True:
            if self._dec.eof and not self._next_member():
                return b""
            data = self._input or self._raw.read(self.IN_BYTES)
            if not data:
                raise EOFError("compressed stream ended before the end-of-stream marker")
            try:
                out = self._dec.decompress(data, n)
            except _inflate.error as e:  # ISA-L's IsalError is not a zlib.error: one kind for callers
                raise zlib.error(str(e)) from e
            self._input = self._dec.unconsumed_tail or self._dec.unused_data
            if out:
                return out

    def _next_member(self) -> bool:
        """After a member's end: start the next one, if the rest is more than NUL padding."""
        rest = self._input.lstrip(b"\x00")
        while not rest:
            more = self._raw.read(self.IN_BYTES)
            if not more:
                return False
            rest = more.lstrip(b"\x00")
        if rest[:2] != GZIP_MAGIC:
            raise OSError("not a gzipped file after the end of a gzip member")
        self._dec, self._input = _inflate.decompressobj(31), rest
        return True

    def read(self, n: int = -1) -> bytes:
        out = bytearray()
        while n < 0 or len(out) < n:
            block = self.read1((1 << 20) if n < 0 else n - len(out))
            if not block:
                break
            out += block
        return bytes(out)

    def close(self):
        self._raw.close()


def one_line(e: BaseException) -> str:
    """What a decompressor said, on one line, else the kind of error."""
    said = " ".join(str(e).split())
    return said[:200] if said else type(e).__name__


def read_some(stream, n: int) -> tuple[bytes, str | None]:
    """Read up to n bytes; a compressed stream that breaks off returns the problem as text.

    Reads with `read1` where the stream has it, so that the bytes decompressed before a
    compression error are returned too (a single `read(n)` that fails loses them all).
    """
    out = bytearray()
    read1 = getattr(stream, "read1", None)
    try:
        if read1 is None:
            return stream.read(n), None
        while len(out) < n:
            block = read1(n - len(out))
            if not block:
                break
            out += block
        return bytes(out), None
    except EOFError:
        return bytes(out), "compressed stream ended early"
    except Exception as e:
        return bytes(out), f"corrupt compressed data ({one_line(e)})"
