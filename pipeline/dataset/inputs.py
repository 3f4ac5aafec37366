"""inputs: every trace a batch source holds: a directory (recursive), a .tar/.tar.gz/.zip archive
(members streamed one at a time, unsafe names and links quarantined, bombs refused), a trace, or
a text file listing paths; each hashed (BLAKE2b) so the same content is one trace."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import tarfile
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import chain
from pathlib import Path, PurePosixPath

from pipeline.errors import UsageError
from pipeline.kineto import is_trace_name, is_trace_path
from pipeline.read.limits import inflate_limit, not_regular, too_inflated

TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz")


@dataclass
class Item:
    """One input: a local file to flatten (`path`) and the name it is reported by (`source`)."""

    source: str
    path: str | None = None
    size: int = 0
    content_hash: str | None = None
    rejected: str | None = None  # an archive member refused before reading (unsafe name, a link)
    failed: str | None = None  # not readable, through no fault of its content: nothing committed
    temp: bool = False  # path is an extracted copy to delete once used
    captures: tuple[str, ...] = ()  # capture traces of the CUDA/HIP graphs it replays (`captures`)

    @property
    def trace_id(self) -> str:
        if self.content_hash is None:  # rejected unread: never the id of real content
            return "t" + hashlib.blake2b(f"rejected:{self.source}".encode(), digest_size=8).hexdigest()
        return "t" + self.content_hash[:16]


class _Hasher:
    def __init__(self):
        self.h, self.size = hashlib.blake2b(digest_size=32), 0

    def update(self, b: bytes):
        self.h.update(b)
        self.size += len(b)


def file_hash(path: str) -> tuple[str, int]:
    """BLAKE2b-256 hex digest and size of a file, read in 1 MiB blocks."""
    h = _Hasher()
    with open(path, "rb") as f:
        while b := f.read(1 << 20):
            h.update(b)
    return h.h.hexdigest(), h.size


def _file_item(path: str) -> Item:
    """A file input, hashed. One that cannot be read for good (a FIFO, no permission) is
    quarantined with the reason; one that vanished fails (retried by the next run)."""
    why = not_regular(path)
    if why == "no such file":
        return Item(source=path, failed=why)
    if why:
        return Item(source=path, rejected=why)
    try:
        digest, size = file_hash(path)
    except OSError as e:
        return Item(source=path, rejected=f"cannot read: {e.strerror or e}")
    return Item(source=path, path=path, size=size, content_hash=digest)


def unsafe_member(name: str) -> str | None:
    """Why an archive member name may not be used, or None."""
    p = PurePosixPath(name.replace("\\", "/"))
    if p.is_absolute() or (p.parts and p.parts[0].endswith(":")):
        return "absolute path in archive"
    if ".." in p.parts:
        return "'..' in archive member path"
    if not p.name or p.name in (".", ".."):
        return "empty archive member name"
    return None


class _TooInflated(Exception):
    pass


def extract_member(stream, source: str, name: str, tmp: Path, n: int, limit: int | None, compressed: int) -> Item:
    """Copy one member's bytes into tmp/<n>/<basename>, hashing them on the way; a member that
    inflates past `limit` bytes is removed again and quarantined (a decompression bomb)."""
    d = tmp / str(n)
    d.mkdir(parents=True)
    dst = d / PurePosixPath(name.replace("\\", "/")).name
    h = _Hasher()
    try:
        with open(dst, "wb") as out:
            while b := stream.read(1 << 20):
                h.update(b)
                if limit is not None and h.size > limit:
                    raise _TooInflated()
                out.write(b)
    except _TooInflated:
        assert limit is not None  # raised only under a limit
        shutil.rmtree(d, ignore_errors=True)
        return Item(source=source, rejected=f"archive member {too_inflated(limit, compressed)}")
    return Item(source=source, path=str(dst), size=h.size, content_hash=h.h.hexdigest(), temp=True)


def _tar_items(path: str, tmp: Path, ratio: float | None) -> Iterator[Item]:
    """Members of a tar archive, streamed: one member on disk at a time per pending task. A
    member may inflate to `inflate_limit` of the whole archive's size."""
    try:
        tf = tarfile.open(path, mode="r|*")  # noqa: SIM115 - closed by the `with tf` below
    except (tarfile.TarError, OSError) as e:
        raise UsageError(f"{path}: cannot read archive: {e}") from None
    limit = inflate_limit(_size(path), ratio)
    with tf:
        n = 0
        try:
            for m in tf:
                if m.isdir() or not is_trace_path(m.name):
                    continue
                src = f"{path}!{m.name}"
                why = unsafe_member(m.name) or (None if m.isfile() else "archive member is a link or device")
                if why is None and limit is not None and m.size > limit:
                    why = f"archive member of {m.size:,} bytes {too_inflated(limit, _size(path))}"
                if why:
                    yield Item(source=src, rejected=why)
                    continue
                n += 1
                yield extract_member(tf.extractfile(m), src, m.name, tmp, n, limit, _size(path))
        except (tarfile.TarError, OSError, EOFError, ValueError) as e:
            yield Item(source=path, failed=f"archive unreadable after {n} members: {e}")


def _zip_items(path: str, tmp: Path, ratio: float | None) -> Iterator[Item]:
    """Members of a zip archive; each may inflate to `inflate_limit` of its compressed size (its
    declared size is checked first, and the bytes as they come: a header may lie)."""
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as e:
        raise UsageError(f"{path}: cannot read archive: {e}") from None
    with zf:
        for n, info in enumerate(zf.infolist(), 1):
            if info.is_dir() or not is_trace_path(info.filename):
                continue
            src = f"{path}!{info.filename}"
            mode = info.external_attr >> 16
            limit = inflate_limit(info.compress_size, ratio)
            why = unsafe_member(info.filename) or (
                "archive member is a link or device" if stat.S_IFMT(mode) not in (0, stat.S_IFREG) else None
            )
            if why is None and limit is not None and info.file_size > limit:
                why = f"archive member of {info.file_size:,} bytes {too_inflated(limit, info.compress_size)}"
            if why:
                yield Item(source=src, rejected=why)
                continue
            try:
                with zf.open(info) as stream:
                    yield extract_member(stream, src, info.filename, tmp, n, limit, info.compress_size)
            except (zipfile.BadZipFile, OSError, EOFError, ValueError) as e:
                yield Item(source=src, rejected=f"archive member unreadable: {e}")


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _dir_items(root: str, skip: Path) -> Iterator[Item]:
    """Trace files under root (not inside the dataset), largest first: workers finish together."""
    skip, found = skip.resolve(), []
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if Path(d, x).resolve() != skip)
        found += [os.path.join(d, f) for f in sorted(files) if is_trace_path(os.path.relpath(os.path.join(d, f), root))]
    for p in sorted(found, key=_size, reverse=True):
        yield _file_item(p)


def _list_items(listing: str) -> Iterator[Item]:
    try:
        lines = Path(listing).read_text().splitlines()
    except (UnicodeDecodeError, OSError):
        raise UsageError(
            f"{listing}: not a directory, an archive (.tar, .tar.gz, .tgz, .zip), a trace or a text file listing traces"
        ) from None
    base = os.path.dirname(listing)
    for line in lines:
        p = line.strip()
        if not p or p.startswith("#"):
            continue
        if not os.path.isabs(p) and not os.path.exists(p) and os.path.exists(os.path.join(base, p)):
            p = os.path.join(base, p)  # relative to the current directory, else to the list file
        yield _file_item(p)


Sources = str | os.PathLike | Sequence[str | os.PathLike]  # one source, or several (`batch A B DIR`)


def sources(src: Sources) -> list[str]:
    """SRC as a list of sources (one or several), each as a string."""
    return [str(src)] if isinstance(src, (str, os.PathLike)) else [str(s) for s in src]


def inputs(src: Sources, tmp: Path, dataset: Path, max_inflate: float | None = None) -> Iterator[Item]:
    """Every input of SRC: a directory (recursive), an archive, a trace, or a list of paths; or of
    each of several such sources in turn (each checked now: a missing one is a usage error before
    any work). `max_inflate`: the ratio archive members may inflate by (`pipeline.limits`)."""
    many = sources(src)
    if len(many) != 1:  # each source's archive members extracted into a folder of its own
        return chain.from_iterable([_inputs(s, tmp / str(i), dataset, max_inflate) for i, s in enumerate(many)])
    return _inputs(many[0], tmp, dataset, max_inflate)


def _inputs(src: str, tmp: Path, dataset: Path, max_inflate: float | None) -> Iterator[Item]:
    if os.path.isdir(src):
        return _dir_items(src, dataset)
    if not os.path.isfile(src):
        raise UsageError(f"{src}: no such file or directory")
    low = src.lower()
    if is_trace_name(low):
        return iter([_file_item(src)])
    if low.endswith(".zip") or (not low.endswith(TAR_SUFFIXES) and zipfile.is_zipfile(src)):
        return _zip_items(src, tmp, max_inflate)
    if low.endswith(TAR_SUFFIXES) or tarfile.is_tarfile(src):
        return _tar_items(src, tmp, max_inflate)
    return _list_items(src)
