"""K seeds of one task trained in one process: parameters stacked on a leading seed axis, one vmapped step.

``SeedStack`` takes K copies of a task, each built by the CLI exactly as a plain ``fit --seed_everything s``
builds it (so each holds its own initialisation), stacks their parameters and buffers with
``torch.func.stack_module_state`` and points every copy's tensors at its slice of the stack (``tie``): the
optimizer steps the stacked tensors, and copy ``k`` always holds seed ``k``'s current weights (its metrics,
``extra_epoch_metrics`` and its checkpoint read them). One training step is ``vmap`` of the task's own
``step`` through ``functional_call`` over the seed axis; the loss back-propagated is the sum of the K seeds'
losses, so every seed's gradient is its own, unscaled (the seeds share no parameter). The optimizer is the
task's, built once over the stacked tensors: torch's optimizers are elementwise (SGD with momentum and
weight decay, Adam(W)), so one step over a stack is K independent steps, with one state per element.

``SeedStackData`` holds the K DataModules (each built under its own seed: its data and its order are the
plain run's) and zips their loaders (``ZipLoader``): step ``i`` gets batch ``i`` of every seed, stacked.

Rows: a stack's rows need not be seeds only. Each row is one plain run's config, which may differ from
the first row's in its seed and in its optimizer's hyperparameters (``--run.rows``: arms of a learning
rate, weight decay or momentum). When the rows' optimizers differ, the optimizer gets one param group per
block of consecutive rows with equal settings (an arm's seeds), built by the block's own task over leaf
views of its rows of every stacked tensor (``stacked.detach()[a:b]``: they share its storage, so the
group's update writes the stack), merged into one optimizer of the first row's class;
``on_before_optimizer_step`` hands each block's leaves its slice of the stacked gradient. torch's
optimizers and schedulers take their hyperparameters per group and are elementwise, so each row steps as
its plain run does. Rows whose optimizers all agree keep the seeds-only path: one group over the
stacked tensors.

What is refused, in one line naming the sequential fallback (``refusal``): a task that is not
``vectorizable``, a step that does not run under ``vmap``, gradient clipping (it would clip the norm over
all seeds), accumulated gradients, ``ReduceLROnPlateau`` (it follows one metric, not K), several
optimizers, rows whose optimizers are of different classes.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import lightning as L
import torch
from torch import Tensor, nn
from torch.func import functional_call, stack_module_state, vmap

from datamodules.base import BatchedTensorLoader, ResumableLoader, SplitsCache, shared_splits
from errors import ConfigError
from modules.base import PaperTask, Stage, as_step_output, metric_args

#: the Lightning hooks of a fit: a task that overrides one is refused (the stack runs PaperTask's, for all seeds)
FIT_HOOKS = ("training_step", "validation_step", "on_fit_start", "on_train_start", "on_train_epoch_start",
             "on_train_batch_start", "on_train_batch_end", "on_train_epoch_end", "on_validation_epoch_start",
             "on_validation_epoch_end", "on_before_backward", "on_after_backward", "on_before_optimizer_step",
             "optimizer_step", "configure_gradient_clipping", "on_train_end", "on_fit_end", "setup")
# torch has no vmap rule for CPU flash attention and loops over the seeds instead: measured (tiny GPT shapes,
# 4 seeds, forward + backward) 21.8 ms against 22.7 ms for four plain calls, so nothing a user should act on
warnings.filterwarnings("ignore", message=r".*not yet implemented the batching rule for aten::_scaled_dot_product")
#: the activations one vmapped call may keep for backward, summed over its seeds; more seeds than that run in
#: chunks (``SeedStack.chunk_size``). Why: a stack's activations are K times a plain step's, and past the CPU's
#: caches every op streams them from memory. The tiny GPT keeps 29 MB per seed: its stacked step took 1.28x the
#: K plain steps at K = 16 and 1.68x at K = 32 in one call, 0.90-1.05x in chunks of 4 (torch.vmap's chunk_size;
#: the flash-attention fallback's per-seed backward also fills a zero tensor of the whole call per seed, which
#: chunks shrink from K^2 to K x chunk). The reference MLP keeps 0.05 MB per seed and is never chunked.
CHUNK_BYTES = 128 * 2**20
SEQUENTIAL = "run the seeds one after another instead (a sweep with `seeds:`, or one fit per --seed_everything)"


def refusal(why: str) -> ConfigError:
    """The one line a seed-parallel run that cannot be vectorised fails with."""
    return ConfigError(f"--run.seeds cannot train these seeds in one process: {why}; {SEQUENTIAL}")


def task_class_refusal(cls: type) -> str | None:
    """Why a task class cannot train as a stack of seeds, or None: what the class alone decides. A fit with
    --run.seeds checks it when it builds the stack; a sweep with vectorize_seeds when it checks the sweep."""
    if not getattr(cls, "vectorizable", False):
        return (f"{cls.__name__} is not vectorizable ({cls.__name__}.vectorizable is False: its step is not known "
                "to be a pure function of parameters and batch; docs/design.md, 'Seed-parallel runs', says how to "
                "make a method vectorizable)")
    if getattr(cls, "configure_optimizers", None) is not PaperTask.configure_optimizers:
        return f"{cls.__name__} configures its own optimizers"
    hooks = [h for h in FIT_HOOKS if getattr(cls, h, None) is not getattr(PaperTask, h)]
    if hooks:  # the stack runs the base's hooks for all seeds, never a task's own
        return f"{cls.__name__} overrides {', '.join(hooks)}, which a stack of seeds does not run"
    return None


def rows_refusal(why: str) -> ConfigError:
    """The one line a stack of rows (``--run.rows``) that cannot share one process fails with."""
    return ConfigError(f"--run.rows cannot train these rows in one process: {why}; run them one after another "
                       "instead (a sweep without vectorize_arms, or one fit per row)")


class _StepCall(nn.Module):
    """``forward`` = the task's ``step``, so that ``functional_call`` can run ``step`` on other parameters."""

    def __init__(self, task: PaperTask) -> None:
        super().__init__()
        self.task = task

    def forward(self, batch: Any, stage: Stage) -> Any:
        return self.task.step(batch, stage)


def _map_tensors(batch: Any, fn: Any) -> Any:
    """``fn`` applied to every tensor of a batch (tensors, lists, tuples and dicts of them)."""
    if isinstance(batch, Tensor):
        return fn(batch)
    if isinstance(batch, list | tuple):
        return type(batch)(_map_tensors(b, fn) for b in batch)
    if isinstance(batch, dict):
        return {k: _map_tensors(v, fn) for k, v in batch.items()}
    return batch


def _stack_batches(batches: Sequence[Any]) -> Any:
    """K batches of the same structure as one batch with a leading seed axis."""
    first = batches[0]
    if isinstance(first, Tensor):
        return torch.stack(list(batches))
    if isinstance(first, list | tuple):
        return type(first)(_stack_batches([b[i] for b in batches]) for i in range(len(first)))
    if isinstance(first, dict):
        return {k: _stack_batches([b[k] for b in batches]) for k in first}
    raise refusal(f"a batch holds a {type(first).__name__}, which cannot be stacked over seeds")


class ZipLoader:
    """K loaders, one per seed, zipped: each item is their K batches stacked on a new leading axis.

    A paperlab loader (``ResumableLoader``) orders its batches from its own ``(seed, epoch)``; any other
    loader draws from torch's global generator when iterated, so each gets its own generator state (from
    when its seed's task was built, as in a plain run) swapped in around each of its batches.
    """

    def __init__(self, loaders: Sequence[Any], rng_states: Sequence[Tensor] | None = None) -> None:
        lengths = {len(loader) for loader in loaders}
        if len(lengths) != 1:
            raise refusal(f"the seeds' loaders have different lengths {sorted(lengths)}")
        self.loaders = list(loaders)
        self.rng_states = list(rng_states) if rng_states is not None else None
        self.sampler = self  # Lightning tells a loader its epoch through loader.sampler.set_epoch
        self.batch_sampler = None

    def __len__(self) -> int:
        return len(self.loaders[0])

    def set_epoch(self, epoch: int) -> None:
        for loader in self.loaders:
            sampler = getattr(loader, "sampler", None)
            if hasattr(sampler, "set_epoch"):
                sampler.set_epoch(epoch)

    def _own_rng(self, k: int) -> bool:
        return self.rng_states is not None and not isinstance(self.loaders[k], ResumableLoader)

    def _shared_tensors(self) -> tuple[Tensor, ...] | None:
        """The tensors every seed's loader gathers from, when they are the same ones (seed-independent data,
        ``datamodules.base.shared_splits``): then each step gathers the K seeds' batches at once."""
        first = self.loaders[0]
        for loader in self.loaders:
            if type(loader) is not BatchedTensorLoader or len(loader.tensors) != len(first.tensors) or any(
                    a is not b for a, b in zip(loader.tensors, first.tensors)):
                return None
        return first.tensors

    def __iter__(self) -> Iterator[Any]:
        tensors = self._shared_tensors()
        if tensors is not None:
            # each loader still orders and counts its own seed's indices (its resume state included)
            orders = [loader.counted(loader.indices) for loader in self.loaders]
            for idx in zip(*orders):
                stacked = torch.stack(idx)  # (K, batch): one gather for all seeds
                yield tuple(t[stacked] for t in tensors)
            return
        iterators = []
        for k, loader in enumerate(self.loaders):
            iterators.append(self._with_rng(k, lambda loader=loader: iter(loader)))
        while True:
            try:
                batches = [self._with_rng(k, lambda it=it: next(it)) for k, it in enumerate(iterators)]
            except StopIteration:
                return
            yield _stack_batches(batches)

    def _with_rng(self, k: int, fn: Any) -> Any:
        if not self._own_rng(k):
            return fn()
        assert self.rng_states is not None
        outer = torch.get_rng_state()
        torch.set_rng_state(self.rng_states[k])
        try:
            return fn()
        finally:
            self.rng_states[k] = torch.get_rng_state()
            torch.set_rng_state(outer)

    def state_dict(self) -> dict[str, Any]:
        return {"loaders": [loader.state_dict() if hasattr(loader, "state_dict") else {} for loader in self.loaders]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for loader, s in zip(self.loaders, state["loaders"], strict=True):
            if s and hasattr(loader, "load_state_dict"):
                loader.load_state_dict(s)


class SeedStackData(L.LightningDataModule):
    """The K seeds' DataModules as one: their loaders zipped (``ZipLoader``).

    Args:
        datamodules: one per seed, each built as the plain run of that seed builds it.
        rng_states: torch's global generator state of each seed after its task was built (what a plain run's
            ``DataLoader`` would draw its shuffling from).
    """

    def __init__(self, datamodules: Sequence[L.LightningDataModule], rng_states: Sequence[Tensor]) -> None:
        super().__init__()
        self.datamodules = list(datamodules)
        self.rng_states = list(rng_states)
        self.splits: SplitsCache = {}  # the seeds' shared splits of seed-independent data
        self.dataset_name = getattr(self.datamodules[0], "dataset_name", "data")

    def prepare_data(self) -> None:
        self.datamodules[0].prepare_data()

    def setup(self, stage: str) -> None:
        # seed-independent data is built once for all seeds (data a linked size built while the seeds' tasks
        # were is built already, once per seed, as the plain runs build it)
        with shared_splits(self.splits):
            for dm in self.datamodules:
                dm.trainer = self.trainer
                dm.setup(stage)

    def train_dataloader(self) -> ZipLoader:
        return ZipLoader([dm.train_dataloader() for dm in self.datamodules], self.rng_states)

    def val_dataloader(self) -> ZipLoader:
        return ZipLoader([dm.val_dataloader() for dm in self.datamodules])


class SeedStack(L.LightningModule):
    """K copies of a task (one per seed) trained as one (see the module docstring).

    Args:
        tasks: the seeds' tasks, each built under its own seed (``seed_everything(s)`` then the CLI's
            instantiation), all of one class and one configuration (with ``rows``: their optimizers' hyper-
            parameters may differ).
        seeds: their seeds, in the same order; with ``rows``, the rows' keys (distinct: ``0..K-1``), which
            name their metrics ``s<key>/...``.
        rows: each row's identity (its seed and optimizer overrides, in words) when the rows are not seeds
            only: a resume checks that the checkpoint holds the same rows.
    """

    def __init__(self, tasks: Sequence[PaperTask], seeds: Sequence[int], rows: Sequence[str] | None = None) -> None:
        super().__init__()
        first = tasks[0]
        cls = type(first)
        why = task_class_refusal(cls)
        if why is not None:
            raise refusal(why)
        if len(set(seeds)) != len(seeds) or not seeds:
            raise ConfigError(f"--run.seeds needs distinct seeds, got {list(seeds)}")
        if not first.automatic_optimization:
            raise refusal(f"{cls.__name__} optimises manually")
        self.seeds = [int(s) for s in seeds]
        # a plain list: the tasks are not submodules (their tensors are views of the stack, see tie)
        self.tasks: list[PaperTask] = list(tasks)
        self.paper_id, self.monitor, self.monitor_mode = cls.paper_id, cls.monitor, cls.monitor_mode
        self.summary_metrics = cls.summary_metrics
        self.task_class = cls
        params, buffers = stack_module_state(self.tasks)  # type: ignore[arg-type]
        self.param_names = list(params)
        self.buffer_names = list(buffers)
        self.stacked = nn.ParameterList([nn.Parameter(params[n].detach().clone()) for n in self.param_names])
        for i, name in enumerate(self.buffer_names):
            self.register_buffer(f"buffer_{i}", buffers[name].clone())
        self._caller = [_StepCall(first)]  # in a list: not a submodule either
        self._vstep: dict[str, Any] = {}  # stage -> (one seed's step, its output layout)
        self._vfn: dict[str, Any] = {}  # stage -> the vmapped step, once the chunk size is known
        self.chunk_bytes = CHUNK_BYTES
        self.chunk_size: int | None = None  # seeds per vmapped call (None: all), chosen at the first step
        self._chunk_chosen = False
        self._pending: dict[str, list[dict[str, tuple[Any, ...]]]] = {"train": [], "val": [], "test": []}
        self.failed: set[int] = set()  # seeds whose training loss became NaN or infinite: their runs end FAILED
        self.rows = list(rows) if rows is not None else None
        # when the rows' optimizers differ (configure_optimizers): the blocks of consecutive rows with equal
        # optimizer settings, (first row, end), and per block leaf views of its rows of every stacked tensor,
        # the params of its group; else empty (one group over the stacked tensors)
        self.row_blocks: list[tuple[int, int]] = []
        self.row_params: list[list[Tensor]] = []
        self.tie()

    # --- the stack and the copies ---------------------------------------------------------------------------
    def stacked_buffers(self) -> list[Tensor]:
        return [getattr(self, f"buffer_{i}") for i in range(len(self.buffer_names))]

    def tie(self) -> None:
        """Point every task's parameters and buffers at its slice of the stack (again after a device move)."""
        params = dict(zip(self.param_names, self.stacked, strict=True))
        buffers = dict(zip(self.buffer_names, self.stacked_buffers(), strict=True))
        for k, task in enumerate(self.tasks):
            task.to(self.device)
            for name, p in task.named_parameters():
                p.requires_grad_(False)
                p.data = params[name].data[k]
            for name, b in task.named_buffers():
                b.data = buffers[name].data[k]
        for (start, end), leaves in zip(self.row_blocks, self.row_params, strict=True):
            for leaf, p in zip(leaves, self.stacked, strict=True):
                leaf.data = p.data[start:end]  # after a device or dtype move the stack has new storage

    def on_fit_start(self) -> None:
        self.tie()

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["paperlab_seeds"] = list(self.seeds)
        checkpoint["paperlab_failed_seeds"] = sorted(self.failed)  # a resume keeps them stopped
        if self.rows is not None:
            checkpoint["paperlab_rows"] = list(self.rows)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        saved = checkpoint.get("paperlab_seeds")
        if saved is not None and list(saved) != self.seeds:
            raise ConfigError(f"the checkpoint holds the stack of seeds {list(saved)}, not {self.seeds}: resume "
                              f"with --run.seeds \"{list(saved)}\", or start a fresh fit without --ckpt_path")
        rows = checkpoint.get("paperlab_rows")
        if rows != self.rows:
            raise ConfigError(f"the checkpoint holds the rows {rows}, not {self.rows}: resume with the rows it "
                              "was fitted with, or start a fresh fit without --ckpt_path")
        self.failed = set(checkpoint.get("paperlab_failed_seeds", []))

    # --- one step for all seeds ------------------------------------------------------------------------------
    def _vectorized(self, stage: Stage) -> Any:
        """``one``: ``step`` on one seed's parameters, split into tensors (vmapped) and constants (the same for
        every seed: token counts, which metrics a stage updates), and the layout that puts them back together."""
        if stage in self._vstep:
            return self._vstep[stage]
        caller = self._caller[0]
        task = self.tasks[0]
        names = task._metric_names
        layout: dict[str, Any] = {}
        # every name of every tensor (a tied weight has two), found once: functional_call's own search for ties
        # walks every submodule at every call (the metrics' too), about 0.4 ms per step for the reference MLP
        aliases = [(f"task.{alias}", i) for i, name in enumerate(self.param_names)
                   for alias, p in task.named_parameters(remove_duplicate=False) if p is task.get_parameter(name)]
        buffer_aliases = [(f"task.{alias}", i) for i, name in enumerate(self.buffer_names)
                          for alias, b in task.named_buffers(remove_duplicate=False) if b is task.get_buffer(name)]

        def one(params: tuple[Tensor, ...], buffers: tuple[Tensor, ...], batch: Any) -> dict[str, Tensor]:
            state = {alias: params[i] for alias, i in aliases} | {alias: buffers[i] for alias, i in buffer_aliases}
            out = as_step_output(functional_call(caller, state, (batch, stage), tie_weights=False))
            tensors: dict[str, Tensor] = {}
            spec: dict[str, list[Any]] = {}
            for name, args in metric_args(out, names).items():
                spec[name] = []
                for i, a in enumerate(args):
                    if isinstance(a, Tensor):
                        tensors[f"{name}\0{i}"] = a
                        spec[name].append(None)
                    else:
                        spec[name].append(a)
            layout["spec"] = spec
            return tensors

        self._vstep[stage] = (one, layout)
        return self._vstep[stage]

    def _choose_chunk_size(self, one: Any, params: tuple[Tensor, ...], buffers: tuple[Tensor, ...],
                           batch: Any) -> int | None:
        """Seeds per vmapped call: as many as keep ``chunk_bytes`` of activations for backward, from the bytes
        one seed's plain step saves (measured once, a plain step of the first seed on its first batch: the step
        is pure, so this dry run changes nothing). A function of the shapes only: every run of a config chunks
        alike."""
        saved = 0

        def count(t: Tensor) -> Tensor:
            nonlocal saved
            saved += t.numel() * t.element_size()
            return t

        # validation runs under inference mode, where nothing is saved for backward: step out of it, and take
        # the batch out of its inference tensors
        with torch.inference_mode(False), torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(count, lambda t: t):
            one(tuple(p[0] for p in params), tuple(b[0].clone() for b in buffers), _map_tensors(batch, lambda t: t[0].clone()))
        per_call = max(1, self.chunk_bytes // max(saved, 1))
        return None if per_call >= len(self.seeds) else int(per_call)

    def seed_step(self, batch: Any, stage: Stage) -> tuple[Tensor, dict[str, tuple[Any, ...]]]:
        """The K seeds' losses ``(K,)`` and each metric's arguments with a leading seed axis."""
        one, layout = self._vectorized(stage)
        params, buffers = tuple(self.stacked), tuple(self.stacked_buffers())
        if not self._chunk_chosen:
            self.chunk_size = self._choose_chunk_size(one, params, buffers, batch)
            self._chunk_chosen = True
        if stage not in self._vfn:
            self._vfn[stage] = vmap(one, in_dims=(0, 0, 0), randomness="error", chunk_size=self.chunk_size)
        tensors = self._vfn[stage](params, buffers, batch)
        args = {name: tuple(tensors[f"{name}\0{i}"] if c is None else c for i, c in enumerate(spec))
                for name, spec in layout["spec"].items()}
        return args[""][0], args

    def _record(self, args: dict[str, tuple[Any, ...]], stage: Stage) -> None:
        self._pending[stage].append({n: tuple(a.detach() if isinstance(a, Tensor) else a for a in v)
                                     for n, v in args.items()})
        if len(self._pending[stage]) >= self.tasks[0].metric_flush_every:
            self.flush(stage)

    def flush(self, stage: Stage) -> None:
        """Hand the kept steps to every seed's metrics: per metric, the steps merged once for all seeds
        (stacked over seeds, concatenated over steps), then one ``update`` per seed with its slice."""
        steps, self._pending[stage] = self._pending[stage], []
        if not steps:
            return
        for name in steps[0]:
            calls = [s[name] for s in steps if name in s]
            try:
                merged = [_merge_seeded([c[i] for c in calls]) for i in range(len(calls[0]))]
            except (RuntimeError, TypeError, ValueError):
                for call in calls:
                    for k, task in enumerate(self.tasks):
                        task.update_metrics(stage, {name: tuple(a[k] if isinstance(a, Tensor) else a for a in call)})
                continue
            for k, task in enumerate(self.tasks):
                task.update_metrics(stage, {name: tuple(m[k] if seeded else m for m, seeded in merged)})

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        loss, args = self.seed_step(batch, "train")
        self._record(args, "train")
        # the seeds share no parameter: the gradient of the sum is each seed's own gradient
        return loss.sum()

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        _, args = self.seed_step(batch, "val")
        self._record(args, "val")

    # --- once per epoch: every seed's values, keyed s<seed>/<metric> (outputs.SeedRunsLogger routes them) -------
    def seed_epoch_values(self, stage: Stage) -> dict[str, Tensor]:
        self.flush(stage)
        out: dict[str, Tensor] = {}
        for seed, task in zip(self.seeds, self.tasks, strict=True):
            values = task.epoch_metrics(stage)
            values.update(task.extra_epoch_metrics(stage, values))
            if seed in self.failed:
                continue
            out.update({f"s{seed}/{k}": v for k, v in values.items()})
        return out

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if batch_idx + 1 == self.trainer.num_training_batches:
            self._log_train()

    def on_train_epoch_end(self) -> None:
        if self._pending["train"] or any(t._updated["train"] for t in self.tasks):
            self._log_train()

    def _log_train(self) -> None:
        values = self.seed_epoch_values("train")
        for seed in self.seeds:
            loss = values.get(f"s{seed}/train/loss")
            if loss is not None and not math.isfinite(float(loss)):
                self.failed.add(seed)  # this seed stops being logged; the others go on
        if set(self.seeds) <= self.failed:
            self.trainer.should_stop = True  # nothing left to train
        floats = {k: float(v) for k, v in values.items() if int(k[1:].split("/", 1)[0]) not in self.failed}
        for logger in self.loggers:
            logger.log_metrics(floats, step=self.global_step)
        self.trainer.callback_metrics.update(values)

    def on_validation_epoch_end(self) -> None:
        values = self.seed_epoch_values("val")
        if values:
            self.log_dict(values, on_step=False, on_epoch=True, batch_size=1)

    # --- optimisation ---------------------------------------------------------------------------------------
    def configure_optimizers(self) -> Any:
        task = self.tasks[0]
        blocks = self._row_blocks()
        if len(blocks) > 1:
            optimizer = self._row_optimizer(blocks)
        else:
            optimizer = task.optimizer_factory(list(self.stacked))
            if len(optimizer.param_groups) != 1:
                raise refusal("the optimizer splits the parameters into groups")
        for group in optimizer.param_groups:
            if "foreach" in optimizer.defaults and group.get("foreach") is None:
                # one fused update over all stacked tensors: the same elementwise maths as the per-tensor loop
                group["foreach"] = True
        if task.lr_scheduler_factory is None:
            return optimizer
        # the first row's scheduler over every group: the rows' schedulers are one config (the CLI checks),
        # and a scheduler keeps each group's own rates (base_lrs per group)
        scheduler = task.lr_scheduler_factory(optimizer)
        if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
            raise refusal("ReduceLROnPlateau follows one monitored value, and each seed has its own")
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": task.scheduler_interval}}

    def _row_blocks(self) -> list[tuple[int, int]]:
        """The rows as blocks of consecutive rows whose optimizers agree, ``(first row, end)``: one block when
        all agree (the seeds-only path). From one probe optimizer per row on a dummy tensor (microseconds); a
        different class is refused."""
        probe = torch.zeros(1, requires_grad=True)
        built = [task.optimizer_factory([probe]) for task in self.tasks]
        classes = {type(o).__name__ for o in built}
        if len(classes) > 1:
            raise rows_refusal(f"the rows' optimizers are of different classes ({', '.join(sorted(classes))}); rows "
                          "may differ in their optimizer's hyperparameters only")
        settings = [{k: v for k, v in o.param_groups[0].items() if k != "params"} for o in built]
        blocks = [(0, 1)]
        for k in range(1, len(settings)):
            if settings[k] == settings[k - 1]:
                blocks[-1] = (blocks[-1][0], k + 1)
            else:
                blocks.append((k, k + 1))
        return blocks

    def _row_optimizer(self, blocks: list[tuple[int, int]]) -> torch.optim.Optimizer:
        """One optimizer, one param group per block of rows with equal settings (a sweep's rows come arm by
        arm, so a block is an arm's seeds): its group is what the block's first task's optimizer makes of leaf
        views of the block's rows of every stacked tensor (see the module docstring). Per row would do too;
        per block, K seeds of A arms cost A group updates a step, not K."""
        self.row_blocks = blocks
        self.row_params = [[p.detach()[start:end] for p in self.stacked] for start, end in blocks]
        optimizer: torch.optim.Optimizer | None = None
        for (start, _), leaves in zip(blocks, self.row_params, strict=True):
            own = self.tasks[start].optimizer_factory(leaves)
            if len(own.param_groups) != 1:
                raise refusal("the optimizer splits the parameters into groups")
            if optimizer is None:
                optimizer = own
            else:
                optimizer.add_param_group(own.param_groups[0])
        assert optimizer is not None
        return optimizer

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Rows with their own param groups: each block's leaves get its slice of the stacked gradient (views,
        no copy), and the stacked gradient is let go, so the next backward starts from none (the optimizer's
        ``zero_grad`` clears the blocks' slices)."""
        if not self.row_params:
            return
        for i, p in enumerate(self.stacked):
            grad = p.grad
            for (start, end), leaves in zip(self.row_blocks, self.row_params, strict=True):
                leaves[i].grad = None if grad is None else grad[start:end]
            p.grad = None

    def check_trainer(self, trainer: L.Trainer) -> None:
        """Refuse what would couple the seeds (or is not built): clipping, accumulation, several processes."""
        if trainer.gradient_clip_val:
            raise refusal("gradient clipping would clip the norm over all seeds together")
        if trainer.accumulate_grad_batches != 1:
            raise refusal("accumulate_grad_batches is not supported with seeds")
        if trainer.world_size != 1:
            raise refusal("several processes (DDP) are not supported with seeds")


def _merge_seeded(parts: list[Any]) -> tuple[Any, bool]:
    """One metric argument of several steps merged for all seeds: ``(value, has a seed axis)``. Per-seed
    scalars ``(K,)`` are stacked to ``(K, steps)``, per-seed tensors ``(K, n, ...)`` concatenated along ``n``,
    constants (the same for every seed) become a float64 vector, as ``PaperTask.flush_metrics`` merges them."""
    first = parts[0]
    if isinstance(first, Tensor):
        return (torch.stack(parts, 1) if first.dim() == 1 else torch.cat(parts, 1)), True
    if isinstance(first, bool) or not isinstance(first, int | float):
        raise TypeError(f"cannot batch metric inputs of type {type(first).__name__}")
    return torch.tensor(parts, dtype=torch.float64), False
