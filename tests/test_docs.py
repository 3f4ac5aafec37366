"""The documentation: the README fits a first read, the site's generated parts render from the code,
and every example of README.md and docs/ runs on the shared real traces as the page shows it."""

import importlib.util
import os
import re
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


gen = _load("gen_docs")
ex = _load("doc_examples")
PAGES = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
WITH_EXAMPLES = [p for p in PAGES if ex.examples(p.read_text())]


# ------------------------------------------------------------------ the README
def test_the_readme_fits_a_first_read_and_starts_with_the_two_setup_commands():
    text = (ROOT / "README.md").read_text()
    assert text.count("\n") <= 300
    block = text.split("## Quick start", 1)[1].split("```", 2)[1]
    cmds = [c.strip() for c in block.splitlines()[1:] if c.strip() and not c.startswith("#")]
    assert cmds[:2] == ["make demo", "make test"]  # .ci/run runs `make test`: the README's own command


def test_the_readme_links_only_to_pages_that_exist():
    text = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(((?:docs/)[^)#]+)", text)
    assert links and [t for t in links if not (ROOT / t).exists()] == []


# ------------------------------------------------------------------ the generated parts
def test_every_marker_names_a_part_and_every_part_is_placed_and_renders():
    used = {m for p in DOCS.rglob("*.md") for m in gen.MARKER.findall(p.read_text())}
    assert used == set(gen.PARTS), (
        f"markers without a part: {used - set(gen.PARTS)}, parts unused: {set(gen.PARTS) - used}"
    )
    for name, part in gen.PARTS.items():
        assert part().strip(), name
    with pytest.raises(KeyError, match="nosuch"):
        gen.render("<!-- gen:nosuch -->")


def test_the_command_reference_has_every_command_and_option():
    from pipeline.cli.entry import command

    text = gen.commands()
    for name, sub in command().commands.items():
        assert f"## tracepipe {name}\n" in text
        for p in sub.params:
            if p.param_type_name == "option" and not p.hidden:
                assert p.opts[0] in text, (name, p.opts[0])


def test_the_section_reference_has_every_section_of_the_registry():
    from pipeline.analyses.registry import REGISTRY

    text = gen.sections()
    assert [s.name for s in REGISTRY] == re.findall(r"^### ([a-z-]+)$", text, re.M)[: len(REGISTRY)]


def test_the_table_reference_has_every_column():
    from pipeline import schema

    text = gen.PARTS["schema"]()
    for t in schema.DOCUMENTED:
        for c in schema.table(t).columns:
            assert f"`{c.name}`" in text, (t, c.name)


def test_the_findings_reference_has_every_threshold_of_every_rule():
    from pipeline.findings.limits import table

    text = gen.findings()
    for rule, values in table().items():
        assert f"### {rule}\n" in text
        for key in values:
            assert f"- `{key}`" in text, (rule, key)


def test_the_cost_model_page_names_every_role_and_math_mode():
    """docs/explanation/cost-model.md says what each kernel role and math mode is: a new one in the
    data tables is documented there too."""
    from pipeline.cost.kernel_roles import ROLES
    from pipeline.cost.peaks import MATH_MODES

    page = (DOCS / "explanation" / "cost-model.md").read_text()
    for name in [*ROLES, *MATH_MODES]:
        assert f"| `{name}` |" in page, name


def test_every_page_is_in_the_nav():
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = [p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")]
    assert [p for p in pages if f": {p}\n" not in nav] == []


# ------------------------------------------------------------------ the examples run
def test_examples_are_read_from_console_blocks_only():
    page = (
        "```bash\n$ tracepipe not-run\n```\n```console\n$ tracepipe a \\\n    --b\nout 1\nout 2\n$ tracepipe c\n```\n"
    )
    got = [(e.command, e.output) for e in ex.examples(page)]
    assert got == [("tracepipe a --b", ["out 1", "out 2"]), ("tracepipe c", [])]


@pytest.fixture(scope="module")
def ran(shared_traces, tmp_path_factory):
    """Every page's examples, pages side by side (each page's in order, in its own directory)."""

    def page(p: Path):
        cwd = ex.workdir(tmp_path_factory.mktemp(p.stem))
        return [(e, ex.run(e.command, cwd)) for e in ex.examples(p.read_text())]

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        return dict(zip(WITH_EXAMPLES, pool.map(page, WITH_EXAMPLES)))


@pytest.mark.real
@pytest.mark.parametrize("page", WITH_EXAMPLES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_the_examples_of_a_page_run_as_it_shows(ran, page):
    """Each example exits 0 or 1 (problems reported) and prints what the page shows first (its title
    line: the rest changes with the code; `scripts/doc_examples.py --refresh PAGE` rewrites it)."""
    for e, p in ran[page]:
        assert p.returncode in (0, 1), f"{page.name}: `{e.command}` exited {p.returncode}: {p.stderr.strip()[-300:]}"
        assert "Traceback" not in p.stderr, e.command
        shown = [_timeless(line) for line in e.output if line.strip()]
        printed = [_timeless(line) for line in (p.stdout + p.stderr).splitlines() if line.strip()]
        if shown:
            assert printed[:1] == shown[:1], (
                f"{page.name}: `{e.command}` printed first {printed[:1]}, the page {shown[:1]}"
            )


def _timeless(line: str) -> str:
    """A line with its wall times (`2.8 s`) left out: they differ from run to run."""
    return re.sub(r"\d+(\.\d+)? s\b", "_ s", line.rstrip())
