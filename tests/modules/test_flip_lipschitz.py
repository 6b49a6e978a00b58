"""FLIP (paper 002-05): the tasks and the LipschitzBound diagnostic (the maths: tests/modules/test_lipschitz.py)."""

from __future__ import annotations

import pytest
import torch

from callbacks.lipschitz_bound import LipschitzBound
from errors import ConfigError
from modules.components.lipschitz import eclipse_fast_bound, flip_bound, trivial_bound
from modules.components.mlp import MLP
from modules.flip_lipschitz import LipschitzProbeMLP, RandomNetLipschitzStudy
from modules.protocols import AffineLayers, DiagnosticForward


def probe(activation: str = "relu") -> LipschitzProbeMLP:
    return LipschitzProbeMLP(net=lambda s, n: MLP(s, n, hidden=[8, 8], activation=activation), input_shape=(6,),
                             num_classes=3)


def linear_weights(net: MLP) -> list[torch.Tensor]:
    return [m.weight.detach() for m in net.layers if isinstance(m, torch.nn.Linear)]


def test_probe_offers_its_affine_layers() -> None:
    task = probe()
    assert isinstance(task, AffineLayers) and isinstance(task, DiagnosticForward)
    layers = task.affine_layers()
    assert [tuple(w.shape) for w, _ in layers] == [(8, 6), (8, 8), (3, 8)]
    assert all(w.dtype == torch.float64 and not w.requires_grad for w, _ in layers)
    with pytest.raises(ConfigError, match="slope bounds"):
        probe("gelu")


def test_diagnostic_orders_its_bounds() -> None:
    task = probe()
    diag = LipschitzBound()
    x = torch.randn(16, 6)
    diag._fixed_batch = (x, torch.zeros(16, dtype=torch.long))  # the batch a run's first validation would give
    out = diag.finalize(diag.measure(None, task, None))  # type: ignore[arg-type]
    assert set(out) == {"flip", "eclipse_fast", "trivial", "lower", "seconds"}
    assert 0 < out["lower"] <= out["flip"] <= out["eclipse_fast"] * (1 + 1e-9) <= out["trivial"] * (1 + 2e-9)


def test_random_net_study_measures_every_net() -> None:
    study = RandomNetLipschitzStudy(depths=[2, 3], widths=[5], seeds=[0, 1], input_shape=(4,))
    x = torch.randn(32, 4, dtype=torch.float64)
    study.step((x, x, x), "test")
    out = study.extra_epoch_metrics("test", {})
    assert out["test/ordering_violations"] == 0 and out["test/flip_gap_max"] <= 1e-4
    mean_flip = sum(flip_bound(linear_weights(study.net(3, 5, s))).bound for s in (0, 1)) / 2
    assert float(out["test/d3_w5/flip"]) == pytest.approx(mean_flip, rel=1e-9)
    assert float(out["test/d3_w5/trivial"]) >= float(out["test/d3_w5/eclipse_fast"])
    assert float(out["test/d2_w5/flip_over_eclipse_max"]) <= 1 + 1e-9
    assert float(out["test/d3_w5/seconds_flip_over_eclipse_max"]) > 0
    with pytest.raises(ConfigError, match="slope bounds"):
        RandomNetLipschitzStudy(activation="silu")


def test_eclipse_fast_never_worse_than_the_product_of_norms() -> None:
    study = RandomNetLipschitzStudy(input_shape=(4,))
    for seed in range(3):
        net = study.net(4, 6, seed)
        ws = linear_weights(net)
        assert eclipse_fast_bound(ws).bound <= trivial_bound(ws) * (1 + 1e-12)
