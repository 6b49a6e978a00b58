"""``PaperlabCLI``: LightningCLI for ``python main.py {fit,validate,test,predict}`` (``main.py`` dispatches here).

LightningCLI in subclass mode for the model and the data, plus the project defaults nobody should have to
type: the MLflow logger (experiment = method, run = config stem, tags), the resolved config as an artifact,
checkpoints tied to the run (``--ckpt_path last`` resumes into the same run), ``<monitor>_best``, a NaN/inf
guard and Ctrl-C handling; sizes the data determines (``datamodules.base.LINKED_SIZES``) linked from the
DataModule into the model; ``--diagnostics`` presets (``configs/diagnostics/``) stacked on any experiment; a
summary at the end of every command (and at Ctrl-C, with the resume command) with a link that opens the
experiment's runs table in the MLflow UI.
Kept apart from ``main.py`` so that ``sweep`` and ``compare``, which need neither torch nor Lightning, start
without importing them.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import logging
import math
import os
import re
import secrets
import shlex
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, Checkpoint, ModelSummary, ProgressBar, RichProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only

from callbacks.best_metric import BestMetric
from callbacks.bookkeeping import RunBookkeeping, find_callback
from callbacks.checkpoints import BestCheckpoint, LastCheckpoint
from callbacks.diagnostic import Diagnostic
from callbacks.guards import FiniteLossGuard, InterruptCheckpoint
from callbacks.predictions import PredictionWriter
from datamodules.base import LINKED_SIZES, PaperlabDataModule, run_seed_context
from errors import ConfigError, PaperlabError
from modules.base import PaperTask
from seed_parallel import ROW_KEYS
from tracking.config_artifact import ConfigArtifact, dump_config
from tracking.mlflow_logger import PaperlabMLFlowLogger, check_tracking_server, default_tracking_uri
from tracking.names import child_name, folder_name, import_class, instance_name, method_name, parent_name
from tracking.run_registry import (
    PROCESS_TAG,
    RunRegistry,
    archive_previous,
    check_checkpoint_folder,
    close_orphaned_runs,
    latest_instance,
    mlflow_runs_named,
    next_instance,
    resolve_checkpoint,
    run_id_for_checkpoint,
    taken_instances,
    this_process,
)
from tracking.runs_view import override_params, runs_url, save_view, ui_base_url, view_state
from tracking.system_metrics import SystemMetrics

# Ctrl-C: the shell's convention for a process ended by SIGINT (128 + 2), so scripts can tell it from a failure
# (Lightning's own is 1; so is tests/test_bad_input.py's expectation, see the commit that set this)
INTERRUPTED_EXIT_CODE = 130


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


PRESET_FOLDERS = ("trainer", "diagnostics")  # configs/trainer/*.yaml (hardware), configs/diagnostics/*.yaml


def is_preset(path: Any) -> bool:
    """A hardware or diagnostics preset (``configs/trainer/ddp_cpu.yaml``): it names no run."""
    return Path(str(path)).parent.name in PRESET_FOLDERS


def config_stem(config_files: Any) -> str:
    """Run name from the experiment config: the last ``--config`` that is neither a trainer nor a
    diagnostics preset."""
    stems = [Path(str(p)).stem for p in (config_files or []) if not is_preset(p)]
    return stems[-1] if stems else "default"


# Run controls: they do not change what a run computes, so they do not name it (the same rule as compare's).
RUN_CONTROL = re.compile(
    r"^(seed_everything|run\..*|diagnostics.*|ckpt_path|print_config|config|trainer\.(callbacks|logger|"
    r"enable_progress_bar|enable_model_summary|default_root_dir|log_every_n_steps|num_sanity_val_steps).*)$"
)


def _split_options(argv: list[str]) -> list[tuple[str, str]]:
    """``--key value`` and ``--key=value`` pairs of a command line, in order."""
    out, i = [], 0
    while i < len(argv):
        token = argv[i]
        i += 1
        if not token.startswith("--"):
            continue
        key, eq, value = token[2:].partition("=")
        if not eq and i < len(argv) and not argv[i].startswith("--"):
            value, i = argv[i], i + 1
        out.append((key, value))
    return out


def _trainer_preset(key: str, value: str) -> bool:
    return key in ("trainer", "config") and Path(value).parent.name == "trainer"


def command_overrides(argv: list[str]) -> list[tuple[str, str]]:
    """The ``--key value`` pairs of a command line that change the experiment (not ``--config``, not run
    controls, not a ``--trainer configs/trainer/*.yaml`` preset: hardware is tags and params, like
    ``--run.*``), in order."""
    return [(key, value) for key, value in _split_options(argv)
            if not RUN_CONTROL.match(key) and not _trainer_preset(key, value)]


def trainer_presets(argv: list[str]) -> list[str]:
    """The hardware presets of a command (``--trainer`` or ``--config configs/trainer/<preset>.yaml``)."""
    return [value for key, value in _split_options(argv) if _trainer_preset(key, value)]


def override_label(overrides: list[tuple[str, str]]) -> str:
    """``lr=0.003 hidden=[32]``: the overrides by their last key component."""
    return " ".join(f"{key.rsplit('.', 1)[-1]}={value}" for key, value in overrides)


def without_option(argv: list[str], key: str) -> list[str]:
    """``argv`` without ``--key value`` / ``--key=value``."""
    out, i = [], 0
    while i < len(argv):
        token = argv[i]
        if token == f"--{key}":
            i += 2 if i + 1 < len(argv) and not argv[i + 1].startswith("--") else 1
            continue
        if not token.startswith(f"--{key}="):
            out.append(token)
        i += 1
    return out


def stop_reason(trainer: L.Trainer) -> str:
    """Why a fit ended, in words (Lightning keeps no reason, only the counters and ``should_stop``)."""
    if trainer.max_steps is not None and trainer.max_steps > 0 and trainer.global_step >= trainer.max_steps:
        return f"max_steps={trainer.max_steps} reached"
    if trainer.max_epochs is not None and trainer.max_epochs > 0 and trainer.current_epoch >= trainer.max_epochs:
        return f"max_epochs={trainer.max_epochs} reached"
    if trainer.should_stop:
        return f"stopped early at step {trainer.global_step} by a callback or the task (trainer.should_stop)"
    return f"ended at step {trainer.global_step}, epoch {trainer.current_epoch} (max_time or limits)"


def train_description(trainer: L.Trainer) -> str:
    """The training bar's label: ``Epoch 3/9`` for an epoch budget, ``Epoch 0 · 1500 steps`` for a step budget
    (``max_epochs=-1``: Lightning's Rich bar would print ``Epoch 0/-2``)."""
    epoch = f"Epoch {trainer.current_epoch}"
    if trainer.max_epochs is not None and trainer.max_epochs > 0:
        return f"{epoch}/{trainer.max_epochs - 1}"
    if trainer.max_steps is not None and trainer.max_steps > 0:
        return f"{epoch} · {trainer.max_steps} steps"
    return epoch


class PaperlabProgressBar(RichProgressBar):
    """Lightning's Rich bar with ``train_description`` as its training label (the CLI's default bar when
    ``rich`` is installed; without it Lightning's TQDM bar already says ``Epoch 0``)."""

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_epoch_start(trainer, pl_module)
        if self.progress is not None and self.train_progress_bar_id is not None:
            # padded as Lightning pads it, so the bar does not jump when the validation bar shows
            label = f"{train_description(trainer):{len(self.validation_description)}}"
            self.progress.update(self.train_progress_bar_id, description=label)


@dataclass
class SeedRun:
    """What ``--run.seed_runs`` gives one seed of a seed-parallel fit: its child run's name (and folder) and
    the tags it gets beyond ``--run.tags`` (a sweep's ``sweep.point``, ``sweep.seed``, ``sweep.index``)."""

    name: str
    tags: dict[str, str] = field(default_factory=dict)


@dataclass
class StackRow:
    """One row of a stack (``--run.rows``): the plain run of ``seed`` with ``overrides`` of its optimizer's
    hyperparameters (full keys, ``model.init_args.optimizer.init_args.lr``), named ``name`` (default
    ``<run name> <overrides> s<seed>``) and tagged with ``tags`` beyond ``--run.tags``."""

    seed: int
    name: str | None = None
    tags: dict[str, str] = field(default_factory=dict)
    overrides: dict[str, Any] = field(default_factory=dict)


#: the keys of a row's resolved config that may differ from the first row's besides ROW_KEYS: its seed, name
#: and tags (and the stack's own options, None in every row)
ROW_NAMING = ("seed_everything", "run.name", "run.tags", "run.seeds", "run.seed_runs", "run.rows")


class ParsedConfigParser(LightningArgumentParser):
    """Lightning's parser whose ``dump`` does not validate again unless asked to: LightningCLI dumps each
    command's config once more for ``save_hyperparameters`` (what ``load_from_checkpoint`` re-instantiates
    from), right after the parse that validated it, and that second check was more than half of the dump
    (78 experiment configs: 5.3 s validated, 2.1 s not, the same text for every one). ``--print_config``
    asks for its validation explicitly and keeps it."""

    def dump(self, cfg: Any, *args: Any, skip_validation: bool = True, **kwargs: Any) -> str:
        return super().dump(cfg, *args, skip_validation=skip_validation, **kwargs)


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
            parser_class=ParsedConfigParser,
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
        parser.add_argument("--run.seeds", type=list[int] | None, default=None,
                            help="fit these seeds in one process, parameters stacked over seeds (a vectorizable "
                            "task only): one MLflow child run '<run name> s<seed>' per seed under '<run name> seeds'")
        parser.add_argument("--run.seed_runs", type=dict[int, SeedRun] | None, default=None,
                            help="with --run.seeds: each seed's run name and extra tags; the seeds' runs then hang "
                            "under --run.parent_run_id directly, with no '<run name> seeds' run (what a sweep's "
                            "vectorize_seeds passes)")
        parser.add_argument("--run.rows", type=list[StackRow] | None, default=None,
                            help="instead of --run.seeds: fit these rows in one process, each the plain run of its "
                            "seed with its own optimizer hyperparameters, e.g. '[{seed: 0, overrides: "
                            "{model.init_args.optimizer.init_args.lr: 0.01}}, {seed: 0, overrides: {...: 0.003}}]' "
                            "(keys as --print_config shows them; anything else must be the same in every row); "
                            "each row's run is named 'name' (default '<run name> lr=0.01 s0') and tagged 'tags'; "
                            "under --run.parent_run_id directly when given (what a sweep's vectorize_arms passes), "
                            "else under '<run name> seeds'")
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

    def subcommands(self) -> dict[str, set[str]]:  # type: ignore[override]
        """Lightning's four subcommands, or only the one this command runs when its first argument names one: a
        command parses with one subcommand's parser, and building each of the others took about 0.05 s of
        every command (``python main.py --help`` and a misspelt subcommand still see all four)."""
        every = LightningCLI.subcommands()
        first = self.argv[0] if self.argv else None
        return {first: every[first]} if first in every else every

    def init_parser(self, **kwargs: Any) -> LightningArgumentParser:
        # a prefix of an option (--trainer.max_epoch) is an error, not silently the option it starts
        return super().init_parser(**{"allow_abbrev": False, **kwargs})

    # The names and folders every project default hangs off.
    def _run_settings(self) -> tuple[str, str, bool]:
        """Experiment, run name and whether ``--run.name`` gave it. A run started with overrides on the
        command line carries them in its name (``yinyang lr=0.003``), unless ``--run.name`` names it."""
        run = self._value(self.config, "run")
        experiment = run.experiment or method_name(import_class(self._value(self.config, "model").class_path))
        self.overrides = command_overrides(self.argv[1:] if self.subcommand else self.argv)
        name = run.name or " ".join(filter(None, [config_stem(self._value(self.config, "config")),
                                                  override_label(self.overrides)]))
        return experiment, name, run.name is not None

    def _folder(self, run_name: str) -> Path:
        return self.experiment_dir / folder_name(run_name)

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
        self.experiment, self.run_name, self.named = self._run_settings()
        self.base_name = self.run_name  # before a fresh fit or a resume picks an instance of it (yinyang #2)
        self.experiment_dir = Path(self._value(self.config, "run").checkpoint_root) / self.experiment
        self.earlier: str | None = None  # where an earlier run of this name left its files (the summary says)
        self.resolved_ckpt_path = None
        run = self._value(self.config, "run")
        self.seeds, self.rows = run.seeds, run.rows
        if self.rows is not None:
            if run.seeds is not None or run.seed_runs is not None:
                raise ConfigError("--run.rows lists each row's seed itself: drop --run.seeds and --run.seed_runs")
            if not self.rows:
                raise ConfigError("--run.rows is empty: give at least one row, e.g. '[{seed: 0}]'")
            if self.subcommand and self.subcommand != "fit":
                raise ConfigError(f"{self.subcommand} with --run.rows is not built: evaluate each row's run by its "
                                  f"plain command ({self.subcommand} --run.name '<the row's run name>' with its "
                                  "overrides)")
            self.seeds = list(range(len(self.rows)))  # the rows' keys: their metrics are s<key>/...
        if self.subcommand and self.seeds and self.subcommand != "fit":
            pass  # each seed's run resolves its own checkpoint (``_evaluate_seeds``)
        elif self.subcommand and self.seeds:
            # a seed-parallel fit resumes from the stack's own last.ckpt, in the folder of '<run name> seeds'
            ckpt_path = self._value(self.config, "ckpt_path")
            if ckpt_path == "best":
                how = ("test --run.name '<the row's run name>' with its overrides" if self.rows
                       else f"test --run.seeds {self.seeds}")
                raise ConfigError("a seed-parallel fit resumes from last (--ckpt_path last); each seed's best "
                                  f"checkpoint is for evaluation: {how} --ckpt_path best")
            self.resolved_ckpt_path = resolve_checkpoint(ckpt_path, self._seed_group_folder())
            self.config[f"{self.subcommand}.ckpt_path"] = self.resolved_ckpt_path
        elif self.subcommand:
            ckpt_path = self._value(self.config, "ckpt_path")
            never = None
            if ckpt_path in ("last", "best"):
                if not self.named:
                    # the newest run of this name: "the same command plus --ckpt_path last" resumes the latest fit
                    self.run_name = instance_name(self.run_name, latest_instance(self.run_name, self.experiment_dir))
                never = self._never_checkpointed()
            self.resolved_ckpt_path = resolve_checkpoint(ckpt_path, self._folder(self.run_name), never)
            self.config[f"{self.subcommand}.ckpt_path"] = self.resolved_ckpt_path
        self.ckpt_dir = self._folder(self.run_name)

    def instantiate_classes(self) -> None:
        # the run's seed, for the task and the data to read instead of the environment or torch's state: set
        # while they are built, since a linked size (input_shape, ...) may build the data during instantiation
        seed = self._value(self.config, "seed_everything")
        if self.seeds and (self.subcommand or "fit") != "fit":
            # each seed's run is evaluated by a plain command of its own, and that is the whole command:
            # LightningCLI has no hook that skips its subcommand, so the command ends here with its exit code
            self._evaluate_seeds(str(self.subcommand))
            raise SystemExit(0)
        try:
            if self.seeds:
                self._instantiate_seeds(self.seeds)
            else:
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

    def _seed_config(self, seed: int) -> Any:
        """The parsed config of the plain run of ``seed``: ``seed_everything: seed``, no ``run.seeds``; with
        ``run.seed_runs``, the name and tags that plain run would have been given (a sweep's point). With
        ``run.rows``, ``seed`` is a row's key: the plain run of that row (its seed, name, tags, overrides)."""
        config = self.config.clone()
        prefix = f"{self.subcommand}." if self.subcommand else ""
        row = self.rows[seed] if self.rows else None
        config[f"{prefix}seed_everything"] = row.seed if row else seed
        config[f"{prefix}run.seeds"] = None
        config[f"{prefix}run.seed_runs"] = None
        config[f"{prefix}run.rows"] = None
        own = self._seed_run(seed)
        if own is not None and own.name is not None:
            config[f"{prefix}run.name"] = own.name
        if own is not None:
            config[f"{prefix}run.tags"] = {**(config[f"{prefix}run.tags"] or {}), **own.tags}
        for key, value in (row.overrides if row else {}).items():
            if not key.startswith(ROW_KEYS) or f"{prefix}{key}" not in config:
                raise ConfigError(f"--run.rows: row {seed} sets '{key}', which is not a hyperparameter of the "
                                  f"config's optimizer (a row sets keys under {ROW_KEYS} as --print_config "
                                  "shows them; anything else is the same for every row)")
            config[f"{prefix}{key}"] = value
        return config

    def _seed_run(self, seed: int) -> Any:
        """``--run.seed_runs``'s entry of ``seed`` (its ``name`` and ``tags``), ``--run.rows``' row of that key,
        or None without either."""
        if self.rows:
            return self.rows[seed]
        seed_runs = self._value(self.config, "run").seed_runs
        return seed_runs[seed] if seed_runs else None

    def _row_name(self, key: int) -> str:
        """A stack's run of one seed or row: ``--run.seed_runs``'s or the row's name, else ``<run name> s<seed>``
        (a row: ``<run name> lr=0.01 s<seed>``, its overrides as a plain fit's name shows them)."""
        own = self._seed_run(key)
        if own is not None and own.name is not None:
            return own.name
        if self.rows:
            row = self.rows[key]
            label = override_label([(k, str(v)) for k, v in row.overrides.items()])
            return child_name(" ".join(filter(None, [self.run_name, label])), row.seed)
        return child_name(self.run_name, key)

    def _check_rows(self, configs: list[Any]) -> None:
        """Rows differ from the first in their seed, name, tags and optimizer hyperparameters only: anything
        else (the optimizer's class, the scheduler, the model, the data) is refused in one line."""
        from seed_parallel.stack import rows_refusal

        prefix = f"{self.subcommand}." if self.subcommand else ""
        skip = tuple(prefix + k for k in ROW_NAMING)
        first = dict(configs[0].items(branches=False))
        for k, config in enumerate(configs[1:], 1):
            other = dict(config.items(branches=False))
            for key in sorted(first.keys() | other.keys()):
                if key.startswith((*skip, prefix + ROW_KEYS)) or first.get(key) == other.get(key):
                    continue
                what = " (a different optimizer class)" if key == f"{prefix}model.init_args.optimizer.class_path" else ""
                raise rows_refusal(f"row {k} differs from row 0 in {key.removeprefix(prefix)}{what}; rows may "
                                   f"differ in their seed and their optimizer's hyperparameters ({ROW_KEYS}*) only")

    def _instantiate_seeds(self, seeds: list[int]) -> None:
        """A seed-parallel fit (``--run.seeds``): the task and the data built once per seed, exactly as the plain
        run of that seed builds them (seeded, then instantiated in its run-seed context), then stacked."""
        from lightning.fabric.utilities.seed import seed_everything

        from seed_parallel.outputs import SEED_LINE
        from seed_parallel.stack import SeedStack, SeedStackData

        seed_runs = self._value(self.config, "run").seed_runs
        if seed_runs is not None and set(seed_runs) != set(seeds):
            raise ConfigError(f"--run.seed_runs names seeds {sorted(seed_runs)}, --run.seeds lists {sorted(seeds)}: "
                              "give every seed of --run.seeds one entry")
        if seed_runs is not None and not self._value(self.config, "run").parent_run_id:
            raise ConfigError("--run.seed_runs hangs the seeds' runs under --run.parent_run_id: give that run's id")
        configs = {s: self._seed_config(s) for s in seeds}
        if self.rows:
            self._check_rows(list(configs.values()))
            names = [self._row_name(k) for k in seeds]
            if len(set(names)) != len(names):
                twice = sorted({n for n in names if names.count(n) > 1})
                raise ConfigError(f"--run.rows names two rows' runs alike ({', '.join(twice)}): give each row a "
                                  "distinct name, or distinct seeds or overrides")
        tasks, datamodules, states = [], [], []
        self.seed_configs: dict[int, str] = {}
        for s in seeds:
            config = configs[s]
            seed = self.rows[s].seed if self.rows else s
            seed_everything(seed, workers=True)
            with run_seed_context(seed):
                init = self.parser.instantiate_classes(config)
            states.append(torch.get_rng_state())  # what a plain run's DataLoader would shuffle from
            tasks.append(self._get(init, "model"))
            datamodules.append(self._get(init, "data"))
            if s == seeds[0]:
                self.config_init = init
            if s == seeds[0] or seed_runs is not None or self.rows:
                # dumped once (a few hundredths of a second) when the seeds' configs differ in the seed line
                # only; with --run.seed_runs their names and tags differ too
                dumped = dump_config(self._parser(self.subcommand), config.get(str(self.subcommand), config))
                if len(SEED_LINE.findall(dumped)) != 1:
                    raise RuntimeError("the dumped config has no single top-level seed_everything line")
            self.seed_configs[s] = SEED_LINE.sub(f"seed_everything: {seed}", dumped)
        self.datamodule = SeedStackData(datamodules, states)
        # a row's identity for a resume to check: its seed and overrides
        rows = [json.dumps({"seed": r.seed, **r.overrides}, sort_keys=True) for r in self.rows] if self.rows else None
        self.model = SeedStack(tasks, seeds, rows=rows)
        self.trainer = self.instantiate_trainer()
        self.model.check_trainer(self.trainer)

    def _seed_trainer(self, trainer_config: dict[str, Any], kwargs: dict[str, Any]) -> L.Trainer:
        """The trainer of a seed-parallel fit: the parent run's logger (routing each seed's metrics to its
        child run), the per-seed outputs (``seed_parallel.outputs``), no callback that reads one model."""
        from seed_parallel.outputs import SeedOutputs, SeedRunsLogger
        from seed_parallel.stack import refusal

        user = list(trainer_config.get("callbacks") or []) + list(self._value(self.config_init, "diagnostics") or [])
        if user:
            names = ", ".join(sorted({type(c).__name__ for c in user}))
            raise refusal(f"callbacks and diagnostics ({names}) watch one model, not a stack of seeds; drop them "
                          "with --trainer.callbacks=[] (and no --diagnostics)")
        run = self._value(self.config, "run")
        names = {s: self._row_name(s) for s in self.seeds}
        # the runs hang under --run.parent_run_id directly (a sweep's): with --run.seed_runs, or rows under a parent
        shared = bool(run.seed_runs) or bool(self.rows and run.parent_run_id)
        folders = {s: self._folder(names[s]) for s in self.seeds}
        self.ckpt_dir = self._seed_group_folder()
        resumed = self.resolved_ckpt_path is not None
        if not resumed:
            for folder in [self.ckpt_dir, *folders.values()]:
                archive_previous(folder)  # a fit of a taken name: the earlier files move aside, as with --run.name
                check_checkpoint_folder(folder)
        tags = {**(run.tags or {}), **self._fit_tags()}
        # each seed's tags: a sweep's own (--run.seed_runs), else this fit's group, read as a sweep by compare
        group = {} if shared else {"sweep.name": parent_name(self.run_name)}
        seed_tags = {s: {**tags, **group, **(self._seed_run(s).tags if run.seed_runs or self.rows else {})}
                     for s in self.seeds}
        logged = trainer_config.get("logger") in (None, True)
        if logged:
            check_tracking_server(default_tracking_uri())
            # runs of these names left RUNNING by a process that has ended (kill -9): marked KILLED, as a plain
            # fit does for its name (one query for all of them)
            own = [] if shared else [parent_name(self.run_name)]
            self._orphans_closed(self.run_name, names=[*own, *names.values()])
            uri = default_tracking_uri()
            if shared:
                # the seeds' runs go under the given run (a sweep's parent), which this fit neither ends nor
                # gives params: its config and params are the sweep's business
                kwargs["logger"] = SeedRunsLogger(self.seeds, experiment_name=self.experiment, tracking_uri=uri,
                                                  run_id=run.parent_run_id, keep_end_time=True, shares_parent=True)
                self.save_config_callback = None
            else:
                parent_tags = {**tags, **group, "sweep.role": "parent", "paperlab.seeds": " ".join(
                    map(str, [r.seed for r in self.rows] if self.rows else self.seeds))}
                if run.parent_run_id:
                    parent_tags["mlflow.parentRunId"] = run.parent_run_id
                parent_id = self._resumed_run(self.ckpt_dir, uri) if resumed else None
                kwargs["logger"] = SeedRunsLogger(self.seeds, experiment_name=self.experiment,
                                                  run_name=parent_name(self.run_name), tracking_uri=uri,
                                                  tags=parent_tags, run_id=parent_id)
            if resumed:
                kwargs["logger"].resume_children({s: self._resumed_run(folders[s], uri) for s in self.seeds})
        outputs = SeedOutputs(self.seeds, names, folders, self.seed_configs, seed_tags,
                              self.model.monitor, self.model.monitor_mode, self.ckpt_dir,
                              row_seeds={k: r.seed for k, r in enumerate(self.rows)} if self.rows else None)
        self.seed_outputs = outputs
        callbacks: list[Callback] = [outputs]
        if trainer_config.get("enable_checkpointing", True) is not False:
            # the stack's resumable state, at epoch ends only (within an epoch the seeds' metric states would be
            # lost); each seed's own checkpoints are SeedOutputs' business. A Checkpoint callback, so Lightning
            # adds no ModelCheckpoint of its own
            callbacks.append(LastCheckpoint(str(self.ckpt_dir), min_interval_s=run.checkpoint_interval_s,
                                            every_s=math.inf))
        if trainer_config.get("enable_progress_bar", True) is not False and importlib.util.find_spec("rich"):
            callbacks.append(PaperlabProgressBar())
        kwargs["callbacks"] = callbacks
        return super().instantiate_trainer(**kwargs)

    def _seed_group_folder(self) -> Path:
        """The folder of a seed-parallel fit as a whole (``<run name> seeds``): its resumable ``last.ckpt`` and
        its parent run's record; each seed's own files are in its run's folder."""
        return self._folder(parent_name(self.run_name))

    def _resumed_run(self, folder: Path, uri: str) -> str:
        """The run whose files are in ``folder`` (its ``mlflow_run.json``), which a resume continues."""
        run_id = run_id_for_checkpoint(folder / "last.ckpt", uri)
        if run_id is None:
            raise ConfigError(f"cannot resume: {folder} has no record of its MLflow run in {uri} "
                              "(mlflow_run.json); start the fit again without --ckpt_path")
        return run_id

    def instantiate_trainer(self, **kwargs: Any) -> L.Trainer:
        subcommand = self.subcommand or "fit"
        if getattr(self, "seeds", None):
            return self._seed_trainer(self._value(self.config_init, "trainer", default={}), kwargs)
        trainer_config = self._value(self.config_init, "trainer", default={})
        logged = trainer_config.get("logger") in (None, True)
        if logged:
            check_tracking_server(default_tracking_uri())  # before anything asks the store for names
        if subcommand == "fit" and self.resolved_ckpt_path is None and rank_zero_only.rank == 0:
            self._fresh_run_name(logged)
        elif subcommand == "fit":  # a resume continues in its own folder: a non-empty one is expected
            warnings.filterwarnings("ignore", message=r"Checkpoint directory .* exists and is not empty")
        if subcommand in ("fit", "predict") and rank_zero_only.rank == 0:
            check_checkpoint_folder(self.ckpt_dir)  # before the run exists: no empty FAILED run for a bad folder
        if logged:
            kwargs["logger"] = self._make_logger()
        user = list(trainer_config.get("callbacks") or [])
        kwargs["callbacks"] = user + self._diagnostics(user) + self._project_callbacks(trainer_config, user)
        trainer = super().instantiate_trainer(**kwargs)
        self._fold_added_callbacks(trainer, user)
        return trainer

    @staticmethod
    def _fold_added_callbacks(trainer: L.Trainer, user: list[Callback]) -> None:
        """Move the callbacks LightningCLI and the Trainer added themselves, the ``ConfigArtifact`` (setup only)
        and Lightning's default ``ModelSummary`` (fit start only), into the run's ``RunBookkeeping``: as entries
        of their own they would cost a dispatch per hook (callbacks/bookkeeping.py). A user's own are kept."""
        bookkeeping = find_callback(trainer.callbacks, RunBookkeeping)
        if bookkeeping is None:
            return
        for callback in [c for c in trainer.callbacks if isinstance(c, ConfigArtifact | ModelSummary)]:
            if not any(callback is u for u in user):
                trainer.callbacks.remove(callback)
                bookkeeping.add(callback)

    def _fresh_run_name(self, logged: bool) -> None:
        """A fresh fit of a taken name: ``--run.name`` is taken as given (a sweep finds its points by name and
        folder), so the earlier files move to ``<folder>.archive/<run id>/``; a name the CLI derived becomes
        the next instance, ``yinyang #2``, and the earlier runs' files stay where they are. Rank 0 only:
        other DDP ranks write no files and log nothing (checkpoint paths come from rank 0)."""
        runs = self._orphans_closed(self.run_name) if logged else []
        if self.named:
            moved = archive_previous(self.ckpt_dir)
            if moved is not None:
                self.earlier = f"the earlier run's files under this name were moved to {moved}/"
            return
        base = self.run_name
        names = [r.info.run_name for r in runs]
        n = next_instance(base, self.experiment_dir, names)
        if n == 1:
            return
        self.run_name, self.ckpt_dir = instance_name(base, n), self._folder(instance_name(base, n))
        taken = taken_instances(base, self.experiment_dir, names)
        local = {k: path for k, path in taken.items() if path is not None}
        if local:
            k = max(local)
            self.earlier = f"earlier run '{instance_name(base, k)}': its files stay in {local[k]}/"
        else:
            self.earlier = f"earlier run '{instance_name(base, max(taken))}' is in MLflow (no files here)"

    def _orphans_closed(self, base: str, names: list[str] | None = None) -> list[Any]:
        """The MLflow runs of ``base`` and its instances (or of ``names``), after marking KILLED those left
        RUNNING by a process that has ended (kill -9 before the first checkpoint: ``close_orphaned_runs``);
        says which."""
        runs = mlflow_runs_named(default_tracking_uri(), self.experiment, base, names=names)
        for run in close_orphaned_runs(default_tracking_uri(), runs):
            print(f"note: run '{run.info.run_name}' ({run.info.run_id}) was left RUNNING by a process that no longer "
                  "exists: marked KILLED", file=sys.stderr, flush=True)
        return runs

    def _never_checkpointed(self) -> str | None:
        """For ``--ckpt_path last|best`` without a checkpoint: the run of this name that was started but wrote
        none (its folder has no ``last.ckpt``), as ``'name' (run id)``; None when the name has no run."""
        if self._value(self.config, "trainer.logger") not in (None, True) or rank_zero_only.rank != 0:
            return None
        check_tracking_server(default_tracking_uri())
        folder = self._folder(self.run_name)
        if (folder / "last.ckpt").is_file():
            return None
        runs = [r for r in self._orphans_closed(self.base_name) if r.info.run_name == self.run_name]
        # newest first; a FINISHED run without files had them moved or deleted: the usual message then
        if not runs or runs[0].info.status == "FINISHED":
            return None
        return f"'{runs[0].info.run_name}' ({runs[0].info.run_id})"

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
        run = self._value(self.config, "run")
        subcommand = self.subcommand or "fit"
        tags = dict(run.tags or {})
        if run.parent_run_id:
            tags["mlflow.parentRunId"] = run.parent_run_id
        if subcommand == "fit":
            tags.update(self._fit_tags())
        ckpt = self.resolved_ckpt_path
        run_id = run_id_for_checkpoint(Path(ckpt), uri) if ckpt else None
        # validate/test/predict of a trained run log into it without ending it again (its duration stays)
        return PaperlabMLFlowLogger(experiment_name=self.experiment, run_name=self.run_name, tracking_uri=uri,
                                    tags=tags, run_id=run_id, keep_end_time=subcommand != "fit")

    def _fit_tags(self) -> dict[str, str]:
        """What a fit's run is tagged with beyond ``--run.tags``: the overrides and the command, the process,
        the hardware preset (a seed-parallel fit's child runs get the same)."""
        tags: dict[str, str] = {}
        if self.overrides:
            tags["overrides"] = " ".join(f"--{k} {v}" for k, v in self.overrides)
            tags["mlflow.note.content"] = "python main.py " + shlex.join(self.argv)
        tags[PROCESS_TAG] = this_process()  # a kill -9 leaves the run RUNNING: the next command checks this
        presets = trainer_presets(self.argv)
        if presets:
            tags["trainer_preset"] = " ".join(presets)  # hardware: a tag (and the params), never the name
        return tags

    # --- running a subcommand: Ctrl-C ends in a summary, not in Lightning's bare exit(1) -----------------------
    # LightningCLI runs ``self.<subcommand>`` when the CLI defines it (else ``trainer.<subcommand>``).
    def fit(self, **kwargs: Any) -> None:
        self._run_handling_interrupt("fit", kwargs)

    def validate(self, **kwargs: Any) -> None:
        self._run_handling_interrupt("validate", kwargs)

    def test(self, **kwargs: Any) -> None:
        self._run_handling_interrupt("test", kwargs)

    def predict(self, **kwargs: Any) -> None:
        self._run_handling_interrupt("predict", kwargs)

    def _run_handling_interrupt(self, subcommand: str, kwargs: dict[str, Any]) -> None:
        try:
            getattr(self.trainer, subcommand)(**kwargs)
        except SystemExit:
            # Lightning handles a KeyboardInterrupt (checkpoint callbacks' on_exception, loggers finalized, so
            # the run is KILLED) and then calls sys.exit(1); what is left is to say so and exit as Ctrl-C does
            if not self.trainer.interrupted:
                raise
            self._summary(subcommand, interrupted=True)
            raise SystemExit(INTERRUPTED_EXIT_CODE) from None

    def _evaluate_seeds(self, subcommand: str) -> None:
        """``validate``/``test``/``predict`` with ``--run.seeds``: each seed's run (``<run name> s<seed>``, what a
        seed-parallel fit of this command line named it) evaluated by its plain command, one after another in
        this process: an evaluation is one pass over the data, nothing a stack would speed up. Each prints
        its summary; the exit code is the first failure's (130 at a Ctrl-C, which stops the rest)."""
        from cli_messages import run_training

        argv = [*without_option(self.argv, "run.seeds"), "--run.seeds", "null"]  # also over a config's run.seeds
        failed: list[tuple[int, int]] = []
        for seed in self.seeds:
            rc = run_training([*argv, "--seed_everything", str(seed), "--run.name", child_name(self.run_name, seed)])
            if rc == INTERRUPTED_EXIT_CODE:
                raise SystemExit(rc)
            if rc != 0:
                failed.append((seed, rc))
        if failed:
            print(f"error: {subcommand} failed for seed(s) {', '.join(str(s) for s, _ in failed)} of "
                  f"{len(self.seeds)}; their lines above say why", file=sys.stderr)
            raise SystemExit(failed[0][1])

    # --- what the user sees at the end -----------------------------------------------------------------------
    def after_fit(self) -> None:
        self._summary("fit")

    def after_validate(self) -> None:
        self._summary("validate")

    def after_test(self) -> None:
        self._summary("test")

    def after_predict(self) -> None:
        self._summary("predict")

    def _summary(self, stage: str, interrupted: bool = False) -> None:
        """The result in a few lines: the metrics the task declares first (``PaperTask.summary_metrics``), the
        monitored metric and its best, the evaluation metrics, why a fit stopped, the MLflow run and a link to
        the runs table, where the checkpoints and predictions are, where an earlier run of the name is, and
        after Ctrl-C where ``interrupted.ckpt`` is and the command that resumes."""
        trainer = self.trainer
        if not trainer.is_global_zero:
            return
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if v.numel() == 1}
        if interrupted:
            # a fit's run ends KILLED; an evaluation leaves the run it logged into as its fit ended it
            what = "KILLED (Ctrl-C)" if stage == "fit" else "interrupted (Ctrl-C)"
            head = (f"paperlab {stage} {what} at step {trainer.global_step}, epoch {trainer.current_epoch}: "
                    f"{self.experiment} / {self.run_name}")
        else:
            head = f"paperlab {stage} finished: {self.experiment} / {self.run_name}"
        lines = [head]
        if getattr(self, "seeds", None):
            from seed_parallel.outputs import seed_summary

            lines += seed_summary(self.model, self.seed_outputs, trainer.logger, trainer.callback_metrics)
            if stage == "fit" and not interrupted:
                lines.append(f"  stopped: {stop_reason(trainer)}")
            print("\n".join(lines), flush=True)
            return
        first = [m for m in self.model.summary_metrics if stage == "fit" or m in metrics]
        if first:
            lines.append("  " + ", ".join(f"{m} {metrics[m]:.4g}" if m in metrics else f"{m} not logged"
                                          for m in first))
        monitor = self.model.monitor
        best = getattr(find_callback(trainer.callbacks, BestMetric), "best", None)
        if stage == "fit" and monitor in metrics:
            lines.append(f"  {monitor}: last {metrics[monitor]:.4g}" + (f", best {best:.4g}" if best is not None else ""))
        if stage in ("validate", "test"):
            prefix = "val/" if stage == "validate" else "test/"
            shown = ", ".join(f"{k} {v:.4g}" for k, v in sorted(metrics.items())
                              if k.startswith(prefix) and k not in first)
            lines.append(f"  {shown or 'no ' + prefix + ' metrics'}")
        if stage == "fit" and not interrupted:
            lines.append(f"  stopped: {stop_reason(trainer)}")
        logger = trainer.logger
        if isinstance(logger, PaperlabMLFlowLogger):
            status = " (marked KILLED)" if interrupted and stage == "fit" else ""
            lines.append(f"  MLflow run {logger.run_id} in experiment '{self.experiment}'{status}")
            lines.append(f"  runs table: {self._runs_link(logger, stage, metrics)}")
            if not logger.tracking_uri.startswith(("http://", "https://")):
                lines.append(f"    (start the UI first: python main.py ui, or mlflow ui --backend-store-uri "
                             f"{logger.tracking_uri})")
        if stage == "predict" and not interrupted:
            lines.append(f"  predictions: {Path(self.ckpt_dir) / 'predictions.pt'}")
        if self.ckpt_dir.is_dir():
            files = sorted(p.name for p in self.ckpt_dir.glob("*.ckpt"))
            lines.append(f"  checkpoints: {self.ckpt_dir}/ ({', '.join(files) or 'none'})")
        if self.earlier and stage == "fit":
            lines.append(f"  {self.earlier}")
        if interrupted and stage == "fit":
            lines += self._resume_lines()
        print("\n".join(lines), flush=True)

    def _runs_link(self, logger: PaperlabMLFlowLogger, stage: str, metrics: dict[str, float]) -> str:
        """The experiment's runs table in Model-training mode, its columns the metrics this summary shows
        and the params this run's command line overrode (a saved view, ``tracking.runs_view``)."""
        from mlflow.exceptions import MlflowException

        base = ui_base_url(logger.tracking_uri)
        monitor = self.model.monitor
        shown = [*self.model.summary_metrics, f"{monitor}_best", monitor]
        if stage in ("validate", "test"):
            prefix = "val/" if stage == "validate" else "test/"
            shown += sorted(k for k in metrics if k.startswith(prefix))
        try:
            client = logger.experiment
            params = client.get_run(logger.run_id).data.params
            columns = override_params([k for k, _ in self.overrides], params)
            short = [c.rsplit(".", 1)[-1] for c in columns]
            name = f"paperlab: {monitor}" + (f" by {', '.join(short)}" if short else "")
            key = save_view(client, logger.experiment_id, view_state(shown, columns), name)
        except MlflowException:  # a read-only or older store: the link without columns still opens the runs
            key = None
        return runs_url(base, logger.experiment_id, key)

    def _resume_lines(self) -> list[str]:
        """Where the interrupted state is and the command that resumes it. ``last.ckpt`` resumes exactly (the
        newest epoch end or within-epoch save); ``interrupted.ckpt`` holds the weights at the Ctrl-C, for
        evaluation: a Ctrl-C inside a step leaves the loader past a batch the loop has not counted, and a
        resume from it skips that batch (docs/design.md, "Runs, checkpoints, resume")."""
        lines = []
        interrupted_ckpt = self.ckpt_dir / "interrupted.ckpt"
        if interrupted_ckpt.is_file():
            lines.append(f"  interrupted.ckpt: {interrupted_ckpt} (the weights at Ctrl-C: "
                         f"test --ckpt_path {interrupted_ckpt})")
        argv = without_option(self.argv, "ckpt_path")
        if self.run_name != self.base_name:
            argv += ["--run.name", self.run_name]  # an instance (yinyang #2): resume that one, not a newer one
        if (self.ckpt_dir / "last.ckpt").is_file():
            lines.append(f"  resume: python main.py {shlex.join([*argv, '--ckpt_path', 'last'])}")
        else:
            lines.append("  nothing to resume from (no last.ckpt yet): run the command again")
        return lines

    def _project_callbacks(self, config: dict[str, Any], user: list[Callback]) -> list[Callback]:
        monitor = self.model.monitor
        mode = self.model.monitor_mode
        ckpt_dir = str(self.ckpt_dir)
        # the callbacks without per-batch hooks are parts of one RunBookkeeping: one hook dispatch for all of them
        # (callbacks/bookkeeping.py); the config artifact and the model summary join them once the CLI and the
        # Trainer have made them (_fold_added_callbacks)
        bookkeeping = RunBookkeeping([RunRegistry(ckpt_dir), InterruptCheckpoint(ckpt_dir)])
        out: list[Callback] = [bookkeeping]
        if config.get("enable_progress_bar", True) is not False and importlib.util.find_spec("rich") is not None \
                and not any(isinstance(c, ProgressBar) for c in user):
            out.append(PaperlabProgressBar())
        if not any(isinstance(c, FiniteLossGuard) for c in user):
            out.append(FiniteLossGuard())
        if config.get("enable_checkpointing", True) is not False and not any(
            isinstance(c, Checkpoint) for c in user
        ):
            run = self._value(self.config, "run")
            out += [BestCheckpoint(ckpt_dir, monitor=monitor, mode=mode),
                    LastCheckpoint(ckpt_dir, min_interval_s=run.checkpoint_interval_s, every_s=run.checkpoint_every_s)]
        if monitor and not any(isinstance(c, BestMetric) for c in user):
            bookkeeping.add(BestMetric(monitor=monitor, mode=mode))
        if self._value(self.config, "run").system_metrics:
            bookkeeping.add(SystemMetrics())
        if (self.subcommand or "fit") == "predict":
            out.append(PredictionWriter(ckpt_dir))
        return out
