"""modules/components/local_basis.py: CauchyAct, local-basis residuals, RBF-KAN, interpolated grids vs naive loops."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from errors import ConfigError
from modules.components.activations import make_activation
from modules.components.local_basis import (
    CauchyAct,
    CauchyNodes,
    GaussianAct,
    GaussianBumps,
    InterpolatedGrid,
    RBFKANLayer,
    ResidualCAN,
    grid_centres,
)


def test_cauchy_act_formula_init_and_positive_d():
    act = CauchyAct()
    assert (act.lambda1.item(), act.lambda2.item()) == (1.0, 1.0)
    assert act.d.item() == pytest.approx(1.0, rel=1e-6)
    with torch.no_grad():
        act.lambda1.fill_(0.7)
        act.lambda2.fill_(-0.2)
        act.raw_d.fill_(0.3)
    x = torch.linspace(-4, 4, 41, dtype=torch.float64)
    d = math.log1p(math.exp(0.3)) + 1e-3
    assert torch.allclose(act(x), (0.7 * x - 0.2) / (x**2 + d**2))
    with torch.no_grad():
        act.raw_d.fill_(-1e4)  # d stays at its floor 1e-3, never 0
    assert act.d.item() == pytest.approx(1e-3) and torch.isfinite(act(torch.zeros(1))).all()
    assert sum(p.numel() for p in act.parameters()) == 3


def test_gaussian_act_and_activation_names():
    g = GaussianAct(a=0.5)
    x = torch.linspace(-2, 2, 9)
    assert torch.allclose(g(x), torch.exp(-(x**2) / (2 * 0.25)), atol=1e-6)
    assert isinstance(make_activation("cauchy"), CauchyAct)
    assert isinstance(make_activation("silu"), torch.nn.SiLU)
    with pytest.raises(ConfigError, match="unknown activation 'swish'"):
        make_activation("swish")


@pytest.mark.parametrize("cls", [CauchyNodes, GaussianBumps])
@pytest.mark.parametrize("dim", [1, 2])
def test_local_basis_residual_matches_a_loop_over_nodes(cls, dim):
    res = cls(in_dim=dim, out_dim=2, n_nodes=16, seed=1).double()
    with torch.no_grad():
        res.logits.normal_()
        res.raw_width.add_(0.1 * torch.randn(16, dtype=torch.float64))
    x = torch.rand(30, dim, dtype=torch.float64) * 2 - 1
    w = res.logits.softmax(0)
    out = torch.zeros(30, 2, dtype=torch.float64)
    for j in range(16):
        diff = x - res.centres[j]
        sq = diff.square().sum(1, keepdim=True)
        d = res.widths[j]
        env = 1 / (sq + d**2) if cls is CauchyNodes else torch.exp(-sq / (2 * d**2))
        out += w[j] * (diff @ res.b1[j] + res.b2[j]) * env
    assert torch.allclose(res(x), res.scale * out, atol=1e-12)


def test_nodes_start_on_a_grid_with_uniform_weights_and_small_scale():
    res = CauchyNodes(n_nodes=32)
    assert torch.allclose(res.centres[:, 0], torch.linspace(-1, 1, 32))
    assert torch.allclose(res.weights, torch.full((32,), 1 / 32))
    assert res.scale.item() == pytest.approx(0.1)
    assert torch.allclose(res.widths, torch.full((32,), 2 * 2 / 31), rtol=1e-5)
    c, spacing = grid_centres(16, 2, -1.0, 1.0)
    assert c.shape == (16, 2) and spacing == pytest.approx(2 / 3) and len(set(c[:, 0].tolist())) == 4
    c5, _ = grid_centres(5, 2, -1.0, 1.0)  # not a square: seeded uniform draws inside the box
    assert c5.shape == (5, 2) and (c5.abs() <= 1).all()
    with pytest.raises(ConfigError, match="positive sizes"):
        CauchyNodes(n_nodes=0)


def test_residual_can_without_a_basis_is_its_main_path():
    torch.manual_seed(0)
    net = ResidualCAN(1, 1, width=8, depth=2, basis="none")
    x = torch.rand(5, 1)
    assert net.residual is None and torch.equal(net(x), net.main(x))
    assert isinstance(ResidualCAN(1, 1, basis="gaussian").residual, GaussianBumps)
    with pytest.raises(ConfigError, match="depth >= 1"):
        ResidualCAN(1, 1, depth=0)


def test_rbf_kan_layer_matches_a_loop():
    layer = RBFKANLayer(3, 2, n_grid=5, low=-1.0, high=1.0).double()
    x = torch.randn(7, 3, dtype=torch.float64)
    grid = torch.linspace(-1, 1, 5, dtype=torch.float64)
    h = 0.5
    out = layer.base(F.silu(x))
    for o in range(2):
        for i in range(3):
            for g in range(5):
                out[:, o] = out[:, o] + layer.spline[o, i, g] * torch.exp(-(((x[:, i] - grid[g]) / h) ** 2))
    assert torch.allclose(layer(x), out, atol=1e-12)


def test_interpolated_grid_1d_is_piecewise_linear_through_its_nodes():
    g = InterpolatedGrid(9, channels=2, low=-1.0, high=1.0, init="normal").double()
    x = torch.rand(50, 1, dtype=torch.float64) * 2 - 1
    nodes = np.linspace(-1, 1, 9)
    for c in range(2):
        ref = np.interp(x[:, 0].numpy(), nodes, g.values[c].detach().numpy())
        assert np.allclose(g(x)[:, c].detach().numpy(), ref, atol=1e-12)
    # clamped outside the box, exact at the nodes
    assert torch.allclose(g(torch.tensor([[5.0]], dtype=torch.float64))[0], g.values[:, -1])


def test_interpolated_grid_2d_matches_a_bilinear_loop_and_render():
    g = InterpolatedGrid((5, 4), channels=1, low=0.0, high=1.0, init="normal").double()
    pts = torch.rand(20, 2, dtype=torch.float64)
    vals = g.values[0].detach()
    ref = []
    for p in pts:
        u, v = p[0].item() * 4, p[1].item() * 3  # node coordinates along axis 0 (5 nodes), axis 1 (4 nodes)
        i, j = min(int(u), 3), min(int(v), 2)
        a, b = u - i, v - j
        ref.append((1 - a) * (1 - b) * vals[i, j] + a * (1 - b) * vals[i + 1, j] + (1 - a) * b * vals[i, j + 1]
                   + a * b * vals[i + 1, j + 1])
    assert torch.allclose(g(pts)[:, 0], torch.stack(ref), atol=1e-12)
    # render(H, W) is the same interpolant on the full grid (align_corners=True: the corners are nodes)
    img = g.render((9, 7))
    ii, jj = torch.meshgrid(torch.linspace(0, 1, 9, dtype=torch.float64), torch.linspace(0, 1, 7, dtype=torch.float64),
                            indexing="ij")
    at = g(torch.stack([ii.reshape(-1), jj.reshape(-1)], 1))[:, 0].reshape(9, 7)
    assert torch.allclose(img[0], at, atol=1e-12)
    with pytest.raises(ConfigError, match="points \\(N, 2\\)"):
        g(torch.rand(3, 1))
    with pytest.raises(ConfigError, match=">= 2 nodes"):
        InterpolatedGrid(1)
