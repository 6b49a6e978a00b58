"""Trainable activation and local-basis parameters over training (paper 000-02).

The tracker selects layers by what they declare, never by their class:

- a layer whose class declares ``shape_parameters`` (``modules.components.activations``; ``CauchyAct``'s
  ``lambda1, lambda2, d``, ``GaussianAct``'s width ``a``) has each of them logged,
  ``diag/activation_params/<layer>/<parameter>``;
- an ``AdaptiveNodes`` layer (``modules.components.local_basis``: the local-basis residuals ``CauchyNodes``,
  ``GaussianBumps``) has its scale ``s``, summaries of the centres ``c_j`` (mean, std, min, max), of the widths
  ``d_j`` (mean, min, max), the effective number of nodes ``exp(entropy(softmax(a)))`` (M at init, 1 when
  one node takes all the weight) and the largest weight logged. The full centres, widths and weights of every
  measurement are kept for the figure (centres against step, the marker size showing the weight) and in
  checkpoints.

Every rank holds the same parameters under DDP, so nothing needs reducing.
"""

from __future__ import annotations

from itertools import cycle
from typing import Any, Literal

import lightning as L
import torch
from torch import nn

from callbacks.diagnostic import Diagnostic, Moment, Schedule
from modules.components.activations import declared_shape_parameters
from modules.components.local_basis import AdaptiveNodes
from tracking.figures import new_figure


def shaped_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(name, module)`` of every layer whose class declares ``shape_parameters``."""
    return [(n, m) for n, m in model.named_modules() if declared_shape_parameters(m)]


def node_layers(model: nn.Module) -> list[tuple[str, AdaptiveNodes]]:
    """``(name, module)`` of every ``AdaptiveNodes`` layer (a local-basis residual)."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, AdaptiveNodes)]


def activation_param_values(model: nn.Module) -> tuple[dict[str, float], dict[str, dict[str, list[float]]]]:
    """``(logged values, {layer: {"centres", "widths", "weights"}})`` for the current parameters."""
    values: dict[str, float] = {}
    nodes: dict[str, dict[str, list[float]]] = {}
    with torch.no_grad():
        for name, layer in shaped_layers(model):
            for param in declared_shape_parameters(layer):
                values[f"{name}/{param}"] = float(getattr(layer, param))
        for name, res in node_layers(model):
            state = res.node_state()
            c = state.centres.detach().double()
            w = state.widths.detach().double()
            p = state.weights.detach().double()
            values[f"{name}/scale"] = float(state.scale)
            values[f"{name}/centre_mean"] = float(c.mean())
            values[f"{name}/centre_std"] = float(c.std()) if c.numel() > 1 else 0.0
            values[f"{name}/centre_min"] = float(c.min())
            values[f"{name}/centre_max"] = float(c.max())
            values[f"{name}/width_mean"] = float(w.mean())
            values[f"{name}/width_min"] = float(w.min())
            values[f"{name}/width_max"] = float(w.max())
            values[f"{name}/effective_nodes"] = float(torch.exp(-(p * p.clamp_min(1e-300).log()).sum()))
            values[f"{name}/max_weight"] = float(p.max())
            nodes[name] = {"centres": c[:, 0].tolist(), "widths": w.tolist(), "weights": p.tolist()}
    return values, nodes


class ActivationParamTracker(Diagnostic):
    """The declared shape parameters of every layer (CauchyAct's ``lambda1, lambda2, d``) and the centres,
    widths and weights of every ``AdaptiveNodes`` layer.

    Args:
        schedule: when to measure (default: the initialisation and every 100 optimiser steps).
        if_unsupported, plot, max_history: see ``Diagnostic``.
    """
    name = "activation_params"

    def __init__(
        self,
        schedule: Schedule = Schedule(every_n_steps=100),
        if_unsupported: Literal["error", "skip"] = "error",
        plot: bool = True,
        max_history: int = 10_000,
    ) -> None:
        super().__init__(schedule, if_unsupported, plot, max_history)
        self.node_history: list[dict[str, Any]] = []

    def unsupported_reason(self, trainer: L.Trainer, pl_module: L.LightningModule) -> str | None:
        if not shaped_layers(pl_module) and not node_layers(pl_module):
            return (f"ActivationParamTracker found no CauchyAct (no layer declaring shape_parameters) and no "
                    f"local-basis residual in {type(pl_module).__name__} (use a net with activation: cauchy, or net: "
                    "modules.components.local_basis.ResidualCAN)")
        return None

    def measure(self, trainer: L.Trainer, pl_module: L.LightningModule, moment: Moment) -> dict[str, float]:
        values, nodes = activation_param_values(pl_module)
        if nodes:
            self.node_history.append({"step": moment.step, **nodes})
            del self.node_history[: max(0, len(self.node_history) - self.max_history)]
        return values

    def extra_state(self) -> dict[str, Any]:
        return {"node_history": list(self.node_history)}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self.node_history = list(state.get("node_history", []))[-self.max_history :]

    def figure(self) -> Any:

        steps = [h["step"] for h in self.history]
        residuals = sorted({k for h in self.node_history for k in h if k != "step"})
        # every logged key that is not a node layer's summary is a declared shape parameter
        shape_keys = sorted({k for h in self.history for k in h if k != "step" and k.rsplit("/", 1)[0] not in residuals})
        fig, axes = new_figure(1, 2, figsize=(11, 4))
        for key, style in zip(shape_keys, cycle(("-", "--", ":", "-."))):
            axes[0].plot(steps, [h.get(key, float("nan")) for h in self.history], style, label=key.replace("/", " "))
        axes[0].set(xlabel="step", title="activation shape parameters")
        if shape_keys:
            axes[0].legend(fontsize=6)
        for name in residuals[:1]:
            for h in self.node_history:
                if name in h:
                    w = torch.tensor(h[name]["weights"])
                    axes[1].scatter([h["step"]] * len(w), h[name]["centres"], s=4 + 400 * w, c="tab:red", alpha=0.5)
            axes[1].set(xlabel="step", ylabel="centre c_j", title=f"{name} nodes (size: softmax weight)")
        fig.tight_layout()
        return fig
