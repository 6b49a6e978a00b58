"""paperlab's command line: ``python main.py {fit,validate,test,predict} --config configs/<method>/<x>.yaml``.

LightningCLI in subclass mode for the model and the data, plus the project defaults nobody should have to
type: the MLflow logger (experiment = method, run = config stem, tags), the resolved config as an artifact,
checkpoints tied to the run (``--ckpt_path last`` resumes into the same run), ``<monitor>_best``, a NaN/inf
guard and Ctrl-C handling; sizes the data determines (``datamodules.base.LINKED_SIZES``) linked from the
DataModule into the model; ``--diagnostics`` presets (``configs/diagnostics/``) stacked on any experiment.
``sweep`` and ``compare`` are handed to ``sweeps``.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, Checkpoint
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only

from callbacks.best_metric import BestMetric
from callbacks.checkpoints import BestCheckpoint, LastCheckpoint
from callbacks.config_artifact import ConfigArtifact, method_name
from callbacks.diagnostic import Diagnostic
from callbacks.guards import FiniteLossGuard, InterruptCheckpoint
from callbacks.mlflow_logger import PaperlabMLFlowLogger, check_tracking_server, default_tracking_uri
from callbacks.predictions import PredictionWriter
from callbacks.run_registry import RunRegistry, archive_previous, resolve_checkpoint, run_id_for_checkpoint
from callbacks.system_metrics import SystemMetrics
from datamodules.base import LINKED_SIZES
from errors import ConfigError, PaperlabError


def config_stem(config_files: Any) -> str:
    """Run name from the experiment config: the last ``--config`` that is neither a trainer nor a
    diagnostics preset."""
    presets = ("trainer", "diagnostics")
    stems = [Path(str(p)).stem for p in (config_files or []) if Path(str(p)).parent.name not in presets]
    return stems[-1] if stems else "default"


def model_class(class_path: str) -> type:
    module_name, _, name = class_path.rpartition(".")
    return getattr(importlib.import_module(module_name), name)


class PaperlabCLI(LightningCLI):
    """LightningCLI with paperlab's defaults (see the module docstring)."""

    def __init__(self, args: list[str] | None = None, run: bool = True) -> None:
        super().__init__(
            model_class=L.LightningModule,
            datamodule_class=L.LightningDataModule,
            subclass_mode_model=True,
            subclass_mode_data=True,
            save_config_callback=ConfigArtifact,
            save_config_kwargs={"save_to_log_dir": False},
            trainer_defaults={
                "enable_progress_bar": not os.environ.get("CI"),
                # parameters are the resolved config, logged once by ConfigArtifact
                "enable_autolog_hparams": False,
            },
            parser_kwargs={
                "exit_on_error": False,
                "description": "paperlab: fit / validate / test / predict a paper's method from its config. "
                "Sweeps and run comparisons: python main.py sweep --help, python main.py compare --help.",
            },
            # optimizers and schedulers are arguments of the model (model.init_args.optimizer)
            auto_configure_optimizers=False,
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

    # The names and folders every project default hangs off.
    def _run_settings(self) -> tuple[str, str, Path]:
        run = self._get(self.config, "run")
        experiment = run.experiment or method_name(model_class(self._get(self.config, "model").class_path))
        name = run.name or config_stem(self._get(self.config, "config"))
        return experiment, name, Path(run.checkpoint_root) / experiment / name

    def before_instantiate_classes(self) -> None:
        threads = self._get(self.config, "run").num_threads
        if threads is not None:
            if threads <= 0:
                raise ConfigError(f"--run.num_threads must be positive, got {threads}")
            torch.set_num_threads(threads)
        self.experiment, self.run_name, self.ckpt_dir = self._run_settings()
        self.resolved_ckpt_path = None
        if self.subcommand:
            self.resolved_ckpt_path = resolve_checkpoint(self._get(self.config, "ckpt_path"), self.ckpt_dir)
            self.config[f"{self.subcommand}.ckpt_path"] = self.resolved_ckpt_path

    def instantiate_classes(self) -> None:
        try:
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
        trainer_config = self._get(self.config_init, "trainer", default={})
        if trainer_config.get("logger") in (None, True):
            kwargs["logger"] = self._make_logger()
        user = list(trainer_config.get("callbacks") or [])
        kwargs["callbacks"] = user + self._diagnostics(user) + self._project_callbacks(trainer_config, user)
        return super().instantiate_trainer(**kwargs)

    def _diagnostics(self, user: list[Callback]) -> list[Callback]:
        """The ``--diagnostics`` preset, minus the classes the experiment already configures itself."""
        extra = list(self._get(self.config_init, "diagnostics") or [])
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
        run = self._get(self.config, "run")
        tags = dict(run.tags or {})
        if run.parent_run_id:
            tags["mlflow.parentRunId"] = run.parent_run_id
        ckpt = self.resolved_ckpt_path
        run_id = run_id_for_checkpoint(Path(ckpt), uri) if ckpt else None
        return PaperlabMLFlowLogger(experiment_name=self.experiment, run_name=self.run_name, tracking_uri=uri,
                                    tags=tags, run_id=run_id)

    def _project_callbacks(self, config: dict[str, Any], user: list[Callback]) -> list[Callback]:
        monitor = getattr(self.model, "monitor", None)
        mode = getattr(self.model, "monitor_mode", "max")
        ckpt_dir = str(self.ckpt_dir)
        out: list[Callback] = [RunRegistry(ckpt_dir), InterruptCheckpoint(ckpt_dir)]
        if not any(isinstance(c, FiniteLossGuard) for c in user):
            out.append(FiniteLossGuard())
        if config.get("enable_checkpointing", True) is not False and not any(
            isinstance(c, Checkpoint) for c in user
        ):
            out += [BestCheckpoint(ckpt_dir, monitor=monitor, mode=mode),
                    LastCheckpoint(ckpt_dir, min_interval_s=self._get(self.config, "run").checkpoint_interval_s)]
        if monitor and not any(isinstance(c, BestMetric) for c in user):
            out.append(BestMetric(monitor=monitor, mode=mode))
        if self._get(self.config, "run").system_metrics:
            out.append(SystemMetrics())
        if (self.subcommand or "fit") == "predict":
            out.append(PredictionWriter(ckpt_dir))
        return out


_NOISE = ("Expected a <class 'NoneType'>", "Given value type:", "Given value:", "Subtypes:", "Errors:",
          "Does not validate against any of the Union subtypes")


def clean_error(message: str) -> str:
    """jsonargparse's message without the Union-of-None noise (every class argument is Optional)."""
    lines = [ln.strip().lstrip("- ").strip() for ln in str(message).splitlines()]
    kept = [ln for ln in lines if ln and not any(n in ln for n in _NOISE)]
    return "; ".join(dict.fromkeys(kept)).replace(":; ", ": ") or str(message)


def cli_main(args: list[str] | None = None) -> int:
    """Run the CLI on ``args`` (default: ``sys.argv[1:]``); return the exit code."""
    argv = list(sys.argv[1:] if args is None else args)
    if argv and argv[0] in ("sweep", "compare"):
        from sweeps.cli import main as sweeps_main

        return sweeps_main(argv)
    from jsonargparse import ArgumentError

    try:
        PaperlabCLI(args=None if args is None else argv)
    except ArgumentError as err:
        print(f"error: {clean_error(str(err))}", file=sys.stderr)
        print("(python main.py fit --help lists every option)", file=sys.stderr)
        return 2
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    except PaperlabError as err:
        if os.environ.get("PAPERLAB_TRACEBACK"):
            raise
        print(f"error: {clean_error(str(err))}", file=sys.stderr)
        print("(set PAPERLAB_TRACEBACK=1 for the full traceback)", file=sys.stderr)
        return err.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(cli_main())
