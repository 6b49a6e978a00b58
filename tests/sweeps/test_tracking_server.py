"""A real MLflow server over HTTP: a fit and a two-point sweep land there, artifacts proxied."""

from __future__ import annotations

import os
from pathlib import Path

import mlflow
import pytest

from main import cli_main
from tests.helpers import MlflowUI
from tests.sweeps.common import BASE, TINY, write_sweep


def test_fit_and_sweep_log_to_a_tracking_server(
    mlflow_ui: MlflowUI, paperlab_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the session's server (tests/conftest.py): `python main.py ui`, i.e. `mlflow ui` with served artifacts
    uri, artifact_root = mlflow_ui.url, mlflow_ui.artifacts
    local_store = os.environ["MLFLOW_TRACKING_URI"]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    tiny = [a for k, v in TINY.items() for a in (f"--{k}", str(v).lower() if isinstance(v, bool) else str(v))]
    assert cli_main(["fit", "--config", str(BASE), *tiny, "--run.name", "single"]) == 0
    sweep = write_sweep(paperlab_tmp, grid={"model.net.activation": ["relu", "tanh"]}, seeds=[0])
    assert cli_main(["sweep", "--config", str(sweep), "--in-process"]) == 0

    client = mlflow.MlflowClient(uri)
    exp = client.get_experiment_by_name("mlp_classifier")
    runs = {r.info.run_name: r for r in client.search_runs([exp.experiment_id])}
    assert set(runs) == {"single", "tiny", "tiny-activation=relu-s0", "tiny-activation=tanh-s0"}
    parent = runs["tiny"]
    assert parent.info.status == "FINISHED" and parent.data.tags["sweep.role"] == "parent"
    for name, act in (("tiny-activation=relu-s0", "relu"), ("tiny-activation=tanh-s0", "tanh")):
        child = runs[name]
        assert child.info.status == "FINISHED"
        assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert child.data.params["model.init_args.net.init_args.activation"] == act
        assert child.data.tags["sweep.point"] == f"activation={act}"
        assert {"train/loss", "val/acc", "val/acc_best"} <= set(child.data.metrics)
        assert [a.path for a in client.list_artifacts(child.info.run_id, "config")] == ["config/config.yaml"]
    assert "val/acc" in runs["single"].data.metrics
    assert runs["single"].data.params["model.init_args.net.init_args.activation"] == "relu"
    text = Path(
        client.download_artifacts(parent.info.run_id, "sweep/tiny.yaml", str(paperlab_tmp / "dl"))
    ).read_text()
    assert text == sweep.read_text()
    # The artifacts went through the server into its own artifact store, nothing into the local sqlite store.
    assert list(artifact_root.rglob("tiny.yaml")) and list(artifact_root.rglob("config.yaml"))
    assert mlflow.MlflowClient(local_store).get_experiment_by_name("mlp_classifier") is None
