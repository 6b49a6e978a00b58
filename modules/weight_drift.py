"""Paper 000-09 (Bug or Feature²): train an MLP, ResNet, ViT or tiny GPT with a chosen activation, loss and
optimiser, so the ``WeightDrift`` and ``ActivationStats`` callbacks can watch what the weights reading
``h = phi(z)`` do.

The paper's mechanism: for ``z' = W h + b`` with ``h >= 0`` (or mostly positive, ``E[phi(z)] > 0``),
``dL/dW = (dL/dz') h^T``; if ``E[dL/dz']`` is non-negative on the units that fire, the expected gradient
is non-negative and descent drives the mean of ``W`` negative, which zeroes more ReLUs (sparsity).
Whether that holds depends on the loss and optimiser: both come from the config (``model.init_args.loss``,
``model.init_args.optimizer``), the architecture and activation from ``model.init_args.net``.
"""

from __future__ import annotations

from modules.components.supervised import SupervisedTask


class WeightDriftModel(SupervisedTask):
    """``SupervisedTask`` under paper 000-09: checkpoints follow the validation loss (accuracy is
    meaningless on the random-label data the drift is first measured on)."""

    paper_id = "000-09"
    monitor = "val/loss"
    # step is SupervisedTask's: net(x), the loss and argmax, no .item() and no state: --run.seeds can stack it
    vectorizable = True
    monitor_mode = "min"
