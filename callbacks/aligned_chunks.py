"""``AlignedChunkStats`` (paper 000-08): how often two tokenizations agree, and how much mass ends a token inside one.

Cross-tokenizer distillation compares the teacher and the student byte by byte; their token boundaries
coincide only at some byte offsets. On a training batch this asks the module for ``aligned_chunks(batch)``
(``modules.protocols.AlignedChunks``) and logs ``diag/aligned_chunks/<key>``:

- ``chunk_len_mean``, ``chunk_len_max``: bytes between consecutive offsets where both tokenizations start a
  token (an aligned chunk), and ``n_chunks``;
- ``boundary_mass_student``, ``boundary_mass_teacher``: the mean token-ending mass fraction ``e / (sum m + e)``
  at bytes inside an observed token, i.e. what ``boundary_mode="drop"`` throws away.

A module without a teacher (``loss=sft``) returns nothing and nothing is logged. Under DDP the sums and
counts are summed over ranks and the maxima maximised.
"""

from __future__ import annotations

from typing import Any

import lightning as L

from callbacks.diagnostic import Diagnostic, Moment, Reduction, Schedule
from modules.protocols import AlignedChunks


class AlignedChunkStats(Diagnostic):
    """Aligned-chunk lengths and boundary masses of a cross-tokenizer distillation (see the module docstring).

    Args:
        schedule: when to measure (default: every 50 steps).
        if_unsupported, plot, max_history: see ``Diagnostic``.
    """

    name = "aligned_chunks"
    requires = (AlignedChunks,)
    default_schedule = Schedule(every_n_steps=50)

    def measure(self, trainer: L.Trainer, pl_module: L.LightningModule, moment: Moment) -> dict[str, Any] | None:
        batch = moment.batch if moment.batch is not None else self._batch
        if batch is None:
            return None
        assert isinstance(pl_module, AlignedChunks)
        was = pl_module.training
        pl_module.eval()
        try:
            out = pl_module.aligned_chunks(batch)
        finally:
            pl_module.train(was)
        if not out:
            return None
        chunks = out["chunk_lengths"].double()
        stats: dict[str, Any] = {
            "chunk_sum": chunks.sum(),
            "n_chunks": float(chunks.numel()),
            "chunk_len_max": chunks.max() if chunks.numel() else 0.0,
        }
        for side in ("student", "teacher"):
            mass = out[f"boundary_mass_{side}"].double()
            stats[f"mass_sum_{side}"] = mass.sum()
            stats[f"mass_n_{side}"] = float(mass.numel())
        return stats

    def reduction(self, key: str) -> Reduction | None:
        return "max" if key == "chunk_len_max" else "sum"

    def finalize(self, stats: dict[str, Any]) -> dict[str, float]:
        out = {
            "n_chunks": float(stats["n_chunks"]),
            "chunk_len_max": float(stats["chunk_len_max"]),
            "chunk_len_mean": float(stats["chunk_sum"]) / max(float(stats["n_chunks"]), 1.0),
        }
        for side in ("student", "teacher"):
            out[f"boundary_mass_{side}"] = float(stats[f"mass_sum_{side}"]) / max(float(stats[f"mass_n_{side}"]), 1.0)
        return out
