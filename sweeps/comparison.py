"""What a comparison is made of: a run's value (``Row``), a group's statistics (``Group``), the whole result
(``Comparison``), and the order groups are listed in (``sort_key``).

Its own file so that ``compare`` (which builds these) and ``output`` (which prints and draws them) can both
import it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Row:
    run_id: str
    run_name: str
    keys: tuple[str, ...]
    value: float
    x: float | None = None
    metric: str = ""
    seed: str = ""


@dataclass
class Group:
    keys: tuple[str, ...]
    values: list[float]
    runs: list[str]
    best_run: str
    best_value: float
    mean: float
    std: float
    ci_low: float
    ci_high: float
    metric: str = ""
    ratio: tuple[float, float, float, int] | None = None  # paired ratio to the baseline: mean, lo, hi, pairs
    difference: tuple[float, float, float, int] | None = None  # paired difference to it: mean, lo, hi, pairs
    welch: tuple[float, float, float] | None = None  # Welch's t-test against it, unpaired: t, df, p

    @property
    def n(self) -> int:
        return len(self.values)


@dataclass
class Comparison:
    metric: str
    by: list[str]
    rows: list[Row]
    groups: list[Group]
    mode: str
    x: str | None = None
    spearman: tuple[float, float] | None = None
    files: dict[str, Path] = field(default_factory=dict)
    parent_id: str | None = None
    metrics: list[str] = field(default_factory=list)
    agg: str = "last"
    auto_by: list[str] = field(default_factory=list)
    excluded: dict[str, int] = field(default_factory=dict)
    baseline: str | None = None
    robustness: list[tuple[str, float, float, int]] = field(default_factory=list)
    x_unit: str = "runs"
    where: list[str] = field(default_factory=list)
    bootstrap: tuple[float, float, int, int] | None = None  # rho's 95% interval, resamples used, grid points
    divide_by: str | None = None


def sort_key(keys: tuple[str, ...]) -> tuple[tuple[int, float, str], ...]:
    """Numbers before words, and numbers by value (so that ``1e-3`` < ``0.01`` < ``0.1``)."""
    out = []
    for k in keys:
        try:
            out.append((0, float(k), ""))
        except ValueError:
            out.append((1, 0.0, k))
    return tuple(out)
