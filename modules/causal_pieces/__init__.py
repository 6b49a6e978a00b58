"""Causal pieces (paper 000-01, Dold & Petersen): a single-spike time-to-first-spike SNN.

``CausalPiecesSNN`` is a feedforward network of current-based integrate-and-fire neurons with exponential
synapses in which every neuron spikes at most once. The spike times come from the exact closed forms in
``neurons.py`` (nLIF, or LIF with ``tau_m = tau_s`` / ``2 tau_s``) or from a time-stepped grid simulation.
Training follows Goeltz et al. (2021): cross-entropy on ``softmax(-t_out / (xi tau_s))`` plus
``alpha (exp(t_label / (beta tau_s)) - 1)``, Adam, StepLR, and weight bumping for silent neurons.

The module exposes ``spike_times(batch)``, the protocol of ``callbacks.causal_pieces.CausalPieceCounter``:
a list with one ``(t_pre (B, N_in), t_post (B, N_out))`` pair per layer.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import lightning as L
import torch
from torch import Tensor, nn
from torchmetrics import MaxMetric, MeanMetric
from torchmetrics.classification import MulticlassAccuracy

from modules.causal_pieces.neurons import (
    grid_first_spike_times,
    lif_first_spike_times,
    nlif_first_spike_times,
)

__all__ = [
    "CausalPiecesSNN",
    "grid_first_spike_times",
    "lif_first_spike_times",
    "nlif_first_spike_times",
    "ttfs_loss",
]

NEURONS = ("nlif", "lif", "lif_grid")


def ttfs_loss(
    t_out: Tensor,
    y: Tensor,
    tau_s: float = 1.0,
    xi: float = 0.2,
    alpha: float = 0.005,
    beta: float = 1.0,
    t_no_spike: float = 10.0,
) -> Tensor:
    """Goeltz et al.'s loss: ``CE(softmax(-t/(xi tau_s)), y) + alpha (exp(t_y/(beta tau_s)) - 1)``.

    Missing output spikes (``inf``) enter as the finite time ``t_no_spike`` so the loss stays finite; they
    carry no gradient, which is why silent neurons are revived by weight bumping.
    """
    t = torch.where(torch.isfinite(t_out), t_out, torch.full_like(t_out, t_no_spike))
    ce = nn.functional.cross_entropy(-t / (xi * tau_s), y)
    t_label = t.gather(1, y[:, None]).squeeze(1)
    reg = alpha * (torch.exp(t_label / (beta * tau_s)) - 1.0)
    return ce + reg.mean()


class CausalPiecesSNN(L.LightningModule):
    """Feedforward single-spike SNN ``n_inputs -> hidden_sizes -> n_classes``; class = earliest output spike.

    Args:
        n_inputs: input spike trains per sample, bias spikes included (Yin-Yang: 4 + 1 bias).
        hidden_sizes: widths of the hidden layers.
        n_classes: output neurons, one per class.
        neuron: ``"nlif"`` (no leak, exact closed form), ``"lif"`` (leak, exact closed form for
            ``tau_m = tau_s`` or ``2 tau_s``) or ``"lif_grid"`` (time-stepped simulation on a ``grid_dt`` grid).
        tau_s: synaptic time constant (the unit of time).
        theta: firing threshold ``theta``.
        tau_m: membrane time constant; ``None`` = no leak (required for ``"nlif"``, allowed for ``"lif_grid"``).
        grid_dt, grid_t_max: step and horizon of the ``"lif_grid"`` simulation (units of tau_s).
        init_mean, init_std: mean and standard deviation of the Gaussian initial weights, one per layer.
        positive_weights: keep all weights >= 0 (initialise with ``|w|``, clamp after every step).
        xi, alpha, beta: loss parameters (softmax temperature, size and time scale of the early-spike term).
        t_no_spike: the finite time a missing output spike takes in the loss.
        lr, lr_step, lr_gamma: Adam learning rate and its StepLR schedule (epochs, factor).
        weight_bump: added to all incoming weights of a neuron silent on more than ``max_missing`` of a batch.
        max_missing: per layer, the largest tolerated fraction of samples on which a neuron stays silent.
        bump_iters: at most this many bump-and-recompute rounds per training batch.
        init_seed: seed of the weight initialisation (``None``: the global torch generator).
    """

    paper_id = "000-01"
    monitor = "val/acc"
    monitor_mode = "max"

    def __init__(
        self,
        n_inputs: int = 5,
        hidden_sizes: Sequence[int] = (120,),
        n_classes: int = 3,
        neuron: str = "nlif",
        tau_s: float = 1.0,
        theta: float = 1.0,
        tau_m: float | None = None,
        grid_dt: float = 0.01,
        grid_t_max: float = 8.0,
        init_mean: Sequence[float] = (1.5, 0.5),
        init_std: Sequence[float] = (0.8, 0.8),
        positive_weights: bool = False,
        xi: float = 0.2,
        alpha: float = 0.005,
        beta: float = 1.0,
        t_no_spike: float = 10.0,
        lr: float = 5e-3,
        lr_step: int = 20,
        lr_gamma: float = 0.95,
        weight_bump: float = 5e-4,
        max_missing: Sequence[float] = (0.3, 0.0),
        bump_iters: int = 20,
        init_seed: int | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        sizes = [n_inputs, *hidden_sizes, n_classes]
        if any(int(s) <= 0 for s in sizes):
            raise ValueError(f"layer sizes must be positive, got n_inputs={n_inputs}, hidden={list(hidden_sizes)}")
        n_layers = len(sizes) - 1
        for name, vals in (("init_mean", init_mean), ("init_std", init_std), ("max_missing", max_missing)):
            if len(vals) != n_layers:
                raise ValueError(f"{name} needs one value per layer ({n_layers}), got {list(vals)}")
        if neuron not in NEURONS:
            raise ValueError(f"neuron must be one of {NEURONS}, got {neuron!r}")
        if neuron == "nlif" and tau_m is not None:
            raise ValueError("neuron='nlif' has no leak: set tau_m to null, or use neuron='lif'/'lif_grid'")
        if neuron == "lif":
            if tau_m is None or not (
                math.isclose(tau_m, tau_s, rel_tol=1e-12) or math.isclose(tau_m, 2 * tau_s, rel_tol=1e-12)
            ):
                raise ValueError(
                    f"neuron='lif' needs tau_m = tau_s or 2 tau_s (got tau_m={tau_m}, tau_s={tau_s}); "
                    "use neuron='lif_grid' for other values"
                )
        if bump_iters < 0 or weight_bump < 0:
            raise ValueError(f"bump_iters and weight_bump must be >= 0, got {bump_iters} and {weight_bump}")
        if tau_s <= 0 or theta <= 0 or (tau_m is not None and tau_m <= 0):
            raise ValueError(f"tau_s, theta and tau_m must be positive, got {tau_s}, {theta}, {tau_m}")
        self.sizes = [int(s) for s in sizes]
        gen = torch.Generator().manual_seed(init_seed) if init_seed is not None else None
        weights = []
        for l in range(n_layers):
            w = torch.randn(sizes[l], sizes[l + 1], generator=gen, dtype=torch.float64) * init_std[l] + init_mean[l]
            weights.append(nn.Parameter(w.abs() if positive_weights else w))
        self.weights = nn.ParameterList(weights)
        self.train_acc = MulticlassAccuracy(n_classes, average="micro")
        self.val_acc = MulticlassAccuracy(n_classes, average="micro")
        self.test_acc = MulticlassAccuracy(n_classes, average="micro")
        self.val_acc_best = MaxMetric()
        self.train_loss = MeanMetric()
        self.val_loss = MeanMetric()
        self.test_loss = MeanMetric()

    # ---- forward ---------------------------------------------------------------------------------
    def layer_spike_times(self, t_in: Tensor, w: Tensor) -> Tensor:
        """Output spike times of one layer for input times ``t_in`` and weights ``w``."""
        hp = self.hparams
        if hp.neuron == "nlif":
            return nlif_first_spike_times(t_in, w, hp.tau_s, hp.theta)
        if hp.neuron == "lif":
            return lif_first_spike_times(t_in, w, hp.tau_s, hp.theta, hp.tau_m)
        return grid_first_spike_times(t_in, w, hp.tau_s, hp.theta, hp.tau_m, hp.grid_dt, hp.grid_t_max)

    def _as_times(self, x: Tensor) -> Tensor:
        if x.dim() != 2:
            x = x.flatten(1)
        if x.shape[1] != self.sizes[0]:
            raise ValueError(
                f"the network expects {self.sizes[0]} input spike times per sample (bias spikes included), got "
                f"{x.shape[1]}: set model.n_inputs to {x.shape[1]} or use a spike-encoding DataModule"
            )
        if torch.isnan(x).any():
            raise ValueError("input spike times contain NaN: encode 'no spike' as +inf, not NaN")
        return x.to(self.weights[0].dtype)

    def all_spike_times(self, x: Tensor) -> list[Tensor]:
        """Spike times of every layer: ``[t_input, t_hidden_1, ..., t_output]``."""
        times = [self._as_times(x)]
        for w in self.weights:
            times.append(self.layer_spike_times(times[-1], w))
        return times

    def forward(self, x: Tensor) -> Tensor:
        """Output spike times ``(B, n_classes)``; ``inf`` = no spike."""
        return self.all_spike_times(x)[-1]

    def spike_times(self, batch) -> list[tuple[Tensor, Tensor]]:
        """Protocol for ``CausalPieceCounter``: ``[(t_pre, t_post)]`` per layer, for inputs ``batch[0]``."""
        x = batch[0] if isinstance(batch, (tuple, list)) else batch
        with torch.no_grad():
            times = self.all_spike_times(x)
        return list(zip(times[:-1], times[1:]))

    @staticmethod
    def predict_from_times(t_out: Tensor) -> Tensor:
        """The class of the earliest output spike (ties: lowest index; no spike at all: class 0)."""
        return torch.argmin(t_out, dim=1)

    # ---- training --------------------------------------------------------------------------------
    def _step(self, batch, stage: str) -> tuple[Tensor, list[Tensor]]:
        x, y = batch
        times = self.all_spike_times(x)
        t_out = times[-1]
        hp = self.hparams
        loss = ttfs_loss(t_out, y, hp.tau_s, hp.xi, hp.alpha, hp.beta, hp.t_no_spike)
        preds = self.predict_from_times(t_out)
        getattr(self, f"{stage}_acc").update(preds, y)
        getattr(self, f"{stage}_loss").update(loss.detach())
        self.log(
            f"{stage}/acc",
            getattr(self, f"{stage}_acc"),
            on_step=False,
            on_epoch=True,
            prog_bar=stage != "train",
        )
        self.log(f"{stage}/loss", getattr(self, f"{stage}_loss"), on_step=False, on_epoch=True)
        return loss, times

    def training_step(self, batch, batch_idx: int) -> Tensor:
        loss, times = self._step(batch, "train")
        if not torch.isfinite(loss):
            raise FloatingPointError("the loss is not finite: lower model.lr or model.alpha, or raise model.t_no_spike")
        return loss

    def bump_silent_weights(self, x: Tensor, reduce=None) -> int:
        """Weight bumping (Goeltz et al.), after the optimiser step: while some neuron of layer ``l`` is silent
        on more than ``max_missing[l]`` of the batch ``x``, add ``weight_bump * 2^r`` (round ``r``) to all its
        incoming weights and recompute the spike times (at most ``bump_iters`` rounds; the doubling keeps the
        number of rounds logarithmic in the needed bump). Returns the number of rounds.

        Without the repetition, output neurons that the cross-entropy pushes ever later fall off the
        nLIF cliff (``t -> inf`` as ``sum_C w -> theta / tau_s``) faster than single bumps revive them, and
        training collapses to missing outputs. ``reduce`` averages the silent fractions over DDP ranks so
        that every replica applies the same bump.
        """
        hp = self.hparams
        if hp.weight_bump <= 0 and not hp.positive_weights:
            return 0
        rounds = 0
        with torch.no_grad():
            if hp.positive_weights:
                for w in self.weights:
                    w.clamp_(min=0.0)
            while rounds < hp.bump_iters and hp.weight_bump > 0:
                times = self.all_spike_times(x)
                fracs = [torch.isinf(t).double().mean(0) for t in times[1:]]
                if reduce is not None:
                    fracs = [reduce(f) for f in fracs]
                bumps = [(f > m).to(w.dtype) for f, m, w in zip(fracs, hp.max_missing, self.weights)]
                if not any(bool(b.any()) for b in bumps):
                    break
                for w, b in zip(self.weights, bumps):
                    w.add_(hp.weight_bump * 2.0**rounds * b[None, :])
                rounds += 1
        return rounds

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        reduce = None
        if self.trainer.world_size > 1:
            reduce = lambda f: self.trainer.strategy.reduce(f, reduce_op="mean")  # noqa: E731
        self.bump_silent_weights(batch[0], reduce)

    def on_train_epoch_end(self) -> None:
        with torch.no_grad():
            for l, w in enumerate(self.weights):
                self.log(f"train/weight_mean_layer{l}", w.mean().float(), on_step=False, on_epoch=True)

    def validation_step(self, batch, batch_idx: int) -> None:
        _, times = self._step(batch, "val")
        self.log("val/missing_output", torch.isinf(times[-1]).all(1).float().mean(), on_step=False, on_epoch=True)
        if len(times) > 2:
            silent = torch.cat([torch.isinf(t) for t in times[1:-1]], dim=1).float().mean()
            self.log("val/silent_hidden", silent, on_step=False, on_epoch=True)
        finite = times[-1][torch.isfinite(times[-1])]
        if finite.numel():
            self.log("val/t_out_mean", finite.mean().float(), on_step=False, on_epoch=True)

    def on_validation_epoch_end(self) -> None:
        self.val_acc_best.update(self.val_acc.compute())
        self.log("val/acc_best", self.val_acc_best.compute(), on_step=False, on_epoch=True)

    def test_step(self, batch, batch_idx: int) -> None:
        self._step(batch, "test")

    def predict_step(self, batch, batch_idx: int) -> Tensor:
        x = batch[0] if isinstance(batch, (tuple, list)) else batch
        return self.predict_from_times(self(x))

    def configure_optimizers(self):
        hp = self.hparams
        opt = torch.optim.Adam(self.parameters(), lr=hp.lr)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=hp.lr_step, gamma=hp.lr_gamma)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "epoch"}}
