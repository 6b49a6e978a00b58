"""Scaling laws of loss in parameters N and training tokens D, fitted with a Huber loss on log residuals.

- Chinchilla (Hoffmann et al. 2022): ``L(N, D) = E + A / N^alpha + B / D^beta`` (``fit_chinchilla``), and its
  inverse in D, the effective tokens ``D_eff(L, N) = (B / (L - E - A / N^alpha))^(1 / beta)``.
- Data-constrained (Muennighoff et al. 2023): U unique tokens seen ``D / U`` times, ``R = D / U - 1`` repeats;
  ``D_eff = U + U R* (1 - exp(-R / R*))``, i.e. a derived token's worth decays as ``exp(-r / R*)`` after
  ``r`` repeats, and ``L = E + A / N^alpha + B / D_eff^beta`` with the Chinchilla constants fixed
  (``fit_effectiveness``). ``form="constant"``: one R* for all runs (Muennighoff's); ``form="cd"``: the
  CD-scaling reading (paper 000-12) ``R* = c0 N^(-a) (U / N)^b``.

The fitter is the Chinchilla refit's: log L-hat written as a log-sum-exp of its terms, the Huber loss (delta
1e-3) of ``log L-hat - log L`` summed over runs, L-BFGS from every point of a small grid of initial
values, the lowest objective kept. Gradients are analytic, so a fit takes milliseconds (``.seconds``).
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.optimize import minimize

from errors import ConfigError

Array = NDArray[np.float64]
EffectivenessForm = Literal["cd", "constant"]

HUBER_DELTA = 1e-3
CHINCHILLA_NAMES = ("E", "A", "alpha", "B", "beta")
# log E, log A, alpha, log B, beta: Chinchilla's refit grid thinned to 8 starts (each L-BFGS run costs
# ~0.1 s here; the recovery tests show these reach the global minimum on char-level loss scales)
CHINCHILLA_GRID = ((-1.0, 0.5), (2.0, 8.0), (0.3,), (2.0, 8.0), (0.3,))
# log c0 (log R* for "constant"), a, b
EFFECTIVENESS_GRID: dict[str, tuple[tuple[float, ...], ...]] = {
    "constant": ((-1.0, 1.0, 3.0, 5.0),),
    "cd": ((-1.0, 2.0, 5.0), (0.0,), (-0.5, 0.5)),
}


def huber(r: Array, delta: float = HUBER_DELTA) -> tuple[Array, Array]:
    """The Huber loss of each residual and its derivative."""
    a = np.abs(r)
    quad = a <= delta
    value = np.where(quad, 0.5 * r**2, delta * (a - 0.5 * delta))
    grad = np.where(quad, r, delta * np.sign(r))
    return value, grad


def _as_arrays(name: str, *arrays: ArrayLike) -> list[Array]:
    out = [np.asarray(a, dtype=np.float64).reshape(-1) for a in arrays]
    n = len(out[0])
    if any(len(a) != n for a in out):
        raise ConfigError(f"{name}: the arrays have different lengths {[len(a) for a in out]}; pass one value per run")
    return out


def _check_runs(name: str, n_params: int, losses: Array, **positive: Array) -> None:
    if not np.all(np.isfinite(losses)):
        bad = np.flatnonzero(~np.isfinite(losses)).tolist()
        raise ConfigError(f"{name}: losses of runs {bad} are not finite; drop the diverged runs before fitting")
    if np.any(losses <= 0):
        raise ConfigError(f"{name}: losses must be > 0 (the fit is on log L); pass cross-entropy losses")
    for key, values in positive.items():
        if not np.all(np.isfinite(values)) or np.any(values <= 0):
            raise ConfigError(f"{name}: {key} must be finite and > 0 for every run")
    if len(losses) < n_params:
        raise ConfigError(
            f"{name}: {len(losses)} runs cannot determine {n_params} parameters; fit at least {n_params} runs"
        )


def _fit_grid(
    objective: Callable[[Array], tuple[float, Array]], grid: Sequence[Sequence[float]]
) -> tuple[Array, float]:
    """The lowest Huber objective over L-BFGS runs from every grid point."""
    best_x, best_f = np.asarray([g[0] for g in grid], dtype=np.float64), math.inf
    for start in itertools.product(*grid):
        res = minimize(
            objective,
            np.asarray(start, dtype=np.float64),
            jac=True,
            method="L-BFGS-B",
            options={"maxiter": 2000, "ftol": 1e-15, "gtol": 1e-12},
        )
        if np.isfinite(res.fun) and res.fun < best_f:
            best_x, best_f = res.x, float(res.fun)
    return best_x, best_f


@dataclass(frozen=True)
class ChinchillaLaw:
    """``L = E + A / N^alpha + B / D^beta`` (a fit's result, or a law written down)."""

    E: float
    A: float
    alpha: float
    B: float
    beta: float
    rmse: float = math.nan  # RMS of log L-hat - log L over the fitted runs
    seconds: float = 0.0  # the fit's wall time

    @property
    def params(self) -> dict[str, float]:
        return {k: getattr(self, k) for k in CHINCHILLA_NAMES}

    def model_term(self, N: ArrayLike) -> Array:
        """``E + A / N^alpha``: the loss with infinite data."""
        return self.E + self.A * np.asarray(N, dtype=np.float64) ** -self.alpha

    def predict(self, N: ArrayLike, D: ArrayLike) -> Array:
        return self.model_term(N) + self.B * np.asarray(D, dtype=np.float64) ** -self.beta

    def effective_tokens(self, L: ArrayLike, N: ArrayLike) -> Array:
        """The fresh tokens D at which the law reaches loss L at size N; NaN where L is at or below the
        model-bound floor ``E + A / N^alpha``."""
        gap = np.asarray(L, dtype=np.float64) - self.model_term(N)
        with np.errstate(divide="ignore", invalid="ignore"):
            out = (self.B / gap) ** (1.0 / self.beta)
        return np.where(gap > 0, out, np.nan)


def fit_chinchilla(N: ArrayLike, D: ArrayLike, L: ArrayLike, delta: float = HUBER_DELTA) -> ChinchillaLaw:
    """Fit ``L = E + A / N^alpha + B / D^beta`` to runs (arrays ``(n,)``); needs n >= 5 finite losses."""
    n_arr, d_arr, l_arr = _as_arrays("fit_chinchilla", N, D, L)
    _check_runs("fit_chinchilla", 5, l_arr, N=n_arr, D=d_arr)
    log_n, log_d, log_l = np.log(n_arr), np.log(d_arr), np.log(l_arr)

    def objective(x: Array) -> tuple[float, Array]:
        e, a, alpha, b, beta = x
        terms = np.stack([np.full_like(log_n, e), a - alpha * log_n, b - beta * log_d])  # (3, n)
        top = terms.max(0)
        w = np.exp(terms - top)
        total = w.sum(0)
        pred = top + np.log(total)
        w /= total
        value, g = huber(pred - log_l, delta)
        grad = np.array(
            [(g * w[0]).sum(), (g * w[1]).sum(), -(g * w[1] * log_n).sum(), (g * w[2]).sum(), -(g * w[2] * log_d).sum()]
        )
        return float(value.sum()), grad

    start = time.perf_counter()
    x, _ = _fit_grid(objective, CHINCHILLA_GRID)
    e, a, alpha, b, beta = (float(v) for v in x)
    law = ChinchillaLaw(math.exp(e), math.exp(a), alpha, math.exp(b), beta)
    rmse = float(np.sqrt(np.mean((np.log(law.predict(n_arr, d_arr)) - log_l) ** 2)))
    return ChinchillaLaw(**law.params, rmse=rmse, seconds=time.perf_counter() - start)


def repeats(U: ArrayLike, D: ArrayLike) -> Array:
    """``R = D / U - 1``: how many times the U unique tokens were seen again."""
    return np.asarray(D, dtype=np.float64) / np.asarray(U, dtype=np.float64) - 1.0


def _effective_from_rstar(U: Array, R: Array, r_star: Array) -> Array:
    # U R* (1 - exp(-R/R*)) with expm1 so that a large R* (eta -> 1) keeps its precision
    return U - U * r_star * np.expm1(-R / r_star)


@dataclass(frozen=True)
class EffectivenessLaw:
    """Effective data ``D_eff = U + U R* (1 - exp(-R / R*))`` inside a fixed Chinchilla law.

    ``form="constant"``: ``R* = c0``; ``form="cd"``: ``R* = c0 N^(-a) (U / N)^b``.
    """

    law: ChinchillaLaw
    form: EffectivenessForm
    c0: float
    a: float = 0.0
    b: float = 0.0
    rmse: float = math.nan
    seconds: float = 0.0

    @property
    def params(self) -> dict[str, float]:
        if self.form == "constant":
            return {"R_star": self.c0}
        return {"c0": self.c0, "a": self.a, "b": self.b}

    def r_star(self, N: ArrayLike, U: ArrayLike) -> Array:
        n_arr, u_arr = np.asarray(N, dtype=np.float64), np.asarray(U, dtype=np.float64)
        return self.c0 * n_arr**-self.a * (u_arr / n_arr) ** self.b

    def effective_tokens(self, N: ArrayLike, U: ArrayLike, D: ArrayLike) -> Array:
        u_arr = np.asarray(U, dtype=np.float64)
        return _effective_from_rstar(u_arr, repeats(u_arr, D), self.r_star(N, u_arr))

    def predict(self, N: ArrayLike, U: ArrayLike, D: ArrayLike) -> Array:
        return self.law.predict(N, self.effective_tokens(N, U, D))

    def eta_bar(self, N: ArrayLike, U: ArrayLike, D: ArrayLike) -> Array:
        """Mean worth of a derived token, ``(D_eff - U) / (D - U)``; 1 at one epoch (the limit R -> 0), NaN
        where D < U."""
        u_arr, d_arr = np.asarray(U, dtype=np.float64), np.asarray(D, dtype=np.float64)
        derived = d_arr - u_arr
        with np.errstate(divide="ignore", invalid="ignore"):
            out = (self.effective_tokens(N, u_arr, d_arr) - u_arr) / derived
        return np.where(derived > 0, out, np.where(derived == 0, 1.0, np.nan))


def fit_effectiveness(
    N: ArrayLike,
    U: ArrayLike,
    D: ArrayLike,
    L: ArrayLike,
    law: ChinchillaLaw,
    form: EffectivenessForm = "cd",
    delta: float = HUBER_DELTA,
) -> EffectivenessLaw:
    """Fit R* (``constant``) or ``c0, a, b`` (``cd``) of the effective-data law to runs (arrays ``(n,)``) with
    ``law``'s constants fixed; D >= U for every run."""
    if form not in EFFECTIVENESS_GRID:
        raise ConfigError(f"fit_effectiveness: form={form!r}; use 'cd' or 'constant'")
    n_arr, u_arr, d_arr, l_arr = _as_arrays("fit_effectiveness", N, U, D, L)
    n_params = len(EFFECTIVENESS_GRID[form])
    _check_runs("fit_effectiveness", n_params, l_arr, N=n_arr, U=u_arr, D=d_arr)
    if np.any(d_arr < u_arr):
        bad = np.flatnonzero(d_arr < u_arr).tolist()
        raise ConfigError(
            f"fit_effectiveness: runs {bad} saw fewer tokens D than unique tokens U; D >= U (epochs >= 1)"
        )
    R, log_n, log_un, log_l = repeats(u_arr, d_arr), np.log(n_arr), np.log(u_arr / n_arr), np.log(l_arr)
    floor = law.model_term(n_arr)

    def objective(x: Array) -> tuple[float, Array]:
        if form == "constant":
            log_rs, dlog = np.full_like(R, x[0]), [np.ones_like(R)]
        else:
            log_rs, dlog = x[0] - x[1] * log_n + x[2] * log_un, [np.ones_like(R), -log_n, log_un]
        log_rs = np.clip(log_rs, -30.0, 30.0)
        rs = np.exp(log_rs)
        q = R / rs
        e = np.exp(-q)
        d_eff = u_arr + u_arr * rs * (1.0 - e)
        pred = floor + law.B * d_eff**-law.beta
        # d D_eff / d log R* = U R* (1 - e^-q - q e^-q)
        dd = u_arr * rs * (1.0 - e - q * e)
        dlogpred_dlogrs = -law.beta * law.B * d_eff ** (-law.beta - 1.0) * dd / pred
        value, g = huber(np.log(pred) - log_l, delta)
        grad = np.array([(g * dlogpred_dlogrs * d).sum() for d in dlog])
        return float(value.sum()), grad

    start = time.perf_counter()
    x, _ = _fit_grid(objective, EFFECTIVENESS_GRID[form])
    coef = [float(v) for v in x]
    fit = EffectivenessLaw(law, form, math.exp(coef[0]), *coef[1:])
    rmse = float(np.sqrt(np.mean((np.log(fit.predict(n_arr, u_arr, d_arr)) - log_l) ** 2)))
    return EffectivenessLaw(law, form, fit.c0, fit.a, fit.b, rmse=rmse, seconds=time.perf_counter() - start)
