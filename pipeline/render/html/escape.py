"""escape: every text that reaches the page goes through here (a trace is untrusted text).

Three places, three rules:

- HTML text and attribute values (`text`): `& < > " '` as character references, so a name can
  neither open a tag nor close the attribute it stands in.
- Data for the page's scripts (`script_json`): JSON inside `<script type="application/json">`,
  with `<`, `>` and `&` as `\\u003c`-style escapes (so neither `</script>` nor `<!--` can appear
  in it) and U+2028 / U+2029 escaped too (line terminators for older JavaScript parsers).
  The scripts read it with `JSON.parse` and put names on the page with `textContent` only.
- Anything else (a CSS value, a URL) is never made from trace text.

The page's Content-Security-Policy (`page.py`) allows only its own script, by hash: were an
escape ever missed, injected markup could still not run.
"""

from __future__ import annotations

import math

import orjson

_TEXT = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"})
_SCRIPT = {
    "<": "\\u003c",
    ">": "\\u003e",
    "&": "\\u0026",
    "\u2028": "\\u2028",
    "\u2029": "\\u2029",
}
_SCRIPT_TABLE = str.maketrans(_SCRIPT)


def text(value: object) -> str:
    """`value` as text safe in HTML content and in a quoted attribute value."""
    return str(value).translate(_TEXT)


def _plain(v: object) -> object:
    """NaN / inf as null (JSON has neither); other values as orjson writes them."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    raise TypeError(f"not JSON: {type(v).__name__}")


def script_json(value: object) -> str:
    """`value` as JSON that is safe inside an inline `<script>` element."""
    raw = orjson.dumps(value, default=_plain, option=orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY).decode()
    return raw.translate(_SCRIPT_TABLE)
