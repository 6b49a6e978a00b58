"""``CDScalingLM``: one point of a CD-scaling grid, a character-level ``TinyGPT`` of non-embedding size N trained
for ``epochs`` passes over the first U characters of the train split (D = U x epochs tokens).

Each run's learning rate follows its own token budget (the spec's risk: runs with different D need their own
schedules, or a short run is compared at a high learning rate with a long one annealed): linear warm-up over
``warmup_fraction`` of ``trainer.estimated_stepping_batches``, then cosine from the peak to
``final_lr_fraction`` x peak at the last step.

Token accounting (``modules.protocols.TokenBudget``): ``n_params`` is the non-embedding parameter count of the
transformer blocks (Kaplan's N: token and position embeddings, the final norm and the head are left out),
``unique`` the number of distinct training targets (counted over the first epoch, in which the loader visits
every window once), ``seen`` every training target so far; ``seen / unique`` is the number of epochs.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from lightning.pytorch.cli import OptimizerCallable

from errors import ConfigError
from modules.base import Stage, StepOutput
from modules.components.lm_task import IGNORE, CausalLMTask, lm_batch
from modules.components.supervised import NetFactory
from modules.components.tiny_gpt import TinyGPT


def cd_lm(shape: tuple[int, ...], n: int) -> TinyGPT:
    """The default network: 4 layers, width 64 (N = 48 x 64^2 = 197k non-embedding parameters), RMSNorm."""
    return TinyGPT(shape, n, n_layer=4, n_head=4, n_embd=64, norm="rmsnorm")


def non_embedding_params(net: TinyGPT) -> int:
    """Kaplan's N: the parameters of the transformer blocks (``12 d^2`` per layer without biases)."""
    return sum(p.numel() for p in net.blocks.parameters())


def warmup_cosine(step: int, total: int, warmup: int, final: float) -> float:
    """The learning-rate factor after ``step`` optimiser steps of ``total``: linear 0 -> 1 over ``warmup`` steps,
    then cosine from 1 to ``final`` at ``step = total``."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return final + (1.0 - final) * 0.5 * (1.0 + math.cos(math.pi * progress))


class CDScalingLM(CausalLMTask):
    """Next-character training of a ``TinyGPT`` under a warm-up + cosine-to-``final_lr_fraction`` schedule over the
    run's own steps; logs its token budget through ``TokenAccounting``.

    Args:
        net: the task network (``TinyGPT`` factory; its width sets N).
        warmup_fraction: share of the run's optimiser steps spent warming up linearly.
        final_lr_fraction: the learning rate at the last step, as a fraction of the peak (0.1: cosine to 10 %).
        input_shape, num_classes, optimizer: see ``CausalLMTask``.
    """

    paper_id = "000-12"
    monitor = "val/loss"
    monitor_mode = "min"
    vectorizable = False  # --run.seeds: it configures its own optimizers

    def __init__(
        self,
        net: NetFactory = cd_lm,
        warmup_fraction: float = 0.05,
        final_lr_fraction: float = 0.1,
        input_shape: tuple[int, ...] = (64,),
        num_classes: int = 128,
        optimizer: OptimizerCallable = lambda p: torch.optim.AdamW(p, lr=3e-3, weight_decay=0.0),
    ) -> None:
        if not 0.0 <= warmup_fraction < 1.0:
            raise ConfigError(f"warmup_fraction={warmup_fraction} must be in [0, 1); 0.05 warms up over 5 % of the steps")
        if not 0.0 <= final_lr_fraction <= 1.0:
            raise ConfigError(f"final_lr_fraction={final_lr_fraction} must be in [0, 1]; 0.1 anneals to 10 %")
        super().__init__(net, input_shape, num_classes, optimizer, None)
        self.warmup_fraction = warmup_fraction
        self.final_lr_fraction = final_lr_fraction
        self.n_params = non_embedding_params(self.net)
        self.unique_tokens = 0
        self.seen_tokens = 0

    # --- token accounting ------------------------------------------------------------------------------------
    def token_budget(self) -> dict[str, int]:
        """``modules.protocols.TokenBudget``: N (non-embedding), U (distinct training targets), D (targets seen)."""
        return {"n_params": self.n_params, "unique": self.unique_tokens, "seen": self.seen_tokens}

    def extra_state(self) -> dict[str, Any]:
        return {"unique": self.unique_tokens, "seen": self.seen_tokens}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self.unique_tokens = int(state.get("unique", 0))
        self.seen_tokens = int(state.get("seen", 0))

    def step(self, batch: Any, stage: Stage) -> StepOutput:
        out = super().step(batch, stage)
        if stage == "train":
            _, y, _ = lm_batch(batch)
            n = int((y != IGNORE).sum())
            self.seen_tokens += n
            if self.current_epoch == 0:
                self.unique_tokens += n
        return out

    # --- the schedule ------------------------------------------------------------------------------------------
    def configure_optimizers(self) -> Any:
        optimizer = self.optimizer_factory(self.optimizer_parameters())
        steps = self.trainer.estimated_stepping_batches
        if not math.isfinite(steps) or steps < 1:
            raise ConfigError("CDScalingLM anneals over the whole run: set trainer.max_epochs (or max_steps) to a finite value")
        total = int(steps)
        warmup = max(1, round(self.warmup_fraction * total))
        final = self.final_lr_fraction
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: warmup_cosine(s, total, warmup, final))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
