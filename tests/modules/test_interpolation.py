"""``modules.components.interpolation``: the linear path and its loss barrier against closed forms and loops."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from errors import ConfigError
from modules.components.interpolation import interpolate, loss_barrier
from modules.components.tiny_gpt import TinyGPT


def test_interpolate_matches_a_naive_loop_and_its_endpoints() -> None:
    g = torch.Generator().manual_seed(0)
    a = {
        "w": torch.randn(3, 4, generator=g, dtype=torch.float64),
        "b": torch.randn(4, generator=g, dtype=torch.float64),
    }
    b = {k: torch.randn(v.shape, generator=g, dtype=torch.float64) for k, v in a.items()}
    for alpha in (0.0, 0.3, 1.0):
        out = interpolate(a, b, alpha)
        for k in a:
            ref = torch.empty_like(a[k]).flatten()
            for i, (x, y) in enumerate(zip(a[k].flatten().tolist(), b[k].flatten().tolist())):
                ref[i] = (1 - alpha) * x + alpha * y
            assert torch.allclose(out[k], ref.view_as(a[k]), atol=1e-15)
    assert torch.equal(interpolate(a, b, 0.0)["w"], a["w"]) and torch.equal(interpolate(a, b, 1.0)["w"], b["w"])
    # a tensor alpha is differentiable
    alpha = torch.tensor(0.25, dtype=torch.float64, requires_grad=True)
    interpolate(a, b, alpha)["w"].sum().backward()
    assert torch.allclose(alpha.grad, (b["w"] - a["w"]).sum())


def test_double_well_barrier_is_its_closed_form() -> None:
    # L(w) = (w^2 - 1)^2 between the minima w = -1 and w = 1: along w = 2 alpha - 1, L(0) = L(1) = 0 and the
    # barrier is L at alpha = 1/2, (0 - 1)^2 = 1
    alphas = torch.linspace(0, 1, 11, dtype=torch.float64)
    losses = ((2 * alphas - 1) ** 2 - 1) ** 2
    assert loss_barrier(alphas, losses) == pytest.approx(1.0, abs=1e-12)
    # a tilted chord: L(alpha) = 4 alpha (1 - alpha) + 3 alpha has chord 3 alpha and barrier max 4a(1-a) = 1
    losses = 4 * alphas * (1 - alphas) + 3 * alphas
    assert loss_barrier(alphas, losses) == pytest.approx(1.0, abs=1e-12)
    # a convex loss lies under its chord: the barrier is the endpoints' 0
    assert loss_barrier(alphas, (alphas - 0.3) ** 2) == pytest.approx(0.0, abs=1e-15)


def test_barrier_matches_a_fine_grid_brute_force() -> None:
    g = torch.Generator().manual_seed(1)
    alphas = torch.linspace(0, 1, 101, dtype=torch.float64)
    losses = torch.rand(101, generator=g, dtype=torch.float64)
    ref = max(
        float(l) - ((1 - float(a)) * float(losses[0]) + float(a) * float(losses[-1])) for a, l in zip(alphas, losses)
    )
    assert loss_barrier(alphas.tolist(), losses.tolist()) == pytest.approx(ref, abs=1e-15)


def test_a_models_barrier_with_itself_is_zero() -> None:
    torch.manual_seed(0)
    net = TinyGPT(8, 20, n_layer=1, n_head=2, n_embd=16, norm="rmsnorm", tie_weights=False).double()
    sd = {k: v.clone() for k, v in net.state_dict().items()}
    x = torch.randint(0, 20, (4, 8))
    y = torch.randint(0, 20, (4, 8))
    alphas = [k / 10 for k in range(11)]
    losses = []
    for a in alphas:
        net.load_state_dict(interpolate(sd, sd, a))
        with torch.no_grad():
            losses.append(float(F.cross_entropy(net(x).flatten(0, 1), y.flatten())))
    assert loss_barrier(alphas, losses) == pytest.approx(0.0, abs=1e-12)


def test_interpolation_errors() -> None:
    a = {"w": torch.zeros(2)}
    with pytest.raises(ConfigError, match="differ in their entries"):
        interpolate(a, {"v": torch.zeros(2)}, 0.5)
    with pytest.raises(ConfigError, match="shapes"):
        interpolate(a, {"w": torch.zeros(3)}, 0.5)
    with pytest.raises(ConfigError, match="from 0 to 1"):
        loss_barrier([0.1, 1.0], [0.0, 0.0])
    with pytest.raises(ConfigError, match="one loss per alpha"):
        loss_barrier([0.0, 1.0], [0.0])
