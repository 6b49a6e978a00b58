"""``CausalLMTask``: next-token training of a ``TinyGPT`` with bits per byte, and ``load_lm`` for its checkpoints.

The task base of the tiny-language-model methods (ByteDistill, CD scaling, ScaleBITS, LMC-DM). It is
``SupervisedTask``'s next-token cross-entropy with two additions:

- targets ``-100`` are padding (BPE windows have different lengths): they count in no loss or metric, and
  trailing padding columns a whole batch shares are cut before the forward pass (the model is causal, so a
  real position never sees them);
- ``<stage>/bpb``: bits per byte, ``sum of the targets' cross-entropy in bits / sum of the bytes they
  cover``. A batch ``(x, y, n_bytes, ...)`` gives the bytes (``datamodules.bpe_text``); a character batch
  ``(x, y)`` counts one byte per target. That is exact for ``datamodules.text``: its stream is ASCII (a
  non-ASCII character is ``?``, one byte), so a character model's bpb equals its bits per character and a
  BPE model's bpb over the same stream is comparable with it.

Extra tensors after the first three (another tokenizer's ``(x, y, n_bytes)``) are for the subclass.
"""

from __future__ import annotations

import importlib
import math
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor

from errors import ConfigError
from modules.base import Stage, StepOutput, WeightedMean
from modules.components.supervised import NetFactory, SupervisedTask
from modules.components.tiny_gpt import TinyGPT

IGNORE = -100


def default_lm(shape: tuple[int, ...], n: int) -> TinyGPT:
    """The default task network: minGPT's gpt-nano with RMSNorm."""
    return TinyGPT(shape, n, norm="rmsnorm")


def lm_batch(batch: Any) -> tuple[Tensor, Tensor, Tensor]:
    """``(x, y, n_bytes)`` of the first tokenizer, padding columns shared by the whole batch cut off;
    ``n_bytes`` is one byte per target for character batches ``(x, y)``."""
    x, y = batch[0], batch[1]
    valid = y != IGNORE
    n_bytes = batch[2] if len(batch) > 2 else valid.sum(1)
    # the last real input sits one place after the last target (a BPE window's x holds all its tokens)
    width = min(int(valid.sum(1).max().item()) + 1, x.shape[1]) if len(batch) > 2 else x.shape[1]
    return x[:, :width], y[:, :width], n_bytes


class CausalLMTask(SupervisedTask, abstract=True):
    """Next-token cross-entropy of a ``TinyGPT`` over the real targets; logs ``loss``, ``acc``, ``bpc`` (bits
    per token) and ``bpb`` (bits per byte) per stage.

    Args:
        net: the task network (a ``TinyGPT`` factory, ``class_path`` + ``init_args`` in a config).
        input_shape, num_classes: ``(block_size,)`` and the vocabulary (linked from the DataModule).
        optimizer, lr_scheduler: see ``PaperTask``; the scheduler steps once per optimiser step.
    """

    #: language models here are budgeted in steps (``max_steps``, one long epoch): a cosine T_max counts steps
    scheduler_interval = "step"

    def __init__(
        self,
        net: NetFactory = default_lm,
        input_shape: tuple[int, ...] = (64,),
        num_classes: int = 128,
        optimizer: OptimizerCallable = lambda p: torch.optim.AdamW(p, lr=3e-3, weight_decay=0.0),
        lr_scheduler: LRSchedulerCallable | None = None,
    ) -> None:
        super().__init__(net, "ce", input_shape, num_classes, optimizer, lr_scheduler)
        if not isinstance(self.net, TinyGPT):
            raise ConfigError(
                f"{type(self).__name__} trains a TinyGPT; set net.class_path to modules.components.tiny_gpt.TinyGPT"
            )
        for stage_metrics in self.stage_metrics.values():
            stage_metrics["bpb"] = WeightedMean()
        self._metric_names.append("bpb")

    def lm_loss(self, batch: Any) -> tuple[Tensor, Tensor, StepOutput]:
        """``(logits, mean CE, StepOutput)`` of the first tokenizer's next-token prediction."""
        x, y, n_bytes = lm_batch(batch)
        logits = self(x)
        flat, target = logits.reshape(-1, logits.shape[-1]), y.reshape(-1)
        keep = target != IGNORE
        n_tok = keep.sum()
        ce_sum = F.cross_entropy(flat, target, ignore_index=IGNORE, reduction="sum")
        loss = ce_sum / n_tok.clamp_min(1)
        bits, total_bytes = ce_sum.detach() / math.log(2), n_bytes.sum()
        out = StepOutput(
            loss,
            n=int(n_tok),
            preds=flat[keep].argmax(-1),
            target=target[keep],
            inputs={
                "bpc": (loss.detach() / math.log(2), n_tok),
                "bpb": (bits / total_bytes.clamp_min(1), total_bytes),
            },
        )
        return logits, loss, out

    def per_sample_loss(self, batch: Any) -> Tensor:
        """``modules.protocols.PerSampleLoss``: each window's mean cross-entropy over its real targets, ``(B,)``."""
        x, y, _ = lm_batch(batch)
        logits = self(x)
        rows = F.cross_entropy(logits.transpose(1, 2), y, ignore_index=IGNORE, reduction="none")
        return rows.sum(1) / (y != IGNORE).sum(1).clamp_min(1)

    def step(self, batch: Any, stage: Stage) -> StepOutput:
        return self.lm_loss(batch)[2]


def _build_net(spec: Any, shape: tuple[int, ...], n: int) -> TinyGPT:
    if isinstance(spec, dict) and "class_path" in spec:
        module, _, name = spec["class_path"].rpartition(".")
        net = getattr(importlib.import_module(module), name)(shape, n, **(spec.get("init_args") or {}))
    elif isinstance(spec, str) and "<" not in spec:
        module, _, name = spec.rpartition(".")
        net = getattr(importlib.import_module(module), name)(shape, n)
    else:
        raise ConfigError(
            f"cannot rebuild the network {spec!r} from the checkpoint: train it from a config "
            "(net: class_path ...) or with a module-level factory"
        )
    if not isinstance(net, TinyGPT):
        raise ConfigError(f"the checkpoint's network is a {type(net).__name__}, not a TinyGPT")
    return net


def load_lm(ckpt: str | Path, prefix: str = "net.") -> TinyGPT:
    """The ``TinyGPT`` of a ``CausalLMTask`` checkpoint (``last.ckpt`` or ``best-*.ckpt``), in eval mode."""
    path = Path(ckpt)
    if not path.is_file():
        raise ConfigError(f"checkpoint {str(path)!r} does not exist; train the model first (its fit writes it)")
    state = torch.load(path, map_location="cpu", weights_only=False)
    hp = state.get("hyper_parameters") or {}
    if not {"net", "input_shape", "num_classes"} <= set(hp):
        raise ConfigError(f"{path} is not a checkpoint of a CausalLMTask (no net / input_shape / num_classes)")
    net = _build_net(hp["net"], tuple(hp["input_shape"]), int(hp["num_classes"]))
    weights = {k[len(prefix) :]: v for k, v in state["state_dict"].items() if k.startswith(prefix)}
    net.load_state_dict(weights)
    return net.eval()
