"""``PaperlabCLI``: LightningCLI for ``python main.py {fit,validate,test,predict}`` (``main.py`` dispatches here).

LightningCLI in subclass mode for the model and the data, plus the project defaults nobody should have to
type: the MLflow logger (experiment = method, run = config stem, tags), the resolved config as an artifact,
checkpoints tied to the run (``--ckpt_path last`` resumes into the same run), ``<monitor>_best``, a NaN/inf
guard and Ctrl-C handling; sizes the data determines (``datamodules.base.LINKED_SIZES``) linked from the
DataModule into the model; ``--diagnostics`` presets (``configs/diagnostics/``) stacked on any experiment.
Kept apart from ``main.py`` so that ``sweep`` and ``compare``, which need neither torch nor Lightning, start
without importing them.
"""

from __future__ import annotations

import importlib
import logging
import os
import re
import secrets
import shlex
import sys
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, Checkpoint
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only

from callbacks.best_metric import BestMetric
from callbacks.checkpoints import BestCheckpoint, LastCheckpoint
from callbacks.diagnostic import Diagnostic
from callbacks.guards import FiniteLossGuard, InterruptCheckpoint
from callbacks.predictions import PredictionWriter
from datamodules.base import LINKED_SIZES, PaperlabDataModule, run_seed_context
from errors import ConfigError, PaperlabError
from modules.base import PaperTask
from tracking.config_artifact import ConfigArtifact, method_name
from tracking.mlflow_logger import PaperlabMLFlowLogger, check_tracking_server, default_tracking_uri
from tracking.run_registry import RunRegistry, archive_previous, resolve_checkpoint, run_id_for_checkpoint
from tracking.system_metrics import SystemMetrics


class _DropTip(logging.Filter):
    """Lightning suggests a cloud logger on every run; paperlab logs to MLflow."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "litlogger" not in record.getMessage()


logging.getLogger("lightning.pytorch").addFilter(_DropTip())
for _name in ("lightning.pytorch.utilities.rank_zero", "lightning.pytorch.trainer.connectors.logger_connector"):
    logging.getLogger(_name).addFilter(_DropTip())
# torch 2.13 deprecates a pytree check Lightning 2.6 still makes on every fit; nothing a user can change
warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\).*")
# PaperTask logs its metrics once per epoch whatever log_every_n_steps is, so an epoch shorter than the
# interval loses nothing: the warning would only tell a user to change a setting that does not matter here
warnings.filterwarnings("ignore", message=r".*is smaller than the logging interval Trainer\(log_every_n_steps.*")


def config_stem(config_files: Any) -> str:
    """Run name from the experiment config: the last ``--config`` that is neither a trainer nor a
    diagnostics preset."""
    presets = ("trainer", "diagnostics")
    stems = [Path(str(p)).stem for p in (config_files or []) if Path(str(p)).parent.name not in presets]
    return stems[-1] if stems else "default"


# Run controls: they do not change what a run computes, so they do not name it (the same rule as compare's).
RUN_CONTROL = re.compile(
    r"^(seed_everything|run\..*|diagnostics.*|ckpt_path|print_config|config|trainer\.(callbacks|logger|"
    r"enable_progress_bar|enable_model_summary|default_root_dir|log_every_n_steps|num_sanity_val_steps).*)$"
)


def command_overrides(argv: list[str]) -> list[tuple[str, str]]:
    """The ``--key value`` pairs of a command line that change the experiment (not ``--config``, not run
    controls), in order."""
    out, i = [], 0
    while i < len(argv):
        token = argv[i]
        i += 1
        if not token.startswith("--"):
            continue
        key, eq, value = token[2:].partition("=")
        if not eq and i < len(argv) and not argv[i].startswith("--"):
            value, i = argv[i], i + 1
        if not RUN_CONTROL.match(key):
            out.append((key, value))
    return out


def override_label(overrides: list[tuple[str, str]]) -> str:
    """``lr=0.003 hidden=[32]``: the overrides by their last key component."""
    return " ".join(f"{key.rsplit('.', 1)[-1]}={value}" for key, value in overrides)


def folder_name(run_name: str) -> str:
    """A run name as a portable folder name."""
    return re.sub(r"[^A-Za-z0-9._,=+\[\]-]+", "_", run_name).strip("_") or "run"


def model_class(class_path: str) -> type:
    module_name, _, name = class_path.rpartition(".")
    return getattr(importlib.import_module(module_name), name)


class PaperlabCLI(LightningCLI):
    """LightningCLI with paperlab's defaults (see the module docstring)."""

    def __init__(self, args: list[str] | None = None, run: bool = True) -> None:
        self.argv = list(sys.argv[1:] if args is None else args)
        super().__init__(
            # --model and --data take paperlab's bases only: anything else is one line naming them
            model_class=PaperTask,
            datamodule_class=PaperlabDataModule,
            subclass_mode_model=True,
            subclass_mode_data=True,
            save_config_callback=ConfigArtifact,
            save_config_kwargs={"save_to_log_dir": False},
            trainer_defaults={
                "enable_progress_bar": not os.environ.get("CI"),
                # parameters are the resolved config, logged once by ConfigArtifact
                "enable_autolog_hparams": False,
                # metrics are logged per epoch (PaperTask) or by diagnostics on their own schedule; a method
                # that logs per step with self.log is logged at every step it does so
                "log_every_n_steps": 1,
            },
            parser_kwargs={
                "exit_on_error": False,
                "description": "paperlab: fit / validate / test / predict a paper's method from its config. "
                "Sweeps and run comparisons: python main.py sweep --help, python main.py compare --help.",
            },
            # optimizers and schedulers are arguments of the model (model.init_args.optimizer)
            auto_configure_optimizers=False,
            # a config without seed_everything gets a seed chosen here, logged with the config (Lightning's own
            # default, True, would seed every such run with 0)
            seed_everything_default=secrets.randbelow(2**31),
            args=args,
            run=run,
        )

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_argument("--run.name", type=str | None, default=None,
                            help="MLflow run name and checkpoint folder (default: the experiment config's stem)")
        parser.add_argument("--run.experiment", type=str | None, default=None,
                            help="MLflow experiment (default: the method, i.e. the module's file name)")
        parser.add_argument("--run.checkpoint_root", type=str, default="checkpoints",
                            help="checkpoints go to <checkpoint_root>/<experiment>/<run name>/")
        parser.add_argument("--run.checkpoint_interval_s", type=float, default=1.0,
                            help="last.ckpt is written at an epoch end at most this often (and when training ends)")
        parser.add_argument("--run.checkpoint_every_s", type=float, default=300.0,
                            help="last.ckpt is also written within an epoch this often (resumable data only)")
        parser.add_argument("--run.parent_run_id", type=str | None, default=None,
                            help="make this run a child of that MLflow run (sweeps)")
        parser.add_argument("--run.tags", type=dict[str, str], default={}, help="extra MLflow tags")
        parser.add_argument("--run.system_metrics", type=bool, default=False,
                            help="log CPU/memory/GPU usage to MLflow while fitting")
        parser.add_argument("--run.num_threads", type=int | None, default=None,
                            help="torch intra-op CPU threads (1 is fastest for tiny models; default: torch's)")
        # typed as callbacks: with list[Diagnostic], jsonargparse 4.53 drops a subclass's dataclass defaults
        parser.add_argument("--diagnostics", type=list[Callback] | None, default=None,
                            help="diagnostics added to the trainer's callbacks (configs/diagnostics/*.yaml); one "
                            "whose class the experiment already has is left out")
        for size in LINKED_SIZES:
            parser.link_arguments(f"data.{size}", f"model.init_args.{size}", apply_on="instantiate")

    def _value(self, config: Any, key: str, default: Any = None) -> Any:
        """``config[<subcommand>.]key``. LightningCLI has no public accessor for a value of the parsed config
        under the running subcommand; its ``_get`` is that accessor, wrapped here once so that no other
        line depends on a private name."""
        return self._get(config, key, default=default)

    def init_parser(self, **kwargs: Any) -> LightningArgumentParser:
        # a prefix of an option (--trainer.max_epoch) is an error, not silently the option it starts
        return super().init_parser(**{"allow_abbrev": False, **kwargs})

    # The names and folders every project default hangs off.
    def _run_settings(self) -> tuple[str, str, Path]:
        """Experiment, run name and checkpoint folder. A run started with overrides on the command line
        carries them in its name (``yinyang lr=0.003``), unless ``--run.name`` names it."""
        run = self._value(self.config, "run")
        experiment = run.experiment or method_name(model_class(self._value(self.config, "model").class_path))
        self.overrides = command_overrides(self.argv[1:] if self.subcommand else self.argv)
        name = run.name or " ".join(filter(None, [config_stem(self._value(self.config, "config")),
                                                  override_label(self.overrides)]))
        return experiment, name, Path(run.checkpoint_root) / experiment / folder_name(name)

    def _check_hardware(self) -> None:
        """A GPU preset without a GPU is one line; more CPU processes than cores, one warning."""
        trainer = self._value(self.config, "trainer")
        accelerator = str(trainer.accelerator)
        strategy = str(getattr(trainer.strategy, "class_path", trainer.strategy))
        wants_gpu = accelerator in ("gpu", "cuda") or any(s in strategy.lower() for s in ("fsdp", "deepspeed"))
        if wants_gpu and not torch.cuda.is_available():
            raise ConfigError(
                f"no GPU found on this machine (accelerator={accelerator}, strategy={strategy}): here use "
                "--trainer configs/trainer/cpu.yaml (one process) or configs/trainer/ddp_cpu.yaml (2 CPU processes)"
            )
        cores = os.cpu_count() or 1
        devices = int(trainer.devices) if str(trainer.devices).isdigit() else 0  # "auto", -1, a list: no count
        if accelerator == "cpu" and devices > cores:
            warnings.warn(
                f"{devices} CPU processes on a machine with {cores} cores: each gets a fraction of a core "
                f"and training is slower than with --trainer.devices {cores}", stacklevel=2,
            )

    def before_instantiate_classes(self) -> None:
        threads = self._value(self.config, "run").num_threads
        if threads is not None:
            if threads <= 0:
                raise ConfigError(f"--run.num_threads must be positive, got {threads}")
            torch.set_num_threads(threads)
        self._check_hardware()
        self.experiment, self.run_name, self.ckpt_dir = self._run_settings()
        self.resolved_ckpt_path = None
        if self.subcommand:
            self.resolved_ckpt_path = resolve_checkpoint(self._value(self.config, "ckpt_path"), self.ckpt_dir)
            self.config[f"{self.subcommand}.ckpt_path"] = self.resolved_ckpt_path

    def instantiate_classes(self) -> None:
        # the run's seed, for the task and the data to read instead of the environment or torch's state: set
        # while they are built, since a linked size (input_shape, ...) may build the data during instantiation
        seed = self._value(self.config, "seed_everything")
        try:
            with run_seed_context(seed if isinstance(seed, int) and not isinstance(seed, bool) else 0):
                super().instantiate_classes()
        except ValueError as err:
            # jsonargparse wraps what a class raises while it is built ("Does not validate against any of
            # the Union subtypes"); a user error inside is shown as itself, anything else stays a traceback
            cause = err.__cause__
            while cause is not None and not isinstance(cause, PaperlabError):
                cause = cause.__cause__
            if cause is None:
                raise
            raise cause from None

    def instantiate_trainer(self, **kwargs: Any) -> L.Trainer:
        subcommand = self.subcommand or "fit"
        if subcommand == "fit" and self.resolved_ckpt_path is None and rank_zero_only.rank == 0:
            archive_previous(self.ckpt_dir)
        elif subcommand == "fit":  # a resume continues in its own folder: a non-empty one is expected
            warnings.filterwarnings("ignore", message=r"Checkpoint directory .* exists and is not empty")
        trainer_config = self._value(self.config_init, "trainer", default={})
        if trainer_config.get("logger") in (None, True):
            kwargs["logger"] = self._make_logger()
        user = list(trainer_config.get("callbacks") or [])
        kwargs["callbacks"] = user + self._diagnostics(user) + self._project_callbacks(trainer_config, user)
        return super().instantiate_trainer(**kwargs)

    def _diagnostics(self, user: list[Callback]) -> list[Callback]:
        """The ``--diagnostics`` preset, minus the classes the experiment already configures itself."""
        extra = list(self._value(self.config_init, "diagnostics") or [])
        for d in extra:
            if not isinstance(d, Diagnostic):
                raise ConfigError(f"--diagnostics takes diagnostics (callbacks.diagnostic.Diagnostic), got "
                                  f"{type(d).__name__}: put other callbacks in trainer.callbacks")
        have = {type(c) for c in user}
        kept = [d for d in extra if type(d) not in have]
        dropped = sorted({type(d).__name__ for d in extra if type(d) in have})
        if dropped:
            rank_zero_info(f"diagnostics preset: {', '.join(dropped)} already configured by the experiment; kept that")
        return kept

    def _make_logger(self) -> PaperlabMLFlowLogger:
        uri = default_tracking_uri()
        check_tracking_server(uri)
        run = self._value(self.config, "run")
        tags = dict(run.tags or {})
        if run.parent_run_id:
            tags["mlflow.parentRunId"] = run.parent_run_id
        if self.overrides and (self.subcommand or "fit") == "fit":
            tags["overrides"] = " ".join(f"--{k} {v}" for k, v in self.overrides)
            tags["mlflow.note.content"] = "python main.py " + shlex.join(self.argv)
        ckpt = self.resolved_ckpt_path
        run_id = run_id_for_checkpoint(Path(ckpt), uri) if ckpt else None
        return PaperlabMLFlowLogger(experiment_name=self.experiment, run_name=self.run_name, tracking_uri=uri,
                                    tags=tags, run_id=run_id)

    # --- what the user sees at the end -----------------------------------------------------------------------
    def after_fit(self) -> None:
        self._summary("fit")

    def after_validate(self) -> None:
        self._summary("validate")

    def after_test(self) -> None:
        self._summary("test")

    def after_predict(self) -> None:
        self._summary("predict")

    def _summary(self, stage: str) -> None:
        """The result in a few lines: the monitored metric and its best, the evaluation metrics, where the
        run, the checkpoints and the predictions are, and how to open the MLflow UI."""
        trainer = self.trainer
        if not trainer.is_global_zero:
            return
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if v.numel() == 1}
        lines = [f"paperlab {stage} finished: {self.experiment} / {self.run_name}"]
        monitor = self.model.monitor
        best = next((c.best for c in trainer.callbacks if isinstance(c, BestMetric)), None)
        if stage == "fit" and monitor in metrics:
            lines.append(f"  {monitor}: last {metrics[monitor]:.4g}" + (f", best {best:.4g}" if best is not None else ""))
        if stage in ("validate", "test"):
            prefix = "val/" if stage == "validate" else "test/"
            shown = ", ".join(f"{k} {v:.4g}" for k, v in sorted(metrics.items()) if k.startswith(prefix))
            lines.append(f"  {shown or 'no ' + prefix + ' metrics'}")
        logger = trainer.logger
        if isinstance(logger, PaperlabMLFlowLogger):
            lines.append(f"  MLflow run {logger.run_id} in experiment '{self.experiment}': "
                         f"mlflow ui --backend-store-uri {logger.tracking_uri}")
        if stage == "predict":
            lines.append(f"  predictions: {Path(self.ckpt_dir) / 'predictions.pt'}")
        if self.ckpt_dir.is_dir():
            files = sorted(p.name for p in self.ckpt_dir.glob("*.ckpt"))
            lines.append(f"  checkpoints: {self.ckpt_dir}/ ({', '.join(files) or 'none'})")
        print("\n".join(lines), flush=True)

    def _project_callbacks(self, config: dict[str, Any], user: list[Callback]) -> list[Callback]:
        monitor = self.model.monitor
        mode = self.model.monitor_mode
        ckpt_dir = str(self.ckpt_dir)
        out: list[Callback] = [RunRegistry(ckpt_dir), InterruptCheckpoint(ckpt_dir)]
        if not any(isinstance(c, FiniteLossGuard) for c in user):
            out.append(FiniteLossGuard())
        if config.get("enable_checkpointing", True) is not False and not any(
            isinstance(c, Checkpoint) for c in user
        ):
            run = self._value(self.config, "run")
            out += [BestCheckpoint(ckpt_dir, monitor=monitor, mode=mode),
                    LastCheckpoint(ckpt_dir, min_interval_s=run.checkpoint_interval_s, every_s=run.checkpoint_every_s)]
        if monitor and not any(isinstance(c, BestMetric) for c in user):
            out.append(BestMetric(monitor=monitor, mode=mode))
        if self._value(self.config, "run").system_metrics:
            out.append(SystemMetrics())
        if (self.subcommand or "fit") == "predict":
            out.append(PredictionWriter(ckpt_dir))
        return out
