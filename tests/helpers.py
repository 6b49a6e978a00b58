"""Test-only modules and callbacks, importable by class_path from CLI runs (``tests.helpers.X``)."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import mlflow
import torch
from lightning.pytorch.callbacks import Callback

from modules.mlp_classifier import MLPClassifier
from tests.fork_server import start_fork_server

REPO = Path(__file__).resolve().parent.parent
TINY = ["--trainer.max_epochs", "1", "--trainer.limit_train_batches", "3", "--trainer.limit_val_batches", "2",
        "--trainer.limit_test_batches", "2", "--trainer.num_sanity_val_steps", "0"]


class SignalAtStep(Callback):
    """Sends ``signum`` to this process once ``global_step`` reaches ``step`` (simulates kill -9 / Ctrl-C)."""

    def __init__(self, step: int = 10, signum: int = 9) -> None:
        self.step = step
        self.signum = signum

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step >= self.step:
            os.kill(os.getpid(), self.signum)


class NaNAtStep(MLPClassifier):
    """The reference MLP whose loss turns NaN from step ``nan_step`` on."""

    def __init__(self, nan_step: int = 5, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.nan_step = nan_step

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        return loss * float("nan") if self.global_step >= self.nan_step else loss


def run_main(args: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python main.py <args>`` in a subprocess (needed for kill -9, signals and the ddp launcher)."""
    full_env = {**os.environ, "CI": "1", "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run([sys.executable, str(REPO / "main.py"), *args], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=timeout, preexec_fn=_sigint_as_in_a_terminal)


def forked(target: Any, *args: Any) -> Any:
    """``target(*args)`` started in a process forked from this session's fork server, which imported torch,
    Lightning and MLflow once: a separate process (to kill -9, to signal) without a fresh interpreter's imports.
    The target must be importable (a module-level function). Returns the started ``multiprocessing`` process.
    A test that forks requests the ``fork_server`` fixture, so that the server is started ahead of it."""
    proc = start_fork_server().Process(target=target, args=args)
    proc.start()
    return proc


def fork_main(args: list[str], cwd: Path, env: dict[str, str] | None = None,
              timeout: float = 300) -> subprocess.CompletedProcess:
    """``python main.py <args>`` as ``run_main`` runs it, in a process forked from a fork server that imported
    torch, Lightning and MLflow once per session (as the sweep workers are): the 4-7 s of imports of a fresh
    interpreter are paid once, not per call. For the tests whose point is a separate process (kill -9, Ctrl-C,
    its exit code and output); a test of the interpreter's own start (the ddp launcher re-runs ``sys.argv``)
    keeps ``run_main``. Libraries that read the environment when imported and that the fork server has not
    imported (the hub libraries) can be imported in the child after its environment is set
    (``tests/datamodules/test_hub.py`` checks that they were not imported before)."""
    import tempfile

    full_env = {**os.environ, "CI": "1", "PYTHONPATH": str(REPO), **(env or {})}
    with tempfile.TemporaryDirectory() as tmp:
        out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
        proc = forked(_forked_main, args, str(cwd), full_env, str(out), str(err))
        proc.join(timeout)
        if proc.exitcode is None:
            proc.kill()
            proc.join()
            raise subprocess.TimeoutExpired(["main.py", *args], timeout)
        return subprocess.CompletedProcess(["main.py", *args], proc.exitcode, out.read_text(errors="replace"),
                                           err.read_text(errors="replace"))


def _forked_main(args: list[str], cwd: str, env: dict[str, str], out: str, err: str) -> None:
    """The child of ``fork_main``: the working folder, environment, Ctrl-C handling and file descriptors 1 and 2
    a fresh ``python main.py`` would have, then its exit code."""
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # what Python installs in a terminal
    for fd, path in ((1, out), (2, err)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(target, fd)
        os.close(target)
    from main import cli_main

    sys.argv = [str(REPO / "main.py"), *args]
    sys.exit(cli_main(args))


def _sigint_as_in_a_terminal() -> None:
    # a suite started in the background (`pytest &` in a script) inherits SIGINT ignored, and Python then
    # installs no KeyboardInterrupt handler: give the child the default, as a terminal would
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def client() -> mlflow.MlflowClient:
    """A client on this test's store (MLflow keeps the last ``set_tracking_uri`` process-wide)."""
    return mlflow.MlflowClient(os.environ["MLFLOW_TRACKING_URI"])


def runs_of(experiment: str) -> list[mlflow.entities.Run]:
    client_ = client()
    exp = client_.get_experiment_by_name(experiment)
    if exp is None:
        return []
    return client_.search_runs([exp.experiment_id], run_view_type=mlflow.entities.ViewType.ALL)


@dataclass(frozen=True)
class MlflowUI:
    """The session's MLflow server, started by ``python main.py ui`` (``mlflow ui``: served artifacts)."""

    url: str  # http://127.0.0.1:<port>: a tracking URI and the UI
    port: int
    store_uri: str  # its sqlite backend
    artifacts: Path  # where the served artifacts land
    experiment_id: str  # "ui_links": one run in the store before the server started
    output: str  # what the command printed once the server answered (the links)


def store_with_a_run(path: Path, experiment: str = "mlp_classifier") -> tuple[str, str]:
    """A sqlite store at ``path`` (already migrated) holding one FINISHED run that overrode the learning rate:
    the store's URI and the experiment's id."""
    uri = f"sqlite:///{path}"
    client_ = mlflow.MlflowClient(uri)
    exp = client_.create_experiment(experiment)
    run = client_.create_run(exp, run_name="yinyang lr=0.003", tags={"overrides": "--model.optimizer.lr 0.003"})
    client_.log_param(run.info.run_id, "model.init_args.optimizer.init_args.lr", "0.003")
    client_.log_metric(run.info.run_id, "val/acc", 0.9)
    client_.log_metric(run.info.run_id, "val/acc_best", 0.93)
    client_.set_terminated(run.info.run_id)
    return uri, exp


SIGKILL = signal.SIGKILL
SIGINT = signal.SIGINT


class CleanDistributedExit(Callback):
    """Destroy the process group in step on every rank when a ``ddp_spawn`` run ends.

    Spawned workers leave through ``os._exit``, so Lightning's atexit clean-up never runs; a rank that exits
    while a peer's gloo thread still holds the connection can then die with "terminate called without an
    active exception" (SIGABRT) after the test's work is done.
    """

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()


def sgd(lr: float = 0.1, momentum: float = 0.0):
    """An ``OptimizerCallable`` as the CLI builds it from ``class_path: torch.optim.SGD`` (picklable, for
    ``ddp_spawn``)."""
    return functools.partial(torch.optim.SGD, lr=lr, momentum=momentum)


def mlp_net(hidden=(16, 16), activation: str = "relu", init: str = "kaiming"):
    """A task-network factory as the CLI builds it from ``class_path: modules.components.mlp.MLP``."""
    from modules.components.mlp import MLP

    return functools.partial(MLP, hidden=list(hidden), activation=activation, init=init)


def drift_model(hidden=(16, 16), activation: str = "relu", lr: float = 0.1, input_shape=(64,), num_classes: int = 10,
                **kw: Any):
    """``WeightDriftModel`` with an SGD-trained MLP on the random-Gaussian data's sizes."""
    from modules.weight_drift import WeightDriftModel

    return WeightDriftModel(net=mlp_net(hidden, activation), optimizer=sgd(lr), input_shape=input_shape,
                            num_classes=num_classes, **kw)


class TwoRankRegression(L.LightningModule):
    """Least squares on w in R^dim for a 2-process comm-hook test: rank r's data (x_r, y_r) from seed
    ``data_seed + r``, one SGD step (lr 0.1), then every rank writes ``{"w": ..., **report(strategy)}`` to
    ``<out>.<rank>`` (``report`` reads what the strategy under test exposes)."""

    lr = 0.1

    def __init__(self, out: str, dim: int, init: float, data_seed: int, rows: int,
                 report: Any = None) -> None:
        super().__init__()
        self.w = torch.nn.Linear(dim, 1, bias=False)
        torch.nn.init.constant_(self.w.weight, init)
        self.out, self.data_seed, self.rows, self.report = out, data_seed, rows, report

    def data(self, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(self.data_seed + rank)
        return torch.randn(self.rows, self.w.in_features, generator=gen), torch.randn(self.rows, 1, generator=gen)

    def rank_grads(self) -> list[torch.Tensor]:
        """Each rank's own gradient at the initial weights (an independent reference for the hook)."""
        grads = []
        for r in (0, 1):
            self.w.weight.grad = None
            x, y = self.data(r)
            ((self.w(x) - y) ** 2).mean().backward()
            grads.append(self.w.weight.grad.detach().flatten().clone())
        self.w.weight.grad = None
        return grads

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = self.data(self.global_rank)
        return ((self.w(x) - y) ** 2).mean()

    def train_dataloader(self) -> list[torch.Tensor]:
        return [torch.zeros(1)]

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr)

    def on_train_end(self) -> None:
        extra = self.report(self.trainer.strategy) if self.report is not None else {}
        Path(f"{self.out}.{self.global_rank}").write_text(
            json.dumps({"w": self.w.weight.detach().flatten().tolist(), **extra}))
