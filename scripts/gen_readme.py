"""Regenerate the README sections that derive from code and data (`make readme`).

Sections between `<!-- NAME:begin -->` and `<!-- NAME:end -->` markers:
- schema: every table's declaration (schemas/*.toml)
- formulas: the cost formula table (pipeline/cost/formulas/)
- devices: the device-spec table (data/device_specs.csv)
- causes: why a kernel has no cost, and the remedies (pipeline/cost/coverage.py)
- layouts: the Kineto layouts tracepipe reads (data/kineto_layouts.toml)
- commlibs: the communication libraries' kernels (pipeline/cost/comm_kernels.py)
- sizesources: where collective sizes are read (pipeline/cost/formulas/messages.py)
tests/test_docs.py fails when the README is not current.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def sections() -> dict[str, str]:
    from pipeline import kineto, schema

    out = {
        "schema": "\n\n".join(schema.markdown(t) for t in schema.DOCUMENTED),
        "layouts": kineto.layouts_markdown(),
    }
    try:
        from pipeline.cost import formulas

        out["formulas"] = formulas.formulas_markdown()
    except ImportError:
        pass
    try:
        from pipeline.cost import coverage

        out["causes"] = coverage.causes_markdown()
    except ImportError:
        pass
    try:
        from pipeline.cost import devices

        out["devices"] = devices.specs_markdown(devices.load_specs())
    except ImportError:
        pass
    try:
        from pipeline.cost import comm_kernels
        from pipeline.cost.formulas import messages

        out["commlibs"] = comm_kernels.libraries_markdown()
        out["sizesources"] = messages.sources_markdown()
    except ImportError:
        pass
    return out


def render(text: str, parts: dict[str, str]) -> str:
    for name, body in parts.items():
        pat = re.compile(rf"(<!-- {name}:begin -->\n).*?(<!-- {name}:end -->)", re.S)
        text = pat.sub(lambda m, body=body: m.group(1) + body.strip() + "\n" + m.group(2), text)
    return text


if __name__ == "__main__":
    readme = ROOT / "README.md"
    new = render(readme.read_text(), sections())
    readme.write_text(new)
    print("README.md sections regenerated")
