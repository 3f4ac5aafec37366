"""redact: secrets in a trace's metadata (a profiled machine's environment records access tokens)
replaced before anything is written that people share: the tables, augmented and combined traces."""

from __future__ import annotations

import functools
import re

SECRET_KEY = re.compile(
    r"TOKEN|SECRET|PASSW|CREDENTIAL|PRIVATE|COOKIE|AUTH|(^|[_\-. ])(API|ACCESS)?_?KEY([_\-. ]|$)", re.I
)
SECRET_VALUE = re.compile(r"^(hf_|ghp_|gho_|ghs_|github_pat_|sk-|xox[abpr]-|AKIA|ASIA|glpat-)[A-Za-z0-9_\-]{8,}")
REDACTED = "<redacted>"


_PLAIN = frozenset((int, float, bool, type(None)))  # values that are never secrets nor hold one


@functools.lru_cache(maxsize=4096)
def _secret_key(key: str) -> bool:
    """Whether a key looks like a secret's: the same few keys come in every trace of a batch."""
    return SECRET_KEY.search(key) is not None


def redact(obj):
    """A copy of trace metadata with values under secret-looking keys (and token-like values) replaced."""
    if isinstance(obj, dict):
        return {
            k: (REDACTED if _secret_key(str(k)) and v not in (None, "") else v if type(v) in _PLAIN else redact(v))
            for k, v in obj.items()
        }
    if isinstance(obj, list):
        # a list of numbers is copied whole: a process group's ranks can be thousands (a gloo trace
        # of 300 ranks' 11 groups: 0.62 ms a trace, a third of what a batch spends on it)
        if _PLAIN.issuperset(map(type, obj)):
            return obj.copy()
        return [redact(v) for v in obj]
    if isinstance(obj, str) and SECRET_VALUE.match(obj):
        return REDACTED
    return obj
