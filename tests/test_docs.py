"""The README's generated sections (schemas, formulas, devices) match the code and data."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _gen():
    spec = importlib.util.spec_from_file_location("gen_readme", ROOT / "scripts" / "gen_readme.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_readme_generated_sections_are_current():
    gen = _gen()
    text = (ROOT / "README.md").read_text()
    assert gen.render(text, gen.sections()) == text, "README is out of date: run `make readme`"


def test_readme_quick_start_has_the_two_setup_commands_first():
    text = (ROOT / "README.md").read_text()
    block = text.split("## Quick start", 1)[1].split("```", 2)[1]
    cmds = [c.strip() for c in block.splitlines()[1:] if c.strip() and not c.startswith("#")]
    assert cmds[:2] == ["make demo", "make test"]


def test_every_schema_column_is_in_the_readme():
    from pipeline import schema

    text = (ROOT / "README.md").read_text()
    for t in schema.TABLES:
        for c in schema.table(t).columns:
            assert f"`{c.name}`" in text


def test_the_cost_model_page_names_every_role_and_math_mode():
    """docs/explanation/cost-model.md says what each kernel role and math mode is: a new one in the
    data tables is documented there too."""
    from pipeline.cost.kernel_roles import ROLES
    from pipeline.cost.peaks import MATH_MODES

    page = (Path(__file__).resolve().parent.parent / "docs" / "explanation" / "cost-model.md").read_text()
    for name in [*ROLES, *MATH_MODES]:
        assert f"| `{name}` |" in page, name
