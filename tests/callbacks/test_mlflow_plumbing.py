"""The MLflow plumbing every diagnostic reuses: figures as PNG artifacts, system metrics, buffered metrics."""

from __future__ import annotations

import ast
import time
from pathlib import Path

import lightning as L
import matplotlib
import pytest
import torch

from callbacks.causal_pieces import piece_map_figure
from datamodules.hub import HubDataUnavailable, load_hub_dataset
from datamodules.yinyang import YinYangDataModule
from modules.mlp_classifier import MLPClassifier
from tests.helpers import REPO, client
from tracking.figures import close_pyplot_figure, log_figure, new_figure
from tracking.mlflow_logger import PaperlabMLFlowLogger, check_tracking_server, flatten_params
from tracking.system_metrics import SystemMetrics


class _SlowEpochs(L.Callback):
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        time.sleep(0.4)  # long enough for the system-metrics sampler to take samples


class _Plot(L.Callback):
    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        fig, ax = new_figure(figsize=(4, 3))
        ax.plot([0, 1], [1, 0])
        self.logged = log_figure(trainer, fig, "figures/line.png")


def test_figures_leave_pyplot_and_its_backend_alone() -> None:
    """A researcher's notebook keeps its backend and its figures through a fit: the figures are drawn without
    pyplot (a callback's piece map here), and a figure drawn with pyplot is dropped from pyplot once logged."""
    import matplotlib.pyplot as plt

    before = matplotlib.get_backend()
    plt.switch_backend("svg")  # stands for a notebook's inline backend
    try:
        user_fig = plt.figure()
        points = torch.rand(50, 2)
        fig = piece_map_figure(points, torch.arange(50) % 3, title="t")
        assert fig.axes and matplotlib.get_backend() == "svg"
        assert plt.get_fignums() == [user_fig.number]  # the piece map is not in pyplot's registry
        close_pyplot_figure(user_fig)
        assert plt.get_fignums() == []
    finally:
        plt.close("all")
        plt.switch_backend(before)


def test_no_module_draws_with_pyplot_or_switches_the_backend() -> None:
    """Every figure comes from ``tracking.figures.new_figure``: no module of the project imports pyplot or
    calls ``matplotlib.use`` (either would switch a notebook's backend or leave figures in pyplot's registry)."""
    offenders = []
    tops = [p for p in REPO.iterdir() if p.name != "tests" and not p.name.startswith((".", "build"))]
    paths = [p for top in tops for p in ([top] if top.suffix == ".py" else top.rglob("*.py") if top.is_dir() else [])]
    for path in sorted(paths):
        rel, text = path.relative_to(REPO), path.read_text()
        if "matplotlib" not in text and "pyplot" not in text:
            continue
        for node in ast.walk(ast.parse(text)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("matplotlib"):
                names = [f"{node.module}.{a.name}" for a in node.names]
            called = isinstance(node, ast.Call) and ast.unparse(node.func) == "matplotlib.use"
            if called or any(n.startswith("matplotlib.pyplot") for n in names):
                offenders.append(f"{rel}:{node.lineno}")
    assert not offenders, offenders


def test_figure_and_system_metrics_reach_the_run(paperlab_tmp: Path) -> None:
    logger = PaperlabMLFlowLogger(experiment_name="plumbing", run_name="fig")
    plot = _Plot()
    trainer = L.Trainer(max_epochs=3, logger=logger, enable_checkpointing=False, enable_progress_bar=False,
                        limit_train_batches=2, limit_val_batches=1,
                        callbacks=[plot, _SlowEpochs(), SystemMetrics(sampling_interval=0.2)])
    trainer.fit(MLPClassifier(), YinYangDataModule(train_size=100, val_size=50, test_size=50))
    assert plot.logged
    run = client().get_run(logger.run_id)
    (artifact,) = client().list_artifacts(logger.run_id, "figures")
    local = Path(client().download_artifacts(logger.run_id, artifact.path, str(paperlab_tmp)))
    assert local.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    system = [k for k in run.data.metrics if k.startswith("system/")]
    assert any("cpu" in k for k in system) and any("memory" in k for k in system), system
    assert {"train/loss", "val/acc"} <= set(run.data.metrics)  # buffered metrics were flushed at the end
    assert run.info.status == "FINISHED"


def test_buffered_metrics_keep_every_step(paperlab_tmp: Path) -> None:
    logger = PaperlabMLFlowLogger(experiment_name="plumbing", run_name="buffer", flush_every_s=3600)
    for step in range(7):
        logger.log_metrics({"a": float(step), "bad@name": 1.0}, step=step)
    assert client().get_metric_history(logger.run_id, "a") == []  # still buffered
    logger.finalize("success")
    history = client().get_metric_history(logger.run_id, "a")
    assert [(m.step, m.value) for m in history] == [(s, float(s)) for s in range(7)]
    assert client().get_metric_history(logger.run_id, "badname")


def test_flatten_params_drops_lightning_noise() -> None:
    flat = flatten_params({"model": {"init_args": {"h": [1, 2]}, "_instantiator": "x"}, "_class_path": "y", "e": {}})
    assert flat == {"model.init_args.h": "[1, 2]", "e": "{}"}


def test_non_http_tracking_uris_are_not_probed() -> None:
    check_tracking_server("sqlite:///somewhere.db")  # no network, no error


def test_hub_offline_names_the_embedded_default(paperlab_tmp: Path) -> None:
    with pytest.raises(HubDataUnavailable, match="Use the embedded default instead: configs/x/digits.yaml"):
        load_hub_dataset("zalando-datasets/fashion_mnist", embedded_default="configs/x/digits.yaml")
