"""``CompressedDDPClassifier``: the real path of paper 004-18's uplink compression, a classifier trained under
``modules.components.ddp_hooks.CompressedDDPStrategy`` (compressed gradient buckets all-reduced on
``torch.distributed``; the downlink stays simulated)."""

from __future__ import annotations

from modules.components.supervised import SupervisedTask


class CompressedDDPClassifier(SupervisedTask):
    """The real path: a classifier trained with data-parallel SGD under ``CompressedDDPStrategy`` (each rank a
    worker; gradient buckets compressed before the all-reduce). Everything is ``SupervisedTask``'s: the network
    and the SGD optimizer come from the config (``configs/inkheart_sgd/digits_randk_ddp.yaml``)."""

    paper_id = "004-18"
    monitor = "val/acc"
    monitor_mode = "max"
    vectorizable = False  # --run.seeds: its step has not been checked under torch.func.vmap yet
