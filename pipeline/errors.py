"""The few named errors of tracepipe. The CLI maps them to exit codes in one place."""


class TracepipeError(Exception):
    """Base class: a problem tracepipe explains in one line."""

    exit_code = 2


class BadTrace(TracepipeError):
    """The input is not a readable trace (not JSON, corrupt compression, no traceEvents list)."""


class UsageError(TracepipeError):
    """The command line or an argument does not make sense."""


class DatasetError(TracepipeError):
    """A flattened directory or dataset is missing or malformed."""


class OutputError(TracepipeError):
    """An output cannot be written (disk full, no permission, read-only filesystem)."""


def output_error(target, e: OSError) -> OutputError:
    """An OSError met while writing `target`, as one line in the system's words."""
    import os

    why = os.strerror(e.errno) if e.errno else (" ".join(str(e).split()) or type(e).__name__)
    return OutputError(f"cannot write {target}: {why}")


def did_you_mean(word: str, choices) -> str:
    """' (did you mean 'X'?)' for the choice closest to a mistyped `word`, or '' when none is close."""
    import difflib

    choices = [str(c) for c in choices]
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    if not close:  # a prefix or a part of one (`crit` for critical-path)
        close = [c for c in choices if len(word) >= 3 and word.lower() in c.lower()][:1]
    return f" (did you mean {close[0]!r}?)" if close else ""
