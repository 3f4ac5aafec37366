"""guard: exit codes and the one-line error of every command, without typer (the light `ranks`
path runs through here too)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from pipeline.errors import TracepipeError

EXIT_OK, EXIT_PROBLEMS, EXIT_BAD_INPUT, EXIT_INTERNAL = 0, 1, 2, 3


def say(msg: str) -> None:
    """One line on stderr, `tracepipe: ` first."""
    sys.stderr.write(f"tracepipe: {msg}\n")
    sys.stderr.flush()


def guarded(call: Callable[[], object]) -> int:
    """Run `call` and return its exit code; every error is one line on stderr, with its code
    (`TRACEPIPE_DEBUG=1`: internal errors raise)."""
    try:
        rc = call()
    except TracepipeError as e:
        say(str(e))
        return e.exit_code
    except KeyboardInterrupt:
        say("interrupted")
        return 130
    except OSError as e:  # the environment, not a bug: a disk that filled, a permission
        why = os.strerror(e.errno) if e.errno else " ".join(str(e).split())
        say(f"{getattr(e, 'filename', None) or 'I/O error'}: {why}")
        return EXIT_BAD_INPUT
    except Exception as e:  # a bug
        if os.environ.get("TRACEPIPE_DEBUG"):
            raise
        first = " ".join(str(e).split())[:300]
        say(f"internal error: {type(e).__name__}: {first} (set TRACEPIPE_DEBUG=1 for details)")
        return EXIT_INTERNAL
    return rc if isinstance(rc, int) else EXIT_OK
