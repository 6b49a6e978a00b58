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
from typing import Any, Literal

import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor, nn

from errors import ConfigError, NonFiniteLossError
from modules.base import PaperTask, Stage, StepOutput, WeightedMean
from modules.causal_pieces.neurons import (
    grid_first_spike_times,
    lif_first_spike_times,
    nlif_first_spike_times,
)
from modules.components.metrics import Accuracy

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


class CausalPiecesSNN(PaperTask):
    """Feedforward single-spike SNN ``num_features -> hidden_sizes -> num_classes``; class = earliest output spike.

    Args:
        hidden_sizes: widths of the hidden layers.
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
        weight_bump: added to all incoming weights of a neuron silent on more than ``max_missing`` of a batch.
        max_missing: per layer, the largest tolerated fraction of samples on which a neuron stays silent.
        bump_iters: at most this many bump-and-recompute rounds per training batch.
        init_seed: seed of the weight initialisation (``None``: the global torch generator).
        num_features: input spike trains per sample, bias spikes included (linked from the DataModule).
        num_classes: output neurons, one per class (linked from the DataModule).
        optimizer, lr_scheduler: Adam and a per-epoch StepLR by default (Goeltz et al.'s recipe).
    """

    paper_id = "000-01"
    monitor = "val/acc"
    monitor_mode = "max"
    vectorizable = False  # --run.seeds: it draws random numbers during training

    def __init__(
        self,
        hidden_sizes: Sequence[int] = (120,),
        neuron: Literal["nlif", "lif", "lif_grid"] = "nlif",
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
        weight_bump: float = 5e-4,
        max_missing: Sequence[float] = (0.3, 0.0),
        bump_iters: int = 20,
        init_seed: int | None = None,
        num_features: int = 5,
        num_classes: int = 3,
        optimizer: OptimizerCallable = lambda p: torch.optim.Adam(p, lr=5e-3),
        lr_scheduler: LRSchedulerCallable | None = lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=20, gamma=0.95),
    ) -> None:
        metrics = {"acc": Accuracy(), "missing_output": WeightedMean(), "silent_hidden": WeightedMean(),
                   "t_out_mean": WeightedMean()}
        super().__init__(optimizer, lr_scheduler, metrics)
        sizes = [num_features, *hidden_sizes, num_classes]
        if any(int(s) <= 0 for s in sizes):
            raise ConfigError(f"layer sizes must be positive, got num_features={num_features}, hidden={list(hidden_sizes)}")
        n_layers = len(sizes) - 1
        for name, vals in (("init_mean", init_mean), ("init_std", init_std), ("max_missing", max_missing)):
            if len(vals) != n_layers:
                raise ConfigError(f"{name} needs one value per layer ({n_layers}), got {list(vals)}")
        if neuron not in NEURONS:
            raise ConfigError(f"neuron must be one of {NEURONS}, got {neuron!r}")
        if neuron == "nlif" and tau_m is not None:
            raise ConfigError("neuron='nlif' has no leak: set tau_m to null, or use neuron='lif'/'lif_grid'")
        if neuron == "lif":
            if tau_m is None or not (
                math.isclose(tau_m, tau_s, rel_tol=1e-12) or math.isclose(tau_m, 2 * tau_s, rel_tol=1e-12)
            ):
                raise ConfigError(
                    f"neuron='lif' needs tau_m = tau_s or 2 tau_s (got tau_m={tau_m}, tau_s={tau_s}); "
                    "use neuron='lif_grid' for other values"
                )
        if bump_iters < 0 or weight_bump < 0:
            raise ConfigError(f"bump_iters and weight_bump must be >= 0, got {bump_iters} and {weight_bump}")
        if tau_s <= 0 or theta <= 0 or (tau_m is not None and tau_m <= 0):
            raise ConfigError(f"tau_s, theta and tau_m must be positive, got {tau_s}, {theta}, {tau_m}")
        self.sizes = [int(s) for s in sizes]
        self.neuron, self.tau_s, self.theta, self.tau_m = neuron, tau_s, theta, tau_m
        self.grid_dt, self.grid_t_max = grid_dt, grid_t_max
        self.xi, self.alpha, self.beta, self.t_no_spike = xi, alpha, beta, t_no_spike
        self.positive_weights, self.weight_bump = positive_weights, weight_bump
        self.max_missing, self.bump_iters = tuple(max_missing), bump_iters
        gen = torch.Generator().manual_seed(init_seed) if init_seed is not None else None
        weights = []
        for l in range(n_layers):
            w = torch.randn(sizes[l], sizes[l + 1], generator=gen, dtype=torch.float64) * init_std[l] + init_mean[l]
            weights.append(nn.Parameter(w.abs() if positive_weights else w))
        self.weights = nn.ParameterList(weights)

    # ---- forward ---------------------------------------------------------------------------------
    def layer_spike_times(self, t_in: Tensor, w: Tensor) -> Tensor:
        """Output spike times of one layer for input times ``t_in`` and weights ``w``."""
        if self.neuron == "nlif":
            return nlif_first_spike_times(t_in, w, self.tau_s, self.theta)
        if self.neuron == "lif":
            return lif_first_spike_times(t_in, w, self.tau_s, self.theta, self.tau_m)
        return grid_first_spike_times(t_in, w, self.tau_s, self.theta, self.tau_m, self.grid_dt, self.grid_t_max)

    def _as_times(self, x: Tensor) -> Tensor:
        if x.dim() != 2:
            x = x.flatten(1)
        if x.shape[1] != self.sizes[0]:
            raise ConfigError(
                f"the network expects {self.sizes[0]} input spike times per sample (bias spikes included), got "
                f"{x.shape[1]}: use a spike-encoding DataModule (the CLI links num_features from it)"
            )
        if torch.isnan(x).any():
            raise ConfigError("input spike times contain NaN: encode 'no spike' as +inf, not NaN")
        return x.to(self.weights[0].dtype)

    def all_spike_times(self, x: Tensor) -> list[Tensor]:
        """Spike times of every layer: ``[t_input, t_hidden_1, ..., t_output]``."""
        times = [self._as_times(x)]
        for w in self.weights:
            times.append(self.layer_spike_times(times[-1], w))
        return times

    def forward(self, x: Tensor) -> Tensor:
        """Output spike times ``(B, num_classes)``; ``inf`` = no spike."""
        return self.all_spike_times(x)[-1]

    def spike_times(self, batch: Any) -> list[tuple[Tensor, Tensor]]:
        """``modules.protocols.SpikeTimes``: ``[(t_pre, t_post)]`` per layer, for inputs ``batch[0]``."""
        x = batch[0] if isinstance(batch, (tuple, list)) else batch
        with torch.no_grad():
            times = self.all_spike_times(x)
        return list(zip(times[:-1], times[1:]))

    #: the prediction of a network whose output layer stays silent: no class, so it never counts as correct
    NO_SPIKE = -1

    @classmethod
    def predict_from_times(cls, t_out: Tensor) -> Tensor:
        """The class of the earliest output spike (ties: lowest index); ``NO_SPIKE`` (-1) when no output neuron
        spikes, which every accuracy counts as wrong (a silent network does not answer)."""
        pred = torch.argmin(t_out, dim=1)
        return torch.where(torch.isinf(t_out).all(1), torch.full_like(pred, cls.NO_SPIKE), pred)

    # ---- training --------------------------------------------------------------------------------
    def step(self, batch: Any, stage: Stage) -> StepOutput:
        x, y = batch
        times = self.all_spike_times(x)
        t_out = times[-1]
        loss = ttfs_loss(t_out, y, self.tau_s, self.xi, self.alpha, self.beta, self.t_no_spike)
        if stage == "train" and not torch.isfinite(loss):
            raise NonFiniteLossError(
                "the loss is not finite: lower the learning rate or model.alpha, or raise model.t_no_spike"
            )
        n = y.shape[0]
        # the fraction of samples without any output spike (predicted NO_SPIKE, counted wrong), every stage
        inputs: dict[str, Any] = {"missing_output": (torch.isinf(t_out).all(1).double().mean(), n),
                                  "silent_hidden": None, "t_out_mean": None}
        if stage != "train":
            if len(times) > 2:
                hidden = torch.cat([torch.isinf(t) for t in times[1:-1]], dim=1)
                inputs["silent_hidden"] = (hidden.double().mean(), n)
            finite = torch.isfinite(t_out)
            if finite.any():
                inputs["t_out_mean"] = (t_out[finite].mean(), int(finite.sum()))
        return StepOutput(loss, n=n, preds=self.predict_from_times(t_out), target=y, inputs=inputs)

    def extra_epoch_metrics(self, stage: Stage, values: dict[str, Tensor]) -> dict[str, Tensor]:
        if stage != "train":
            return {}
        with torch.no_grad():
            return {f"train/weight_mean_layer{l}": w.mean().float() for l, w in enumerate(self.weights)}

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
        if self.weight_bump <= 0 and not self.positive_weights:
            return 0
        rounds = 0
        with torch.no_grad():
            if self.positive_weights:
                for w in self.weights:
                    w.clamp_(min=0.0)
            while rounds < self.bump_iters and self.weight_bump > 0:
                times = self.all_spike_times(x)
                fracs = [torch.isinf(t).double().mean(0) for t in times[1:]]
                if reduce is not None:
                    fracs = [reduce(f) for f in fracs]
                bumps = [(f > m).to(w.dtype) for f, m, w in zip(fracs, self.max_missing, self.weights)]
                if not any(bool(b.any()) for b in bumps):
                    break
                for w, b in zip(self.weights, bumps):
                    w.add_(self.weight_bump * 2.0**rounds * b[None, :])
                rounds += 1
        return rounds

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        reduce = None
        if self.trainer.world_size > 1:
            reduce = lambda f: self.trainer.strategy.reduce(f, reduce_op="mean")  # noqa: E731
        self.bump_silent_weights(batch[0], reduce)
        super().on_train_batch_end(outputs, batch, batch_idx)  # the epoch's metrics, after the bump

    def predict_batch(self, batch: Any) -> Tensor:
        x = batch[0] if isinstance(batch, (tuple, list)) else batch
        return self.predict_from_times(self(x))
