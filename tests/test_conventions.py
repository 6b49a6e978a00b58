"""Conventions of the test suite itself, checked by parsing the test files (ast), not by running them.

A strict xfail records a claim that does not hold: it fails the day the claim starts to hold, so that the page
and the README row must change. Without ``raises=AssertionError`` a crash (an ImportError after a refactor, a
ConfigError from a renamed argument, a sweep that no longer runs) also counts as the expected failure, and the
claim test keeps "passing" while it checks nothing. So every strict xfail names ``raises=AssertionError``: a
refuted claim is an AssertionError, anything else is a failure.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.helpers import REPO


def _is_xfail_mark(node: ast.expr) -> bool:
    """``pytest.mark.xfail`` or ``mark.xfail`` (the mark object, called or not)."""
    return (isinstance(node, ast.Attribute) and node.attr == "xfail" and
            ((isinstance(node.value, ast.Attribute) and node.value.attr == "mark") or
             (isinstance(node.value, ast.Name) and node.value.id == "mark")))


def _raises_assertion_error(call: ast.Call) -> bool:
    raises = next((k.value for k in call.keywords if k.arg == "raises"), None)
    return isinstance(raises, ast.Name) and raises.id == "AssertionError"


def strict_xfails_without_assertion_raises(source: str, strict_by_default: bool = False) -> list[int]:
    """Lines of the strict xfail marks in ``source`` that do not name ``raises=AssertionError``.

    A mark is strict when it says ``strict=True``, or, with ``strict_by_default`` (pytest's ``xfail_strict``
    ini option), unless it says ``strict=False``. A mark written without a call (``@pytest.mark.xfail``) has no
    arguments, so it is strict only by default and never names ``raises``.
    """
    tree = ast.parse(source)
    bad = []
    called = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _is_xfail_mark(node.func):
            called.add(id(node.func))
            strict = next((k.value for k in node.keywords if k.arg == "strict"), None)
            is_strict = (isinstance(strict, ast.Constant) and strict.value is True) or (
                strict is None and strict_by_default)
            if strict is not None and not isinstance(strict, ast.Constant):
                is_strict = True  # strict=<expression>: cannot tell, so it must name raises as well
            if is_strict and not _raises_assertion_error(node):
                bad.append(node.lineno)
    if strict_by_default:
        for node in ast.walk(tree):
            if _is_xfail_mark(node) and id(node) not in called:
                bad.append(node.lineno)
    return sorted(bad)


def test_the_check_finds_strict_xfails_without_raises_assertion_error() -> None:
    """The parser on made-up test files: every way of writing a strict xfail mark is seen."""
    src = '''
import pytest
from pytest import mark

@pytest.mark.xfail(strict=True, raises=AssertionError, reason="ok")
def test_a(): ...

@pytest.mark.xfail(strict=True, reason="a crash would pass as expected")
def test_b(): ...

@pytest.mark.parametrize("x", [1, pytest.param(2, marks=pytest.mark.xfail(strict=True, raises=ValueError))])
def test_c(x): ...

pytestmark = mark.xfail(strict=True)

@pytest.mark.xfail(reason="not strict: an unexpected pass is only reported")
def test_d(): ...

@pytest.mark.xfail
def test_e(): ...
'''
    assert strict_xfails_without_assertion_raises(src) == [8, 11, 14]
    # with xfail_strict = true in the ini, the marks without strict= are strict too (test_d, bare test_e)
    assert strict_xfails_without_assertion_raises(src, strict_by_default=True) == [8, 11, 14, 16, 19]
    assert strict_xfails_without_assertion_raises("import pytest\n@pytest.mark.xfail(strict=False)\ndef t(): ...",
                                                  strict_by_default=True) == []


def test_every_strict_xfail_names_raises_assertion_error(pytestconfig: pytest.Config) -> None:
    by_default = bool(pytestconfig.getini("xfail_strict"))  # the ini option as this session reads it
    offenders = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        for line in strict_xfails_without_assertion_raises(path.read_text(), by_default):
            offenders.append(f"{Path(path).relative_to(REPO)}:{line}")
    assert not offenders, ("a strict xfail without raises=AssertionError counts a crash as the expected failure; "
                           "add raises=AssertionError at " + ", ".join(offenders))
