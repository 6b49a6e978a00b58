"""LaplaceEvidence (paper 004-10): the EB-Laplace log evidence and log delta* of the net during fit.

At every validation (and on its schedule) it asks the module, through ``LaplaceEvidenceSource``, for log Z(delta*)
and log delta* of standard EB and of each gamma-canonical arm on the last training batch, which is the whole
training set under full-batch training (the evidence is a property of the training data, not of a validation
batch). Logged as ``diag/laplace_evidence/<arm>/log_evidence`` and ``.../<arm>/log_delta``. One device: under DDP
each rank would see its own shard, so the values are rank 0's.
"""

from __future__ import annotations

from typing import Any

import lightning as L

from callbacks.diagnostic import Diagnostic, Moment, Schedule
from modules import protocols


class LaplaceEvidence(Diagnostic):
    """Log evidence and log delta* of standard and gamma-canonical EB-Laplace on the training batch.

    Args:
        schedule: when to measure (default: after every validation; the sanity check has no training batch yet
            and is skipped).
        if_unsupported, plot, max_history: see ``Diagnostic``.
    """

    name = "laplace_evidence"
    requires = (protocols.LaplaceEvidenceSource,)
    default_schedule = Schedule(at_fit_start=False, at_validation=True)
    default_plot = False

    def measure(self, trainer: L.Trainer, pl_module: L.LightningModule, moment: Moment) -> dict[str, Any] | None:
        batch = moment.batch if moment.batch is not None else self._batch
        if batch is None:
            return None
        return dict(pl_module.laplace_evidence(batch))

    def reduction(self, key: str) -> None:
        return None

    def finalize(self, stats: dict[str, Any]) -> dict[str, float]:
        return {k: float(v) for k, v in stats.items()}


__all__ = ["LaplaceEvidence"]
