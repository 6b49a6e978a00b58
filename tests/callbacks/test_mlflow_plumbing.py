"""The MLflow plumbing every diagnostic reuses: figures as PNG artifacts, system metrics, buffered metrics."""

from __future__ import annotations

import time
from pathlib import Path

import lightning as L
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from datamodules.hub import HubDataUnavailable, load_hub_dataset  # noqa: E402
from datamodules.yinyang import YinYangDataModule  # noqa: E402
from modules.mlp_classifier import MLPClassifier  # noqa: E402
from tests.helpers import client  # noqa: E402
from tracking.figures import log_figure  # noqa: E402
from tracking.mlflow_logger import PaperlabMLFlowLogger, check_tracking_server, flatten_params  # noqa: E402
from tracking.system_metrics import SystemMetrics  # noqa: E402


class _SlowEpochs(L.Callback):
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        time.sleep(0.4)  # long enough for the system-metrics sampler to take samples


class _Plot(L.Callback):
    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        fig, ax = plt.subplots()
        ax.plot([0, 1], [1, 0])
        self.logged = log_figure(trainer, fig, "figures/line.png")


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
