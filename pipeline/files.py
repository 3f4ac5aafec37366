"""files: writing outputs whole or not at all (`atomic_file`, `atomic_dir`), with the mode the
umask gives, and errors naming the output (`output_of`); where tracepipe keeps what it read of a
run folder (`folder_cache`). Light: no Arrow or polars, so that a command that writes a small
report does not import them."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import uuid
from contextlib import contextmanager, suppress
from pathlib import Path

from pipeline.errors import output_error


def umask() -> int:
    """The process's umask, read without changing it (Linux), else by setting it back at once."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _as_if_created(path: str | Path, directory: bool):
    """Give a private temporary file or directory (mkstemp: 0600, mkdtemp: 0700) the mode a plain
    open()/mkdir() would have given it, so that outputs follow the umask like any other file."""
    os.chmod(path, (0o777 if directory else 0o666) & ~umask())


@contextmanager
def atomic_dir(final: Path):
    """Yield a temporary directory beside `final`; on success it replaces `final` by rename.

    On any failure the temporary directory is removed: no half-written output is left. The
    directory gets the mode the umask gives a new directory.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        _as_if_created(tmp, directory=True)
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if final.exists():
        old = final.parent / f".{final.name}.old-{uuid.uuid4().hex[:8]}"
        os.rename(final, old)
    os.rename(tmp, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


@contextmanager
def atomic_file(final: Path):
    """Yield a temporary path beside `final`; it is renamed over `final` on success (and removed on
    failure). The file gets the mode the umask gives a new file."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.tmp-", dir=final.parent)
    os.close(fd)
    try:
        _as_if_created(tmp, directory=False)
        yield Path(tmp)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    os.replace(tmp, final)


@contextmanager
def output_of(target: str | Path, made: Path | None = None):
    """Within: an OSError (a full disk, a permission) is an OutputError naming `target`; whatever
    fails (a bad input included), the directory `made` is removed again if this block created it
    and left it empty."""
    made = None if made is None or Path(made).exists() else Path(made)
    try:
        yield
    except BaseException as e:
        if made is not None:
            _remove_empty_dirs(made)
        if isinstance(e, OSError):
            raise output_error(target, e) from None
        raise


def _remove_empty_dirs(top: Path):
    """Remove `top` and its subdirectories where they are empty (never a file)."""
    for d, _, _ in sorted(os.walk(top), key=lambda x: -len(x[0])):
        with suppress(OSError):
            os.rmdir(d)


def is_flat_dir(path: str | os.PathLike) -> bool:
    return (Path(path) / "events.parquet").is_file() and (Path(path) / "trace.parquet").is_file()


def cache_root() -> Path:
    """`$TRACEPIPE_CACHE_DIR`, else `$XDG_CACHE_HOME/tracepipe`, else `~/.cache/tracepipe`."""
    env = os.environ.get("TRACEPIPE_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "tracepipe"


def path_key(path: str | os.PathLike) -> str:
    """16 hex digits naming a path (its absolute form) in the cache."""
    return hashlib.blake2b(os.path.abspath(str(path)).encode(), digest_size=8).hexdigest()


def folder_cache(folder: str | os.PathLike) -> Path:
    """Where what tracepipe read of a run folder is kept: `<cache root>/runs/<path_key(folder)>`."""
    return cache_root() / "runs" / path_key(folder)
