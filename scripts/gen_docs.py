"""The documentation site's generated parts: an MkDocs hook (mkdocs.yml `hooks:`), run by `make docs`.

A page of docs/ holds a line `<!-- gen:NAME -->` where a part made from the code or data goes; the
hook replaces it at build time, so nothing generated is committed and nothing can go stale:

- commands: every command of the CLI with its arguments and options (the typer app)
- sections: every report section of `analyze` (pipeline.analyses.registry.REGISTRY)
- schema: every table and column (schemas/*.toml)
- layouts: the Kineto layouts tracepipe reads (data/kineto_layouts.toml)
- devices: the device-spec rows (data/device_specs.csv)
- findings: every finding rule and its thresholds, with why (data/findings.toml)
- formulas, causes, commlibs, sizesources: the cost formulas, why a kernel has no cost, the
  communication libraries' kernels, where collective sizes are read (pipeline/cost/)
- api: the public Python API (`pipeline.__all__`, `pipeline.report.__all__`)

`python scripts/gen_docs.py NAME` prints one part. tests/test_docs.py checks every marker names a
part and every part renders.
"""

from __future__ import annotations

import inspect
import re
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MARKER = re.compile(r"^<!-- gen:([\w-]+) -->$", re.M)


def _click():
    from pipeline.cli.entry import _click

    return _click()


def commands() -> str:
    """Every command: its help, usage, arguments and options, as `tracepipe CMD --help` has them."""
    from pipeline.cli.entry import command

    click = _click()
    root = command()
    subs = root.commands  # type: ignore[attr-defined]
    out = ["| command | what it does |", "| --- | --- |"]
    for name, sub in subs.items():
        first = (sub.help or "").split("\n\n")[0].replace("\n", " ")
        out.append(f"| [`tracepipe {name}`](#tracepipe-{name}) | {_cell(first)} |")
    for name, sub in subs.items():
        ctx = click.Context(sub, info_name=f"tracepipe {name}", terminal_width=100, max_content_width=100)
        out += ["", f"## tracepipe {name}", "", _para(sub.help or ""), "", "```text", sub.get_usage(ctx), "```", ""]
        args = [p for p in sub.params if p.param_type_name == "argument"]
        opts = [p for p in sub.params if p.param_type_name == "option" and not getattr(p, "hidden", False)]
        if args:
            out += ["Arguments:", ""]
            out += [_param(p, ctx) for p in args]
            out.append("")
        if opts:
            out += ["Options:", ""]
            out += [_param(p, ctx) for p in opts]
    return "\n".join(out)


def _param(p, ctx) -> str:
    record = p.get_help_record(ctx)
    if record is None:  # an argument: typer keeps its help on the parameter
        names, text = (p.metavar or p.name or "").strip("{}"), getattr(p, "help", "") or ""
    else:
        names, text = record
    return f"- `{names}`: {_inline(text)}" if text else f"- `{names}`"


def _para(text: str) -> str:
    """A docstring as Markdown paragraphs (its single newlines joined)."""
    return "\n\n".join(" ".join(p.split()) for p in inspect.cleandoc(text).split("\n\n"))


def _inline(text: str) -> str:
    return " ".join(text.split()).replace("<", "&lt;")


def _cell(text: str) -> str:
    return _inline(text).replace("|", "\\|")


def sections() -> str:
    """Every section of `analyze`: name, title, what it holds, its table columns and JSON place."""
    from pipeline.analyses.registry import PCT_MEANINGS, REGISTRY, pct_meanings

    place = {"devices": "`devices` (the list of devices)", "device": "inside each device", "top": "top level"}
    out = ["| section | title | what it holds | in the JSON document |", "| --- | --- | --- | --- |"]
    for s in REGISTRY:
        out.append(f"| [`{s.name}`](#{s.name}) | {_cell(s.title)} | {_cell(s.help)} | {place[s.json]} |")
    for s in REGISTRY:
        out += ["", f"### {s.name}", "", f"**{s.title}.** {_inline(s.help)}.", ""]
        out.append(f"`tracepipe analyze TRACE --section {s.name}`")
        if s.columns:
            out += ["", "Columns in table and md (`--columns` picks others; JSON and CSV keep every column): "]
            out[-1] += ", ".join(f"`{c}`" for c in s.columns) + "."
        meanings = pct_meanings(s.name, s.columns or [*s.meanings, *PCT_MEANINGS])
        own = {c: m for c, m in meanings.items() if s.columns or c in s.meanings}
        if own:
            out += ["", *[f"- `{c}`: {m}" for c, m in own.items()]]
    out += ["", "### What every percentage column is a share of", ""]
    out += [f"- `{c}`: {m}" for c, m in PCT_MEANINGS.items()]
    return "\n".join(out)


def findings() -> str:
    """Every table of data/findings.toml: its comment, then each key with its value and why."""
    from pipeline.resources import find_dir, read_toml

    path = find_dir("data") / "findings.toml"
    text = path.read_text()
    data = read_toml(path)
    out: list[str] = []
    table, notes = None, []
    arrays_done: set[str] = set()
    for line in text.splitlines():
        head = re.match(r"^\[(\[)?([\w.]+)\]?\]$", line.strip())
        if head:
            name = head.group(2)
            if head.group(1):  # an array of tables: shown once, whole, under its parent
                if name not in arrays_done:
                    arrays_done.add(name)
                    parent, key = name.split(".")
                    out += ["", f"- `{key}`:"]
                    out += [f"    - {_value(item)}" for item in data[parent][key]]
                table, notes = None, []
                continue
            table, notes = name, []
            if "." in name:  # a rule's text per vendor: default, then each vendor's override
                parent, key = name.split(".", 1)
                out += ["", f"- `{key}`, by the trace's vendor (`default` where none is given):"]
                continue
            doc = _rule_doc(name)
            out += ["", f"### {name}", ""] + ([doc, ""] if doc else [])
            continue
        if table is None:
            continue
        if line.startswith("#"):
            notes.append(line.lstrip("# ").rstrip())
            continue
        key = re.match(r"^(\w+)\s*=", line)
        here = _table(data, table)
        if key and key.group(1) in here:
            k = key.group(1)
            why = line.split("  # ", 1)[1].strip() if "  # " in line else ""
            said = " ".join(n for n in notes if n)
            if said:
                out += ["", _inline(said), ""]
            notes = []
            v = here[k]
            prose = isinstance(v, str) and " " in v and len(v) > 60  # a remedy, not a pattern
            shown = _inline(v) if prose else f"`` {v} ``"
            indent = "    " if "." in table else ""
            out.append(f"{indent}- `{k}` = {shown}" + (f": {_inline(why)}" if why else ""))
    return "\n".join(out).strip()


def _table(data: dict, name: str) -> dict:
    """A table of the TOML by its dotted name (`host_bound.remedy`)."""
    for part in name.split("."):
        data = data[part]
    return data


def _value(v) -> str:
    if isinstance(v, dict):
        return ", ".join(f"{k} = `{x}`" for k, x in v.items())
    return f"`{v}`"


def _rule_doc(rule: str) -> str:
    """The first paragraph of the rule's module docstring (pipeline/findings/<rule>.py)."""
    f = ROOT / "pipeline" / "findings" / f"{rule}.py"
    if not f.exists():
        return ""
    import ast

    doc = ast.get_docstring(ast.parse(f.read_text())) or ""
    return _para(doc.split("\n\n")[0]) + f" (`pipeline/findings/{rule}.py`)"


def api() -> str:
    """The public Python API: every name of `pipeline.__all__` and `pipeline.report.__all__`."""
    import pipeline
    from pipeline import report

    out: list[str] = []
    for mod, names in (("pipeline", pipeline.__all__), ("pipeline.report", report.__all__)):
        out += ["", f"## `{mod}`", "", _para(inspect.getdoc(sys.modules[mod]) or "").split("\n\n")[0], ""]
        for name in names:
            obj = getattr(sys.modules[mod], name)
            if not (inspect.isfunction(obj) or inspect.isclass(obj)):
                continue
            try:
                sig = str(inspect.signature(obj))
            except (TypeError, ValueError):
                sig = "(...)"
            doc = (inspect.getdoc(obj) or "").split("\n\n")[0]
            out += [f"### `{mod}.{name}`", "", "```python", f"{name}{sig}", "```", "", _para(doc), ""]
    return "\n".join(out).strip()


def _cost(name: str) -> Callable[[], str]:
    def part() -> str:
        from pipeline.cost import comm_kernels, coverage, devices, formulas
        from pipeline.cost.formulas import messages

        return {
            "formulas": formulas.formulas_markdown,
            "causes": coverage.causes_markdown,
            "devices": lambda: devices.specs_markdown(devices.load_specs()),
            "commlibs": comm_kernels.libraries_markdown,
            "sizesources": messages.sources_markdown,
        }[name]()

    return part


def _schema() -> str:
    from pipeline import schema

    return "\n\n".join(schema.markdown(t) for t in schema.DOCUMENTED)


def _layouts() -> str:
    from pipeline import kineto

    return kineto.layouts_markdown()


PARTS: dict[str, Callable[[], str]] = {
    "commands": commands,
    "sections": sections,
    "schema": _schema,
    "layouts": _layouts,
    "findings": findings,
    "api": api,
    **{n: _cost(n) for n in ("formulas", "causes", "devices", "commlibs", "sizesources")},
}


def render(markdown: str) -> str:
    """The page with each `<!-- gen:NAME -->` line replaced by its part (an unknown NAME fails)."""

    def part(m: re.Match) -> str:
        if m.group(1) not in PARTS:
            raise KeyError(f"unknown generated part {m.group(1)!r} (known: {', '.join(PARTS)})")
        return PARTS[m.group(1)]().strip()

    return MARKER.sub(part, markdown)


def on_page_markdown(markdown: str, **_) -> str:
    """MkDocs hook: fill the generated parts of every page."""
    return render(markdown)


if __name__ == "__main__":
    print(PARTS[sys.argv[1]]())
