"""Reference method: a classifier that proves the pipe (data -> module -> callbacks -> MLflow).

Not a paper: the baseline every paper's method is compared with, and the smallest complete example of the
project's conventions. All of it is ``SupervisedTask`` (``modules/components/supervised.py``): the network
(an MLP by default) comes from the config, the sizes from the data, the optimizer and scheduler from the
config; this class only names the method and what its checkpoints follow.
"""

from __future__ import annotations

from modules.components.supervised import SupervisedTask


class MLPClassifier(SupervisedTask):
    """Softmax classifier ``net(x) -> logits`` trained with cross-entropy; see ``SupervisedTask``."""

    paper_id = "reference"
    monitor = "val/acc"
    # step is SupervisedTask's: net(x), the loss and argmax, no .item() and no state: --run.seeds can stack it
    vectorizable = True
    monitor_mode = "max"
