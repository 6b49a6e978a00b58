"""ResidualCAN / Cauchy co-design (000-02): the functional API against sympy, the tasks, bad input, the CLI, claims."""

from __future__ import annotations

import functools
import importlib
import math
from pathlib import Path

import pytest
import sympy as sp
import torch
import yaml

from datamodules.gmm_score import mixture_params, ou_mixture_score
from errors import ConfigError
from main import cli_main
from modules.components.local_basis import RBFKAN, CauchyAct, CauchyNodes, ResidualCAN
from modules.components.metrics import count_parameters
from modules.components.mlp import MLP
from modules.residual_can import (
    CauchyPINN,
    CauchyScoreNet,
    FourierFeatureNet,
    SirenNet,
    allen_cahn_residual,
    score_fp_residual,
)
from modules.residual_can.functional import best_shift, count_in_layer, layer_half_width
from tests.helpers import REPO, TINY, runs_of

X_SYM, T_SYM = sp.symbols("x t")


def _points(n: int = 64, dtype=torch.float64, lo: float = -1.0, hi: float = 1.0, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (lo + (hi - lo) * torch.rand(n, 1, generator=g, dtype=torch.float64)).to(dtype)


# --- allen_cahn_residual ------------------------------------------------------------------------------------
def test_allen_cahn_residual_matches_sympy_for_a_non_solution():
    eps = 0.3
    u_sym = sp.sin(2 * X_SYM) + sp.Rational(3, 10) * X_SYM**2 + sp.exp(-X_SYM) / 4
    r_sym = eps**2 * sp.diff(u_sym, X_SYM, 2) + u_sym - u_sym**3
    r_np = sp.lambdify(X_SYM, r_sym, "math")
    x = _points()
    r = allen_cahn_residual(lambda z: torch.sin(2 * z) + 0.3 * z**2 + torch.exp(-z) / 4, x, eps)
    expected = torch.tensor([r_np(float(v)) for v in x[:, 0]], dtype=torch.float64)
    assert r.shape == (64,) and r.dtype == torch.float64
    assert torch.allclose(r, expected, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("eps", [1.0, 0.3, 0.05, 0.02])
def test_allen_cahn_residual_vanishes_for_the_exact_solution(eps):
    x = _points(256)
    r = allen_cahn_residual(lambda z: torch.tanh(z / (math.sqrt(2) * eps)), x, eps)
    # each term is O(1); float64 rounding of tanh'' scales like 1 / eps^2 * eps^2
    assert r.abs().max() < 1e-12


def test_allen_cahn_residual_keeps_the_graph_and_the_dtype():
    a = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    x = _points(32)
    eps = 0.5
    r = allen_cahn_residual(lambda z: a * torch.sin(z), x, eps)  # (N, 1) -> (N, 1)
    r.sum().backward()
    # d/da sum_i [eps^2 (-a sin x_i) + a sin x_i - a^3 sin^3 x_i], from sympy
    a_s = sp.Symbol("a")
    dr = sp.lambdify((X_SYM, a_s), sp.diff(eps**2 * -a_s * sp.sin(X_SYM) + a_s * sp.sin(X_SYM) - (a_s * sp.sin(X_SYM)) ** 3, a_s))
    expected = sum(dr(float(v), 0.7) for v in x[:, 0])
    assert a.grad is not None and abs(a.grad.item() - expected) < 1e-10
    # u returning (N,) is accepted; float32 points give float32 residuals
    r32 = allen_cahn_residual(lambda z: torch.tanh(z).reshape(-1), x.float(), 1.0)
    assert r32.dtype == torch.float32 and r32.shape == (32,)


@pytest.mark.parametrize("bad", [0.0, -0.1, float("nan"), float("inf")])
def test_allen_cahn_residual_rejects_bad_eps(bad):
    with pytest.raises(ConfigError, match="eps"):
        allen_cahn_residual(torch.tanh, _points(4), bad)


def test_allen_cahn_residual_rejects_bad_points():
    with pytest.raises(ConfigError, match=r"\(N, 1\)"):
        allen_cahn_residual(torch.tanh, torch.zeros(4, 2, dtype=torch.float64), 1.0)
    with pytest.raises(ConfigError, match=r"\(N, 1\)"):
        allen_cahn_residual(torch.tanh, torch.zeros(4, dtype=torch.float64), 1.0)
    x = _points(4)
    x[2, 0] = float("nan")
    with pytest.raises(ConfigError, match="NaN or infinite"):
        allen_cahn_residual(torch.tanh, x, 1.0)
    with pytest.raises(ConfigError, match=r"or \(N,\) values"):
        allen_cahn_residual(lambda z: z.repeat(1, 3), _points(4), 1.0)


# --- score_fp_residual --------------------------------------------------------------------------------------
def _fp_residual_sympy(s_exprs: list, xs: list) -> list:
    """d_t s - grad_x(div s + |s|^2 + x . s), symbolically."""
    phi = sum(sp.diff(s_i, x_i) for s_i, x_i in zip(s_exprs, xs))
    phi += sum(s_i**2 for s_i in s_exprs) + sum(x_i * s_i for x_i, s_i in zip(xs, s_exprs))
    return [sp.diff(s_i, T_SYM) - sp.diff(phi, x_i) for s_i, x_i in zip(s_exprs, xs)]


def test_score_fp_residual_matches_sympy_in_1d():
    s_sym = [-X_SYM * sp.exp(T_SYM) / 2 + sp.sin(X_SYM * T_SYM) + T_SYM**2 * X_SYM**3]
    r_np = sp.lambdify((X_SYM, T_SYM), _fp_residual_sympy(s_sym, [X_SYM])[0], "math")
    x, t = _points(50, lo=-2, hi=2), _points(50, lo=0, hi=1, seed=1)

    def score(x_, t_):
        return -x_ * torch.exp(t_) / 2 + torch.sin(x_ * t_) + t_**2 * x_**3

    r = score_fp_residual(score, x, t)
    expected = torch.tensor([[r_np(float(a), float(b))] for a, b in zip(x[:, 0], t[:, 0])], dtype=torch.float64)
    assert r.shape == (50, 1) and torch.allclose(r, expected, atol=1e-10, rtol=1e-10)


def test_score_fp_residual_matches_sympy_in_2d():
    x1, x2 = sp.symbols("x1 x2")
    s_sym = [x1 * x2 * T_SYM - x1, sp.sin(x1) + T_SYM * x2**2]
    r_sym = _fp_residual_sympy(s_sym, [x1, x2])
    r_np = [sp.lambdify((x1, x2, T_SYM), e, "math") for e in r_sym]
    g = torch.Generator().manual_seed(3)
    x = torch.randn(40, 2, generator=g, dtype=torch.float64)
    t = torch.rand(40, 1, generator=g, dtype=torch.float64)

    def score(x_, t_):
        a, b = x_[:, :1], x_[:, 1:]
        return torch.cat([a * b * t_ - a, torch.sin(a) + t_ * b**2], dim=1)

    r = score_fp_residual(score, x, t)
    expected = torch.tensor([[f(*map(float, (p[0], p[1], q[0]))) for f in r_np] for p, q in zip(x, t)],
                            dtype=torch.float64)
    assert r.shape == (40, 2) and torch.allclose(r, expected, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("dim", [1, 2])
def test_score_fp_residual_vanishes_for_the_exact_ou_score(dim):
    means, stds, weights = mixture_params(dim)
    g = torch.Generator().manual_seed(dim)
    x = 2.5 * torch.randn(200, dim, generator=g, dtype=torch.float64)
    t = 0.01 + 1.5 * torch.rand(200, 1, generator=g, dtype=torch.float64)

    def score(x_, t_):
        return ou_mixture_score(x_, t_, means, stds, weights)

    r = score_fp_residual(score, x, t)
    scale = score(x, t).abs().max() ** 2  # |s|^2 terms are the largest in the residual
    assert r.abs().max() < 1e-10 * scale
    # a wrong drift (the score of the OU process run twice as fast) is not a solution
    r_wrong = score_fp_residual(lambda x_, t_: score(x_, 2 * t_), x, t)
    assert r_wrong.abs().max() > 1e-2


def test_score_fp_residual_keeps_dtype_and_graph():
    net = MLP(3, 2, hidden=[8], activation="silu")
    x, t = torch.randn(16, 2), torch.rand(16, 1)
    r = score_fp_residual(lambda x_, t_: net(torch.cat([x_, t_], 1)), x, t)
    assert r.dtype == torch.float32 and r.shape == (16, 2)
    r.square().mean().backward()
    assert all(p.grad is not None for p in net.parameters())


def test_score_fp_residual_rejects_bad_input():
    def s(x_, t_):
        return x_ * t_

    x, t = torch.randn(8, 2, dtype=torch.float64), torch.rand(8, 1, dtype=torch.float64)
    with pytest.raises(ConfigError, match="t must be >= 0"):
        score_fp_residual(s, x, -t)
    with pytest.raises(ConfigError, match=r"\(N, 1\)"):
        score_fp_residual(s, x, t[:, 0])
    with pytest.raises(ConfigError, match="same number"):
        score_fp_residual(s, x, t[:4])
    bad = x.clone()
    bad[0, 1] = float("inf")
    with pytest.raises(ConfigError, match="NaN or infinite"):
        score_fp_residual(s, bad, t)
    with pytest.raises(ConfigError, match=r"must return \(N, d\)"):
        score_fp_residual(lambda x_, t_: x_[:, :1], x, t)


# --- networks and tasks -------------------------------------------------------------------------------------
def test_residual_can_is_main_path_plus_softmax_weighted_cauchy_nodes():
    torch.manual_seed(0)
    net = CauchyPINN(net=functools.partial(ResidualCAN, width=16, depth=2, n_nodes=32)).net
    res = net.residual
    assert isinstance(res, CauchyNodes) and res.n_nodes == 32 and res.scale.item() == pytest.approx(0.1)
    assert torch.allclose(res.centres[:, 0], torch.linspace(-1, 1, 32))
    with torch.no_grad():
        res.logits.normal_()
    x = _points(20, dtype=torch.float32)
    # u = MLP_CauchyAct(x) + s sum_j softmax(a)_j (b1_j (x - c_j) + b2_j) / ((x - c_j)^2 + d_j^2), one node at a time
    w = res.logits.softmax(0)
    manual = net.main(x)[:, 0].clone()
    for j in range(32):
        dx = x[:, 0] - res.centres[j, 0]
        manual += res.scale * w[j] * (res.b1[j, 0, 0] * dx + res.b2[j, 0]) / (dx**2 + res.widths[j] ** 2)
    assert torch.allclose(net(x)[:, 0], manual, atol=1e-6)
    assert all(isinstance(m, CauchyAct) for m in net.main.layers[1::2])


ARCHS = {  # the task networks of the PINN comparisons, 2 hidden layers of 8
    "mlp": functools.partial(MLP, activation="cauchy", hidden=[8, 8]),
    "residual_can": functools.partial(ResidualCAN, activation="cauchy", width=8, depth=2),
    "siren": functools.partial(SirenNet, width=8, depth=2),
    "fourier": functools.partial(FourierFeatureNet, activation="tanh", width=8, depth=2),
    "kan": functools.partial(RBFKAN, hidden=[8, 8]),
}


@pytest.mark.parametrize("arch", ["mlp", "residual_can", "siren", "fourier", "kan"])
def test_every_arch_has_a_second_derivative(arch):
    m = CauchyPINN(net=ARCHS[arch]).double()
    x = _points(16)
    r, bc = m.terms(x)
    assert r.shape == (16,) and bc.shape == (2,) and torch.isfinite(r).all()
    (r.square().mean() + bc.square().mean()).backward()
    assert sum(p.grad.abs().sum() for p in m.parameters() if p.grad is not None) > 0


def test_siren_and_fourier_baselines():
    siren = SirenNet(1, 1, width=8, depth=2, w0=30.0)
    first = siren.layers[0]
    assert first.weight.abs().max() <= 1.0 and siren.layers[1].w0 == 30.0
    x = _points(5, dtype=torch.float32)
    assert torch.allclose(siren.layers[1](first(x)), torch.sin(30.0 * first(x)))
    ff = FourierFeatureNet(1, 1, n_features=4, sigma=2.0, activation="tanh")
    z = 2 * math.pi * x @ ff.B.T
    assert torch.allclose(ff(x), ff.mlp(torch.cat([torch.sin(z), torch.cos(z)], 1)))


def _config_model(name: str) -> dict:
    return yaml.safe_load((REPO / "configs/residual_can" / name).read_text())["model"]["init_args"]


def _config_net(name: str) -> tuple[str, dict, functools.partial]:
    """The config's ``model.init_args.net``: its class path, its init_args and the factory they make."""
    net = _config_model(name)["net"]
    module, cls = net["class_path"].rsplit(".", 1)
    args = net.get("init_args", {})
    return net["class_path"], args, functools.partial(getattr(importlib.import_module(module), cls), **args)


def test_residual_can_and_the_silu_mlp_of_the_configs_are_within_ten_percent_parameters():
    rcan_path, rcan_args, rcan_net = _config_net("allen_cahn.yaml")
    silu_path, silu_args, silu_net = _config_net("allen_cahn_silu.yaml")
    rcan = CauchyPINN(net=rcan_net)
    silu = CauchyPINN(net=silu_net)
    assert silu_path == "modules.components.mlp.MLP" and silu_args["activation"] == "silu"
    assert rcan_path == "modules.components.local_basis.ResidualCAN" and rcan_args.get("basis", "cauchy") == "cauchy"
    n_r, n_s = count_parameters(rcan.net), count_parameters(silu.net)
    assert abs(n_r - n_s) <= 0.1 * n_s, (n_r, n_s)
    # by hand: main path 1 -> 32 -> 32 -> 1 with a CauchyAct (3 scalars) after each hidden layer: 64 + 1056 + 33
    # + 6 = 1159; 32 nodes x (centre, width, b1, b2, logit) + the scale s: 161
    assert n_r == 1159 + 161 == 1320


def test_pinn_step_metrics_on_the_exact_solution():
    """A network that *is* u* has zero error and a residual at float64 rounding on the test grid."""

    class Exact(torch.nn.Module):
        def forward(self, x):
            return torch.tanh(x / (math.sqrt(2) * 0.3))

    m = CauchyPINN(eps=0.3, net=functools.partial(ResidualCAN, width=4, depth=1)).double()
    m.net = Exact()
    x = torch.linspace(-1, 1, 101, dtype=torch.float64)[:, None]
    out = m.step((x,), "test")
    assert out.loss.item() < 1e-25
    assert torch.allclose(out.preds, out.target)
    assert out.inputs["residual_ms"][0] < 1e-25 and out.inputs["bc_ms"][0] < 1e-25


def test_score_net_losses_at_the_exact_score():
    """With s = the exact score the FP loss vanishes, and the DSM loss is its irreducible constant
    E|sigma s* + z|^2 = d - E[sigma^2 |s*|^2] (Tweedie: E[z | x_t] = -sigma s*(x_t, t)), checked by Monte Carlo
    within 4 standard errors."""
    means, stds, weights = mixture_params(1)

    def exact(x, t):
        return ou_mixture_score(x, t, means, stds, weights)

    g = torch.Generator().manual_seed(0)
    n = 20_000
    comp = torch.multinomial(weights, n, replacement=True, generator=g)
    x0 = means[comp] + stds[comp, None] * torch.randn(n, 1, generator=g, dtype=torch.float64)
    fp = CauchyScoreNet(loss="fp_pde", num_features=1).double()
    fp.score = exact
    out = fp.step((x0[:512], exact(x0[:512], torch.zeros(512, 1, dtype=torch.float64))), "train")
    assert out.loss.item() < 1e-18
    dsm = CauchyScoreNet(loss="dsm", num_features=1).double()
    dsm.score = exact
    t = 1e-3 + torch.rand(n, 1, generator=g, dtype=torch.float64)
    z = torch.randn(n, 1, generator=g, dtype=torch.float64)
    sigma2 = 1 - torch.exp(-2 * t)
    x_t = torch.exp(-t) * x0 + sigma2.sqrt() * z
    per_point = dsm.dsm_loss(x_t, t, z) - (1 - sigma2[:, 0] * exact(x_t, t).square().sum(1))
    assert abs(per_point.mean()) < 4 * per_point.std() / n**0.5


def test_bad_arguments_are_one_line_errors(capsys: pytest.CaptureFixture):
    with pytest.raises(ConfigError, match="eps"):
        CauchyPINN(eps=0.0)
    with pytest.raises(ConfigError, match="eps"):
        CauchyPINN(eps=-1.0, pde="burgers")
    # the network is a class path (it was an `arch` name): an unknown one is a one-line error of the command line
    config = str(REPO / "configs/residual_can/allen_cahn.yaml")
    assert cli_main(["fit", "--config", config, "--model.init_args.net", "modules.nowhere.Transformer",
                     "--print_config"]) == 2
    assert "modules.nowhere.Transformer: no such class" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="loss must be one of"):
        CauchyPINN(loss="l3")
    with pytest.raises(ConfigError, match="pde must be one of"):
        CauchyPINN(pde="heat")
    with pytest.raises(ConfigError, match="activation 'swish'; choose one of"):  # the net's activation
        CauchyScoreNet(net=functools.partial(MLP, activation="swish"))
    with pytest.raises(ConfigError, match="t_min < t_max"):
        CauchyScoreNet(t_min=1.0, t_max=0.5)
    with pytest.raises(ConfigError, match="loss_scale"):
        CauchyPINN(loss="cauchy", loss_scale=0.0)
    with pytest.raises(ConfigError, match="1-D problems"):
        CauchyPINN(input_shape=(2,))
    m = CauchyPINN(net=functools.partial(ResidualCAN, width=4, depth=1))
    x = _points(8, dtype=torch.float32)
    x[0] = float("inf")
    with pytest.raises(ConfigError, match="NaN or infinite"):
        m.step((x,), "train")


# --- where the layer is: best_shift, the layer count, anchors -------------------------------------------------
def _kink(eps: float):
    return lambda x: torch.tanh(x.reshape(-1) / (math.sqrt(2) * eps))


def _brute_force_shift(u: torch.Tensor, x: torch.Tensor, eps: float) -> tuple[float, float]:
    """An independent reference: scipy's bounded scalar minimiser on the squared error, started from a plain
    loop over 2,001 shifts (both in numpy)."""
    import numpy as np
    from scipy.optimize import minimize_scalar

    un, xn = u.double().numpy(), x.reshape(-1).double().numpy()
    ref = float(np.sum(np.tanh(xn / (np.sqrt(2) * eps)) ** 2))

    def err(s: float) -> float:
        return float(np.sum((un - np.tanh((xn - s) / (np.sqrt(2) * eps))) ** 2))

    grid = np.linspace(-1, 1, 2001)
    s0 = grid[int(np.argmin([err(s) for s in grid]))]
    best = minimize_scalar(err, bounds=(s0 - 1e-3, s0 + 1e-3), method="bounded", options={"xatol": 1e-10})
    return float(best.x), math.sqrt(best.fun / ref)


@pytest.mark.parametrize(("eps", "s_true", "noise"), [(0.1, 0.2371, 0.0), (0.02, -0.5123, 0.0), (0.1, -0.0437, 0.05)])
def test_best_shift_finds_the_translate_a_brute_force_search_finds(eps: float, s_true: float, noise: float):
    """u = u*(x - s) (+ noise) on the 4,096-point grid: the shift and the aligned error agree with an independent
    brute-force + scipy search; without noise the shift is s itself and the aligned error 0, while the plain
    relative error is large."""
    x = torch.linspace(-1, 1, 4096, dtype=torch.float64)[:, None]
    g = torch.Generator().manual_seed(0)
    u = _kink(eps)(x - s_true) + noise * torch.randn(4096, generator=g, dtype=torch.float64)
    s, e = best_shift(u, x, _kink(eps))
    s_ref, e_ref = _brute_force_shift(u, x, eps)
    assert s == pytest.approx(s_ref, abs=1e-6) and e == pytest.approx(e_ref, rel=1e-6, abs=1e-6)
    plain = float((u - _kink(eps)(x)).norm() / _kink(eps)(x).norm())
    if noise == 0:
        assert s == pytest.approx(s_true, abs=1e-7) and e < 1e-6 and plain > 0.2
    else:
        assert e < plain


def test_layer_half_width_and_count_in_layer():
    """The layer is |u*| <= tanh 1: Allen-Cahn |x| <= sqrt 2 eps, Burgers |x| <= 2 eps (checked on u*)."""
    for pde, eps, exact in (("allen_cahn", 0.05, lambda x: math.tanh(x / (math.sqrt(2) * 0.05))),
                            ("burgers", 0.05, lambda x: -math.tanh(x / (2 * 0.05)))):
        w = layer_half_width(pde, eps)
        assert abs(exact(w)) == pytest.approx(math.tanh(1.0), rel=1e-12)
    assert layer_half_width("poisson", 1.0) is None
    x = torch.tensor([[-0.2], [-0.1], [0.0], [0.05], [0.1], [0.3]])
    assert count_in_layer(x, 0.1) == sum(abs(v) <= 0.1 for v in (-0.2, -0.1, 0.0, 0.05, 0.1, 0.3)) == 4


def test_pinn_logs_layer_points_and_the_aligned_error_and_anchors_enter_the_boundary_term():
    """A network that is a shifted kink: the test step feeds the aligned metrics (shift s, aligned error 0); the
    training step counts the points in |x| <= sqrt 2 eps; an anchor a adds u(a) - u*(a) to the boundary errors."""
    eps, s_true = 0.1, 0.3

    class Shifted(torch.nn.Module):
        def forward(self, x):
            return torch.tanh((x - s_true) / (math.sqrt(2) * eps))

    m = CauchyPINN(eps=eps, net=functools.partial(MLP, hidden=[4]), anchors=[0.05]).double()
    m.net = Shifted()
    x = torch.linspace(-1, 1, 4096, dtype=torch.float64)[:, None]
    out = m.step((x,), "test")
    metric = m.stage_metrics["test_"]
    metric["layer_shift"].update(*out.inputs["layer_shift"])
    metric["rel_l2_aligned"].update(*out.inputs["rel_l2_aligned"])
    assert float(metric["layer_shift"].compute()) == pytest.approx(s_true, abs=1e-7)
    assert float(metric["rel_l2_aligned"].compute()) < 1e-6
    r, bc = m.terms(x)
    w = math.sqrt(2) * eps
    assert bc.shape == (3,) and float(bc[2]) == pytest.approx(math.tanh((0.05 - s_true) / w) - math.tanh(0.05 / w))
    train = m.step((x,), "train")
    assert train.inputs["layer_points"] == (int((x.abs() <= math.sqrt(2) * eps).sum()), 1)
    assert m.step((x,), "val").inputs["layer_shift"] is None
    with pytest.raises(ConfigError, match="anchors must lie inside"):
        CauchyPINN(anchors=[1.0])


def test_eps_continuation_is_geometric_and_trains_on_the_annealed_problem():
    """eps_k = eps_start (eps / eps_start)^min(1, k / K) (closed form at k = 0, K/2, K, 2K); the training step at
    k solves the problem at eps_k (its boundary data tanh(1 / (sqrt 2 eps_k)) included), validation at eps."""
    m = CauchyPINN(eps=0.01, eps_start=1.0, eps_anneal_steps=100, net=functools.partial(MLP, hidden=[4])).double()
    assert [m.eps_at(k) for k in (0, 50, 100, 200)] == pytest.approx([1.0, 0.1, 0.01, 0.01], rel=1e-12)
    assert CauchyPINN(eps=0.3, net=functools.partial(MLP, hidden=[4])).eps_at(7) == 0.3

    class Zero(torch.nn.Module):
        def forward(self, x):
            return 0.0 * x**3  # u = 0, with a second derivative autograd can take

    m.net = Zero()
    x = torch.linspace(-1, 1, 11, dtype=torch.float64)[:, None]
    # u = 0: the residual vanishes and the loss is w_bc * mean of the squared boundary data, tanh^2(1/(sqrt 2 eps_k))
    assert m.step((x,), "train").loss.item() == pytest.approx(10.0 * math.tanh(1 / math.sqrt(2)) ** 2, rel=1e-12)
    assert m.step((x,), "val").loss.item() == pytest.approx(10.0 * math.tanh(1 / (math.sqrt(2) * 0.01)) ** 2, rel=1e-12)
    with pytest.raises(ConfigError, match="eps_anneal_steps > 0"):
        CauchyPINN(eps=0.1, eps_start=1.0)


# --- CLI ----------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_fit_and_test_through_the_cli(paperlab_tmp: Path):
    """fit + test of the default experiment and the metrics it logs (slow: the default suite's CLI fit + test of
    this config is tests/test_cli.py's smoke test; the parameter count is checked without a fit below, the
    metric names by the step tests above, the node diagnostics in tests/callbacks/test_activation_params.py)."""
    path = str(REPO / "configs/residual_can/allen_cahn.yaml")
    assert cli_main(["fit", "--config", path, *TINY]) == 0
    assert cli_main(["test", "--config", path, *TINY, "--ckpt_path", "last"]) == 0
    (run,) = runs_of("residual_can")
    metrics = run.data.metrics
    assert run.info.status == "FINISHED" and run.data.tags["paper_id"] == "000-02"
    assert {"test/rel_l2", "test/n_params", "train/loss", "val/pde_loss", "test/max_abs", "test/residual_rms"} <= set(metrics)
    assert metrics["test/n_params"] == 1320
    assert any(k.startswith("diag/activation_params/net.residual/") for k in metrics)
