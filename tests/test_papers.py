"""The pages' front matter and the README's methods table generated from it (``sweeps/papers.py``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sweeps.papers import (
    TABLE_END,
    TABLE_START,
    VERDICTS,
    PaperPageError,
    generated_table,
    load_pages,
    main,
    parse_page,
    render_readme,
    split_front_matter,
    summarise,
    table,
)
from tests.helpers import REPO
from tests.test_completeness import method_names

GOOD = {
    "paper": "000-99",
    "title": "A toy method",
    "tier": "B",
    "module": "toy",
    "default_config": "configs/toy/toy.yaml",
    "default_run_time": "12 s on 2 shared cores",
    "claims": [
        {"claim": "the toy effect has the claimed size", "verdict": "reproduced"},
        {"claim": "the toy effect also holds elsewhere", "verdict": "inconclusive",
         "reason": "the interval [-0.1, 0.3] spans both 0 and the claimed 0.2"},
    ],
    "headline": "The toy effect is 0.2 [0.1, 0.3] over 3 seeds.",
    "compare": "python main.py compare --experiment toy --sweep s --metric test/acc --by x",
}
BODY = "# A toy method\n\n```bash\npython main.py compare --experiment toy --sweep s \\\n    --metric test/acc --by x\n```\n"


def write_page(root: Path, front: dict, body: str = BODY, name: str = "toy") -> Path:
    """A repository under ``root`` with one page ``docs/papers/<name>.md`` and the config it names."""
    (root / "configs" / "toy").mkdir(parents=True, exist_ok=True)
    (root / "configs" / "toy" / "toy.yaml").write_text("seed_everything: 0\n")
    page = root / "docs" / "papers" / f"{name}.md"
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text("---\n" + yaml.safe_dump(front, allow_unicode=True, sort_keys=False) + "---\n\n" + body)
    return page


def rejects(tmp_path: Path, front: dict, field: str, body: str = BODY) -> str:
    """The one-line error for a page with ``front``; it names the page and ``field``."""
    page = write_page(tmp_path, front, body)
    with pytest.raises(PaperPageError) as err:
        parse_page(page, tmp_path)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("docs/papers/toy.md: "), message
    assert field in message, message
    return message


# --- the real pages and the README --------------------------------------------------------------------------

def test_every_page_has_a_valid_front_matter() -> None:
    pages = load_pages(REPO)
    assert sorted(p.module for p in pages) == method_names()
    assert pages[0].module == "mlp_classifier"  # the reference first, then by paper id
    assert [p.paper for p in pages[1:]] == sorted(p.paper for p in pages[1:])
    for p in pages:
        assert (REPO / p.default_config).is_file()
        assert all(c.verdict in VERDICTS for c in p.claims)


def test_the_readme_methods_table_is_the_generated_one() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    pages = load_pages(REPO)
    assert generated_table(readme) == table(pages), "run: python main.py papers --write"
    assert render_readme(readme, pages) == readme, "run: python main.py papers --write"
    assert f"{sum(p.paper != '—' for p in pages)} of them implemented so far" in readme


def test_a_hand_edited_row_is_not_the_generated_table() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    row = next(line for line in generated_table(readme).splitlines() if "`bvpo`" in line)
    edited = readme.replace(row, row.replace("| A |", "| C |"))
    assert edited != readme
    assert render_readme(edited, load_pages(REPO)) == readme  # --write restores it


def test_every_row_links_its_page_and_names_its_module() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    rows = generated_table(readme).splitlines()[2:]
    for p, row in zip(load_pages(REPO), rows):
        assert f"](docs/papers/{p.module}.md)" in row and f"`{p.module}`" in row and p.default_config in row


def test_papers_command_prints_the_table_without_torch() -> None:
    code = ("import sys, main; rc = main.cli_main(['papers']); "
            "assert 'torch' not in sys.modules and 'lightning' not in sys.modules, 'torch imported'; sys.exit(rc)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "| paper | method | tier | verdict | headline | default config |" in out.stdout
    assert "papers implemented" in out.stdout


def test_usage_lists_papers() -> None:
    from main import USAGE

    assert "papers" in USAGE


# --- the validator --------------------------------------------------------------------------------------------

def test_a_good_page_validates(tmp_path: Path) -> None:
    page = parse_page(write_page(tmp_path, GOOD), tmp_path)
    assert page.module == "toy" and [c.verdict for c in page.claims] == ["reproduced", "inconclusive"]


def test_a_bad_verdict_word_is_rejected(tmp_path: Path) -> None:
    front = {**GOOD, "claims": [{"claim": "x", "verdict": "mostly reproduced"}]}
    message = rejects(tmp_path, front, "claims[0].verdict")
    assert "mostly reproduced" in message and "partly reproduced" in message


def test_a_31_word_headline_is_rejected(tmp_path: Path) -> None:
    headline = " ".join(["word"] * 30) + " 1."
    assert len(headline.split()) == 31
    message = rejects(tmp_path, {**GOOD, "headline": headline}, "headline")
    assert "31 words" in message
    parse_page(write_page(tmp_path, {**GOOD, "headline": " ".join(["word"] * 29) + " 1."}), tmp_path)  # 30: fine


@pytest.mark.parametrize("field", ["paper", "title", "tier", "module", "default_config", "default_run_time",
                                   "claims", "headline", "compare"])
def test_a_missing_field_is_rejected(tmp_path: Path, field: str) -> None:
    front = {k: v for k, v in GOOD.items() if k != field}
    assert "missing" in rejects(tmp_path, front, field)


@pytest.mark.parametrize(("change", "field"), [
    ({"headline": "The toy effect is large."}, "headline"),                      # no number
    ({"default_config": "configs/toy/absent.yaml"}, "default_config"),           # not a file
    ({"compare": "python main.py compare --experiment toy --metric test/loss"}, "compare"),  # not in the body
    ({"claims": [{"claim": "x", "verdict": "not reproduced"}]}, "claims[0].reason"),  # a null without a reason
    ({"claims": []}, "claims"),
    ({"tier": "D"}, "tier"),
    ({"paper": "42"}, "paper"),
    ({"module": "other"}, "module"),
    ({"extra": 1}, "extra"),
])
def test_other_bad_fields_are_rejected(tmp_path: Path, change: dict, field: str) -> None:
    rejects(tmp_path, {**GOOD, **change}, field)


def test_a_page_without_front_matter_is_rejected(tmp_path: Path) -> None:
    page = write_page(tmp_path, GOOD)
    page.write_text(BODY)
    with pytest.raises(PaperPageError, match="docs/papers/toy.md: no front matter"):
        parse_page(page, tmp_path)
    with pytest.raises(PaperPageError, match="closing"):
        split_front_matter("---\npaper: x\n", "p.md")


def test_the_command_prints_one_error_line_naming_page_and_field(tmp_path: Path, capsys) -> None:
    write_page(tmp_path, {**GOOD, "claims": [{"claim": "x", "verdict": "refuted", "reason": "r"}]})
    assert main([], repo=tmp_path) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: docs/papers/toy.md: claims[0].verdict: 'refuted'") and "\n" not in err


def test_write_and_check_on_a_readme(tmp_path: Path, capsys) -> None:
    write_page(tmp_path, GOOD)
    readme = tmp_path / "README.md"
    readme.write_text("# x\n\nMethods of 57 papers, <!-- papers:count -->0<!-- /papers:count -->.\n\n"
                      "## Methods\n\n| a | b |\n|---|---|\n| old | row |\n\nAfter.\n")
    assert main(["--check"], repo=tmp_path) == 1
    assert main(["--write"], repo=tmp_path) == 0
    text = readme.read_text()
    assert TABLE_START in text and TABLE_END in text and "| old | row |" not in text and text.endswith("\nAfter.\n")
    assert "1 of them implemented so far" in text and "[A toy method](docs/papers/toy.md) (`toy`)" in text
    assert main(["--check"], repo=tmp_path) == 0
    readme.write_text(text.replace("| B |", "| A |"))  # a row edited by hand
    assert main(["--check"], repo=tmp_path) == 1


def test_summarise() -> None:
    assert summarise(["reproduced"]) == "reproduced"
    assert summarise(["inconclusive"] * 3) == "inconclusive (3 of 3)"
    assert summarise(["reproduced", "not reproduced", "partly reproduced", "reproduced"]) == (
        "2 of 4 reproduced; 1 partly, 1 not reproduced")
    assert summarise(["inconclusive", "not checkable here"]) == "0 of 2 reproduced; 1 inconclusive, 1 not checkable"
