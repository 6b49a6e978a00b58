"""CrossAttnContribution (paper 004-02): how much does the neural cross-attention move a decoder's tokens?

For a decoder whose neural data enter through a cross-attention sublayer in each block (BeeMO), the ratio of the
norm of that sublayer's residual to the norm of its input, per block, on a fixed batch (the first validation
batch): ``diag/cross_attn_contribution/layer<i>`` and their mean ``mean``. Near zero: the decoder ignores the
neural data and runs on its behaviour prior; it should grow once paired training starts. Each rank measures its
shard; the ratios are averaged over ranks.
"""

from __future__ import annotations

from typing import Any, Literal

import lightning as L
import torch

from callbacks.diagnostic import Diagnostic, Moment, Schedule
from modules import protocols
from tracking.figures import new_figure


class CrossAttnContribution(Diagnostic):
    """Per-block ``||cross-attention residual|| / ||its input||`` on a fixed batch (module docstring).

    Args:
        schedule: when to measure (default: every 100 steps).
        if_unsupported, plot, max_history: see ``Diagnostic``.
    """
    name = "cross_attn_contribution"
    requires = (protocols.CrossAttentionShare,)

    def __init__(self, schedule: Schedule = Schedule(every_n_steps=100),
                 if_unsupported: Literal["error", "skip"] = "error", plot: bool = True,
                 max_history: int = 10_000) -> None:
        super().__init__(schedule, if_unsupported, plot, max_history)

    def measure(self, trainer: L.Trainer, pl_module: L.LightningModule, moment: Moment) -> dict[str, Any] | None:
        batch = self.fixed_batch(trainer, moment)
        if batch is None:
            return None
        was_training = pl_module.training
        pl_module.eval()
        try:
            share = pl_module.cross_attention_share(batch).detach().double().cpu()
        finally:
            pl_module.train(was_training)
        return {"share": share, "ranks": torch.tensor(1.0, dtype=torch.float64)}

    def reduction(self, key: str) -> str:
        return "sum"

    def finalize(self, stats: dict[str, Any]) -> dict[str, float]:
        share = torch.as_tensor(stats["share"]).double() / float(stats["ranks"])
        out = {f"layer{i}": float(v) for i, v in enumerate(share.tolist())}
        out["mean"] = float(share.mean())
        return out

    def figure(self) -> Any:
        if not self.history:
            return None

        fig, ax = new_figure(figsize=(5, 3.5))
        steps = [rec.get("step", 0) for rec in self.history]
        for key in sorted(k for k in self.history[-1] if k.startswith("layer")):
            ax.plot(steps, [rec.get(key, float("nan")) for rec in self.history], marker="o", label=key)
        ax.set(xlabel="step", ylabel="|cross-attn residual| / |input|", title="neural contribution per block")
        ax.legend(fontsize=7)
        fig.tight_layout()
        return fig


__all__ = ["CrossAttnContribution"]
