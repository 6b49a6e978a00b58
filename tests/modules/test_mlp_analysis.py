"""The MLP analysis floor: affine layers in order, seeded random nets, function-preserving rescaling, Jacobians."""

from __future__ import annotations

import pytest
import torch

from errors import ConfigError
from modules.components.mlp import MLP
from modules.components.mlp_analysis import (
    activation_name,
    affine_layers,
    input_jacobians,
    random_mlp,
    rescale_hidden,
)


def manual_forward(layers: list[tuple[torch.Tensor, torch.Tensor]], x: torch.Tensor) -> torch.Tensor:
    for i, (w, b) in enumerate(layers):
        x = x @ w.T + b
        if i < len(layers) - 1:
            x = x.relu()
    return x


def test_affine_layers_rebuild_the_function_in_parameter_order() -> None:
    net = random_mlp([5, 7, 6, 3], "relu", seed=0, bias_scale=0.5)
    layers = affine_layers(net)
    assert [tuple(w.shape) for w, _ in layers] == [(7, 5), (6, 7), (3, 6)]
    flat = [t for pair in layers for t in pair]
    assert all(a is b for a, b in zip(flat, net.parameters(), strict=True))
    x = torch.randn(11, 5, dtype=torch.float64)
    assert torch.allclose(manual_forward(layers, x), net(x), atol=1e-12)
    assert activation_name(net) == "relu" and activation_name(MLP(3, 2, activation="gelu")) == "gelu"


def test_random_mlp_is_seeded_and_has_the_stated_variance() -> None:
    a, b, c = random_mlp([400, 300, 2], seed=1), random_mlp([400, 300, 2], seed=1), random_mlp([400, 300, 2], seed=2)
    wa = affine_layers(a)[0][0].detach()
    assert torch.equal(wa, affine_layers(b)[0][0]) and not torch.equal(wa, affine_layers(c)[0][0])
    # N(0, scale^2 / fan_in): var * fan_in = 1 within Monte Carlo error (120k draws, sd of the estimate ~0.004)
    assert abs(float(wa.var()) * 400 - 1) < 0.02
    assert float(affine_layers(random_mlp([400, 300, 2], seed=1, scale=2.0))[0][0].detach().var()) * 400 == pytest.approx(
        4 * float(wa.var()) * 400, rel=1e-10)
    assert torch.count_nonzero(affine_layers(a)[0][1]) == 0 and wa.dtype == torch.float64


def test_rescale_hidden_keeps_the_function_and_moves_the_weights() -> None:
    net = random_mlp([4, 8, 8, 2], seed=3, bias_scale=0.3)
    gen = torch.Generator().manual_seed(0)
    log_alpha = [torch.rand(8, generator=gen, dtype=torch.float64) * 4 - 2 for _ in range(2)]
    scaled = rescale_hidden(net, log_alpha)
    x = torch.randn(50, 4, dtype=torch.float64)
    assert torch.allclose(scaled(x), net(x), atol=1e-12)
    (w0, b0), (w1, _), _ = affine_layers(scaled)
    a0 = log_alpha[0].exp()
    assert torch.allclose(w0, affine_layers(net)[0][0] * a0[:, None])
    assert torch.allclose(b0, affine_layers(net)[0][1] * a0)
    assert torch.allclose(w1 * a0[None, :] / log_alpha[1].exp()[:, None], affine_layers(net)[1][0])
    with pytest.raises(ConfigError, match="positively homogeneous|preserves the function"):
        rescale_hidden(random_mlp([4, 8, 2], "tanh", seed=0), [torch.zeros(8)])
    with pytest.raises(ConfigError, match="one tensor per hidden layer"):
        rescale_hidden(net, log_alpha[:1])


def test_input_jacobians_against_finite_differences() -> None:
    net = random_mlp([3, 16, 2], "tanh", seed=4, bias_scale=0.2)
    x = torch.randn(5, 3, dtype=torch.float64)
    jac = input_jacobians(net, x)
    eps = 1e-6
    fd = torch.stack([(net(x + eps * e) - net(x - eps * e)) / (2 * eps) for e in torch.eye(3, dtype=x.dtype)], -1)
    assert jac.shape == (5, 2, 3) and torch.allclose(jac, fd, atol=1e-8)
