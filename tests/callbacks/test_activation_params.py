"""callbacks/activation_params.py: CauchyAct and node parameters read back exactly, layers selected by what they
declare, errors, figure."""

from __future__ import annotations

import functools

import lightning as L
import pytest
import torch

from callbacks.activation_params import ActivationParamTracker, activation_param_values
from callbacks.diagnostic import Schedule
from datamodules.collocation import CollocationDataModule
from errors import ConfigError
from modules.components.activations import CauchyAct, GaussianAct
from modules.components.local_basis import AdaptiveNodes, CauchyNodes, NodeState, ResidualCAN
from modules.components.mlp import MLP
from modules.residual_can import CauchyPINN


def test_values_are_the_parameters():
    m = CauchyPINN(net=functools.partial(ResidualCAN, width=4, depth=2, n_nodes=8))
    with torch.no_grad():
        m.net.main.layers[1].lambda1.fill_(0.25)
        m.net.residual.logits.copy_(torch.log(torch.tensor([4.0, 1, 1, 1, 1, 1, 1, 1])))
    values, nodes = activation_param_values(m)
    assert values["net.main.layers.1/lambda1"] == 0.25 and values["net.main.layers.3/lambda2"] == 1.0
    assert values["net.main.layers.1/d"] == pytest.approx(1.0, rel=1e-6)
    assert values["net.residual/scale"] == pytest.approx(0.1)
    p = torch.tensor([4.0, 1, 1, 1, 1, 1, 1, 1]) / 11
    assert values["net.residual/effective_nodes"] == pytest.approx(torch.exp(-(p * p.log()).sum()).item(), rel=1e-6)
    assert values["net.residual/max_weight"] == pytest.approx(4 / 11, rel=1e-6)
    assert values["net.residual/centre_min"] == pytest.approx(-1.0) and values["net.residual/centre_max"] == pytest.approx(1.0)
    assert nodes["net.residual"]["centres"] == pytest.approx(torch.linspace(-1, 1, 8).tolist(), abs=1e-6)


def test_training_logs_changes_and_a_figure(tmp_path):
    torch.manual_seed(0)
    m = CauchyPINN(net=functools.partial(ResidualCAN, width=8, depth=1, n_nodes=8))
    tracker = ActivationParamTracker(schedule=Schedule(every_n_steps=2))
    trainer = L.Trainer(max_epochs=1, limit_train_batches=4, limit_val_batches=0, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=[tracker], default_root_dir=tmp_path)
    trainer.fit(m, CollocationDataModule(n_collocation=64, steps_per_epoch=4, seed=0))
    steps = [h["step"] for h in tracker.history]
    assert steps == [0.0, 2.0, 4.0] and len(tracker.node_history) == 3
    assert tracker.history[0]["net.main.layers.1/lambda1"] == 1.0
    assert tracker.history[-1]["net.main.layers.1/lambda1"] != 1.0  # Adam moved it
    assert "diag/activation_params/net.residual/scale" in trainer.callback_metrics
    assert tracker.figure() is not None
    state = tracker.state_dict()
    fresh = ActivationParamTracker(schedule=Schedule(every_n_steps=2))
    fresh.load_state_dict(state)
    assert fresh.node_history == tracker.node_history


def test_a_model_without_cauchy_parts_is_refused_or_skipped(tmp_path):
    m = CauchyPINN(net=functools.partial(MLP, activation="silu", hidden=[4]))
    dm = CollocationDataModule(n_collocation=16, steps_per_epoch=1)

    def fit(tracker):
        trainer = L.Trainer(max_epochs=1, limit_train_batches=1, limit_val_batches=0, logger=False,
                            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                            callbacks=[tracker], default_root_dir=tmp_path)
        trainer.fit(m, dm)

    with pytest.raises(ConfigError, match="found no CauchyAct"):
        fit(ActivationParamTracker())
    skip = ActivationParamTracker(if_unsupported="skip")
    fit(skip)
    assert skip.history == []


class _Gain(torch.nn.Module):
    """Not an activation class the tracker knows: it declares a shape parameter and nothing else."""

    shape_parameters = ("gain",)

    def __init__(self) -> None:
        super().__init__()
        self.gain = torch.nn.Parameter(torch.tensor(0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gain * x


class _UndeclaredCauchy(CauchyAct):
    """A CauchyAct that declares no shape parameters: the tracker must not pick it by its class."""

    shape_parameters = ()


class _TwoNodes(torch.nn.Module):
    """An ``AdaptiveNodes`` layer that is no ``LocalBasisResidual``."""

    def __init__(self) -> None:
        super().__init__()
        self.centres = torch.nn.Parameter(torch.tensor([[-0.5], [0.5]]))

    def node_state(self) -> NodeState:
        return NodeState(self.centres, torch.tensor([0.1, 0.3]), torch.tensor([0.25, 0.75]), torch.tensor(2.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def test_layers_are_selected_by_what_they_declare_not_by_class():
    model = torch.nn.Sequential(_Gain(), _UndeclaredCauchy(), _TwoNodes(), GaussianAct(a=0.5))
    values, nodes = activation_param_values(model)
    assert values["0/gain"] == 0.5 and values["3/a"] == pytest.approx(0.5, rel=1e-6)
    assert not any(k.startswith("1/") for k in values)  # a CauchyAct subclass that declares nothing
    assert values["2/scale"] == 2.0 and values["2/max_weight"] == 0.75
    assert values["2/centre_mean"] == 0.0 and values["2/width_min"] == pytest.approx(0.1)
    p = torch.tensor([0.25, 0.75], dtype=torch.float64)
    assert values["2/effective_nodes"] == pytest.approx(torch.exp(-(p * p.log()).sum()).item())
    assert nodes == {"2": {"centres": [-0.5, 0.5], "widths": pytest.approx([0.1, 0.3]), "weights": [0.25, 0.75]}}
    assert isinstance(CauchyNodes(n_nodes=4), AdaptiveNodes) and not isinstance(CauchyAct(), AdaptiveNodes)
    tracker = ActivationParamTracker(if_unsupported="skip")
    assert tracker.unsupported_reason(None, torch.nn.Sequential(_Gain())) is None
    assert "found no CauchyAct" in tracker.unsupported_reason(None, torch.nn.Sequential(_UndeclaredCauchy()))
