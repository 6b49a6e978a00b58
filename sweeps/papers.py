"""``python main.py papers [--write | --check]``: the README's methods table, generated from the pages.

Every method's page ``docs/papers/<module>.md`` starts with a YAML front matter (between ``---`` lines) that
names its paper, tier, default experiment and run time, the verdict on each claim and a headline
(``docs/design.md``, "Verdicts"). This module reads and validates those front matters and renders them:

* ``python main.py papers`` prints the table (and the count of implemented papers);
* ``python main.py papers --write`` rewrites the README's table (between the ``papers:table`` markers under
  ``## Methods``) and the count in its intro (between the ``papers:count`` markers);
* ``python main.py papers --check`` exits 1 when the README is not what ``--write`` would make it.

A page that breaks a rule is one ``error:`` line naming the page and the field. Torch-free: it imports only
PyYAML and the standard library.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from errors import PaperlabError

REPO = Path(__file__).resolve().parent.parent
TOTAL_PAPERS = 57

VERDICTS = ("reproduced", "partly reproduced", "not reproduced", "inconclusive", "not checkable here")
#: verdicts whose claim must say why in one sentence
NEEDS_REASON = ("not reproduced", "inconclusive", "not checkable here")
#: the verdict as it appears in the compact summary after the first count
SHORT = {"partly reproduced": "partly", "not checkable here": "not checkable"}
TIERS = ("A", "B", "C", "X")
NO_PAPER = "—"  # the reference MLP has no paper id and no tier
REQUIRED = ("paper", "title", "tier", "module", "default_config", "default_run_time", "claims", "headline", "compare")
MAX_HEADLINE_WORDS = 30

TABLE_START, TABLE_END = "<!-- papers:table -->", "<!-- /papers:table -->"
COUNT_START, COUNT_END = "<!-- papers:count -->", "<!-- /papers:count -->"
HEADER = ("| paper | method | tier | verdict | headline | default config |\n"
          "|---|---|---|---|---|---|")


class PaperPageError(PaperlabError):
    """A page's front matter (or the README's generated part) that breaks a rule; the message names both."""


@dataclass(frozen=True)
class Claim:
    """One claim of a page with its verdict (one of ``VERDICTS``) and, where required, why."""

    claim: str
    verdict: str
    reason: str | None


@dataclass(frozen=True)
class Page:
    """The validated front matter of one ``docs/papers/<module>.md``."""

    path: Path
    paper: str
    title: str
    tier: str
    module: str
    default_config: str
    default_run_time: str
    claims: tuple[Claim, ...]
    headline: str
    compare: str

    @property
    def link(self) -> str:
        """The page's path relative to the repository root (what the README links)."""
        return self.path.relative_to(self.path.parents[2]).as_posix()


def split_front_matter(text: str, where: str) -> tuple[dict[str, Any], str]:
    """``(front matter, body)`` of a page's text; ``where`` names the page in errors."""
    if not text.startswith("---\n"):
        raise PaperPageError(f"{where}: no front matter: the page must start with a '---' line, YAML, and '---'")
    end = text.find("\n---\n", 4)
    if end < 0:
        raise PaperPageError(f"{where}: front matter: no closing '---' line")
    try:
        data = yaml.safe_load(text[4:end + 1])
    except yaml.YAMLError as err:
        first = str(err).splitlines()[0]
        raise PaperPageError(f"{where}: front matter: not valid YAML ({first})") from None
    if not isinstance(data, dict):
        raise PaperPageError(f"{where}: front matter: expected a mapping of fields")
    return data, text[end + 5:]


def _text(data: dict[str, Any], field: str, where: str) -> str:
    value = data.get(field)
    if not isinstance(value, str) or not value.strip():
        raise PaperPageError(f"{where}: {field}: missing or empty (a non-empty string is required)")
    return value.strip()


def _one_line(command: str) -> str:
    """A shell command with its backslash continuations joined and its whitespace collapsed."""
    return " ".join(command.replace("\\\n", " ").split())


def _claims(data: dict[str, Any], where: str) -> tuple[Claim, ...]:
    items = data.get("claims")
    if not isinstance(items, list) or not items:
        raise PaperPageError(f"{where}: claims: missing or empty (a list of {{claim, verdict, reason}})")
    claims = []
    for i, item in enumerate(items):
        field = f"claims[{i}]"
        if not isinstance(item, dict):
            raise PaperPageError(f"{where}: {field}: expected a mapping with claim, verdict and reason")
        unknown = sorted(set(item) - {"claim", "verdict", "reason"})
        if unknown:
            raise PaperPageError(f"{where}: {field}.{unknown[0]}: unknown field (claim, verdict, reason)")
        text = _text(item, "claim", f"{where}: {field}").rstrip()
        verdict = item.get("verdict")
        if verdict not in VERDICTS:
            raise PaperPageError(f"{where}: {field}.verdict: {verdict!r} is not a verdict; use one of "
                                 + ", ".join(repr(v) for v in VERDICTS) + " (docs/design.md, Verdicts)")
        reason = item.get("reason")
        if reason is not None and (not isinstance(reason, str) or not reason.strip()):
            raise PaperPageError(f"{where}: {field}.reason: empty (one sentence, or leave the field out)")
        if verdict in NEEDS_REASON and reason is None:
            raise PaperPageError(f"{where}: {field}.reason: missing; a claim that is {verdict!r} says why in one "
                                 "sentence")
        claims.append(Claim(text, verdict, reason.strip() if reason else None))
    return tuple(claims)


def parse_page(path: Path, repo: Path = REPO) -> Page:
    """Read and validate the front matter of ``path`` (configs are looked up under ``repo``)."""
    where = path.relative_to(repo).as_posix() if path.is_relative_to(repo) else str(path)
    data, body = split_front_matter(path.read_text(encoding="utf-8"), where)
    missing = [f for f in REQUIRED if f not in data]
    if missing:
        raise PaperPageError(f"{where}: {missing[0]}: missing field (every page has "
                             + ", ".join(REQUIRED) + ")")
    unknown = sorted(set(data) - set(REQUIRED))
    if unknown:
        raise PaperPageError(f"{where}: {unknown[0]}: unknown field (the fields are " + ", ".join(REQUIRED) + ")")
    paper = _text(data, "paper", where)
    if paper != NO_PAPER and not re.fullmatch(r"\d{3}-\d{2}", paper):
        raise PaperPageError(f"{where}: paper: {paper!r} is not a paper id like '000-01' (or '{NO_PAPER}')")
    tier = _text(data, "tier", where)
    if tier not in (*TIERS, NO_PAPER):
        raise PaperPageError(f"{where}: tier: {tier!r} is not one of {', '.join(TIERS)} (or '{NO_PAPER}')")
    if (paper == NO_PAPER) != (tier == NO_PAPER):
        raise PaperPageError(f"{where}: tier: '{NO_PAPER}' goes with paper '{NO_PAPER}' (the reference) only")
    module = _text(data, "module", where)
    if module != path.stem:
        raise PaperPageError(f"{where}: module: {module!r} is not the page's name ({path.stem!r})")
    config = _text(data, "default_config", where)
    if not config.startswith("configs/") or not (repo / config).is_file():
        raise PaperPageError(f"{where}: default_config: {config} is not a file under configs/")
    headline = _text(data, "headline", where)
    words = len(headline.split())
    if words > MAX_HEADLINE_WORDS:
        raise PaperPageError(f"{where}: headline: {words} words; at most {MAX_HEADLINE_WORDS}")
    if not re.search(r"\d", headline):
        raise PaperPageError(f"{where}: headline: no number; the headline states its number")
    compare = _one_line(_text(data, "compare", where))
    if compare not in _one_line(body):
        raise PaperPageError(f"{where}: compare: not found in the page's body; copy the command that produced "
                             "the headline from the body")
    return Page(path=path, paper=paper, title=_text(data, "title", where), tier=tier, module=module,
                default_config=config, default_run_time=_text(data, "default_run_time", where),
                claims=_claims(data, where), headline=headline, compare=compare)


def load_pages(repo: Path = REPO) -> list[Page]:
    """Every page of ``repo/docs/papers``, validated, the reference first, then by paper id."""
    paths = sorted((repo / "docs" / "papers").glob("*.md"))
    if not paths:
        raise PaperPageError(f"{repo / 'docs' / 'papers'}: no pages")
    pages = [parse_page(p, repo) for p in paths]
    return sorted(pages, key=lambda p: (p.paper != NO_PAPER, p.paper, p.module))


def summarise(verdicts: list[str]) -> str:
    """A compact verdict of a claims list: the one verdict when all share it, else ``k of n reproduced; ...``."""
    counts = Counter(verdicts)
    if len(counts) == 1:
        (verdict, n), = counts.items()
        return verdict if n == 1 else f"{verdict} ({n} of {n})"
    rest = [f"{counts[v]} {SHORT.get(v, v)}" for v in VERDICTS[1:] if counts[v]]
    return f"{counts['reproduced']} of {len(verdicts)} reproduced; " + ", ".join(rest)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table(pages: list[Page]) -> str:
    """The README's methods table: one row per page, linking it."""
    rows = [HEADER]
    for p in pages:
        method = f"[{_cell(p.title)}]({p.link}) (`{p.module}`)"
        config = f"`{p.default_config}` ({_cell(p.default_run_time)})"
        verdict = summarise([c.verdict for c in p.claims])
        rows.append(f"| {p.paper} | {method} | {p.tier} | {verdict} | {_cell(p.headline)} | {config} |")
    return "\n".join(rows)


def implemented(pages: list[Page]) -> int:
    """How many papers have a method here (every page but the reference's)."""
    return sum(p.paper != NO_PAPER for p in pages)


def count_text(pages: list[Page]) -> str:
    """The README intro's count, between the ``papers:count`` markers."""
    return f"{implemented(pages)} of them implemented so far"


def _replace_between(text: str, start: str, end: str, new: str, what: str) -> str:
    i, j = text.find(start), text.find(end)
    if i < 0 or j < i:
        raise PaperPageError(f"README.md: {what}: markers {start} ... {end} not found")
    return text[:i + len(start)] + new + text[j:]


def render_readme(readme: str, pages: list[Page]) -> str:
    """``readme`` with its generated parts replaced. Without table markers, the first table under
    ``## Methods`` is replaced and the markers are put around it."""
    if TABLE_START not in readme:
        match = re.search(r"^## Methods\n\n((?:\|.*\n)+)", readme, flags=re.MULTILINE)
        if match is None:
            raise PaperPageError("README.md: methods table: no '## Methods' heading followed by a table")
        readme = readme[:match.start(1)] + f"{TABLE_START}\n{TABLE_END}\n" + readme[match.end(1):]
    readme = _replace_between(readme, TABLE_START, TABLE_END, "\n\n" + table(pages) + "\n\n", "methods table")
    return _replace_between(readme, COUNT_START, COUNT_END, count_text(pages), "count of implemented papers")


def generated_table(readme: str) -> str:
    """The part of ``readme`` between the table markers (what ``--write`` owns)."""
    i, j = readme.find(TABLE_START), readme.find(TABLE_END)
    if i < 0 or j < i:
        raise PaperPageError(f"README.md: methods table: markers {TABLE_START} ... {TABLE_END} not found")
    return readme[i + len(TABLE_START):j].strip("\n")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python main.py papers",
                                description="The README's methods table from the front matter of docs/papers/*.md.")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="rewrite the README's methods table and paper count")
    mode.add_argument("--check", action="store_true", help="exit 1 if the README differs from what --write makes")
    return p


def main(argv: list[str], repo: Path = REPO) -> int:
    """Entry point: ``argv`` without the ``papers`` command. Returns the exit code."""
    args = parser().parse_args(argv)
    try:
        pages = load_pages(repo)
        readme_path = repo / "README.md"
        if args.write or args.check:
            old = readme_path.read_text(encoding="utf-8")
            new = render_readme(old, pages)
            if args.check:
                if new != old:
                    print("README.md's methods table is not the generated one: run python main.py papers --write",
                          file=sys.stderr)
                    return 1
                print("README.md's methods table is up to date")
                return 0
            if new != old:
                readme_path.write_text(new, encoding="utf-8")
            print(f"README.md: methods table of {len(pages)} pages written "
                  f"({implemented(pages)} of {TOTAL_PAPERS} papers implemented)")
            return 0
        print(f"{implemented(pages)} of {TOTAL_PAPERS} papers implemented\n")
        print(table(pages))
        return 0
    except PaperlabError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
