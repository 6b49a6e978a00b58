"""Shared fixtures: every test that touches MLflow or checkpoints runs in its own temp directory."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch

if TYPE_CHECKING:
    from tests.helpers import MlflowUI

# Tiny models run fastest on one intra-op thread, and CI has two cores for the whole suite.
torch.set_num_threads(1)

REPO = Path(__file__).resolve().parent.parent

# prints the time per test file and per method at the end of every run
pytest_plugins = ("tests.timing_report",)


def _migrated_store(path: Path) -> Path:
    import logging

    import mlflow

    # outside a test nothing captures MLflow's "Creating initial MLflow database tables" lines: keep them quiet
    log = logging.getLogger("mlflow.store.db.utils")
    level = log.level
    log.setLevel(logging.WARNING)
    try:
        mlflow.MlflowClient(f"sqlite:///{path}").search_experiments()
    finally:
        log.setLevel(level)
    return path


_TEMPLATE = pytest.StashKey[Path]()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Migrate the MLflow store template before the first test when a collected test needs one: its seconds of
    schema migrations are the session's, not a cost of whichever test happens to come first (the per-method
    time table would bill them all to one method)."""
    if session.config.option.collectonly:
        return
    needed = set().union(*(getattr(item, "fixturenames", ()) for item in session.items))
    if "_migrated_mlflow_db" in needed:
        folder = Path(tempfile.mkdtemp(prefix="paperlab-mlflow-template-"))
        session.config.stash[_TEMPLATE] = _migrated_store(folder / "mlflow.db")
    if "hub_offline" in needed:  # the same for the hub libraries that fixture imports (about a second)
        import datasets.config  # noqa: F401
        import huggingface_hub.constants  # noqa: F401


def pytest_unconfigure(config: pytest.Config) -> None:
    template = config.stash.get(_TEMPLATE, None)
    if template is not None:
        shutil.rmtree(template.parent, ignore_errors=True)


@pytest.fixture(scope="session")
def _migrated_mlflow_db(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty MLflow sqlite store, migrated once: creating one costs seconds of schema migrations. Each test
    copies it (``paperlab_tmp``)."""
    template = request.config.stash.get(_TEMPLATE, None)
    return template if template is not None else _migrated_store(tmp_path_factory.mktemp("mlflow-template") / "mlflow.db")


UI_STARTUP_TIMEOUT = 180.0  # seconds; the server answers /health after ~10 s on an idle 2-core machine


@pytest.fixture(scope="session")
def mlflow_ui(tmp_path_factory: pytest.TempPathFactory, _migrated_mlflow_db: Path) -> Iterator[MlflowUI]:
    """One MLflow server for the session (starting one costs ~10 s of CPU): the ``ui`` command's test reads what
    it printed, the tracking-server test logs a fit and a sweep to it. Each test uses its own experiment. At the
    end the command is stopped as a ``timeout`` stops it (SIGTERM), and nothing may be left listening."""
    from tests.helpers import MlflowUI, store_with_a_run

    root = tmp_path_factory.mktemp("mlflow-ui")
    db, artifacts, log_path = root / "mlflow.db", root / "artifacts", root / "ui.log"
    shutil.copy(_migrated_mlflow_db, db)
    artifacts.mkdir()
    store_uri, experiment_id = store_with_a_run(db, "ui_links")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "MLFLOW_TRACKING_URI": store_uri, "MLFLOW_ARTIFACTS_DESTINATION": str(artifacts),
           "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    # its output goes to a file: a pipe nobody reads would block the server once its logs fill it
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, str(REPO / "main.py"), "ui", "--port", str(port)], cwd=root,
                                env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + UI_STARTUP_TIMEOUT
        while "/#/experiments/" not in log_path.read_text():  # the links come once the server answers /health
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"python main.py ui did not print its links (exit code {proc.poll()}):\n"
                            + log_path.read_text()[-3000:])
            time.sleep(0.2)
        yield MlflowUI(f"http://127.0.0.1:{port}", port, store_uri, artifacts, experiment_id, log_path.read_text())
    finally:
        proc.send_signal(signal.SIGTERM)  # the command stops the server it started
        proc.wait(timeout=60)
    with socket.socket() as s:
        if s.connect_ex(("127.0.0.1", port)) == 0:
            pytest.fail(f"something still listens on port {port} after python main.py ui was stopped")


@pytest.fixture
def hub_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hub access disabled, so the hub path fails at once instead of after connection time-outs.

    The libraries read the variables when they are imported, and an earlier test may have imported them: set
    their module constants too.
    """
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    import datasets.config
    import huggingface_hub.constants

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


@pytest.fixture
def paperlab_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, _migrated_mlflow_db: Path, hub_offline: None) -> Path:
    """A temp working directory with its own MLflow sqlite store; hub access disabled (fail fast)."""
    shutil.copy(_migrated_mlflow_db, tmp_path / "mlflow.db")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setenv("CI", os.environ.get("CI", "1"))
    return tmp_path


@pytest.fixture
def repo_root() -> Path:
    return REPO


def _tree_files() -> set[str]:
    """Every file under the repository outside .git and the virtual environment (ignored ones included)."""
    skip = {".git", ".venv", "__pycache__", ".ruff_cache", ".pytest_cache"}
    out = set()
    for path in REPO.rglob("*"):
        rel = path.relative_to(REPO)
        if path.is_file() and not skip.intersection(rel.parts) and not rel.parts[0].endswith(".egg-info"):
            out.add(str(rel))
    return out


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config._paperlab_files = _tree_files()  # type: ignore[attr-defined]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Tests write only under their temporary directories: a file they leave in the repository fails the run."""
    before = getattr(session.config, "_paperlab_files", None)
    if before is None or os.environ.get("PAPERLAB_ALLOW_TREE_WRITES"):
        return
    new = sorted(_tree_files() - before)
    if new:
        print(f"\ntests wrote into the repository (they must write under tmp_path): {new[:10]}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(autouse=True)
def _restore_environment():
    """Put os.environ back after every test: in-process multi-process fits (Lightning's spawn/fork launchers)
    set MASTER_PORT and friends in this process, and a later subprocess test would inherit a stale port."""
    saved = dict(os.environ)
    yield
    if os.environ != saved:
        os.environ.clear()
        os.environ.update(saved)
