"""``TokenAccounting`` (paper 000-12): N, U and D of a data-constrained run, exact in MLflow.

A scaling-law fit over runs needs each run's model size N, its unique tokens U and the tokens it trained on D
(``D / U`` epochs). Config values (``data.train_chars``, ``trainer.max_epochs``) say what was asked; this logs
what the run did, read from the module's ``token_budget()`` (``modules.protocols.TokenBudget``) after every
training epoch: ``diag/token_accounting/n_params``, ``unique``, ``seen`` and ``epochs = seen / unique``.
Under DDP each rank counts its own share of the batches, so U and D are summed over ranks and N is the same
on every rank.
"""

from __future__ import annotations

from typing import Any

import lightning as L

from callbacks.diagnostic import Diagnostic, Moment, Reduction, Schedule
from modules.protocols import TokenBudget


class TokenAccounting(Diagnostic):
    """N, U, D and D / U after every training epoch (see the module docstring).

    Args:
        schedule: when to measure (default: after every training epoch, not at fit start).
        if_unsupported, plot, max_history: see ``Diagnostic``.
    """

    name = "token_accounting"
    requires = (TokenBudget,)
    default_plot = False
    default_schedule = Schedule(at_fit_start=False, every_n_epochs=1)

    def measure(self, trainer: L.Trainer, pl_module: L.LightningModule, moment: Moment) -> dict[str, Any] | None:
        assert isinstance(pl_module, TokenBudget)
        budget = pl_module.token_budget()
        return {"n_params": float(budget["n_params"]), "unique": float(budget["unique"]), "seen": float(budget["seen"])}

    def reduction(self, key: str) -> Reduction | None:
        return None if key == "n_params" else "sum"

    def finalize(self, stats: dict[str, Any]) -> dict[str, float]:
        out = {k: float(v) for k, v in stats.items()}
        out["epochs"] = out["seen"] / out["unique"] if out["unique"] > 0 else 0.0
        return out
