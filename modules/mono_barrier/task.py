"""``MonotoneBarrierModule``: MonoBarrier's train-and-refine search under Lightning (package docstring)."""

from __future__ import annotations

import time
from typing import Any, Literal

import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor

from errors import ConfigError
from modules.base import PaperTask, Stage, StepOutput, WeightedMean
from modules.mono_barrier.nets import MaxMonotoneNet
from modules.mono_barrier.search import BarrierSearch, MonotoneSystemLike, cells_tile, verify


class MonotoneBarrierModule(PaperTask):
    """Train-and-refine certification of a monotone system under Lightning: one epoch = ``refine_every``
    rounds' training steps of B on the barrier hinge losses, then a rebuild of the partition (queries);
    training stops once certified or out of budget. ``test`` re-checks the final certificate with its own
    queries (``verify``), checks that its cells tile X (``test/tiles``; ``test/certified`` needs both), and
    simulates the worst-case trajectory from init_hi under w_hi (``test/sim_unsafe`` = 1 if it reaches X_u within
    ``sim_steps`` steps: a concrete unsafe trajectory, since it is one).

    Args:
        num_features: n (linked from ``MonotoneSystemDataModule``).
        n_branches, hidden, branch: the ``MaxMonotoneNet``.
        margin: m of the hinge losses.
        refine_every: training epochs between rebuilds.
        max_queries: the query budget (None: 10 n).
        bisect_depth: plain bisections per cell when no cut helps (``BarrierSearch``).
        sim_steps: the length of the worst-case simulation at ``test``.
        seed: the network's initialisation seed; None: the run's seed.
    """

    paper_id = "004-14"
    monitor = "train/violations"
    monitor_mode = "min"
    vectorizable = False  # --run.seeds: it keeps training state beyond its parameters (extra_state)

    def __init__(
        self,
        num_features: int = 100,
        n_branches: int = 8,
        hidden: int = 32,
        branch: Literal["pos_mlp", "minmax"] = "pos_mlp",
        margin: float = 1e-2,
        refine_every: int = 1,
        max_queries: int | None = None,
        bisect_depth: int = 0,
        sim_steps: int = 500,
        seed: int | None = None,
        optimizer: OptimizerCallable = lambda p: torch.optim.Adam(p, lr=1e-2),
        lr_scheduler: LRSchedulerCallable | None = None,
    ) -> None:
        super().__init__(optimizer, lr_scheduler, metrics={"certified": WeightedMean(), "violations": WeightedMean(),
                                                            "tiles": WeightedMean(), "sim_unsafe": WeightedMean()})
        if refine_every < 1:
            raise ConfigError(f"refine_every must be >= 1, got {refine_every}")
        self.refine_every, self.max_queries, self.bisect_depth, self.sim_steps = refine_every, max_queries, bisect_depth, sim_steps
        self.margin = margin
        self.net = MaxMonotoneNet(num_features, n_branches, hidden, branch, seed=self.seed_or_run(seed))
        self.search: BarrierSearch | None = None
        self._pending_search: dict[str, Any] | None = None
        self._start = time.perf_counter()
        self.seconds = 0.0
        self.last_report: dict[str, float] = {}

    def setup(self, stage: str) -> None:
        if self.search is not None:
            return
        dm = getattr(self.trainer, "datamodule", None)
        system = getattr(dm, "system", None)
        if not isinstance(system, MonotoneSystemLike):
            raise ConfigError(f"{type(self).__name__} needs a monotone system: "
                              "data.class_path: datamodules.monotone_systems.MonotoneSystemDataModule")
        self.search = BarrierSearch(system, self.net, self.margin, max_queries=self.max_queries,
                                    bisect_depth=self.bisect_depth)
        if self._pending_search is not None:
            self.search.load(self._pending_search)
            self._pending_search = None

    def on_fit_start(self) -> None:
        self._start = time.perf_counter()

    def step(self, batch: Any, stage: Stage) -> StepOutput:
        assert self.search is not None
        one = torch.ones((), dtype=torch.float64)
        if stage == "train":
            loss = self.search.loss()
            if self.search.certified:  # the certificate's B must not move after its check
                loss = loss * 0.0
            return StepOutput(loss, n=1, inputs={k: None for k in ("certified", "violations", "tiles", "sim_unsafe")})
        sys_ = self.search.system
        report = verify(sys_, self.net, self.search.cells_lo, self.search.cells_hi)
        tiles = cells_tile(self.search.cells_lo, self.search.cells_hi, sys_.x_lo, sys_.x_hi)
        traj = sys_.worst_case_trajectory(self.sim_steps)
        unsafe = bool((traj >= sys_.unsafe_at).any())
        certified = report["certified"] * float(tiles)
        return StepOutput(one * report["violations"], n=1, inputs={
            "certified": (one * certified, 1), "violations": (one * report["violations"], 1),
            "tiles": (one * float(tiles), 1), "sim_unsafe": (one * float(unsafe), 1)})

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        assert self.search is not None
        last = batch_idx + 1 == self.trainer.num_training_batches
        if last and (self.trainer.current_epoch + 1) % self.refine_every == 0 and not self.search.certified:
            self.search.refine()
            self.seconds = time.perf_counter() - self._start
            if self.search.certified or self.search.exhausted():
                self.trainer.should_stop = True
        super().on_train_batch_end(outputs, batch, batch_idx)  # the epoch's metrics, after this round's rebuild

    def extra_epoch_metrics(self, stage: Stage, values: dict[str, Tensor]) -> dict[str, Tensor]:
        if stage != "train" or self.search is None:
            return {}
        return {f"train/{k}": torch.tensor(float(v)) for k, v in self.certificate_report().items()}

    def certificate_report(self) -> dict[str, float]:
        """``modules.protocols.CertificateReport``: the search's state after its last rebuild."""
        s = self.search
        if s is None:
            return {}
        return {"certified": float(s.certified), "violations": float(max(s.violations, 0)),
                "cells": float(len(s.cells_lo)), "queries": float(s.queries), "rounds": float(s.rounds),
                "seconds": float(self.seconds), "queries_per_dim": s.queries / len(s.system.x_lo)}

    def extra_state(self) -> dict[str, Any]:
        return {"search": self.search.state() if self.search is not None else None, "seconds": self.seconds}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self.seconds = float(state.get("seconds", 0.0))
        search = state.get("search")
        if search is None:
            return
        if self.search is None:
            self._pending_search = search
        else:
            self.search.load(search)
