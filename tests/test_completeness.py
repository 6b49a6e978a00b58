"""A method is complete when it has its module, its configs, its tests, its docs page and its README row."""

from __future__ import annotations

import re

import yaml

from tests.helpers import REPO

NOT_METHODS = {"components", "base", "protocols"}


def method_names() -> list[str]:
    """Every method: a module file or package under modules/ that is not shared infrastructure."""
    names = [p.stem for p in (REPO / "modules").glob("*.py")]
    names += [p.parent.name for p in (REPO / "modules").glob("*/__init__.py")]
    return sorted(n for n in names if n not in NOT_METHODS and not n.startswith("_"))


def test_there_are_methods() -> None:
    assert {"mlp_classifier", "causal_pieces", "weight_drift", "bvpo"} <= set(method_names())


def test_every_method_has_configs_tests_docs_and_a_readme_row() -> None:
    readme = (REPO / "README.md").read_text()
    rows = [line for line in readme.splitlines() if line.startswith("|")]
    missing = []
    for m in method_names():
        configs = list((REPO / "configs" / m).glob("*.yaml"))
        experiments = [c for c in configs if "sweep" not in c.stem]
        if not experiments:
            missing.append(f"{m}: no experiment config in configs/{m}/")
        for c in experiments:
            seed = (yaml.safe_load(c.read_text()) or {}).get("seed_everything")
            if not isinstance(seed, int) or isinstance(seed, bool):
                missing.append(f"{c.relative_to(REPO)}: no integer seed_everything")
        if not list((REPO / "tests").glob(f"**/test_{m}*.py")):
            missing.append(f"{m}: no tests/modules/test_{m}.py")
        page = REPO / "docs" / "papers" / f"{m}.md"
        if not page.is_file():
            missing.append(f"{m}: no docs/papers/{m}.md")
        elif "python main.py" not in page.read_text():
            missing.append(f"{m}: docs/papers/{m}.md gives no command that produced its numbers")
        if not any(re.search(rf"`{m}`", row) for row in rows):
            missing.append(f"{m}: no row in the README's methods table")
    assert not missing, "\n".join(missing)


def test_docs_do_not_point_outside_the_repository() -> None:
    """Users clone only this repository: nothing may link to the steering repo's shared/ folder."""
    pages = [REPO / "README.md", *(REPO / "docs").rglob("*.md")]
    offenders = [str(p.relative_to(REPO)) for p in pages if "../shared" in p.read_text() or "papers/specs" in p.read_text()]
    assert not offenders, offenders
