"""DIAGNO (paper 002-12): the diagonal spectral mix against a naive loop, the longitude-roll probe, the data's
physics against closed forms and an RK4 reference, the scores against Parseval, bad input."""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from callbacks.spectral_energy import SpectralEnergy, band_ratios, energy_per_degree_and_diagonal
from datamodules import sphere_pde
from datamodules.sphere_pde import SpherePDEDataModule, departure_points, simulate, step_operator, windows
from errors import ConfigError
from modules.components.metrics import count_parameters
from modules.components.spherical import grid, isht, sht
from modules.diagno import DIAGNO, SFNO, SphereForecastTask, diagonal_mix, matched_sfno_width, weighted_scores
from modules.protocols import SphericalSpectrum

REPO = Path(__file__).resolve().parents[2]


def naive_mix(a: torch.Tensor, w_sfno: torch.Tensor | None, w_intra: torch.Tensor | None,
              w_inter: torch.Tensor | None) -> torch.Tensor:
    """The issue's formula, one output coefficient at a time."""
    batch, c_in, size, _ = a.shape
    c_out = next(w for w in (w_sfno, w_intra, w_inter) if w is not None).shape[0]
    out = torch.zeros(batch, c_out, size, size, dtype=torch.complex128)
    ki = None if w_intra is None else (w_intra.shape[-1] - 1) // 2
    ke = None if w_inter is None else (w_inter.shape[-1] - 1) // 2
    for o in range(c_out):
        for ell in range(size):
            for m in range(ell + 1):
                for c in range(c_in):
                    if w_sfno is not None:
                        out[:, o, ell, m] += w_sfno[o, c, ell] * a[:, c, ell, m]
                    if ki is not None:
                        for j in range(-ki, ki + 1):
                            if 0 <= m + j <= ell + j < size:
                                out[:, o, ell, m] += w_intra[o, c, ell - m, j + ki] * a[:, c, ell + j, m + j]
                    if ke is not None:
                        for j in range(-ke, ke + 1):
                            if m <= ell + j < size:
                                out[:, o, ell, m] += w_inter[o, c, m, j + ke] * a[:, c, ell + j, m]
    return out


def crandn(*shape: int, gen: torch.Generator) -> torch.Tensor:
    return torch.complex(torch.randn(*shape, generator=gen, dtype=torch.float64),
                         torch.randn(*shape, generator=gen, dtype=torch.float64))


@pytest.mark.parametrize("terms", ["all", "sfno", "intra", "inter", "intra+inter"])
def test_diagonal_mix_matches_the_naive_loop(terms: str) -> None:
    gen = torch.Generator().manual_seed(len(terms))
    size, c_in, c_out = 6, 3, 2
    a = crandn(2, c_in, size, size, gen=gen).tril()  # garbage above the diagonal must be ignored: add some
    a_dirty = a + torch.triu(crandn(2, c_in, size, size, gen=gen), diagonal=1)
    w_sfno = crandn(c_out, c_in, size, gen=gen) if terms in ("all", "sfno") else None
    w_intra = crandn(c_out, c_in, size, 5, gen=gen) if "intra" in terms or terms == "all" else None
    w_inter = crandn(c_out, c_in, size, 3, gen=gen) if "inter" in terms or terms == "all" else None
    got = diagonal_mix(a_dirty, w_sfno, w_intra, w_inter)
    assert torch.allclose(got, naive_mix(a, w_sfno, w_intra, w_inter), atol=1e-12)
    assert got.triu(diagonal=1).abs().max() == 0


def test_diagonal_mix_takes_real_weights_and_float32() -> None:
    gen = torch.Generator().manual_seed(3)
    a = crandn(1, 2, 5, 5, gen=gen).tril()
    w = torch.randn(2, 2, 5, 3, generator=gen, dtype=torch.float64)
    ref = naive_mix(a, None, w.to(torch.complex128), None)
    assert torch.allclose(diagonal_mix(a, None, w), ref, atol=1e-12)
    out32 = diagonal_mix(a.to(torch.complex64), None, w.float())
    assert out32.dtype == torch.complex64 and torch.allclose(out32.to(torch.complex128), ref, atol=1e-4)


def trained(net: torch.nn.Module) -> torch.nn.Module:
    """``net`` with a random projection (it starts at zero, i.e. as persistence), as a trained net would have."""
    torch.nn.init.normal_(net.proj.weight)
    return net


def roll_error(net: torch.nn.Module, shift: int = 5) -> float:
    x = torch.randn(2, 1, 16, 32, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    with torch.no_grad():
        out = net(x)
        rolled = net(torch.roll(x, shift, dims=-1))
    return float((rolled - torch.roll(out, shift, dims=-1)).norm() / out.norm())


def test_longitude_roll_commutes_with_sfno_not_with_diagno() -> None:
    torch.manual_seed(0)
    shape = (1, 16, 32)
    assert roll_error(trained(SFNO(shape, 1, width=4, n_layers=2, lmax=8)).double()) < 1e-6
    assert roll_error(trained(DIAGNO(shape, 1, width=4, n_layers=2, lmax=8)).double()) > 1e-3
    # the break comes from the intra-diagonal shifts m -> m + j: with k_intra = 0 (one weight per diagonal) and
    # any inter-diagonal kernel (fixed m) the operator still commutes with rolls
    assert roll_error(trained(DIAGNO(shape, 1, width=4, n_layers=2, lmax=8, k_intra=0, k_inter=2)).double()) < 1e-6


def test_roll_commutator_of_the_task_and_parameter_matching() -> None:
    torch.manual_seed(0)
    diagno = trained(DIAGNO((1, 16, 32), 1, width=6, n_layers=2, lmax=8))
    width = matched_sfno_width(diagno)
    sfno = trained(SFNO((1, 16, 32), 1, width=width, n_layers=2, lmax=8))
    assert abs(count_parameters(sfno) / count_parameters(diagno) - 1) < 0.05
    assert count_parameters(SFNO((1, 16, 32), 1, width=width - 1, n_layers=2, lmax=8)) < count_parameters(diagno)
    x = torch.randn(3, 1, 16, 32)
    task = SphereForecastTask(lambda s, o: sfno, input_shape=(1, 16, 32))
    assert float(task.roll_commutator(x)) < 1e-10
    task = SphereForecastTask(lambda s, o: diagno, input_shape=(1, 16, 32))
    assert float(task.roll_commutator(x)) > 1e-3


def test_the_claim_sweep_arms_are_matched_within_5_percent() -> None:
    sweep = yaml.safe_load((REPO / "configs/diagno/claim_sweep.yaml").read_text())
    nets = sweep["grid"]["model.init_args.net"]
    counts = {}
    for spec in nets:
        cls = {"modules.diagno.DIAGNO": DIAGNO, "modules.diagno.SFNO": SFNO}[spec["class_path"]]
        counts[cls.__name__] = count_parameters(cls((1, 32, 64), 1, **spec["init_args"]))
    assert set(counts) == {"DIAGNO", "SFNO"}
    assert abs(counts["SFNO"] / counts["DIAGNO"] - 1) < 0.05, counts


def test_scores_match_parseval() -> None:
    """Relative L2 and ACC from the latitude weights against the same integrals in spectral space."""
    gen = torch.Generator().manual_seed(1)
    a, b = crandn(2, 1, 8, 8, gen=gen).tril(), crandn(2, 1, 8, 8, gen=gen).tril()
    a[..., 0], b[..., 0] = a[..., 0].real.to(a.dtype), b[..., 0].real.to(b.dtype)
    p, t = isht(a, 8, 16), isht(b, 8, 16)
    _, _, w = grid(8, 16)
    rel, acc = weighted_scores(p, t, w[:, 0] / w[:, 0].mean())
    fold = torch.ones(8, dtype=torch.float64)
    fold[1:] = 2.0

    def inner(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:  # int u v = sum_lm fold_m Re(u_lm conj v_lm)
        return ((u * v.conj()).real * fold).sum(dim=(-3, -2, -1))

    assert torch.allclose(rel, (inner(a - b, a - b) / inner(b, b)).sqrt(), rtol=1e-10)
    assert torch.allclose(acc, inner(a, b) / (inner(a, a) * inner(b, b)).sqrt(), rtol=1e-10)
    e_l, e_d = energy_per_degree_and_diagonal(b)
    assert torch.allclose(e_l.sum(), (t.square() * w).sum(), rtol=1e-10)
    assert torch.allclose(e_d.sum(), e_l.sum(), rtol=1e-12)
    # one harmonic (l, m) = (5, 2): all of its energy at l = 5 and d = 3
    one = torch.zeros(1, 1, 8, 8, dtype=torch.complex128)
    one[..., 5, 2] = 1.0
    e_l, e_d = energy_per_degree_and_diagonal(one)
    assert e_l.nonzero().flatten().tolist() == [5] and e_d.nonzero().flatten().tolist() == [3]
    e_l, _ = energy_per_degree_and_diagonal(b)
    assert band_ratios(e_l, e_l) == {"low": 1.0, "mid": 1.0, "high": 1.0}
    assert band_ratios(0.5 * e_l, e_l) == {"low": 0.5, "mid": 0.5, "high": 0.5}


def test_control_step_is_diffusion_times_a_rotation() -> None:
    """Solid-body rotation and uniform diffusion: each (l, m) keeps its modulus times the implicit-Euler factor
    ``(1 + tau kappa l (l + 1))^-n_sub`` and turns by ``-m alpha``, one angle alpha ~ Omega dt for all."""
    nlat, nlon = 8, 16
    step = step_operator("control", nlat, nlon)
    ell, m, part = sphere_pde._degrees(nlat)
    c = np.eye(len(ell))
    out = c @ step.T
    tau = sphere_pde.DT / 4
    alphas = []
    for i in np.flatnonzero(part == 0):
        decay = (1.0 + tau * sphere_pde.KAPPA * ell[i] * (ell[i] + 1)) ** -4
        if m[i] == 0:
            assert np.allclose(out[i], decay * c[i], atol=1e-12)
            continue
        j = np.flatnonzero((ell == ell[i]) & (m == m[i]) & (part == 1))[0]
        cos_sin = out[i][[i, j]] / decay  # the cos coefficient turns into (cos m alpha, sin m alpha)
        assert np.isclose(np.hypot(*cos_sin), 1.0, atol=1e-10)
        assert np.allclose(np.delete(out[i], [i, j]), 0.0, atol=1e-10)
        alphas.append(np.arctan2(cos_sin[1], cos_sin[0]) / m[i])
    assert np.ptp(alphas) < 1e-10 and abs(abs(alphas[0]) - sphere_pde.SOLID_BODY * sphere_pde.DT) < 1e-3


def rk4_departure(p: np.ndarray, tau: float, scenario: str, n: int = 50) -> np.ndarray:
    """Integrate dp/dt = -v(p) for ``tau`` with classical RK4 (``n`` steps), renormalised."""
    h = tau / n
    for _ in range(n):
        k1 = -sphere_pde.wind(p, scenario)
        k2 = -sphere_pde.wind(p + h / 2 * k1, scenario)
        k3 = -sphere_pde.wind(p + h / 2 * k2, scenario)
        k4 = -sphere_pde.wind(p + h * k3, scenario)
        p = p + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
        p = p / np.linalg.norm(p, axis=-1, keepdims=True)
    return p


def test_departure_points_match_rk4_and_the_wind_is_tangent() -> None:
    rng = np.random.default_rng(0)
    p = rng.standard_normal((200, 3))
    p /= np.linalg.norm(p, axis=-1, keepdims=True)
    assert np.abs((sphere_pde.wind(p, "hetero") * p).sum(-1)).max() < 1e-12
    for scenario in ("hetero", "control"):
        err = np.linalg.norm(departure_points(p, 0.25, scenario) - rk4_departure(p, 0.25, scenario), axis=-1)
        assert err.max() < 2e-4, (scenario, err.max())


def test_hetero_breaks_roll_symmetry_control_keeps_it() -> None:
    """A roll of one cell (phi -> phi + 2 pi / nlon) commutes with the control's step, not with hetero's."""
    nlat, nlon = 8, 16
    gaps = {}
    for s in ("hetero", "control"):
        traj = simulate(s, 2, 1, nlat, nlon, seed=0).double().numpy()[:, :, 0]  # (n, 2, nlat, nlon)
        start = np.roll(traj[:, 0], 1, axis=-1)
        after = sphere_pde.synthesize(sphere_pde.analyse(start, nlat, nlon) @ step_operator(s, nlat, nlon).T, nlat, nlon)
        expected = np.roll(traj[:, 1], 1, axis=-1)
        gaps[s] = float(np.linalg.norm(after - expected) / np.linalg.norm(expected))
    assert gaps["control"] < 1e-6 and gaps["hetero"] > 1e-2, gaps


def test_datamodule_splits_windows_and_sizes() -> None:
    dm = SpherePDEDataModule("control", n_train=3, n_val=2, n_test=2, n_steps=6, rollout_steps=3, window_stride=2,
                             nlat=8, nlon=16, batch_size=4)
    dm.setup()
    assert dm.dataset_name == "sphere_control" and dm.input_shape == (1, 8, 16)
    x, y = dm.test_dataloader().tensors
    assert set(dm.splits) == {"test"}  # splits are simulated when first asked for
    x, y = dm.train_dataloader().tensors
    assert x.shape == (18, 1, 8, 16) and y.shape == (18, 1, 1, 8, 16)
    x, y = dm.splits["test"]
    assert set(dm.splits) == {"train", "test"}
    assert x.shape == (4, 1, 8, 16) and y.shape == (4, 3, 1, 8, 16)  # starts 0 and 2 of 2 trajectories
    traj = torch.arange(2 * 7).float().reshape(2, 7, 1, 1, 1)
    wx, wy = windows(traj, 3, 2)
    assert wx.flatten().tolist() == [0, 7, 2, 9] and wy[1].flatten().tolist() == [8, 9, 10]


def test_simulated_fields_have_unit_scale_and_zero_climatology() -> None:
    traj = simulate("hetero", 200, 2, 8, 16, seed=3)
    ms = traj[:, 0].square().mean()
    assert 0.8 < float(ms) < 1.2
    assert float(traj[:, 0].mean(0).abs().max()) < 0.35  # per-point mean of 200 unit-variance draws ~ N(0, 1/200)


@pytest.mark.slow
def test_300_trajectories_of_20_steps_on_32x64_take_under_a_minute() -> None:
    start = time.perf_counter()
    traj = simulate("hetero", 300, 20, 32, 64, seed=0)
    assert traj.shape == (300, 21, 1, 32, 64) and time.perf_counter() - start < 60


def test_task_step_metrics_and_spectrum() -> None:
    dm = SpherePDEDataModule("hetero", n_train=2, n_val=1, n_test=1, n_steps=4, rollout_steps=3, window_stride=1,
                             nlat=8, nlon=16, batch_size=4)
    dm.splits = dm.build_splits()
    task = SphereForecastTask(lambda s, o: DIAGNO(s, o, width=4, n_layers=1, lmax=8), rollout_steps=3,
                              input_shape=(1, 8, 16))
    assert isinstance(task, SphericalSpectrum)
    x = dm.splits["test"][0]
    assert torch.equal(task(x), x)  # the projection starts at zero: persistence
    out = task.step(dm.splits["train"], "train")
    assert out.loss.ndim == 0 and set(out.inputs) == {"rel_l2", "acc"}
    out = task.step(dm.splits["test"], "test")
    assert {"rollout3_rel_l2", "rollout3_acc", "rel_l2"} <= set(out.inputs)
    assert task.spectrum(dm.splits["test"]).shape == (2, 1, 8, 8)
    diag = SpectralEnergy()
    diag._fixed_batch = dm.splits["val"]
    logged = diag.finalize(diag.measure(None, task, None))  # type: ignore[arg-type]
    assert set(logged) == {f"ratio_{a}_{b}" for a in "ld" for b in ("low", "mid", "high")}


def test_bad_input_is_one_line() -> None:
    with pytest.raises(ConfigError, match="lmax=40"):
        DIAGNO((1, 32, 64), 1, lmax=40)
    with pytest.raises(ConfigError, match="aliases"):
        SFNO((1, 16, 20), 1, lmax=12)
    with pytest.raises(ConfigError, match="complex coefficients"):
        diagonal_mix(torch.randn(1, 2, 4, 4), torch.randn(2, 2, 4))
    with pytest.raises(ConfigError, match="w_intra must have shape"):
        diagonal_mix(torch.zeros(1, 2, 4, 4, dtype=torch.complex64), None, torch.randn(2, 2, 4, 2))
    with pytest.raises(ConfigError, match="w_sfno must have shape"):
        diagonal_mix(torch.zeros(1, 2, 4, 4, dtype=torch.complex64), torch.randn(2, 3, 4))
    with pytest.raises(ConfigError, match="at least one"):
        diagonal_mix(torch.zeros(1, 2, 4, 4, dtype=torch.complex64), None)
    with pytest.raises(ConfigError, match="hetero"):
        SpherePDEDataModule("era5")
    with pytest.raises(ConfigError, match="rollout_steps"):
        SpherePDEDataModule(n_steps=3, rollout_steps=5)
    with pytest.raises(ConfigError, match="input_shape"):
        SphereForecastTask(input_shape=(32, 64))
    with pytest.raises(ConfigError, match="sht takes a real"):
        sht(torch.zeros(2, 4, 8, dtype=torch.complex64))
    assert math.isfinite(float(count_parameters(DIAGNO((1, 8, 16), 1, width=2, n_layers=1, lmax=4))))


def test_isotropic_step_is_the_per_degree_decay() -> None:
    nlat = 8
    step = step_operator("isotropic", nlat, 16)
    ell = sphere_pde._degrees(nlat)[0]
    decay = (1.0 + sphere_pde.DT / 4 * sphere_pde.KAPPA * ell * (ell + 1)) ** -4
    assert np.allclose(step, np.diag(decay), atol=1e-12)
