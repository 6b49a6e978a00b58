"""Weight drift (paper 000-09): do the weights that read a positively biased activation drift negative?

For every linear / convolutional layer ``z' = W h + b`` this logs ``mean(W)``, the fraction of negative
entries of ``W`` and the drift ``mean(W_t - W_0)`` from the initial weights (the drift removes the
initialisation's own offset). Layers get a role from what they read:

- ``downstream``: ``h`` is the output of a positively biased activation (``positive_bias`` on the
  activation's class, see ``modules.components.activations``), the layers the paper predicts drift negative;
- ``symmetric``: ``h`` is the output of a symmetric activation (tanh, identity), the control;
- ``other``: anything else (the input layer, attention projections, a classifier reading a norm).

Roles are found once, by forward hooks during the first training step: a layer reads an activation if its
input tensor is that activation's output (possibly through dropout, pooling or flatten). Models whose
activations are plain functions rather than modules can name their downstream layers with ``downstream``.
The same pass finds the *read-out*, the last weight layer the forward pass runs (the classifier, the LM
head). Its mean gradient under softmax cross-entropy is exactly zero (the logits' gradients sum to zero over
classes, so every column of ``dL/dW`` does), so a drift of the read-out under SGD + CE is impossible and
under AdamW + CE it is an optimiser artefact (per-coordinate normalisation breaks the zero sum). The
summaries therefore separate the *hidden* layers (the ones reading an activation, downstream or symmetric,
other than the read-out) from the read-out: the same summary for relu and for the tanh control.

The initial weights are part of the callback's state, so a run resumed from a checkpoint measures drift
from the true initialisation. Under DDP the weights (and the averaged gradients) are identical on every
rank, so nothing needs reducing.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal

import lightning as L
from torch import Tensor, nn

from callbacks.diagnostic import Diagnostic, Moment, Schedule
from errors import ConfigError
from modules.components.activations import activation_bias
from modules.protocols import DiagnosticForward
from tracking.figures import new_figure

PREFIX = "diag/weight_drift"
WEIGHT_TYPES = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)
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
        self.order: list[str] = []  # weight layers in the order the forward pass ran them
        self._origin: dict[int, tuple[Tensor, nn.Module]] = {}  # data_ptr -> (tensor kept alive, activation)
        self._handles: list[Any] = []

    def __enter__(self) -> InputSourceTracer:
        for name, m in self.model.named_modules():
            if isinstance(m, _PASSTHROUGH) or activation_bias(m) is not None:
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
            if not (args and isinstance(args[0], Tensor)):
                return
            if name in self.order:
                self.order.remove(name)
            self.order.append(name)
            if name in self.sources:
                return
            found = self._origin.get(args[0].data_ptr())
            act = found[1] if found is not None else None
            self.sources[name] = type(act).__name__ if act is not None else None
            bias = activation_bias(act) if act is not None else None
            self.roles[name] = {True: "downstream", False: "symmetric", None: "other"}[bias]

        return hook

    @property
    def readout(self) -> str | None:
        """The last weight layer the traced forward pass ran (None before the pass)."""
        return self.order[-1] if self.order else None


def forward_on(pl_module: L.LightningModule, batch: Any) -> Any:
    """The module's ``diagnostic_forward(batch)`` (``modules.protocols.DiagnosticForward``), else
    ``forward(batch[0])``."""
    if isinstance(pl_module, DiagnosticForward):
        return pl_module.diagnostic_forward(batch)
    return pl_module(batch[0] if isinstance(batch, list | tuple) else batch)


class WeightDrift(Diagnostic):
    """Per-layer mean weight, fraction of negative weights and drift from initialisation.

    Logs ``diag/weight_drift/<layer>/{mean,frac_negative,drift}`` (and ``/grad_mean``, the mean of
    ``dL/dW`` of the step that produced the logged weights, when ``log_grad_mean``), plus per role
    (``downstream``, ``symmetric``, ``other``) the layer-averaged ``<role>_mean_drift`` and
    ``<role>_frac_negative``. The paper's summary is ``diag/weight_drift/downstream_mean_drift``; because the
    read-out's mean gradient is zero under cross-entropy (module docstring), the averages over the layers
    that read an activation (downstream or symmetric) other than the read-out are
    ``hidden_{mean_drift,frac_negative,grad_mean}``, the same quantity for relu and its tanh control, and
    the read-out's own are ``readout_{drift,frac_negative,grad_mean}``.

    Args:
        schedule: when to measure (default: the initialisation and every 50 optimiser steps).
        log_grad_mean: also log the layer-mean gradient at the logged steps (tests the sign claim directly).
        exclude: skip layers whose name contains any of these strings.
        downstream: names of layers to treat as downstream regardless of the hook detection.
        if_unsupported, plot, max_history: see ``Diagnostic``.
    """
    name = "weight_drift"

    def __init__(
        self,
        schedule: Schedule = Schedule(every_n_steps=50),
        log_grad_mean: bool = True,
        exclude: list[str] = [],  # noqa: B006 - jsonargparse shows the default in --help
        downstream: list[str] = [],  # noqa: B006
        if_unsupported: Literal["error", "skip"] = "error",
        plot: bool = True,
        max_history: int = 10_000,
    ) -> None:
        super().__init__(schedule, if_unsupported, plot, max_history)
        self.log_grad_mean = log_grad_mean
        self.exclude = tuple(exclude)
        self.downstream = tuple(downstream)
        self.initial: dict[str, Tensor] = {}
        self.roles: dict[str, str] = {}
        self.readout: str | None = None
        self._grad_mean: dict[str, float] = {}
        self._tracer: InputSourceTracer | None = None

    def unsupported_reason(self, trainer: L.Trainer, pl_module: L.LightningModule) -> str | None:
        if next(weight_layers(pl_module, self.exclude), None) is None:
            return f"WeightDrift found no Linear/Conv layers in {type(pl_module).__name__} (exclude={list(self.exclude)})"
        return None

    # --- reference state -------------------------------------------------------------------------------
    def attach(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        layers = dict(weight_layers(pl_module, self.exclude))
        if not self.initial:  # fresh run; a resumed run got its W_0 from load_state_dict
            self.initial = {n: m.weight.detach().clone() for n, m in layers.items()}
        else:
            missing = sorted(set(layers) - set(self.initial))
            if missing:
                raise ConfigError(
                    f"WeightDrift's saved initial weights lack layers {missing[:5]}: was the model changed?"
                )
            self.initial = {n: self.initial[n].to(layers[n].weight.device) for n in layers}

    def extra_state(self) -> dict[str, Any]:
        return {
            "initial": {n: w.detach().cpu() for n, w in self.initial.items()},
            "roles": dict(self.roles),
            "readout": self.readout,
        }

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self.initial = {n: w.clone() for n, w in state.get("initial", {}).items()}
        self.roles = dict(state.get("roles", {}))
        self.readout = state.get("readout")

    # --- roles ------------------------------------------------------------------------------------------
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        super().on_train_batch_start(trainer, pl_module, batch, batch_idx)
        if self.active and not self.roles and self._tracer is None:
            self._tracer = InputSourceTracer(pl_module, self.exclude).__enter__()

    def _finish_tracing(self) -> None:
        if self._tracer is None:
            return
        self._tracer.__exit__()
        self.roles = {
            n: "downstream" if n in self.downstream else self._tracer.roles.get(n, "other")
            for n in self.initial
        }
        self.readout = self._tracer.readout
        self._tracer = None

    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Any
    ) -> None:
        self._finish_tracing()
        super().on_before_optimizer_step(trainer, pl_module, optimizer)  # the initialisation, at step 0
        if self.active and self.log_grad_mean and self.schedule.due_step(trainer.global_step + 1):
            # the gradient that produces the step about to be logged; DDP has already averaged it
            self._grad_mean = {
                n: m.weight.grad.double().mean().item()
                for n, m in weight_layers(pl_module, self.exclude)
                if m.weight.grad is not None
            }

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._finish_tracing()
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    # --- measurement ------------------------------------------------------------------------------------
    def compute(self, pl_module: nn.Module) -> dict[str, float]:
        """All values for the current weights (keys without the ``diag/weight_drift/`` prefix)."""
        out: dict[str, float] = {}
        per_role: dict[str, list[tuple[float, float]]] = {r: [] for r in (*ROLES, "hidden")}
        for name, m in weight_layers(pl_module, self.exclude):
            mean, frac_neg, drift = weight_stats(m.weight, self.initial[name])
            out[f"{name}/mean"] = mean
            out[f"{name}/frac_negative"] = frac_neg
            out[f"{name}/drift"] = drift
            role = self.roles.get(name, "other")
            per_role[role].append((drift, frac_neg))
            if self._is_hidden(name):
                per_role["hidden"].append((drift, frac_neg))
            if name == self.readout:
                out["readout_drift"], out["readout_frac_negative"] = drift, frac_neg
        for role, vals in per_role.items():
            if vals:
                out[f"{role}_mean_drift"] = sum(v[0] for v in vals) / len(vals)
                out[f"{role}_frac_negative"] = sum(v[1] for v in vals) / len(vals)
        return out

    def _is_hidden(self, name: str) -> bool:
        """A layer that reads an activation (biased or symmetric) and is not the read-out."""
        return self.roles.get(name) in ("downstream", "symmetric") and name != self.readout

    def _grad_summaries(self, grads: dict[str, float]) -> dict[str, float]:
        hidden = [g for n, g in grads.items() if self._is_hidden(n)]
        out = {f"{n}/grad_mean": g for n, g in grads.items()}
        if hidden:
            out["hidden_grad_mean"] = sum(hidden) / len(hidden)
        if self.readout in grads:
            out["readout_grad_mean"] = grads[self.readout]
        return out

    def measure(self, trainer: L.Trainer, pl_module: L.LightningModule, moment: Moment) -> dict[str, float]:
        values = self.compute(pl_module)
        if moment.kind == "step":
            values.update(self._grad_summaries(self._grad_mean))
            self._grad_mean = {}
        return values

    def figure(self) -> Any:
        return drift_figure(list(self.history), self.roles, list(self.initial))


def drift_figure(history: list[dict[str, float]], roles: dict[str, str], layers: list[str]) -> Any:
    """Drift ``mean(W_t - W_0)`` and the fraction of negative weights against step, one line per layer."""
    fig, axes = new_figure(1, 2, figsize=(11, 4))
    colours = {"downstream": "tab:red", "symmetric": "tab:blue", "other": "tab:gray"}
    steps = [h["step"] for h in history]
    for name in layers:
        role = roles.get(name, "other")
        for ax, key in zip(axes, ("drift", "frac_negative")):
            ys = [h.get(f"{name}/{key}", float("nan")) for h in history]
            ax.plot(steps, ys, color=colours[role], alpha=0.7, label=f"{name} ({role})")
    axes[0].axhline(0.0, color="k", lw=0.5)
    axes[0].set(xlabel="step", ylabel="mean(W_t - W_0)", title="weight drift per layer")
    axes[1].set(xlabel="step", ylabel="fraction W < 0", title="negative weights per layer")
    axes[1].legend(fontsize=6, loc="best")
    fig.tight_layout()
    return fig
