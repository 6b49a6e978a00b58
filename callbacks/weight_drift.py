"""Weight drift (paper 000-09): do the weights that read a positively biased activation drift negative?

For every linear / convolutional layer ``z' = W h + b`` this logs, every ``every_n_steps`` optimiser steps,
``mean(W)``, the fraction of negative entries of ``W`` and the drift ``mean(W_t - W_0)`` from the initial
weights (the drift removes the initialisation's own offset). Layers get a role from what they read:

- ``downstream``: ``h`` is the output of a positively biased activation (relu, gelu, silu, their squares),
  the layers the paper predicts drift negative;
- ``symmetric``: ``h`` is the output of tanh or identity, the control;
- ``other``: anything else (the input layer, attention projections, a classifier reading a norm).

Roles are found once, by forward hooks during the first training step: a layer reads an activation if its
input tensor is that activation's output (possibly through dropout, pooling or flatten). Models whose
activations are plain functions rather than modules can name their downstream layers with ``downstream``.

The initial weights are part of the callback's ``state_dict``, so a run resumed from a checkpoint measures
drift from the true initialisation. Under DDP the weights (and the averaged gradients) are identical on
every rank, so rank 0's numbers are the global ones; nothing needs reducing.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback
from torch import Tensor, nn

from callbacks.figures import log_figure
from modules.components.activations import GELU2, QuantileReLU, ReLU2

PREFIX = "diag/weight_drift"
WEIGHT_TYPES = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)
_POSITIVE = (nn.ReLU, nn.GELU, nn.SiLU, nn.ReLU6, nn.Softplus, nn.ELU, ReLU2, GELU2, QuantileReLU)
_SYMMETRIC = (nn.Tanh, nn.Identity, nn.Hardtanh, nn.Softsign)
_PASSTHROUGH = (
    nn.Dropout,
    nn.Flatten,
    nn.AdaptiveAvgPool1d,
    nn.AdaptiveAvgPool2d,
    nn.AvgPool1d,
    nn.AvgPool2d,
    nn.MaxPool1d,
    nn.MaxPool2d,
)
ROLES = ("downstream", "symmetric", "other")


def weight_layers(model: nn.Module, exclude: tuple[str, ...] = ()) -> Iterator[tuple[str, nn.Module]]:
    """``(name, module)`` of every linear/conv layer whose name contains none of ``exclude``."""
    for name, m in model.named_modules():
        if isinstance(m, WEIGHT_TYPES) and not any(e in name for e in exclude):
            yield name, m


def weight_stats(w: Tensor, w0: Tensor) -> tuple[float, float, float]:
    """``(mean(W), fraction of W < 0, mean(W - W0))`` in float64."""
    w64 = w.detach().double()
    return w64.mean().item(), (w64 < 0).double().mean().item(), (w64 - w0.double()).mean().item()


class InputSourceTracer:
    """Context manager: during one forward pass, find which activation module each weight layer reads.

    After the ``with`` block, ``sources[name]`` is the activation's class name (or None) and ``roles[name]``
    one of ``ROLES``.
    """

    def __init__(self, model: nn.Module, exclude: tuple[str, ...] = ()) -> None:
        self.model = model
        self.layers = dict(weight_layers(model, exclude))
        self.sources: dict[str, str | None] = {}
        self.roles: dict[str, str] = {}
        self._origin: dict[int, tuple[Tensor, nn.Module]] = {}  # data_ptr -> (tensor kept alive, activation)
        self._handles: list[Any] = []

    def __enter__(self) -> InputSourceTracer:
        for name, m in self.model.named_modules():
            if isinstance(m, _POSITIVE + _SYMMETRIC + _PASSTHROUGH):
                self._handles.append(m.register_forward_hook(self._activation_hook))
            elif name in self.layers:
                self._handles.append(m.register_forward_pre_hook(self._layer_hook(name)))
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._origin.clear()

    def _activation_hook(self, module: nn.Module, args: tuple[Any, ...], out: Any) -> None:
        if not (args and isinstance(args[0], Tensor) and isinstance(out, Tensor)):
            return
        known = self._origin.get(args[0].data_ptr())
        if isinstance(module, _PASSTHROUGH) or (isinstance(module, nn.Identity) and known is not None):
            # pooling/dropout/flatten (and an identity shortcut) pass their input's origin through
            if known is not None:
                self._origin[out.data_ptr()] = (out, known[1])
            return
        self._origin[out.data_ptr()] = (out, module)

    def _layer_hook(self, name: str) -> Any:
        def hook(module: nn.Module, args: tuple[Any, ...]) -> None:
            if name in self.sources or not (args and isinstance(args[0], Tensor)):
                return
            found = self._origin.get(args[0].data_ptr())
            act = found[1] if found is not None else None
            self.sources[name] = type(act).__name__ if act is not None else None
            if isinstance(act, _POSITIVE):
                self.roles[name] = "downstream"
            elif isinstance(act, _SYMMETRIC):
                self.roles[name] = "symmetric"
            else:
                self.roles[name] = "other"

        return hook


def forward_on(pl_module: L.LightningModule, batch: Any) -> Any:
    """The module's documented diagnostic forward, else ``forward(batch[0])``."""
    if hasattr(pl_module, "diagnostic_forward"):
        return pl_module.diagnostic_forward(batch)
    return pl_module(batch[0] if isinstance(batch, list | tuple) else batch)


def log_metrics(trainer: L.Trainer, metrics: dict[str, float], step: int) -> None:
    """Straight to the loggers, rank 0 only (one call instead of one ``self.log`` per scalar)."""
    if trainer.is_global_zero:
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=step)


class WeightDrift(Callback):
    """Per-layer mean weight, fraction of negative weights and drift from initialisation.

    Logs ``diag/weight_drift/<layer>/{mean,frac_negative,drift}`` (and ``/grad_mean``, the mean of
    ``dL/dW`` just before the step, when ``log_grad_mean``), plus per role (``downstream``, ``symmetric``,
    ``other``) the layer-averaged ``<role>_mean_drift`` and ``<role>_frac_negative``. The paper's summary is
    ``diag/weight_drift/downstream_mean_drift``.

    Args:
        every_n_steps: log after every n-th optimiser step (and at step 0, the initialisation).
        log_grad_mean: also log the layer-mean gradient at the logged steps (tests the sign claim directly).
        exclude: skip layers whose name contains any of these strings.
        downstream: names of layers to treat as downstream regardless of the hook detection.
        plot: log a figure of drift against step per layer at the end of fit.
    """

    def __init__(
        self,
        every_n_steps: int = 50,
        log_grad_mean: bool = True,
        exclude: list[str] = [],  # noqa: B006 - jsonargparse shows the default in --help
        downstream: list[str] = [],  # noqa: B006
        plot: bool = True,
    ) -> None:
        if every_n_steps <= 0:
            raise ValueError(f"every_n_steps must be a positive integer, got {every_n_steps}")
        self.every_n_steps = every_n_steps
        self.log_grad_mean = log_grad_mean
        self.exclude = tuple(exclude)
        self.downstream = tuple(downstream)
        self.plot = plot
        self.initial: dict[str, Tensor] = {}
        self.roles: dict[str, str] = {}
        self.history: list[dict[str, float]] = []
        self._grad_mean: dict[str, float] = {}
        self._tracer: InputSourceTracer | None = None
        self._last_step = -1

    # --- reference state -------------------------------------------------------------------------------
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        layers = dict(weight_layers(pl_module, self.exclude))
        if not layers:
            raise ValueError(
                f"WeightDrift found no Linear/Conv layers in {type(pl_module).__name__} "
                f"(exclude={self.exclude})"
            )
        if not self.initial:  # fresh run; a resumed run got its W_0 from load_state_dict
            self.initial = {n: m.weight.detach().clone() for n, m in layers.items()}
        else:
            missing = sorted(set(layers) - set(self.initial))
            if missing:
                raise ValueError(
                    f"WeightDrift's saved initial weights lack layers {missing[:5]}: was the model changed?"
                )
            self.initial = {n: self.initial[n].to(layers[n].weight.device) for n in layers}
        self._last_step = -1

    def state_dict(self) -> dict[str, Any]:
        return {
            "initial": {n: w.detach().cpu() for n, w in self.initial.items()},
            "roles": dict(self.roles),
            "history": list(self.history),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.initial = {n: w.clone() for n, w in state_dict["initial"].items()}
        self.roles = dict(state_dict.get("roles", {}))
        self.history = list(state_dict.get("history", []))

    # --- roles ------------------------------------------------------------------------------------------
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if not self.roles:
            self._tracer = InputSourceTracer(pl_module, self.exclude).__enter__()

    def _finish_tracing(self, pl_module: L.LightningModule) -> None:
        if self._tracer is None:
            return
        self._tracer.__exit__()
        self.roles = {
            n: "downstream" if n in self.downstream else self._tracer.roles.get(n, "other")
            for n in self.initial
        }
        self._tracer = None

    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Any
    ) -> None:
        self._finish_tracing(pl_module)
        if trainer.global_step == 0 and not self.history:
            # W = W_0 still (the step has not been taken): the curves start at the origin
            self._measure(trainer, pl_module, with_grads=False)
        if self.log_grad_mean and (trainer.global_step + 1) % self.every_n_steps == 0:
            # the gradient that produces the step about to be logged; DDP has already averaged it
            self._grad_mean = {
                n: m.weight.grad.double().mean().item()
                for n, m in weight_layers(pl_module, self.exclude)
                if m.weight.grad is not None
            }

    # --- measurement ------------------------------------------------------------------------------------
    def compute(self, pl_module: nn.Module) -> dict[str, float]:
        """All metrics for the current weights (keys without the ``diag/weight_drift/`` prefix)."""
        out: dict[str, float] = {}
        per_role: dict[str, list[tuple[float, float]]] = {r: [] for r in ROLES}
        for name, m in weight_layers(pl_module, self.exclude):
            mean, frac_neg, drift = weight_stats(m.weight, self.initial[name])
            out[f"{name}/mean"] = mean
            out[f"{name}/frac_negative"] = frac_neg
            out[f"{name}/drift"] = drift
            per_role[self.roles.get(name, "other")].append((drift, frac_neg))
        for role, vals in per_role.items():
            if vals:
                out[f"{role}_mean_drift"] = sum(v[0] for v in vals) / len(vals)
                out[f"{role}_frac_negative"] = sum(v[1] for v in vals) / len(vals)
        return out

    def _measure(self, trainer: L.Trainer, pl_module: L.LightningModule, with_grads: bool = True) -> None:
        step = trainer.global_step
        if step == self._last_step:
            return
        self._last_step = step
        metrics = self.compute(pl_module)
        if with_grads:
            for name, g in self._grad_mean.items():
                metrics[f"{name}/grad_mean"] = g
            self._grad_mean = {}
        self.history.append({"step": float(step), **metrics})
        log_metrics(trainer, {f"{PREFIX}/{k}": v for k, v in metrics.items()}, step)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._finish_tracing(pl_module)
        if trainer.global_step > 0 and trainer.global_step % self.every_n_steps == 0:
            self._measure(trainer, pl_module)

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.plot and self.history and trainer.is_global_zero and trainer.loggers:
            log_figure(trainer, self.figure(), "figures/weight_drift.png")

    def figure(self) -> Any:
        """Drift ``mean(W_t - W_0)`` against step, one line per layer, coloured by role."""
        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        colours = {"downstream": "tab:red", "symmetric": "tab:blue", "other": "tab:gray"}
        steps = [h["step"] for h in self.history]
        for name in self.initial:
            role = self.roles.get(name, "other")
            for ax, key in zip(axes, ("drift", "frac_negative")):
                ys = [h.get(f"{name}/{key}", float("nan")) for h in self.history]
                ax.plot(steps, ys, color=colours[role], alpha=0.7, label=f"{name} ({role})")
        axes[0].axhline(0.0, color="k", lw=0.5)
        axes[0].set(xlabel="step", ylabel="mean(W_t - W_0)", title="weight drift per layer")
        axes[1].set(xlabel="step", ylabel="fraction W < 0", title="negative weights per layer")
        axes[1].legend(fontsize=6, loc="best")
        fig.tight_layout()
        return fig
