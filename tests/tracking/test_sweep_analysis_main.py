"""The shared command line of a method's analysis over a sweep: defaults, the printed line, one-line errors."""

from __future__ import annotations

import pytest

from errors import ConfigError
from tracking.analysis_run import sweep_analysis_main


def _main(argv: list[str], calls: list[tuple[str, str]]) -> int:
    def run(sweep: str, metric: str) -> dict[str, float]:
        calls.append((sweep, metric))
        if sweep == "missing":
            raise ConfigError("no sweep 'missing': run it first")
        return {"value": 1.5}

    return sweep_analysis_main(argv, "python -m modules.x", "slope", "a slope", ("scaling", "test/q"), run,
                               lambda r, sweep, metric: f"{metric} over {sweep}: {r['value']}")


def test_defaults_and_the_printed_line(capsys: pytest.CaptureFixture) -> None:
    calls: list[tuple[str, str]] = []
    assert _main(["slope"], calls) == 0 and calls == [("scaling", "test/q")]
    assert capsys.readouterr().out == "test/q over scaling: 1.5\n"
    assert _main(["slope", "--sweep", "s2", "--metric", "val/m"], calls) == 0 and calls[-1] == ("s2", "val/m")


def test_a_config_error_is_one_line_and_exit_code_2(capsys: pytest.CaptureFixture) -> None:
    assert _main(["slope", "--sweep", "missing"], []) == 2
    assert capsys.readouterr().err == "error: no sweep 'missing': run it first\n"
    with pytest.raises(SystemExit):
        _main(["other"], [])
