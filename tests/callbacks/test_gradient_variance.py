"""GradientVariance / estimate_gradient_variance against a naive loop of single-sample backward passes,
the unbiased |G|^2 and the noise scale against Monte Carlo with a known distribution of gradients."""

from __future__ import annotations

import copy
import json
import logging
import math

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from callbacks.diagnostic import Schedule
from callbacks.gradient_variance import GradientVariance, estimate_gradient_variance
from datamodules.base import BatchedTensorLoader
from modules.components.grad_variance import GradientVarianceEstimator, GradStats, finalize, per_sample_gradients
from modules.components.tiny_gpt import TinyGPT
from tests.helpers import CleanDistributedExit


def naive_rows(model: nn.Module, loss_fn, batch) -> list[list[torch.Tensor]]:
    """Per-sample gradients from B backward passes, one list of flattened parameter gradients per sample."""
    x, y = batch
    params = [p for p in model.parameters() if p.requires_grad]
    rows = []
    for i in range(x.shape[0]):
        loss = loss_fn(model, (x[i : i + 1], y[i : i + 1]))[0]
        rows.append([g.reshape(-1) for g in torch.autograd.grad(loss, params)])
    return rows


def naive(model: nn.Module, loss_fn, batch) -> dict:
    """Independent reference: stack per-sample gradients from B backward passes, centre, square."""
    n = batch[0].shape[0]
    names = [k for k, p in model.named_parameters() if p.requires_grad]
    rows = naive_rows(model, loss_fn, batch)
    out = {"groups": {}}
    tot_t, tot_g = 0.0, 0.0
    for j, name in enumerate(names):
        g = torch.stack([r[j] for r in rows])
        t = ((g - g.mean(0)) ** 2).sum().item() / (n - 1)
        g2 = g.mean(0).pow(2).sum().item()
        grp = name.rsplit(".", 1)[0]
        prev = out["groups"].get(grp, (0.0, 0.0))
        out["groups"][grp] = (prev[0] + t, prev[1] + g2)
        tot_t, tot_g = tot_t + t, tot_g + g2
    out["trace"], out["grad_norm_sq"] = tot_t, tot_g
    return out


def cls_loss(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y, reduction="none")


def lm_loss(model, batch):
    x, y = batch
    return F.cross_entropy(model(x).transpose(1, 2), y, reduction="none").mean(1)


def _mlp():
    return nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 3)).double(), cls_loss, (
        torch.randn(10, 5, dtype=torch.float64), torch.randint(0, 3, (10,)))


def _cnn():
    net = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.LayerNorm(144), nn.Linear(144, 3))
    return net.double(), cls_loss, (torch.randn(10, 1, 8, 8, dtype=torch.float64), torch.randint(0, 3, (10,)))


def _gpt():
    net = TinyGPT(vocab_size=20, block_size=12, n_layer=2, n_head=2, n_embd=16, bias=True).double()
    return net, lm_loss, (torch.randint(0, 20, (10, 12)), torch.randint(0, 20, (10, 12)))


@pytest.mark.parametrize("make", [_mlp, _cnn, _gpt], ids=["mlp", "cnn", "tiny_gpt"])
@pytest.mark.parametrize("method", ["auto", "vmap", "loop"])
def test_estimator_matches_naive_loop(make, method):
    torch.manual_seed(0)
    model, loss_fn, batch = make()
    ref = naive(model, loss_fn, batch)
    out = estimate_gradient_variance(model, loss_fn, batch, method=method)
    assert out["trace"] == pytest.approx(ref["trace"], rel=1e-5)
    assert out["grad_norm_sq"] == pytest.approx(ref["grad_norm_sq"], rel=1e-5)
    unbiased = ref["grad_norm_sq"] - ref["trace"] / 10
    assert out["grad_norm_sq_unbiased"] == pytest.approx(unbiased, rel=1e-5)
    assert out["noise_scale_plugin"] == pytest.approx(ref["trace"] / ref["grad_norm_sq"], rel=1e-5)
    if unbiased > 0:
        assert out["noise_scale"] == pytest.approx(ref["trace"] / unbiased, rel=1e-5)
    else:
        assert math.isnan(out["noise_scale"])
    assert set(out["groups"]) == set(ref["groups"])
    for grp, (t, g2) in ref["groups"].items():
        assert out["groups"][grp]["trace"] == pytest.approx(t, rel=1e-5, abs=1e-14)
        assert out["groups"][grp]["grad_norm_sq"] == pytest.approx(g2, rel=1e-5, abs=1e-14)
    assert all(p.grad is None for p in model.parameters())  # .grad never written


def test_auto_picks_the_fast_path_where_it_covers_the_model():
    torch.manual_seed(0)
    chosen = {}
    for name, make in [("mlp", _mlp), ("cnn", _cnn), ("gpt", _gpt)]:
        model, loss_fn, batch = make()
        est = GradientVarianceEstimator("auto")
        est(model, loss_fn, batch)
        chosen[name] = est.chosen
    # the CNN's conv weights are not covered by the hooks, so it goes to vmap
    assert chosen == {"mlp": "hooks", "cnn": "vmap", "gpt": "hooks"}


@pytest.mark.parametrize("ghost", ["always", "never"])
def test_hook_path_tied_weights_positional_embedding_and_ghost_norms(ghost):
    # TinyGPT ties head.weight to tok_emb.weight and calls pos_emb on arange(T) (no batch dimension):
    # both must be handled exactly; T == B makes the batch dimension ambiguous by shape alone
    torch.manual_seed(1)
    model = TinyGPT(vocab_size=16, block_size=8, n_layer=1, n_head=2, n_embd=8).double()
    batch = (torch.randint(0, 16, (8, 8)), torch.randint(0, 16, (8, 8)))
    ref = naive(model, lm_loss, batch)
    out = GradientVarianceEstimator("hooks", ghost=ghost)(model, lm_loss, batch)
    assert out["trace"] == pytest.approx(ref["trace"], rel=1e-5)
    assert out["groups"]["pos_emb"]["trace"] == pytest.approx(ref["groups"]["pos_emb"][0], rel=1e-5)
    assert out["groups"]["tok_emb"]["trace"] == pytest.approx(ref["groups"]["tok_emb"][0], rel=1e-5)


class _ItemNet(nn.Module):
    """A layer vmap cannot trace (data-dependent Python control flow)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 3, dtype=torch.float64))

    def forward(self, x):
        return x @ self.w * (2.0 if x.sum().item() > 0 else 1.0)


def test_auto_falls_back_to_the_loop_and_logs_it(caplog):
    torch.manual_seed(0)
    model = _ItemNet()
    batch = (torch.randn(6, 4, dtype=torch.float64), torch.randint(0, 3, (6,)))
    with caplog.at_level(logging.INFO, logger="modules.components.grad_variance"):
        est = GradientVarianceEstimator("auto")
        out = est(model, cls_loss, batch)
    assert est.chosen == "loop"
    assert "using the loop" in caplog.text and "'loop' method" in caplog.text
    assert out["trace"] == pytest.approx(naive(model, cls_loss, batch)["trace"], rel=1e-5)


def test_bad_per_sample_loss_shape_is_a_clear_error():
    model, _, batch = _mlp()
    with pytest.raises(ValueError, match="one loss per sample"):
        estimate_gradient_variance(model, lambda m, b: cls_loss(m, b).mean(), batch)


@pytest.mark.parametrize("make", [_mlp, _gpt], ids=["mlp", "tiny_gpt"])
@pytest.mark.parametrize("method", ["auto", "vmap", "loop"])
def test_per_sample_gradients_are_the_naive_rows(make, method):
    torch.manual_seed(0)
    model, loss_fn, batch = make()
    ref = torch.stack([torch.cat(r) for r in naive_rows(model, loss_fn, batch)])
    out = per_sample_gradients(model, loss_fn, batch, method=method)
    assert out.shape == ref.shape and out.dtype == torch.float64
    assert torch.allclose(out, ref, rtol=1e-6, atol=1e-12)
    assert all(p.grad is None for p in model.parameters())


def test_unbiased_grad_norm_and_noise_scale_on_a_known_gradient_distribution():
    """g_i ~ N(mu, diag(s^2)) i.i.d.: |G|^2 = |mu|^2 and tr(Sigma) = sum s^2 are known exactly.

    Over R batches of n, the mean of grad_norm_sq_unbiased is |G|^2 within 4 standard errors, while the
    plug-in |gbar|^2 sits at |G|^2 + tr(Sigma)/n; the ratio of the means (the noise scale averaged the
    recommended way) is tr(Sigma)/|G|^2, while the plug-in ratio is B / (1 + B / n), below n.
    """
    g = torch.Generator().manual_seed(0)
    d, n, reps = 20, 8, 4000
    mu = torch.full((d,), 0.1, dtype=torch.float64)
    s = torch.linspace(0.2, 0.6, d, dtype=torch.float64)
    true_g2, true_tr = mu.pow(2).sum().item(), s.pow(2).sum().item()  # B_simple = 2.93 / 0.2 = 14.6 > n
    unb, plug, tr = [], [], []
    for _ in range(reps):
        rows = mu + s * torch.randn(n, d, generator=g, dtype=torch.float64)
        stats = GradStats(n=n)
        stats.add_per_sample("w", rows)
        out = finalize(stats, {})
        unb.append(out["grad_norm_sq_unbiased"])
        plug.append(out["grad_norm_sq"])
        tr.append(out["trace"])
    unb, plug, tr = torch.tensor(unb), torch.tensor(plug), torch.tensor(tr)
    se = lambda v: v.std().item() / reps**0.5  # noqa: E731
    assert abs(unb.mean().item() - true_g2) < 4 * se(unb)
    assert abs(tr.mean().item() - true_tr) < 4 * se(tr)
    assert abs(plug.mean().item() - (true_g2 + true_tr / n)) < 4 * se(plug)
    assert (plug.mean().item() - true_g2) > 10 * se(plug)  # the plug-in is visibly biased here
    b_simple = true_tr / true_g2
    assert tr.mean().item() / unb.mean().item() == pytest.approx(b_simple, rel=0.05)
    plug_ratio = tr.mean().item() / plug.mean().item()
    assert plug_ratio == pytest.approx(b_simple / (1 + b_simple / n), rel=0.05) and plug_ratio < n < b_simple


def test_noise_scale_is_invariant_to_the_loss_scale_and_trace_is_not():
    """Half the loss: a quarter of tr(Sigma), the same noise scale (why raw variances cannot rank estimators)."""
    torch.manual_seed(0)
    model, loss_fn, batch = _mlp()
    full = estimate_gradient_variance(model, loss_fn, batch)
    half = estimate_gradient_variance(model, lambda m, b: 0.5 * loss_fn(m, b), batch)
    assert half["trace"] == pytest.approx(0.25 * full["trace"], rel=1e-10)
    assert half["grad_norm_sq_unbiased"] == pytest.approx(0.25 * full["grad_norm_sq_unbiased"], rel=1e-10)
    for k in ("noise_scale", "noise_scale_plugin"):
        assert half[k] == pytest.approx(full[k], rel=1e-10)


# --- the callback ------------------------------------------------------------------------------------------
class TinyClassifier(L.LightningModule):
    def __init__(self, lr: float = 0.05) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.LayerNorm(8), nn.Linear(8, 3))
        self.lr = lr
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(64, 4, generator=g), torch.randint(0, 3, (64,), generator=g)

    def per_sample_loss(self, batch):
        x, y = batch
        return F.cross_entropy(self.net(x), y, reduction="none")

    def training_step(self, batch, batch_idx):
        return self.per_sample_loss(batch).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)

    def train_dataloader(self):
        t = self.trainer
        return BatchedTensorLoader((self.x, self.y), 16, rank=t.global_rank, world_size=t.world_size)


class DumpGradientVariance(GradientVariance):
    """Writes rank 0's first result to a file (a multi-process launcher does not return callback state)."""

    def __init__(self, path: str, **kw) -> None:
        super().__init__(**kw)
        self.path = path

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        super().on_before_optimizer_step(trainer, pl_module, optimizer)
        if trainer.global_rank == 0 and self.history and len(self.history) == 1:
            r = self.history[0]
            with open(self.path, "w") as f:
                json.dump({"trace": r["trace"], "grad_norm_sq": r["grad_norm_sq"], "n": r["n"]}, f)


def _fit(callbacks, **kw):
    model = TinyClassifier()
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks, **kw)
    trainer.fit(model)
    return model


def test_callback_value_and_cadence_and_unchanged_step():
    cb = GradientVariance(schedule=Schedule(every_n_steps=2))
    model = _fit([cb], max_steps=4, devices=1)
    assert [h["step"] for h in cb.history] == [0, 2]
    # step 0 is measured on the first batch with the initial weights: compare with the naive loop
    ref_model = TinyClassifier()
    ref = naive(ref_model.net, cls_loss, (ref_model.x[:16], ref_model.y[:16]))
    assert cb.history[0]["trace"] == pytest.approx(ref["trace"], rel=1e-5)
    assert cb.history[0]["net.0/trace"] == pytest.approx(ref["groups"]["0"][0], rel=1e-5)  # ref on model.net
    assert cb.history[0]["minibatch_var"] == pytest.approx(ref["trace"] / 16, rel=1e-5)
    assert {"trace", "noise_scale", "grad_norm_sq", "net.0/trace"} <= set(cb.history[0])
    plain = _fit([], max_steps=4, devices=1)
    for a, b in zip(model.parameters(), plain.parameters()):
        assert torch.equal(a, b)


class SnapshotNet(L.Callback):
    """A float64 copy of the network at every ``on_before_optimizer_step`` (the weights being measured)."""

    def __init__(self) -> None:
        self.nets: dict[int, nn.Module] = {}

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.nets[trainer.global_step] = copy.deepcopy(pl_module.net).double()


def test_callback_with_accumulation_and_bf16_mixed_measures_the_last_micro_batch_in_full_precision():
    """Under bf16-mixed with 2 accumulated micro-batches, every measurement equals the float64 naive loop on
    the window's last micro-batch at the weights of that step: a bf16 computation (autocast left on) would
    miss by about 1e-2, the first micro-batch or the wrong step by far more."""
    cb, snap = GradientVariance(schedule=Schedule(every_n_steps=1)), SnapshotNet()
    kw = dict(max_steps=3, devices=1, accumulate_grad_batches=2, precision="bf16-mixed")
    model = _fit([cb, snap], **kw)
    assert [h["step"] for h in cb.history] == [0, 1, 2] and all(h["n"] == 16 for h in cb.history)
    data = TinyClassifier()
    for h in cb.history:
        s = int(h["step"])
        i = (2 * s + 1) % 4  # micro-batches 2s and 2s + 1 make step s; 4 micro-batches per epoch
        last = slice(16 * i, 16 * (i + 1))
        ref = naive(snap.nets[s], cls_loss, (data.x[last].double(), data.y[last]))
        assert h["trace"] == pytest.approx(ref["trace"], rel=1e-5)
        assert h["grad_norm_sq"] == pytest.approx(ref["grad_norm_sq"], rel=1e-5)
        assert h["noise_scale_plugin"] == pytest.approx(ref["trace"] / ref["grad_norm_sq"], rel=1e-5)
    plain = _fit([], **kw)
    for a, b in zip(model.parameters(), plain.parameters()):
        assert torch.equal(a, b)


def test_missing_protocol_method_is_a_clear_error():
    class NoProtocol(TinyClassifier):
        per_sample_loss = None

    with pytest.raises(ValueError, match="per_sample_loss"):
        L.Trainer(accelerator="cpu", max_steps=1, logger=False, callbacks=[GradientVariance()],
                  enable_progress_bar=False).fit(NoProtocol())


def test_callback_under_ddp_equals_single_process_on_the_global_batch(tmp_path):
    single, ddp = tmp_path / "single.json", tmp_path / "ddp.json"
    _fit([DumpGradientVariance(str(single), schedule=Schedule(every_n_steps=10))], max_steps=1, devices=1)
    _fit([DumpGradientVariance(str(ddp), schedule=Schedule(every_n_steps=10)), CleanDistributedExit()], max_steps=1, devices=2,
         strategy="ddp_fork")  # forked, not spawned: no re-import of torch and Lightning per rank
    a, b = json.loads(single.read_text()), json.loads(ddp.read_text())
    assert a["n"] == b["n"] == 16
    assert b["trace"] == pytest.approx(a["trace"], rel=1e-5)
    assert b["grad_norm_sq"] == pytest.approx(a["grad_norm_sq"], rel=1e-5)
