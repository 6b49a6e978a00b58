"""The statistics of a comparison, on plain numbers: a group's mean, standard deviation and Student-t
interval (``summarize``), a paired ratio and a paired difference to a baseline (``paired_ratio``,
``paired_difference``), Welch's unpaired t-test against it (``welch``), Spearman's rho with an exact
p-value on few points (``spearman``), and a cluster bootstrap interval of rho (``bootstrap_spearman``).

numpy, scipy and the standard library only: no MLflow, no torch, no runs or groups, so that each number
can be checked on its own. ``compare`` uses them, and so does a method's own analysis (``cd_scaling``'s
per-cell intervals over seeds). numpy and scipy are imported inside the functions, as before the split, so that
``main.py compare --help`` does not pay for them.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping, Sequence

EXACT_P_MAX_N = 8  # up to 8! = 40320 permutations: exact p-values are cheap


def summarize(values: list[float]) -> tuple[float, float, float, float]:
    """Mean, sample std and the 95% Student-t interval of the mean (std and interval are NaN for n = 1)."""
    from scipy import stats

    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, math.nan, math.nan, math.nan
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = float(stats.t.ppf(0.975, n - 1)) * std / math.sqrt(n)
    return mean, std, mean - half, mean + half


def mean_point(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """The mean of each coordinate: the seeds of one grid point as one point."""
    return sum(x for x, _ in points) / len(points), sum(y for _, y in points) / len(points)


def paired_ratio(
    values: Iterable[tuple[Hashable, float]], reference: Mapping[Hashable, float]
) -> tuple[float, float, float, int] | None:
    """Mean and 95% interval (``summarize``) of ``value / reference[key]`` over the ``(key, value)`` pairs
    whose key (the seed) has a nonzero reference, and the number of such pairs; None without any."""
    ratios = [v / reference[k] for k, v in values if k in reference and reference[k] != 0]
    if not ratios:
        return None
    mean, _, lo, hi = summarize(ratios)
    return mean, lo, hi, len(ratios)


def paired_difference(
    values: Iterable[tuple[Hashable, float]], reference: Mapping[Hashable, float]
) -> tuple[float, float, float, int] | None:
    """Mean and 95% Student-t interval (``summarize``) of ``value - reference[key]`` over the ``(key, value)``
    pairs whose key (the seed) the reference has, and the number of such pairs; None without any.

    The interval is over pairs, t(0.975, pairs - 1) times the std of the differences over sqrt(pairs): what the
    two arms share seed by seed (the data draw, the initialisation) cancels, which two unpaired intervals
    cannot show. One pair has a mean and no interval (NaN)."""
    diffs = [v - reference[k] for k, v in values if k in reference]
    if not diffs:
        return None
    mean, _, lo, hi = summarize(diffs)
    return mean, lo, hi, len(diffs)


def welch(a: Sequence[float], b: Sequence[float]) -> tuple[float, float, float] | None:
    """Welch's t-test of mean(a) - mean(b) without assuming equal variances: t, the Welch-Satterthwaite degrees
    of freedom and the two-sided p-value. None when a side has fewer than 2 values or neither side varies (t
    undefined)."""
    from scipy import stats

    if len(a) < 2 or len(b) < 2:
        return None
    _, sd_a, _, _ = summarize(list(a))
    _, sd_b, _, _ = summarize(list(b))
    va, vb = sd_a**2 / len(a), sd_b**2 / len(b)  # squared standard errors of the two means
    if va + vb == 0:
        return None
    t = (sum(a) / len(a) - sum(b) / len(b)) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    return t, df, float(2 * stats.t.sf(abs(t), df))


def spearman(pairs: list[tuple[float, float]]) -> tuple[float, float] | None:
    """Spearman's rho and its two-sided p-value: exact (all permutations) for n <= EXACT_P_MAX_N, where
    scipy's t approximation is wrong (it gives p = 0 for rho = 1 on 3 points; the exact value is 1/3)."""
    from scipy import stats

    if len(pairs) < 3 or len({a for a, _ in pairs}) < 2 or len({b for _, b in pairs}) < 2:
        return None
    xs, ys = [a for a, _ in pairs], [b for _, b in pairs]
    rho, p = stats.spearmanr(xs, ys)
    if len(pairs) <= EXACT_P_MAX_N:
        p = _exact_spearman_p(xs, ys, float(rho))
    return float(rho), float(p)


def _exact_spearman_p(xs: list[float], ys: list[float], rho: float) -> float:
    """P(|rho| >= |observed|) over every permutation of the y ranks (ties keep their average ranks)."""
    import itertools

    import numpy as np
    from scipy import stats

    rx = stats.rankdata(xs) - (len(xs) + 1) / 2
    ry = stats.rankdata(ys) - (len(ys) + 1) / 2
    perms = np.array(list(itertools.permutations(ry)))
    rhos = perms @ rx / math.sqrt(float(rx @ rx) * float(ry @ ry))
    return float(np.mean(np.abs(rhos) >= abs(rho) - 1e-12))


def bootstrap_spearman(
    clusters: Sequence[Sequence[tuple[float, float]]], resamples: int, seed: int = 0
) -> tuple[float, float, int, int] | None:
    """Percentile 95% interval of Spearman's rho over ``resamples`` resamples of the clusters with replacement
    (numpy ``default_rng(seed)``), the resamples used and the number of clusters; a resampled cluster brings
    all its points, so points of one cluster never count as independent. Resamples whose rho is undefined
    (a constant side) are skipped; None if all are."""
    import numpy as np
    from scipy import stats

    rng = np.random.default_rng(seed)
    rhos = []
    for _ in range(resamples):
        sample = [p for i in rng.integers(0, len(clusters), len(clusters)) for p in clusters[i]]
        xs, ys = zip(*sample)
        if len(set(xs)) > 1 and len(set(ys)) > 1:
            rhos.append(float(stats.spearmanr(xs, ys)[0]))
    if not rhos:
        return None
    lo, hi = np.percentile(rhos, [2.5, 97.5])
    return float(lo), float(hi), len(rhos), len(clusters)
