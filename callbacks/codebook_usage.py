"""``CodebookUsage`` (paper 002-08): how much of a discrete tokenizer's codebook is in use.

On a fixed batch (the first validation batch) it reads the module's code counts (``codebook_counts(batch)``,
``modules.protocols.CodebookCounts``), sums them over ranks and logs ``diag/codebook_usage/perplexity``
(``exp`` of the entropy of the code frequencies: K for uniform use, 1 for a collapsed codebook),
``used`` (codes used at least once) and ``dead_frac`` (the fraction never used). VQ codebook collapse can
masquerade as a poor tokenizer; this is the check. A module with continuous tokens (no codes) logs nothing.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch

from callbacks.diagnostic import Diagnostic, Moment, Reduction, Schedule
from modules.components.vector_quantizer import codebook_perplexity
from modules.protocols import CodebookCounts


class CodebookUsage(Diagnostic):
    """Perplexity, used codes and the dead fraction of the codebook on a fixed batch (module docstring).

    Args:
        schedule: when to measure (default: fit start and every 50 steps).
        if_unsupported, plot, max_history: see ``Diagnostic``.
    """

    name = "codebook_usage"
    requires = (CodebookCounts,)
    default_plot = False
    default_schedule = Schedule(every_n_steps=50)

    def measure(self, trainer: L.Trainer, pl_module: L.LightningModule, moment: Moment) -> dict[str, Any] | None:
        assert isinstance(pl_module, CodebookCounts)
        batch = self.fixed_batch(trainer, moment)
        if batch is None:
            return None
        batch = tuple(t.to(pl_module.device) for t in batch)
        was_training = pl_module.training
        pl_module.eval()  # a measurement must not move an EMA codebook
        counts = pl_module.codebook_counts(batch)
        pl_module.train(was_training)
        if counts.numel() == 0:
            return None
        return {"counts": counts.double()}

    def reduction(self, key: str) -> Reduction | None:
        return "sum"

    def finalize(self, stats: dict[str, Any]) -> dict[str, float]:
        counts = torch.as_tensor(stats["counts"])
        used = int((counts > 0).sum())
        return {"perplexity": codebook_perplexity(counts), "used": float(used),
                "dead_frac": 1.0 - used / counts.numel()}
