"""A pytest plugin: at the end of every run, the time spent per test file and per method.

A method's share is its own test files (``tests/**/test_<method>*.py``) plus the CLI checks of its configs
(test cases whose id names one of its configs, ``<method>/<config>``, such as ``tests/test_cli.py``'s and the
diagnostic presets' ``full-<method>/<config>``): the budget is about 5 s of the default suite
per method on 2 cores (``docs/design.md``). Times are setup + call + teardown, as pytest measures them (under
pytest-xdist they are each worker's times, added up).
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# a config id, alone (``[craft/digits]``) or after a preset (``[full-causal_pieces/yinyang]``)
_CONFIG_ID = re.compile(r"[\[-]([a-z0-9_]+)/")


def _methods() -> list[str]:
    """Every method room under ``modules/`` (a file or a package), longest names first for prefix matching."""
    rooms = {p.stem for p in (REPO / "modules").glob("*.py")} | {
        p.parent.name for p in (REPO / "modules").glob("*/__init__.py")
    }
    return sorted(rooms - {"__init__", "base", "protocols", "components"}, key=len, reverse=True)


def method_of(nodeid: str, methods: list[str]) -> str | None:
    """The method a test belongs to: by its file name, else (a CLI config case) by its config folder."""
    file = nodeid.split("::", 1)[0]
    stem = Path(file).stem.removeprefix("test_")
    for m in methods:
        if stem == m or stem.startswith(f"{m}_"):
            return m
    match = _CONFIG_ID.search(nodeid)
    if match and match.group(1) in methods:
        return match.group(1)
    return None


class TimingReport:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid] += report.duration

    @pytest.hookimpl
    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.seconds:
            return
        methods = _methods()
        by_file: dict[str, float] = defaultdict(float)
        by_method: dict[str, float] = defaultdict(float)
        for nodeid, seconds in self.seconds.items():
            by_file[nodeid.split("::", 1)[0]] += seconds
            method = method_of(nodeid, methods)
            if method is not None:
                by_method[method] += seconds
        write = terminalreporter.write_line
        terminalreporter.section("time per test file (s)")
        for file, seconds in sorted(by_file.items(), key=lambda kv: -kv[1]):
            write(f"{seconds:8.1f}  {file}")
        terminalreporter.section("time per method (s): its tests + its config checks")
        for method in sorted(methods, key=lambda m: -by_method.get(m, 0.0)):
            write(f"{by_method.get(method, 0.0):8.1f}  {method}")
        write(f"{sum(self.seconds.values()):8.1f}  all tests")


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(TimingReport(), "paperlab-timing-report")
