"""The scaling-law fits of modules/components/scaling_laws.py (Chinchilla and the effective-data forms)
against known synthetic laws, eta_bar against a fine-grid mean of the marginal worth, and the fitters' errors.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from errors import ConfigError
from modules.components.scaling_laws import ChinchillaLaw, EffectivenessLaw, fit_chinchilla, fit_effectiveness

LAW = ChinchillaLaw(E=1.2, A=80.0, alpha=0.45, B=300.0, beta=0.35)
N_GRID = np.array([5e4, 2e5, 8e5])
U_GRID = np.array([6.4e4, 1.28e5, 2.56e5, 5.12e5, 1e6])


def _anchors() -> tuple[np.ndarray, np.ndarray]:
    n, d = np.meshgrid(N_GRID, U_GRID, indexing="ij")
    return n.ravel(), d.ravel()


def _repeat_grid() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n, u, ep = np.meshgrid(N_GRID, np.array([6.4e4, 2.56e5]), np.array([2.0, 4.0, 8.0]), indexing="ij")
    return n.ravel(), u.ravel(), (u * ep).ravel()


# --- the Chinchilla law ---------------------------------------------------------------------------------


def test_chinchilla_recovers_a_noise_free_law() -> None:
    n, d = _anchors()
    fit = fit_chinchilla(n, d, LAW.predict(n, d))
    for key, true in LAW.params.items():
        assert fit.params[key] == pytest.approx(true, rel=1e-4), key
    assert fit.rmse < 1e-8
    assert fit.seconds > 0


@pytest.mark.slow
def test_chinchilla_with_small_noise_predicts_within_the_noise() -> None:
    n, d = _anchors()
    rng = np.random.default_rng(0)
    noisy = LAW.predict(n, d) * np.exp(rng.normal(0.0, 0.003, n.shape))
    fit = fit_chinchilla(n, d, noisy)
    # five constants from 15 runs at 0.3 % noise: the constants trade off, the predictions do not
    n_test, d_test = np.meshgrid(N_GRID, np.geomspace(6.4e4, 1e6, 9), indexing="ij")
    rel = np.abs(fit.predict(n_test, d_test) / LAW.predict(n_test, d_test) - 1)
    assert rel.max() < 0.01
    assert fit.alpha == pytest.approx(LAW.alpha, abs=0.05)
    assert fit.rmse < 0.006


def test_effective_tokens_inverts_the_law() -> None:
    n = np.array([5e4, 2e5, 8e5])
    d = np.array([1e5, 3e5, 2e6])
    assert LAW.effective_tokens(LAW.predict(n, d), n) == pytest.approx(d, rel=1e-10)
    # at or below the model-bound floor E + A / N^alpha no amount of data reaches L
    floor = LAW.E + LAW.A * n**-LAW.alpha
    assert np.isnan(LAW.effective_tokens(floor, n)).all()
    assert np.isnan(LAW.effective_tokens(floor - 0.1, n)).all()


# --- the effective-data law -----------------------------------------------------------------------------


@pytest.mark.parametrize("r_star", [0.5, 3.0, 15.0])
@pytest.mark.parametrize("repeats", [0.5, 3.0, 7.0, 40.0])
def test_eta_bar_is_the_fine_grid_mean_of_the_marginal_worth(r_star: float, repeats: float) -> None:
    eff = EffectivenessLaw(LAW, "constant", c0=r_star)
    u = 1e5
    grid = np.linspace(0.0, repeats, 200_001)
    mids = 0.5 * (grid[1:] + grid[:-1])
    reference = np.exp(-mids / r_star).mean()  # midpoint rule over [0, R]
    assert eff.eta_bar(1e5, u, u * (1 + repeats)) == pytest.approx(reference, rel=1e-8)


def test_eta_bar_is_one_at_one_epoch_and_the_cd_r_star() -> None:
    eff = EffectivenessLaw(LAW, "cd", c0=5.0, a=0.3, b=0.4)
    assert eff.eta_bar(2e5, 1e5, 1e5) == 1.0
    assert np.isnan(eff.eta_bar(2e5, 1e5, 5e4))
    n, u = 8e5, 2.56e5
    assert eff.r_star(n, u) == pytest.approx(5.0 * n**-0.3 * (u / n) ** 0.4, rel=1e-12)
    # D_eff from its definition, U + U R* (1 - exp(-R/R*)), written out
    r, rs = 3.0, eff.r_star(n, u)
    assert eff.effective_tokens(n, u, 4 * u) == pytest.approx(u + u * rs * (1 - math.exp(-r / rs)), rel=1e-12)


@pytest.mark.parametrize("noise", [0.0, 0.002])
def test_cd_form_recovered_and_beats_the_constant_form(noise: float) -> None:
    n, u, d = _repeat_grid()
    true = EffectivenessLaw(LAW, "cd", c0=5.0, a=0.3, b=0.4)
    rng = np.random.default_rng(1)
    losses = true.predict(n, u, d) * np.exp(rng.normal(0.0, noise, n.shape))
    cd = fit_effectiveness(n, u, d, losses, LAW, form="cd")
    const = fit_effectiveness(n, u, d, losses, LAW, form="constant")
    if noise == 0:
        assert cd.params == pytest.approx({"c0": 5.0, "a": 0.3, "b": 0.4}, rel=1e-4)
        assert cd.rmse < 1e-8
    else:
        assert np.abs(cd.eta_bar(n, u, d) - true.eta_bar(n, u, d)).max() < 0.1
    assert cd.rmse < 0.5 * const.rmse


def test_constant_form_recovers_muennighoffs_r_star() -> None:
    n, u, d = _repeat_grid()
    true = EffectivenessLaw(LAW, "constant", c0=15.0)
    fit = fit_effectiveness(n, u, d, true.predict(n, u, d), LAW, form="constant")
    assert fit.params["R_star"] == pytest.approx(15.0, rel=1e-4)


# --- errors -----------------------------------------------------------------------------------------------


def test_fit_errors() -> None:
    n, d = _anchors()
    losses = LAW.predict(n, d)
    with pytest.raises(ConfigError, match="not finite"):
        fit_chinchilla(n, d, np.where(np.arange(len(n)) == 3, np.nan, losses))
    with pytest.raises(ConfigError, match="at least 5 runs"):
        fit_chinchilla(n[:4], d[:4], losses[:4])
    with pytest.raises(ConfigError, match="different lengths"):
        fit_chinchilla(n, d[:-1], losses)
    nr, u, dr = _repeat_grid()
    with pytest.raises(ConfigError, match="D >= U"):
        fit_effectiveness(nr, u, np.where(np.arange(len(u)) == 0, u / 2, dr), LAW.predict(nr, dr), LAW)
    with pytest.raises(ConfigError, match="at least 3 runs"):
        fit_effectiveness(nr[:2], u[:2], dr[:2], LAW.predict(nr[:2], dr[:2]), LAW, form="cd")
    with pytest.raises(ConfigError, match="not finite"):
        fit_effectiveness(nr, u, dr, np.full(len(u), np.inf), LAW)
    with pytest.raises(ConfigError, match="form"):
        fit_effectiveness(nr, u, dr, LAW.predict(nr, dr), LAW, form="linear")  # type: ignore[arg-type]
