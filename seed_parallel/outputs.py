"""What a seed-parallel fit leaves behind: K ordinary runs, as K plain fits would.

MLflow: a parent run ``<run name> seeds`` (the config with ``run.seeds``, tagged as a sweep parent so that
``compare`` reads its children like a sweep's seeds and never counts the parent) and one child run per seed,
``<run name> s<seed>``, with the params of a plain run with ``seed_everything: <seed>`` (``run.seeds`` None,
as in a plain run), the plain run's tags, the same metric names at the same steps and ``<monitor>_best``.
Files: each child has its own folder ``<checkpoint_root>/<experiment>/<run name>_s<seed>/`` with
``mlflow_run.json``, ``last.ckpt`` (the weights at the end) and ``best-epoch<NNN>.ckpt`` (the best epoch's
weights), both loadable by a plain ``test --ckpt_path``; they are written when training ends (the best
weights are kept in memory until then, and travel in the stack's own resumable ``last.ckpt``, in the
folder ``<run name>_seeds/``, which ``LastCheckpoint`` writes at epoch ends: ``SeedOutputs.state_dict``).

The trainer sees one logger, ``SeedRunsLogger`` (the parent run): it routes every metric named
``s<seed>/<metric>`` to that seed's child run as ``<metric>``, and ``epoch`` to all of them; the child
loggers share one writer thread.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_only

from callbacks.best_metric import improves
from callbacks.checkpoints import AtomicCheckpointIO
from tracking.config_artifact import fit_params, run_tags
from tracking.figures import log_artifact_bytes
from tracking.mlflow_logger import PaperlabMLFlowLogger
from tracking.run_registry import PROCESS_TAG, this_process, write_run_record

_SEEDED = re.compile(r"^s(-?\d+)/(.+)$")
#: the top-level seed line of a dumped config (the seeds' configs of a stack are one dump, this line apart)
SEED_LINE = re.compile(r"^seed_everything: .*$", re.M)
PARENT_ROLE = "parent"  # the value sweeps give the tag sweep.role of a sweep's parent run (compare skips those)


class SeedRunsLogger(PaperlabMLFlowLogger):
    """The parent run's logger; ``s<seed>/<metric>`` goes to that seed's child run (see the module docstring).

    Args:
        seeds: the seeds, each with a child run (created by ``open_children``).
        shares_parent: the parent (``run_id``) is a run of someone else's (a sweep's parent,
            ``--run.seed_runs``): the children hang under it and nothing else of this fit is logged into it
            (pass ``keep_end_time=True`` too: its status stays its owner's).
        kwargs: ``PaperlabMLFlowLogger``'s, for the parent run (``run_id``: a resume continues it).
    """

    def __init__(self, seeds: Sequence[int], shares_parent: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.seeds = [int(s) for s in seeds]
        self.shares_parent = shares_parent
        self.children: dict[int, PaperlabMLFlowLogger] = {}
        self._resumed: dict[int, str] = {}  # seed -> the child run a resume continues
        self._replayed: dict[int, list[list[Any]]] = {}  # a resume's metrics for children not opened yet
        self.failed: set[int] = set()
        self._shared = ThreadPoolExecutor(max_workers=1, thread_name_prefix="paperlab-mlflow-seeds")
        self._opened: Future | None = None

    def open_children(self, names: Mapping[int, str], tags: Mapping[int, Mapping[str, Any]],
                      params: Mapping[int, Mapping[str, Any]], configs: Mapping[int, str],
                      folders: Mapping[int, Path]) -> None:
        """One child run per seed under this run, with its params, tags and config, and its folder's run
        record. On the shared writer thread: K runs cost K times a run's start-up commits (about 0.1 s each
        on sqlite), which overlap the first training steps instead of delaying them; the children's metrics
        go through the same thread, so they reach runs that exist. An error is raised at ``finalize``."""
        parent = self.run_id
        tags = {seed: {**tags[seed], "mlflow.parentRunId": parent} for seed in self.seeds}
        for seed in self.seeds:
            self.children[seed] = PaperlabMLFlowLogger(
                experiment_name=self.experiment_name, run_name=names[seed], tracking_uri=self.tracking_uri,
                tags=tags[seed], run_id=self._resumed.get(seed), flush_every_s=self.flush_every_s, writer=self._shared)
            if seed in self._replayed:
                self.children[seed].replay(self._replayed.pop(seed))
        self._opened = self._shared.submit(self._open, dict(params), dict(configs), dict(folders), tags)

    def _open(self, params: dict[int, Mapping[str, Any]], configs: dict[int, str], folders: dict[int, Path],
              tags: dict[int, dict[str, Any]]) -> None:
        for seed in self.seeds:
            child = self.children[seed]
            # creates the run, in seed order; a row's params hold its own seed (its key is not a seed)
            child.log_hyperparams({"seed_everything": seed, **params[seed]})
            if seed in self._resumed:
                child.set_tags(tags[seed])  # a resumed run: this process owns it now (its process tag)
            log_artifact_bytes(child, configs[seed], "config/config.yaml")
            write_run_record(folders[seed], child)

    def resume_children(self, run_ids: Mapping[int, str]) -> None:
        """A resume: the children continue these runs (``open_children`` takes them over) instead of new ones."""
        self._resumed = {int(s): r for s, r in run_ids.items()}

    def unflushed(self) -> list[list[Any]]:
        """Every run's metrics not yet in the store, a child's keyed ``s<seed>/<metric>`` (what
        ``LastCheckpoint`` puts in the stack's checkpoint, for ``replay`` to route back on a resume)."""
        rows = super().unflushed()
        for seed, child in self.children.items():
            rows += [[f"s{seed}/{key}", *rest] for key, *rest in child.unflushed()]
        return rows

    def replay(self, rows: list[list[Any]]) -> None:
        own: list[list[Any]] = []
        for key, *rest in rows:
            match = _SEEDED.match(str(key))
            if match is None:
                own.append([key, *rest])
                continue
            seed, row = int(match.group(1)), [match.group(2), *rest]
            if seed in self.children:
                self.children[seed].replay([row])
            else:
                self._replayed.setdefault(seed, []).append(row)
        if own:
            super().replay(own)

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        own: dict[str, float] = {}
        routed: dict[int, dict[str, float]] = {s: {} for s in self.children}
        for key, value in metrics.items():
            match = _SEEDED.match(key)
            if match and int(match.group(1)) in routed:
                routed[int(match.group(1))][match.group(2)] = value
            elif key == "epoch":  # Lightning's own, added to every evaluation's values
                own[key] = value
                for values in routed.values():
                    values[key] = value
            else:
                own[key] = value
        for seed, values in routed.items():
            if values and not (set(values) <= {"epoch"}):
                self.children[seed].log_metrics(values, step)
        if own and not (set(own) <= {"epoch"}) and not self.shares_parent:
            super().log_metrics(own, step)

    @rank_zero_only
    def finalize(self, status: str = "success") -> None:
        try:
            if self._opened is not None:
                self._opened.result()  # the children exist (or their creation's error is raised here)
            for seed, child in self.children.items():
                child.finalize("failed" if seed in self.failed and status == "success" else status)
        finally:
            self._shared.shutdown(wait=True)
            super().finalize(status)


class SeedOutputs(Callback):
    """Per seed: the child run's params, tags, config and run record at fit start, ``<monitor>_best`` after
    every validation, ``last.ckpt`` and ``best-epoch<NNN>.ckpt`` when training ends.

    Args:
        seeds: the seeds.
        names: child run name per seed.
        folders: checkpoint folder per seed.
        configs: the dumped config (YAML) of the plain run of each seed.
        tags: each seed's child run's tags (the command line's, the group's or the sweep's).
        monitor, mode: the task's monitored metric and its direction.
        row_seeds: with ``--run.rows``, each row's seed (``seeds`` are then the rows' keys).
    """

    def __init__(self, seeds: Sequence[int], names: Mapping[int, str], folders: Mapping[int, Path],
                 configs: Mapping[int, str], tags: Mapping[int, Mapping[str, Any]], monitor: str, mode: str,
                 group_folder: Path | None = None, row_seeds: Mapping[int, int] | None = None) -> None:
        self.seeds = [int(s) for s in seeds]
        self.row_seeds = dict(row_seeds) if row_seeds is not None else None
        self.group_folder = group_folder
        self.names, self.folders, self.configs = dict(names), dict(folders), dict(configs)
        self.tags = {int(s): dict(t) for s, t in tags.items()}
        self.monitor, self.mode = monitor, mode
        self.best: dict[int, float] = {}
        self.best_state: dict[int, tuple[int, int, dict[str, torch.Tensor]]] = {}
        self.io = AtomicCheckpointIO()

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        logger = trainer.logger
        if not isinstance(logger, SeedRunsLogger) or not trainer.is_global_zero:
            return
        # the same for every seed (the task's class, the data, the hardware, the commit): read once
        common = run_tags(trainer, pl_module.tasks[0], "fit")
        tags = {s: {**self.tags[s], **common} for s in self.seeds}
        logger.open_children(self.names, tags, self._params(), self.configs, self.folders)
        if self.group_folder is not None:
            # the parent run a resume of the stack continues (a sweep's, when shared) and the stack's seeds
            rows = {"rows": [self.names[k] for k in self.seeds]} if self.row_seeds is not None else {}
            write_run_record(self.group_folder, logger, seeds=self.seeds, **rows)
            if trainer.ckpt_path is not None and not logger.shares_parent:  # a resume: this process owns the run
                logger.set_tags({PROCESS_TAG: this_process()})

    def state_dict(self) -> dict[str, Any]:
        """In the stack's ``last.ckpt``: each seed's best value and its best epoch's weights, which the
        ``best-epoch<NNN>.ckpt`` written at the end of a resumed fit needs."""
        return {"best": dict(self.best), "best_state": dict(self.best_state)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.best = {int(s): float(v) for s, v in state_dict["best"].items()}
        self.best_state = {int(s): v for s, v in state_dict["best_state"].items()}

    def _params(self) -> dict[int, dict[str, Any]]:
        """Each seed's params, parsed from its config once when the configs differ in their seed line only
        (a parse costs tens of milliseconds; a sweep's seeds differ in their tags too)."""
        bare = {s: SEED_LINE.sub("", text) for s, text in self.configs.items()}
        if len(set(bare.values())) == 1:
            shared = fit_params(self.configs[self.seeds[0]])
            return {s: {**shared, "seed_everything": s} for s in self.seeds}
        return {s: fit_params(self.configs[s]) for s in self.seeds}

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        out: dict[str, float] = {}
        for seed, task in zip(self.seeds, pl_module.tasks, strict=True):
            key = f"s{seed}/{self.monitor}"
            if key not in trainer.callback_metrics or seed in pl_module.failed:
                continue
            value = float(trainer.callback_metrics[key])
            if math.isfinite(value) and improves(value, self.best.get(seed), self.mode):
                self.best[seed] = value
                self.best_state[seed] = (trainer.current_epoch, trainer.global_step, _weights(task))
            if seed in self.best:
                out[f"s{seed}/{self.monitor}_best"] = self.best[seed]
        if out and trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics(out, step=trainer.global_step)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        logger = trainer.logger
        if isinstance(logger, SeedRunsLogger):
            logger.failed = set(pl_module.failed)
        kept = [(seed, task) for seed, task in zip(self.seeds, pl_module.tasks, strict=True) if seed not in pl_module.failed]
        writes = self._writes(trainer, kept, "last.ckpt")
        # 2K atomic writes, each ending in an fsync: a few threads wait for the disk together (the GIL is free
        # meanwhile); an error is raised here, the files already written stay complete
        with ThreadPoolExecutor(max_workers=4, thread_name_prefix="paperlab-seed-ckpt") as pool:
            for done in [pool.submit(self.io.save_checkpoint, ckpt, path) for ckpt, path in writes]:
                done.result()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        """Ctrl-C: each seed's weights at the interrupt (``interrupted.ckpt``) and its best so far, as a plain
        fit leaves them (``callbacks.guards.InterruptCheckpoint``); for evaluation, not for a resume."""
        if not isinstance(exception, KeyboardInterrupt) or not trainer.is_global_zero:
            return
        for ckpt, path in self._writes(trainer, list(zip(self.seeds, pl_module.tasks, strict=True)), "interrupted.ckpt"):
            self.io.save_checkpoint(ckpt, path)

    def _writes(self, trainer: L.Trainer, tasks: list[tuple[int, Any]], now: str) -> list[tuple[dict[str, Any], Path]]:
        """Per seed: its current weights as ``now`` and its best epoch's as ``best-epoch<NNN>.ckpt``."""
        writes = []
        for seed, task in tasks:
            writes.append((self._checkpoint(task, trainer.current_epoch, trainer.global_step, _weights(task)),
                           self.folders[seed] / now))
            if seed in self.best_state:
                epoch, step, best = self.best_state[seed]
                writes.append((self._checkpoint(task, epoch, step, best), self.folders[seed] / f"best-epoch{epoch:03d}.ckpt"))
        return writes

    @staticmethod
    def _checkpoint(task: Any, epoch: int, step: int, state: dict[str, torch.Tensor]) -> dict[str, Any]:
        """A weights-only checkpoint as Lightning writes one: what a plain ``test --ckpt_path`` loads."""
        return {"epoch": epoch, "global_step": step, "pytorch-lightning_version": L.__version__,
                "state_dict": state, "hparams_name": "kwargs", "hyper_parameters": dict(task.hparams),
                "paperlab_task_state": task.extra_state()}


def _weights(task: Any) -> dict[str, torch.Tensor]:
    """A copy of the task's current weights (its tensors are views of the stack, which the next step changes)."""
    return {k: v.detach().clone() for k, v in task.state_dict().items()}


def seed_summary(module: Any, outputs: SeedOutputs, logger: Any, metrics: Mapping[str, Any]) -> list[str]:
    """The summary's lines for a seed-parallel fit: one per seed (monitor last and best, its run, its folder)."""
    lines = []
    monitor = outputs.monitor
    parent = f"parent run {logger.run_id}" if isinstance(logger, SeedRunsLogger) else "no MLflow run"
    what = "rows (arms x seeds)" if outputs.row_seeds is not None else "seeds"
    lines.append(f"  {len(outputs.seeds)} {what} in one process ({parent})")
    for seed in outputs.seeds:
        last = metrics.get(f"s{seed}/{monitor}")
        best = outputs.best.get(seed)
        state = "FAILED (loss not finite)" if seed in module.failed else (
            f"{monitor} last {float(last):.4g}" if last is not None else f"{monitor} not logged")
        if best is not None and seed not in module.failed:
            state += f", best {best:.4g}"
        run = logger.children[seed].run_id if isinstance(logger, SeedRunsLogger) and seed in logger.children else "-"
        label = f"'{outputs.names[seed]}'" if outputs.row_seeds is not None else f"s{seed}"
        lines.append(f"  {label}: {state}; run {run}; {outputs.folders[seed]}/")
    return lines
