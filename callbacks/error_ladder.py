"""``ErrorLadder``: the compression ladder's true errors, bounds and predictions after every level.

After each epoch (one level of a ``CompressionLadder``) it asks the module for ``error_ladder(batch)``
(``modules.protocols.ProvidesErrorLadder``) on the signals just trained on and logs, averaged over the test
signals, ``diag/error_ladder/true_<k>`` (RMS error of level k against the truth), ``bound_<k>``
(d_k factor(rho_calib)), ``pred_<k>`` (the signal-specific prediction), ``rho_calib``, ``coverage`` and
``tightness`` as far as the levels fitted so far allow. At fit end it logs the figure
``figures/error_ladder.png`` (error curves of every test signal; true and predicted local error maps of the
first) and the table ``tables/error_ladder.csv`` (one row per signal and level, with the level's convergence
check ``rel_grad`` and whether its bound used the tighter factor, ``orthogonal``).

The signals are the same on every rank (the ladder does not shard them), so nothing is reduced.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import lightning as L

from callbacks.diagnostic import Diagnostic, Moment, Schedule
from modules.protocols import ProvidesErrorLadder
from tracking.figures import new_figure


class ErrorLadder(Diagnostic):
    """Logs the ladder table after every level (see the module docstring).

    Args:
        schedule: when to measure (default: after every epoch, i.e. every level).
        if_unsupported, plot, max_history: see ``Diagnostic``.
    """
    name = "error_ladder"
    requires = (ProvidesErrorLadder,)
    default_schedule = Schedule(at_fit_start=False, every_n_epochs=1)

    def __init__(
        self,
        schedule: Schedule | None = None,
        if_unsupported: Literal["error", "skip"] = "error",
        plot: bool = True,
        max_history: int = 10_000,
    ) -> None:
        super().__init__(schedule, if_unsupported, plot, max_history)
        self.last: dict[str, Any] | None = None

    def measure(self, trainer: L.Trainer, pl_module: L.LightningModule, moment: Moment) -> dict[str, Any] | None:
        batch = moment.batch if moment.batch is not None else self._batch
        if batch is None:
            return None
        ladder = pl_module.error_ladder(batch)
        self.last = ladder
        out: dict[str, Any] = {}
        for k, row in enumerate(ladder["per_level"]):
            for key in ("true", "bound", "pred"):
                if math.isfinite(row[key]):
                    out[f"{key}_{k}"] = row[key]
        summary = ladder["summary"]
        for key, name in (("rho_calib", "rho_calib"), ("bound_coverage", "coverage"), ("tightness", "tightness")):
            if key in summary and math.isfinite(summary[key]):
                out[name] = summary[key]
        return out

    def table(self) -> list[dict[str, Any]] | None:
        """One row per (signal, level) of the last measurement (``tables/error_ladder.csv``)."""
        lad = self.last
        if lad is None:
            return None
        rows = []
        true, calib = lad["true"], lad["calib"]
        n = true.shape[1]
        for s in range(true.shape[0]):
            for k in range(n):
                row: dict[str, Any] = {"signal": s, "role": "calib" if bool(calib[s]) else "test",
                                       "level": lad["levels"][k], "true_rmse": float(true[s, k])}
                for key in ("d", "bound", "pred_self", "pred_calib"):
                    row[key] = float(lad[key][s, k]) if k < n - 1 and "d" in lad else ""
                # the convergence check of this level's fit, and whether the bound used 1 / sqrt(1 - rho^2)
                rel = lad.get("rel_grad")
                row["rel_grad"] = float(rel[s, k]) if rel is not None and k < rel.shape[1] else ""
                row["orthogonal"] = int(lad["orthogonal"][s, k]) if k < n - 1 and "d" in lad else ""
                rows.append(row)
        return rows

    def figure(self) -> Any | None:
        lad = self.last
        if lad is None or "d" not in lad:
            return None

        true, calib, levels = lad["true"], lad["calib"], lad["levels"]
        test = (~calib).nonzero().squeeze(1).tolist()
        n = true.shape[1]
        maps = lad.get("maps")
        n_maps = 0 if maps is None else maps["true"].shape[0]
        fig, grid = new_figure(1, 1 + 2 * min(n_maps, 2), figsize=(4 + 3 * 2 * min(n_maps, 2), 3.6), squeeze=False)
        axes = list(grid[0])  # squeeze=False: a (1, n) array even for a single panel
        ax = axes[0]
        for i, s in enumerate(test):
            c = f"C{i}"
            ax.plot(levels, true[s].tolist(), "o-", color=c, label="true" if i == 0 else None)
            ax.plot(levels[: n - 1], lad["bound"][s].tolist(), "^--", color=c, alpha=0.7, label="bound" if i == 0 else None)
            ax.plot(levels[: n - 1], lad["pred_self"][s].tolist(), "s:", color=c, alpha=0.7, label="pred" if i == 0 else None)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("level")
        ax.set_ylabel("RMS error")
        ax.set_title(f"rho_calib = {lad['rho_calib']:.3f}")
        ax.legend(fontsize=8)
        for j in range(min(n_maps, 2)):
            k = n_maps - 1 - j  # the finest two predicted levels
            for a, key in zip(axes[1 + 2 * j : 3 + 2 * j], ("true", "pred")):
                a.imshow(maps[key][k].cpu().numpy(), cmap="magma")
                a.set_title(f"{key} |error|, level {levels[k]}", fontsize=9)
                a.axis("off")
        fig.tight_layout()
        return fig
