"""A real ``mlflow server`` over HTTP: a fit and a two-point sweep land there, artifacts proxied."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import mlflow
import pytest

from main import cli_main
from tests.sweeps.common import BASE, TINY, write_sweep

STARTUP_TIMEOUT = 90.0  # seconds; the server answers /health after ~10 s on an idle 2-core machine


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def mlflow_server(paperlab_tmp: Path, _migrated_mlflow_db: Path) -> Iterator[tuple[str, Path]]:
    """``mlflow server`` on a free local port: sqlite backend (pre-migrated copy), served artifact store."""
    backend = paperlab_tmp / "server" / "mlflow.db"
    artifacts = paperlab_tmp / "server" / "artifacts"
    artifacts.mkdir(parents=True)
    shutil.copy(_migrated_mlflow_db, backend)
    port = _free_port()
    log = open(paperlab_tmp / "server" / "server.log", "w")  # noqa: SIM115 - closed in the finally
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--backend-store-uri",
            f"sqlite:///{backend}",
            "--artifacts-destination",
            str(artifacts),
            "--serve-artifacts",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while True:
            if proc.poll() is not None:
                pytest.fail(
                    f"mlflow server exited with {proc.returncode}:\n"
                    + (paperlab_tmp / "server" / "server.log").read_text()[-3000:]
                )
            try:
                with urllib.request.urlopen(f"{uri}/health", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"mlflow server did not answer /health within {STARTUP_TIMEOUT:.0f} s")
            time.sleep(0.5)
        yield uri, artifacts
    finally:
        # The server runs uvicorn workers in its own process group: stop them all, never leave one behind.
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=15)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=15)
        log.close()


def test_fit_and_sweep_log_to_a_tracking_server(
    mlflow_server: tuple[str, Path], paperlab_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri, artifact_root = mlflow_server
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
