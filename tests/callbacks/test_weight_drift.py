"""WeightDrift: numbers against direct computation, layer roles, state round trip and Trainer resume."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn

from callbacks.diagnostic import Schedule
from callbacks.weight_drift import InputSourceTracer, WeightDrift, weight_stats
from datamodules.random_gaussian import RandomGaussianDataModule
from modules.components.resnet import ResNet
from modules.components.tiny_gpt import TinyGPT
from modules.components.vit import ViT
from tests.helpers import drift_model


def _trainer(callbacks, max_steps, **kw):
    return L.Trainer(
        callbacks=callbacks,
        max_steps=max_steps,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        accelerator="cpu",
        **({"enable_checkpointing": False} | kw),
    )


def test_weight_stats_by_hand():
    w0 = torch.tensor([[0.5, -0.25], [1.0, -1.0]])
    w = torch.tensor([[0.25, -0.5], [1.0, 0.5]])
    mean, frac_neg, drift = weight_stats(w, w0)
    assert mean == pytest.approx((0.25 - 0.5 + 1.0 + 0.5) / 4)
    assert frac_neg == pytest.approx(1 / 4)
    assert drift == pytest.approx((-0.25 - 0.25 + 0.0 + 1.5) / 4)


@pytest.mark.parametrize(
    "net, expected",
    [
        (
            nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 2)),
            {"0": "other", "2": "downstream", "4": "symmetric"},
        ),
        (
            nn.Sequential(
                nn.Linear(3, 4), nn.Identity(), nn.Linear(4, 4), nn.SiLU(), nn.Dropout(0.5), nn.Linear(4, 2)
            ),
            {"0": "other", "2": "symmetric", "5": "downstream"},
        ),
    ],
)
def test_roles_hand_built(net, expected):
    with InputSourceTracer(net) as tracer:
        net(torch.randn(5, 3))
    assert tracer.roles == expected


def test_roles_on_every_architecture():
    torch.manual_seed(0)
    with InputSourceTracer(TinyGPT()) as t:
        t.model(torch.randint(0, 128, (2, 8)))
    down = sorted(n for n, r in t.roles.items() if r == "downstream")
    assert down == [f"blocks.{i}.mlp.proj" for i in range(3)]
    with InputSourceTracer(ViT()) as t:
        t.model(torch.rand(2, 1, 8, 8))
    assert sorted(n for n, r in t.roles.items() if r == "downstream") == [
        f"blocks.{i}.mlp.proj" for i in range(3)
    ]
    with InputSourceTracer(ResNet()) as t:
        t.model(torch.rand(2, 1, 8, 8))
    # every conv after the stem reads a ReLU output, and so does the classifier (through pool + flatten)
    assert t.roles["stem.0"] == "other"
    assert all(r == "downstream" for n, r in t.roles.items() if n != "stem.0")
    assert t.roles["fc"] == "downstream" and t.roles["stages.1.0.shortcut.0"] == "downstream"
    assert t.readout == "fc"


def test_readout_is_the_last_layer_run():
    torch.manual_seed(0)
    for model, x, readout in [
        (TinyGPT(norm="rmsnorm"), torch.randint(0, 128, (2, 8)), "head"),
        (ViT(norm="rmsnorm"), torch.rand(2, 1, 8, 8), "head"),
        (nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)), torch.randn(2, 3), "4"),
    ]:
        with InputSourceTracer(model) as t:
            model(x)
        assert t.readout == readout and t.order[-1] == readout
    # a layer run twice counts where it last ran: the read-out is the last weight layer of the forward pass
    lin, out = nn.Linear(3, 3), nn.Linear(3, 2)

    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.out = lin, out

        def forward(self, x):
            return self.out(self.lin(self.lin(x)))

    with InputSourceTracer(Twice()) as t:
        t.model(torch.randn(2, 3))
    assert t.order == ["lin", "out"] and t.readout == "out"


def _model(**kw):
    return drift_model(hidden=[16, 16], **kw)


def _data():
    return RandomGaussianDataModule(train_size=256, val_size=64, test_size=64, batch_size=32)


def test_logged_values_equal_direct_computation():
    torch.manual_seed(0)
    model = _model(activation="relu", lr=0.1)
    w0 = {n: m.weight.detach().clone() for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    cb = WeightDrift(schedule=Schedule(every_n_steps=4))
    _trainer([cb], 12).fit(model, _data())
    assert [h["step"] for h in cb.history] == [0, 4, 8, 12]
    last = cb.history[-1]
    drifts = []
    for name, w_init in w0.items():
        w = dict(model.named_modules())[name].weight.detach().double()
        assert last[f"{name}/mean"] == pytest.approx(w.mean().item(), abs=1e-12)
        assert last[f"{name}/frac_negative"] == pytest.approx((w < 0).double().mean().item())
        assert last[f"{name}/drift"] == pytest.approx((w - w_init.double()).mean().item(), abs=1e-12)
        if name != "net.layers.0":
            drifts.append((w - w_init.double()).mean().item())
    assert cb.roles == {"net.layers.0": "other", "net.layers.2": "downstream", "net.layers.4": "downstream"}
    assert last["downstream_mean_drift"] == pytest.approx(sum(drifts) / 2, abs=1e-12)
    assert all(cb.history[0][f"{n}/drift"] == 0.0 for n in w0)
    # the read-out (net.layers.4) is kept apart: the hidden summary is layers.2 alone
    assert cb.readout == "net.layers.4"
    w2 = model.net.layers[2].weight.detach().double()
    assert last["hidden_mean_drift"] == pytest.approx((w2 - w0["net.layers.2"].double()).mean().item(), abs=1e-12)
    assert last["hidden_frac_negative"] == pytest.approx((w2 < 0).double().mean().item())
    assert last["readout_drift"] == last["net.layers.4/drift"]
    assert last["readout_frac_negative"] == last["net.layers.4/frac_negative"]
    assert last["hidden_grad_mean"] == last["net.layers.2/grad_mean"]
    assert last["readout_grad_mean"] == last["net.layers.4/grad_mean"]


def test_hidden_summary_is_the_same_quantity_behind_tanh():
    """``hidden_*`` averages the layers reading an activation, biased or symmetric, except the read-out, so the
    relu rows and their tanh control compare one quantity."""
    torch.manual_seed(0)
    model = drift_model(hidden=[16, 16, 16], activation="tanh")
    w0 = {n: m.weight.detach().clone() for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    cb = WeightDrift(schedule=Schedule(every_n_steps=3))
    _trainer([cb], 3).fit(model, _data())
    assert cb.roles == {"net.layers.0": "other", "net.layers.2": "symmetric", "net.layers.4": "symmetric",
                        "net.layers.6": "symmetric"}
    assert cb.readout == "net.layers.6"
    last = cb.history[-1]
    mods = dict(model.named_modules())
    drifts = [(mods[n].weight.detach().double() - w0[n].double()).mean().item() for n in ("net.layers.2", "net.layers.4")]
    assert last["hidden_mean_drift"] == pytest.approx(sum(drifts) / 2, abs=1e-12)
    assert last["hidden_grad_mean"] == pytest.approx(
        (last["net.layers.2/grad_mean"] + last["net.layers.4/grad_mean"]) / 2, abs=1e-15)
    assert "downstream_mean_drift" not in last and last["readout_drift"] == last["net.layers.6/drift"]


def test_grad_mean_is_the_gradient_of_the_logged_step():
    # plain SGD: W_k = W_{k-1} - lr * g_k, so mean(g_k) = -(mean W_k - mean W_{k-1}) / lr
    torch.manual_seed(0)
    lr = 0.1
    cb = WeightDrift(schedule=Schedule(every_n_steps=1))
    _trainer([cb], 5).fit(_model(lr=lr), _data())
    for prev, cur in zip(cb.history[:-1], cb.history[1:]):
        for n in ("net.layers.0", "net.layers.2", "net.layers.4"):
            expected = -(cur[f"{n}/mean"] - prev[f"{n}/mean"]) / lr
            # float32 weights: the mean of W_k - W_{k-1} carries ~1e-9 rounding, so 1e-7 after dividing by lr
            assert cur[f"{n}/grad_mean"] == pytest.approx(expected, rel=1e-3, abs=1e-7)
    # layers.4 is the CE read-out: its mean gradient is 0 by construction (softmax gradients sum to 0)
    assert max(abs(h["net.layers.4/grad_mean"]) for h in cb.history[1:]) < 1e-7
    assert max(abs(h["net.layers.2/grad_mean"]) for h in cb.history[1:]) > 1e-5  # far above the tolerance


def test_state_dict_round_trip():
    torch.manual_seed(0)
    model = _model()
    cb = WeightDrift(schedule=Schedule(every_n_steps=2))
    _trainer([cb], 4).fit(model, _data())
    state = cb.state_dict()
    fresh = WeightDrift(schedule=Schedule(every_n_steps=2))
    fresh.load_state_dict(state)
    for n, w in cb.initial.items():
        assert torch.equal(fresh.initial[n], w)
    assert fresh.roles == cb.roles and fresh.history == cb.history and fresh.readout == cb.readout == "net.layers.4"
    assert fresh.compute(model) == cb.compute(model)


def test_resume_from_checkpoint_keeps_true_initialisation(tmp_path):
    torch.manual_seed(0)
    model = _model(lr=0.2)
    w0 = {n: m.weight.detach().clone() for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    ckpt = ModelCheckpoint(dirpath=tmp_path, save_last=True, every_n_train_steps=6)
    _trainer([WeightDrift(schedule=Schedule(every_n_steps=3)), ckpt], 6, enable_checkpointing=True,
             default_root_dir=tmp_path).fit(model, _data())
    path = tmp_path / "last.ckpt"
    assert path.exists()

    torch.manual_seed(1)
    resumed_model = _model(lr=0.2)  # different init: drift must still be from the first W_0
    cb = WeightDrift(schedule=Schedule(every_n_steps=3))
    _trainer([cb], 12, enable_checkpointing=True, default_root_dir=tmp_path).fit(
        resumed_model, _data(), ckpt_path=str(path)
    )
    for n, w in w0.items():
        assert torch.equal(cb.initial[n].cpu(), w)
    last = cb.history[-1]
    assert last["step"] == 12 and [h["step"] for h in cb.history] == [0, 3, 6, 9, 12]
    w = resumed_model.net.layers[2].weight.detach().double()
    assert last["net.layers.2/drift"] == pytest.approx(
        (w - w0["net.layers.2"].double()).mean().item(), abs=1e-12
    )


def test_bad_arguments():
    with pytest.raises(ValueError, match="every_n_steps"):
        WeightDrift(schedule=Schedule(every_n_steps=-1))
    with pytest.raises(ValueError, match="never measure"):
        WeightDrift(schedule=Schedule(at_fit_start=False))
