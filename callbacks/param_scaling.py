"""ParameterScaling (paper 004-01): how a hypernetwork's parameter count grows with the target INR's width W.

Counting only, once (at fit start): the module reports, for each width W in ``widths`` (every hidden layer
of the INR W wide, its other settings unchanged), the trainable parameters of each hypernetwork it knows
(``modules.protocols.ProvidesParameterScaling``). Logged: ``diag/param_scaling/<model>/w<W>``, per model the
ratio of the counts at the two largest widths (``<model>/last_ratio``; a count that does not depend on W has
1, one affine in W tends to 2, one quartic to 16) and ``<model>/max_over_min``; at fit end, through the
``Diagnostic`` base, the table (``table()``, one row per width) as the artifact ``tables/param_scaling.csv``
and a log-log figure as ``figures/param_scaling.png``. Every rank counts the same: nothing to reduce.
"""

from __future__ import annotations

from typing import Any, Literal

import lightning as L

from callbacks.diagnostic import Diagnostic, Moment, Schedule
from errors import ConfigError
from modules.protocols import ProvidesParameterScaling
from tracking.figures import new_figure
from tracking.tables import table_csv


def scaling_rows(widths: list[int], counts: dict[str, list[int]]) -> list[dict[str, int]]:
    """One row per width W: ``{"width": W, <model>: count, ...}``."""
    return [{"width": w, **{name: c[i] for name, c in counts.items()}} for i, w in enumerate(widths)]


def scaling_table(widths: list[int], counts: dict[str, list[int]]) -> str:
    """The logged CSV text: ``width,<model>,...`` then one row per width."""
    return table_csv(scaling_rows(widths, counts))


class ParameterScaling(Diagnostic):
    """Trainable counts of the module's hypernetworks against the INR width (module docstring).

    Args:
        widths: the INR widths W (at least two, increasing).
        schedule: when to count (default: once, at fit start).
        if_unsupported, plot, max_history: see ``Diagnostic``.
    """
    name = "param_scaling"
    requires = (ProvidesParameterScaling,)

    def __init__(self, widths: list[int] = [16, 32, 64, 128, 256, 512],  # noqa: B006 - jsonargparse reads it
                 schedule: Schedule = Schedule(at_fit_start=True), if_unsupported: Literal["error", "skip"] = "error",
                 plot: bool = True, max_history: int = 10_000) -> None:
        super().__init__(schedule, if_unsupported, plot, max_history)
        widths = [int(w) for w in widths]
        if len(widths) < 2 or any(w < 1 for w in widths) or widths != sorted(set(widths)):
            raise ConfigError(f"widths must be at least two increasing positive integers, got {widths}")
        self.widths = widths
        self.counts: dict[str, list[int]] = {}

    def measure(self, trainer: L.Trainer, pl_module: L.LightningModule, moment: Moment) -> dict[str, float] | None:
        if self.counts:
            return None  # counted once
        self.counts = {k: [int(c) for c in v] for k, v in pl_module.param_scaling(self.widths).items()}
        out: dict[str, float] = {}
        for model, counts in self.counts.items():
            if len(counts) != len(self.widths):
                raise ConfigError(f"param_scaling returned {len(counts)} counts for {model}, expected {len(self.widths)}")
            for w, c in zip(self.widths, counts):
                out[f"{model}/w{w}"] = float(c)
            out[f"{model}/last_ratio"] = counts[-1] / counts[-2]
            out[f"{model}/max_over_min"] = max(counts) / min(counts)
        return out

    def extra_state(self) -> dict[str, Any]:
        return {"counts": dict(self.counts)}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self.counts = dict(state.get("counts", {}))

    def table(self) -> list[dict[str, Any]] | None:
        """The counts, one row per width (logged by the base as ``tables/param_scaling.csv``)."""
        return scaling_rows(self.widths, self.counts) if self.counts else None

    def figure(self) -> Any:
        if not self.counts:
            return None

        fig, ax = new_figure(figsize=(5, 3.5))
        for model, counts in self.counts.items():
            ax.loglog(self.widths, counts, marker="o", label=model)
        ax.set(xlabel="INR width W", ylabel="trainable parameters", title="hypernetwork size against target width")
        ax.legend(fontsize=7)
        fig.tight_layout()
        return fig


__all__ = ["ParameterScaling", "scaling_rows", "scaling_table"]
