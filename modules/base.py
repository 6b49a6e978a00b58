"""``PaperTask``: the LightningModule every method subclasses. A subclass writes its maths; this file does the rest.

The contract (``docs/design.md`` explains it with an example):

- class attributes ``paper_id``, ``monitor`` (the metric checkpoints and ``<monitor>_best`` follow) and
  ``monitor_mode`` (``"min"`` or ``"max"``); a class that lacks one fails when it is defined;
- ``__init__`` takes ``optimizer: OptimizerCallable`` and ``lr_scheduler: LRSchedulerCallable | None`` (the
  LightningCLI way: ``class_path`` + ``init_args`` in the YAML) and hands them, with the metrics it wants,
  to ``super().__init__``;
- ``step(batch, stage)`` returns the loss, or a ``StepOutput`` with the loss and what the metrics need.
  ``training_step``/``validation_step``/``test_step``/``predict_step`` live here and call it;
- metrics are declared once (a dict or ``MetricCollection`` of torchmetrics objects); they are cloned per
  stage, updated every step, and logged once per epoch as ``<stage>/<name>`` next to ``<stage>/loss``, the
  sample-weighted mean of the step losses. torchmetrics accumulates and reduces across DDP ranks;
- sizes that come from the data (``input_shape``, ``num_classes``, ...; ``datamodules.base.LINKED_SIZES``)
  are ``__init__`` arguments of those names; the CLI links them from the DataModule, so no config types
  them;
- a method that needs several optimizers or manual optimisation overrides ``configure_optimizers``
  (and sets ``self.automatic_optimization = False``) and keeps everything else.
"""

from __future__ import annotations

import functools
import inspect
import re
import typing
from collections.abc import Mapping
from typing import Any, ClassVar, Literal, NamedTuple

import torch
from lightning import LightningModule
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor, nn
from torchmetrics import Metric, MetricCollection

from datamodules.base import current_run_seed
from errors import ConfigError

Stage = Literal["train", "val", "test"]
STAGES: tuple[Stage, ...] = ("train", "val", "test")
REQUIRED_ATTRIBUTES = ("paper_id", "monitor", "monitor_mode")


class StepOutput(NamedTuple):
    """What ``PaperTask.step`` returns.

    Args:
        loss: the batch's loss (a scalar; training back-propagates it).
        n: what the loss averages over (samples, tokens): the weight of this batch in ``<stage>/loss``
            (default: the length of ``target``, else 1).
        preds, target: the arguments of every declared metric's ``update`` (the common case).
        inputs: per-metric arguments, ``{name: tensor or tuple of tensors}``; a name given here gets these
            instead of ``(preds, target)``, and a name mapped to None is not updated at this step. A metric
            never updated in an epoch is not logged for that stage.
    """

    loss: Tensor
    n: int | None = None
    preds: Tensor | None = None
    target: Tensor | None = None
    inputs: Mapping[str, Tensor | tuple[Tensor, ...]] | None = None


class WeightedMean(Metric):
    """The weighted mean of values, summed across DDP ranks (``<stage>/loss``: batch losses weighted by the
    samples they average over).

    ``update(value, weight)`` takes one value or a vector of values with their weights. Lighter than
    ``torchmetrics.MeanMetric`` (no NaN checks, hence no host sync per update): a NaN loss is the
    ``FiniteLossGuard``'s business, and it should show in the logged mean, not be dropped.
    """

    full_state_update = False

    def __init__(self) -> None:
        super().__init__()
        self.add_state("total", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("weight", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, value: Tensor, weight: float | Tensor = 1.0) -> None:
        w = torch.as_tensor(weight, dtype=torch.float64, device=self.total.device)
        self.total += (value.detach().double() * w).sum()
        self.weight += w.expand_as(value).sum() if value.dim() else w.sum()

    def compute(self) -> Tensor:
        return (self.total / self.weight).float()


def _merge(parts: list[Any]) -> Tensor:
    """The step inputs of one metric argument as one batch: scalars stacked, tensors concatenated."""
    first = parts[0]
    if isinstance(first, Tensor):
        return torch.stack(parts) if first.dim() == 0 else torch.cat(parts)
    if isinstance(first, bool) or not isinstance(first, int | float):
        raise TypeError(f"cannot batch metric inputs of type {type(first).__name__}")
    return torch.tensor(parts, dtype=torch.float64)


def _detach(value: Any) -> Any:
    """A metric state (a tensor or a list of tensors) detached and cloned for a checkpoint."""
    if isinstance(value, list):
        return [v.detach().clone() for v in value]
    return value.detach().clone()


def as_step_output(out: Tensor | StepOutput) -> StepOutput:
    """What ``step`` returned, as a ``StepOutput`` (a bare loss is one)."""
    return out if isinstance(out, StepOutput) else StepOutput(out)


def metric_args(out: StepOutput, names: list[str]) -> dict[str, tuple[Any, ...]]:
    """The arguments of each metric's ``update`` at this step, ``{"": (loss, n), name: args}`` (names not
    updated at this step left out). Pure: it only picks from ``out``, so it runs under ``torch.func.vmap``."""
    n = out.n if out.n is not None else (len(out.target) if out.target is not None else 1)
    args: dict[str, tuple[Any, ...]] = {"": (out.loss, n)}
    inputs = out.inputs or {}
    for name in names:
        if name in inputs:
            given = inputs[name]
            if given is None:
                continue
            args[name] = given if isinstance(given, tuple) else (given,)
        elif out.preds is not None:
            args[name] = (out.preds, out.target)
    return args


def _plain(value: Any) -> Any:
    """A value as checkpoints can store it: configs stay as they are, callables become their dotted name."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_plain(v) for v in value)
    if value is None or isinstance(value, str | int | float | bool):
        return value
    # a function or class names itself; any other object (a functools.partial, an instance) by its type
    target = value if callable(value) and hasattr(value, "__qualname__") else type(value)
    return f"{target.__module__}.{target.__qualname__}"


def default_optimizer(params: Any) -> torch.optim.Optimizer:
    """Adam(W) at lr 1e-3 without weight decay: what a subclass gets when it does not choose."""
    return torch.optim.AdamW(params, lr=1e-3, weight_decay=0.0)


#: how torch's optimizers and schedulers word an argument when they refuse it ("Invalid learning rate: -0.01",
#: "Invalid beta parameter at index 0") -> the argument's name; a refusal that spells the name itself
#: ("Invalid weight_decay value") needs no entry
_ARGUMENT_WORDS: tuple[tuple[str, str], ...] = (
    (r"learning rate", "lr"),
    (r"\bbeta(s|[12]| parameter)?\b", "betas"),
    (r"\bepsilon[12]?\b", "eps"),
    (r"weight decay", "weight_decay"),
    (r"\beta(s| values)\b", "etas"),
    (r"multiplicative factor|\bfactor\b", "factor"),
)


def _factory_class(factory: Any) -> type | None:
    """The class an optimizer or scheduler factory builds: the class itself, or a ``functools.partial`` of it
    (how Python code and the CLI's factories hold one); None for a plain function or a lambda."""
    if isinstance(factory, type):
        return factory
    if isinstance(factory, functools.partial):
        if isinstance(factory.func, type):
            return factory.func
        return next((a for a in factory.args if isinstance(a, type)), None)
    return None


def refused_argument(factory: Any, message: str) -> str | None:
    """The argument of ``factory``'s class that a refusal ``message`` is about, or None if it names none."""
    cls = _factory_class(factory)
    try:  # the first argument is the parameters (an optimizer) or the optimizer (a scheduler): not an option
        names = list(inspect.signature(cls).parameters)[1:] if cls is not None else []
    except (TypeError, ValueError):  # a signature Python cannot read: the wording alone decides
        names = []
    for word in re.findall(r"[A-Za-z_]\w*", message):
        if word in names:
            return word
    for pattern, name in _ARGUMENT_WORDS:
        if re.search(pattern, message, re.IGNORECASE) and (not names or name in names):
            return name
    return None


class PaperTask(LightningModule):
    """Base of every method (see the module docstring).

    Args:
        optimizer: builds the optimizer from the parameters (LightningCLI's ``OptimizerCallable``).
        lr_scheduler: builds the learning-rate scheduler from the optimizer, or None for a constant rate.
        metrics: ``{name: torchmetrics object}`` (or a ``MetricCollection``) cloned for every stage.
    """

    paper_id: ClassVar[str]
    monitor: ClassVar[str]
    monitor_mode: ClassVar[Literal["min", "max"]]
    #: metrics the end-of-command summary prints first, before the monitored one (e.g. a simulated method's
    #: time to target and why it stopped); the runs-table link shows them as columns too
    summary_metrics: ClassVar[tuple[str, ...]] = ()
    #: when a scheduler steps: once per "epoch" or once per optimiser "step"
    scheduler_interval: ClassVar[Literal["epoch", "step"]] = "epoch"
    #: steps whose metric inputs are kept (detached) before each metric gets them in one update: a
    #: torchmetrics update costs about 0.1 ms on CPU, a tenth of a small model's step (1: every step)
    metric_flush_every: ClassVar[int] = 32
    #: whether ``seed_parallel`` may train several seeds of this task in one process (``--run.seeds``): True
    #: only when ``step`` is a pure function of the parameters and the batch (no ``.item()``, no Python branch
    #: on tensor values, no random numbers, no state written during the step, no manual optimisation) and the
    #: task has nothing beyond parameters to train (docs/design.md, "Seed-parallel runs")
    vectorizable: ClassVar[bool] = False
    #: the run's seed: ``seed_everything`` of the command (the CLI builds the task in a ``run_seed_context``;
    #: 0 for a task built in Python, unless set). A ``seed: int | None = None`` argument means "the run seed"
    #: when None (``seed_or_run``); resolve it when used, so that setting ``run_seed`` later still counts.
    run_seed: int

    def __init_subclass__(cls, abstract: bool = False, **kwargs: Any) -> None:
        """``class Foo(PaperTask, abstract=True)`` marks an intermediate base that declares no paper."""
        super().__init_subclass__(**kwargs)
        for hook, instead in (("on_save_checkpoint", "extra_state"), ("on_load_checkpoint", "load_extra_state")):
            if hook in vars(cls):
                raise TypeError(f"{cls.__qualname__} overrides {hook}: implement {instead}() instead (PaperTask "
                                "keeps the training metrics' state in checkpoints and calls it)")
        if abstract:
            return
        # declared class attributes (inherited ones count), not a capability probe
        missing = [a for a in REQUIRED_ATTRIBUTES if not hasattr(cls, a)]
        if missing:
            raise TypeError(
                f"{cls.__qualname__} must declare the class attribute(s) {', '.join(missing)} "
                "(paper_id = '000-01', monitor = 'val/acc', monitor_mode = 'max'), or be declared "
                f"`class {cls.__qualname__}(..., abstract=True)`"
            )
        if cls.monitor_mode not in ("min", "max"):
            raise TypeError(f"{cls.__qualname__}.monitor_mode must be 'min' or 'max', got {cls.monitor_mode!r}")
        if not isinstance(cls.monitor, str) or "/" not in cls.monitor:
            raise TypeError(f"{cls.__qualname__}.monitor must name a logged metric such as 'val/acc', got {cls.monitor!r}")

    def __init__(
        self,
        optimizer: OptimizerCallable = default_optimizer,
        lr_scheduler: LRSchedulerCallable | None = None,
        metrics: Mapping[str, Metric] | MetricCollection | None = None,
    ) -> None:
        super().__init__()
        self.run_seed = current_run_seed()
        self.save_hyperparameters()
        self._keep_own_hparams()
        self._check_choices()
        self.optimizer_factory = optimizer
        self.lr_scheduler_factory = lr_scheduler
        self._check_optimizer()
        declared = dict(metrics.items()) if metrics is not None else {}
        for name in declared:
            if "/" in name or name == "loss":
                raise ConfigError(f"metric name {name!r}: 'loss' is reserved and names may not contain '/'")
        # "train" would shadow nn.Module.train, hence the suffix
        self.stage_metrics = nn.ModuleDict(
            {f"{s}_": nn.ModuleDict({k: m.clone() for k, m in declared.items()}) for s in STAGES}
        )
        self.stage_loss = nn.ModuleDict({f"{s}_": WeightedMean() for s in STAGES})
        self._metric_names = list(declared)
        self._pending: dict[str, dict[str, list[tuple[Any, ...]]]] = {s: {} for s in STAGES}
        self._pending_steps = dict.fromkeys(STAGES, 0)
        self._updated: dict[str, set[str]] = {s: set() for s in STAGES}  # "" is the loss

    def _keep_own_hparams(self) -> None:
        """Keep only this class's own arguments, in a form a checkpoint can store.

        Lightning's CLI records every applied link as a hyperparameter, also one into an argument this
        class does not have (jsonargparse rightly ignores those): a checkpoint holding it could not rebuild
        the class.
        """
        params = inspect.signature(type(self).__init__).parameters
        if any(p.kind is p.VAR_KEYWORD for p in params.values()):
            return
        for key in list(self.hparams):
            if key not in params and not key.startswith("_"):
                del self.hparams[key]
            else:
                self.hparams[key] = _plain(self.hparams[key])

    def _check_optimizer(self) -> None:
        """Build the optimizer and scheduler once on a dummy parameter, so that a bad learning rate fails
        when the model is built, before a run is opened, in one line naming the option to change."""
        probe = nn.Parameter(torch.zeros(1, 1))
        key, factory = "optimizer", self.optimizer_factory
        try:
            optimizer = factory([probe])
            if self.lr_scheduler_factory is not None:
                key, factory = "lr_scheduler", self.lr_scheduler_factory
                factory(optimizer)
        except (ValueError, TypeError) as err:
            what = "optimizer" if key == "optimizer" else "learning-rate scheduler"
            arg = refused_argument(factory, str(err))
            fix = (f"change --model.{key}.{arg} (model.init_args.{key}.init_args.{arg} in a config file)" if arg
                   else f"change --model.{key} (model.init_args.{key} in a config file)")
            raise ConfigError(f"the {what} refuses its arguments: {err}; {fix}") from None

    def _check_choices(self) -> None:
        """A ``Literal`` argument outside its choices fails here, also when the class is built in Python
        (the CLI checks the same before anything is built)."""
        try:
            hints = typing.get_type_hints(type(self).__init__)
        except Exception:  # noqa: BLE001 - an unresolvable annotation only skips this convenience check
            return
        for name, hint in hints.items():
            choices = typing.get_args(hint) if typing.get_origin(hint) is Literal else ()
            if choices and name in self.hparams and self.hparams[name] not in choices:
                raise ConfigError(f"{name} must be one of {list(choices)}, got {self.hparams[name]!r}")

    # --- what a subclass writes ---------------------------------------------------------------------------
    def step(self, batch: Any, stage: Stage) -> Tensor | StepOutput:
        """The method's maths on one batch: the loss, or a ``StepOutput``."""
        raise NotImplementedError(f"{type(self).__name__} must implement step(batch, stage)")

    def predict_batch(self, batch: Any) -> Any:
        """What ``predict`` returns for a batch (default: ``forward`` on the batch's inputs)."""
        return self(batch[0] if isinstance(batch, list | tuple) else batch)

    # --- Lightning's steps ----------------------------------------------------------------------------------
    # The step is split in two so that a seed stack (``seed_parallel``) can run the first half, the maths, under
    # ``torch.func.vmap`` over stacked parameters: ``step`` + ``metric_args`` are pure (tensors in, tensors and
    # constants out); ``record_step`` and ``update_metrics`` hold the state (the pending inputs, the metrics).
    def _run_step(self, batch: Any, stage: Stage) -> StepOutput:
        out = as_step_output(self.step(batch, stage))
        self.record_step(out, stage)
        return out

    def record_step(self, out: StepOutput, stage: Stage) -> None:
        """Keep one step's metric inputs (``metric_args``) until the next flush."""
        pending = self._pending[stage]
        for name, args in metric_args(out, self._metric_names).items():
            pending.setdefault(name, []).append(tuple(a.detach() if isinstance(a, Tensor) else a for a in args))
        self._pending_steps[stage] += 1
        if self._pending_steps[stage] >= self.metric_flush_every:
            self.flush_metrics(stage)

    def update_metrics(self, stage: Stage, updates: Mapping[str, tuple[Any, ...]]) -> None:
        """One ``update`` per named metric ("": the loss) with these arguments; marks them updated this epoch."""
        self._updated[stage] |= set(updates)
        for name, args in updates.items():
            metric = self.stage_loss[f"{stage}_"] if name == "" else self.stage_metrics[f"{stage}_"][name]
            metric.update(*args)

    def flush_metrics(self, stage: Stage) -> None:
        """Hand the kept step inputs of ``stage`` to their metrics: one ``update`` per metric on the
        concatenated inputs, or one per step where they do not concatenate (shapes that vary)."""
        pending, self._pending[stage] = self._pending[stage], {}
        self._pending_steps[stage] = 0
        for name, calls in pending.items():
            try:
                merged = tuple(_merge([call[i] for call in calls]) for i in range(len(calls[0])))
            except (RuntimeError, TypeError, ValueError):
                for call in calls:
                    self.update_metrics(stage, {name: call})
                continue
            self.update_metrics(stage, {name: merged})

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        return self._run_step(batch, "train").loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._run_step(batch, "val")

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self._run_step(batch, "test")

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> Any:
        return self.predict_batch(batch)

    # --- once per epoch -------------------------------------------------------------------------------------
    def epoch_metrics(self, stage: Stage) -> dict[str, Tensor]:
        """Compute and reset the stage's loss and metrics: ``{"<stage>/loss": ..., "<stage>/<name>": ...}``.

        Metrics that were not updated this epoch are left out (and reset).
        """
        self.flush_metrics(stage)
        updated, self._updated[stage] = self._updated[stage], set()
        out: dict[str, Tensor] = {}
        loss = self.stage_loss[f"{stage}_"]
        if "" in updated:
            out[f"{stage}/loss"] = loss.compute()
        loss.reset()
        for name, metric in self.stage_metrics[f"{stage}_"].items():
            if name in updated:
                value = metric.compute()
                if isinstance(value, Mapping):
                    out.update({f"{stage}/{name}_{k}": v for k, v in value.items()})
                else:
                    out[f"{stage}/{name}"] = value
            metric.reset()
        return out

    def log_epoch(self, stage: Stage) -> dict[str, Tensor]:
        """Log ``epoch_metrics(stage)`` plus ``extra_epoch_metrics``; return what was logged."""
        values = self.epoch_metrics(stage)
        values.update(self.extra_epoch_metrics(stage, values))
        if not values:
            return values
        val_step = self._fit_validation_step() if stage == "val" else None
        if stage == "train":
            # Straight to the loggers (rank 0) and callback_metrics, at once: Lightning would hand epoch-level
            # values over only after the epoch-end checkpoint (lost to an interrupt right after it), and
            # step-level ones only every log_every_n_steps. Reduced over ranks by torchmetrics.
            self._log_directly(values, step=self.global_step)
        elif val_step is not None:
            if not self.trainer.sanity_checking:  # Lightning logs nothing of the sanity check either
                # with the epoch, which Lightning adds to every evaluation's logged values
                self._log_directly(values, step=val_step, epoch=self.trainer.current_epoch)
        else:
            # batch_size: one aggregate per epoch; given, Lightning does not search the batch for a size.
            # already reduced (torchmetrics); sync_dist only keeps Lightning from warning under DDP, at the
            # cost of one tiny all-reduce per value per evaluation
            self.log_dict(values, on_step=False, on_epoch=True, sync_dist=True, batch_size=1)
        return values

    def _log_directly(self, values: dict[str, Tensor], step: int, **extra: float) -> None:
        """``values`` to every logger (rank 0) at ``step``, and into ``trainer.callback_metrics`` (what
        checkpoints, early stopping and plateau schedulers read), as Lightning would hand them over."""
        trainer = self.trainer
        if trainer.is_global_zero:
            floats = {k: float(v) for k, v in values.items()} | extra
            for logger in self.loggers:
                logger.log_metrics(floats, step=step)
        trainer.callback_metrics.update(values)

    def _fit_validation_step(self) -> int | None:
        """The step Lightning logs a fit's validation values at, where it follows from public state; None
        where it does not (then ``self.log`` places them).

        ``self.log`` costs about half a millisecond per value (its result collection deep-copies the value's
        metadata), a few per cent of a small model's epoch (docs/benchmarks.md, "Trainer overhead"). Lightning
        logs evaluation values during fit at the number of batches that stepped the optimizer before the
        current one: with automatic optimisation and no gradient accumulation every batch steps once, so that
        is ``global_step - 1``. Manual optimisation (several optimizers step per batch), accumulation, and
        ``validate`` outside a fit go through ``self.log``. tests/test_resume.py, tests/test_summary.py and
        tests/callbacks/test_checkpoints.py pin the steps of both stages.
        """
        trainer = self.trainer
        if (trainer.state.fn != "fit" or not self.automatic_optimization or trainer.accumulate_grad_batches != 1):
            return None
        return self.global_step - 1

    def extra_epoch_metrics(self, stage: Stage, values: dict[str, Tensor]) -> dict[str, Tensor]:
        """Override to derive more epoch values from the logged ones (e.g. bits per character)."""
        return {}

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        """The training epoch's metrics are logged after its last batch (subclasses that override this hook
        call ``super()``)."""
        if batch_idx + 1 == self.trainer.num_training_batches:
            self.log_epoch("train")

    def on_train_epoch_end(self) -> None:
        if self._pending_steps["train"] or self._updated["train"]:
            self.log_epoch("train")  # an epoch cut short (max_steps) or of unknown length

    def seed_or_run(self, seed: int | None) -> int:
        """``seed`` when given, else the run's seed."""
        return self.run_seed if seed is None else int(seed)

    def attached_trainer(self) -> Any | None:
        """The Trainer this task is attached to, or None (``self.trainer`` raises when there is none)."""
        try:
            return self.trainer
        except RuntimeError:
            return None

    # --- state in checkpoints: what a subclass writes ---------------------------------------------------------
    def extra_state(self) -> dict[str, Any]:
        """State beyond parameters and buffers that a resume needs (a simulator, a stage counter): saved in
        every checkpoint. Subclasses override this and ``load_extra_state``, never the Lightning hooks."""
        return {}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        """Restore what ``extra_state`` returned (a checkpoint without it passes ``{}``)."""

    # A checkpoint written within an epoch resumes in it: the training epoch's metric states go with it, and
    # the subclass's own state beside them. Final here (``__init_subclass__`` refuses overrides).
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if "optimizer_states" not in checkpoint:
            # weights only (Lightning sets the optimizers' entry, possibly empty, in every full dump): a file
            # for test/predict, which resumes nothing. The loops' progress (~120 nested entries: a third of a
            # small model's save, copied and pickled at every best epoch) and the training metrics' state
            # are resume state; Lightning's loading reads "loops" with .get and skips it when absent.
            checkpoint.pop("loops", None)
            checkpoint["paperlab_task_state"] = self.extra_state()
            return
        self.flush_metrics("train")
        metrics = {"": self.stage_loss["train_"], **self.stage_metrics["train_"]}
        checkpoint["paperlab_train_metrics"] = {
            "updated": sorted(self._updated["train"]),
            "states": {name: {k: _detach(v) for k, v in m.metric_state.items()} for name, m in metrics.items()},
        }
        checkpoint["paperlab_task_state"] = self.extra_state()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        saved = checkpoint.get("paperlab_train_metrics")
        if saved:
            metrics = {"": self.stage_loss["train_"], **self.stage_metrics["train_"]}
            for name, states in saved["states"].items():
                if name in metrics:
                    for key, value in states.items():
                        setattr(metrics[name], key, value)
            self._updated["train"] = set(saved["updated"])
        self.load_extra_state(checkpoint.get("paperlab_task_state") or {})

    def on_validation_epoch_end(self) -> None:
        self.log_epoch("val")

    def on_test_epoch_end(self) -> None:
        self.log_epoch("test")

    # --- optimisation ---------------------------------------------------------------------------------------
    def optimizer_parameters(self) -> Any:
        """The parameters the optimizer gets: the strategy's wrapped model's when there is one (FSDP)."""
        trainer = self.attached_trainer()
        model = trainer.model if trainer is not None else None
        return (model or self).parameters()

    def configure_optimizers(self) -> Any:
        optimizer = self.optimizer_factory(self.optimizer_parameters())
        if self.lr_scheduler_factory is None:
            return optimizer
        scheduler = self.lr_scheduler_factory(optimizer)
        config: dict[str, Any] = {"scheduler": scheduler, "interval": self.scheduler_interval}
        if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
            config["monitor"] = self.monitor
        return {"optimizer": optimizer, "lr_scheduler": config}
