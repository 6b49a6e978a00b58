"""The state of a certificate search: certified or not, failed checks, partition size and simulator queries.

A certificate search (004-14 MonoBarrier's train-and-refine loop) verifies its candidate exactly after each
refinement; this diagnostic puts that trajectory into MLflow. It reads ``certificate_report()``
(``modules.protocols.CertificateReport``) and logs ``diag/certificate/<key>`` for every key the module
reports (at least ``certified``, ``violations``, ``cells``, ``queries``), every ``every_n_epochs`` epochs
(one epoch is one refinement round) and at fit end, so the last value is the final certificate's even when
the search stops mid-schedule. Every rank runs the same deterministic search, so nothing is reduced. The
figure draws queries and violations against the round.
"""

from __future__ import annotations

from typing import Any

import lightning as L

from callbacks.diagnostic import Diagnostic, Moment, Schedule
from modules.protocols import CertificateReport
from tracking.figures import new_figure


class CertificateVerification(Diagnostic):
    """Log ``diag/certificate/*`` from the module's ``certificate_report()`` (see the module docstring).

    Args:
        schedule: when to log (default: every epoch, i.e. every refinement round, and not at fit start).
        if_unsupported, plot, max_history: see ``Diagnostic``.
    """
    name = "certificate"
    requires = (CertificateReport,)
    default_schedule = Schedule(at_fit_start=False, every_n_epochs=1)

    def measure(self, trainer: L.Trainer, pl_module: L.LightningModule, moment: Moment) -> dict[str, Any] | None:
        assert isinstance(pl_module, CertificateReport)
        report = pl_module.certificate_report()
        return {k: float(v) for k, v in report.items()} or None

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # the search may stop (certified, budget spent) between two scheduled epochs: log the final state
        if self.active and (not self.history or self.history[-1].get("step") != trainer.global_step):
            self.run(trainer, pl_module, Moment("epoch", trainer.global_step, trainer.current_epoch))

    def figure(self) -> Any | None:
        rows = [h for h in self.history if "queries" in h]
        if not rows:
            return None

        fig, axes = new_figure(1, 2, figsize=(8.4, 3.2))
        x = list(range(1, len(rows) + 1))
        axes[0].plot(x, [h["queries"] for h in rows], marker="o")
        axes[0].set_title("simulator queries", fontsize=9)
        axes[1].plot(x, [h["violations"] for h in rows], marker="o")
        axes[1].set_title("failed checks", fontsize=9)
        for ax in axes:
            ax.set_xlabel("measurement (round)")
        fig.tight_layout()
        return fig
