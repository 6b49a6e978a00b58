"""ParameterScaling (paper 004-01): how a hypernetwork's parameter count grows with the target INR's width W.

Counting only, once (at fit start): the module reports, for each width W in ``widths`` (every hidden layer
of the INR W wide, its other settings unchanged), the trainable parameters of each hypernetwork it knows
(``modules.protocols.ProvidesParameterScaling``). Logged: ``diag/param_scaling/<model>/w<W>``, per model the
ratio of the counts at the two largest widths (``<model>/last_ratio``; a count that does not depend on W has
1, one affine in W tends to 2, one quartic to 16) and ``<model>/max_over_min``; the table as the artifact
``param_scaling/param_scaling.csv`` and a log-log figure. Every rank counts the same: nothing to reduce.
"""

from __future__ import annotations

from typing import Any, Literal

import lightning as L

from callbacks.diagnostic import Diagnostic, Moment, Schedule
from errors import ConfigError
from modules.protocols import ProvidesParameterScaling
from tracking.figures import log_artifact_bytes, mlflow_logger


def scaling_table(widths: list[int], counts: dict[str, list[int]]) -> str:
    """CSV: ``width,<model>,...`` one row per width."""
    names = list(counts)
    rows = ["width," + ",".join(names)]
    rows += [f"{w}," + ",".join(str(counts[n][i]) for n in names) for i, w in enumerate(widths)]
    return "\n".join(rows) + "\n"


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
        logger = mlflow_logger(trainer)
        if logger is not None and trainer.is_global_zero:
            log_artifact_bytes(logger, scaling_table(self.widths, self.counts), "param_scaling/param_scaling.csv")
        return out

    def extra_state(self) -> dict[str, Any]:
        return {"counts": dict(self.counts)}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self.counts = dict(state.get("counts", {}))

    def figure(self) -> Any:
        if not self.counts:
            return None
        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(5, 3.5))
        for model, counts in self.counts.items():
            ax.loglog(self.widths, counts, marker="o", label=model)
        ax.set(xlabel="INR width W", ylabel="trainable parameters", title="hypernetwork size against target width")
        ax.legend(fontsize=7)
        fig.tight_layout()
        return fig


__all__ = ["ParameterScaling", "scaling_table"]
