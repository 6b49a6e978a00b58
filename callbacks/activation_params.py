"""Trainable activation and local-basis parameters over training (paper 000-02).

For every ``CauchyAct`` in the module (``modules.components.local_basis``) this logs its three scalars,
``diag/activation_params/<layer>/{lambda1,lambda2,d}``; for every local-basis residual (``CauchyNodes``,
``GaussianBumps``) the scale ``s``, summaries of the centres ``c_j`` (mean, std, min, max), of the widths
``d_j`` (mean, min, max), the effective number of nodes ``exp(entropy(softmax(a)))`` (M at init, 1 when
one node takes all the weight) and the largest weight. The full centres, widths and weights of every
measurement are kept for the figure (centres against step, the marker size showing the weight) and in
checkpoints.

Every rank holds the same parameters under DDP, so nothing needs reducing.
"""

from __future__ import annotations

from typing import Any, Literal

import lightning as L
import torch
from torch import nn

from callbacks.diagnostic import Diagnostic, Moment, Schedule
from modules.components.local_basis import CauchyAct, LocalBasisResidual


def cauchy_acts(model: nn.Module) -> list[tuple[str, CauchyAct]]:
    return [(n, m) for n, m in model.named_modules() if isinstance(m, CauchyAct)]


def basis_residuals(model: nn.Module) -> list[tuple[str, LocalBasisResidual]]:
    return [(n, m) for n, m in model.named_modules() if isinstance(m, LocalBasisResidual)]


def activation_param_values(model: nn.Module) -> tuple[dict[str, float], dict[str, dict[str, list[float]]]]:
    """``(logged values, {residual: {"centres", "widths", "weights"}})`` for the current parameters."""
    values: dict[str, float] = {}
    nodes: dict[str, dict[str, list[float]]] = {}
    with torch.no_grad():
        for name, act in cauchy_acts(model):
            values[f"{name}/lambda1"] = float(act.lambda1)
            values[f"{name}/lambda2"] = float(act.lambda2)
            values[f"{name}/d"] = float(act.d)
        for name, res in basis_residuals(model):
            c = res.centres.detach().double()
            w = res.widths.detach().double()
            p = res.weights.detach().double()
            values[f"{name}/scale"] = float(res.scale)
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
    """CauchyAct's ``lambda1, lambda2, d`` per layer and the local-basis nodes' centres, widths and weights.

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
        if not cauchy_acts(pl_module) and not basis_residuals(pl_module):
            return (f"ActivationParamTracker found no CauchyAct and no local-basis residual in "
                    f"{type(pl_module).__name__} (use activation: cauchy or arch: residual_can)")
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
        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt

        steps = [h["step"] for h in self.history]
        act_keys = sorted({k.rsplit("/", 1)[0] for h in self.history for k in h if k.endswith("/lambda1")})
        residuals = sorted({k for h in self.node_history for k in h if k != "step"})
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for layer in act_keys:
            for param, style in (("lambda1", "-"), ("lambda2", "--"), ("d", ":")):
                axes[0].plot(steps, [h.get(f"{layer}/{param}", float("nan")) for h in self.history], style,
                             label=f"{layer} {param}")
        axes[0].set(xlabel="step", title="CauchyAct parameters")
        if act_keys:
            axes[0].legend(fontsize=6)
        for name in residuals[:1]:
            for h in self.node_history:
                if name in h:
                    w = torch.tensor(h[name]["weights"])
                    axes[1].scatter([h["step"]] * len(w), h[name]["centres"], s=4 + 400 * w, c="tab:red", alpha=0.5)
            axes[1].set(xlabel="step", ylabel="centre c_j", title=f"{name} nodes (size: softmax weight)")
        fig.tight_layout()
        return fig
