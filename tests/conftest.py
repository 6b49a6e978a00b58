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
    if "fork_server" in needed:  # the fork server of tests.helpers.forked: ~7 s of imports, once
        from tests.fork_server import start_fork_server

        start_fork_server(wait=True)
    if "mlflow_ui" in needed:
        # The MLflow server (~10 s of CPU before it answers) starts in the background with the first test of
        # the test file before its first user's (in the whole suite tests/sweeps/test_spec.py: about 10 s of
        # in-process parsing in one process, billed to no method, runs while it gets ready on the other core;
        # the file before, test_runner.py, runs sweeps on two workers); its fixture waits for it there.
        items = session.items
        start = _first_of_file(items, next(i for i, item in enumerate(items) if "mlflow_ui" in item.fixturenames))
        if start > 0:
            start = _first_of_file(items, start - 1)
        session.config.stash[_UI_START] = items[start].nodeid


def _first_of_file(items: list[pytest.Item], i: int) -> int:
    """The index of the first collected test of ``items[i]``'s file."""
    while i > 0 and items[i - 1].path == items[i].path:
        i -= 1
    return i


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.nodeid == item.config.stash.get(_UI_START, None) and _UI not in item.config.stash:
        item.config.stash[_UI] = _UIProcess(item.config.stash[_TEMPLATE])


def pytest_unconfigure(config: pytest.Config) -> None:
    ui = config.stash.get(_UI, None)
    if ui is not None:  # started for a test that did not run (deselected by -x, -k after collection)
        ui.stop()
        shutil.rmtree(ui.root, ignore_errors=True)
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


class _UIProcess:
    """``python main.py ui`` serving a copy of the migrated store (one FINISHED run in it), started at once; its
    output goes to a file (a pipe nobody reads would block the server once its logs fill it)."""

    def __init__(self, template: Path) -> None:
        from tests.helpers import store_with_a_run

        self.root = Path(tempfile.mkdtemp(prefix="paperlab-mlflow-ui-"))
        db, self.artifacts, self.log_path = self.root / "mlflow.db", self.root / "artifacts", self.root / "ui.log"
        shutil.copy(template, db)
        self.artifacts.mkdir()
        self.store_uri, self.experiment_id = store_with_a_run(db, "ui_links")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        env = {**os.environ, "MLFLOW_TRACKING_URI": self.store_uri, "MLFLOW_ARTIFACTS_DESTINATION": str(self.artifacts),
               "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen([sys.executable, str(REPO / "main.py"), "ui", "--port", str(self.port)],
                                         cwd=self.root, env=env, stdout=log, stderr=subprocess.STDOUT)

    def wait_for_links(self) -> str:
        """What the command printed once the server answered /health (it prints the links then)."""
        deadline = time.monotonic() + UI_STARTUP_TIMEOUT
        while "/#/experiments/" not in self.log_path.read_text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"python main.py ui did not print its links (exit code {self.proc.poll()}):\n"
                            + self.log_path.read_text()[-3000:])
            time.sleep(0.2)
        return self.log_path.read_text()

    def stop(self) -> None:
        """Stop the command as a ``timeout`` stops it (SIGTERM): it stops the server it started."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=60)


_UI = pytest.StashKey[_UIProcess]()
_UI_START = pytest.StashKey[str]()  # the test with which the server starts


@pytest.fixture(scope="session")
def mlflow_ui(request: pytest.FixtureRequest, _migrated_mlflow_db: Path) -> Iterator[MlflowUI]:
    """One MLflow server for the session (starting one costs ~10 s of CPU, so it is started in the background a
    folder's tests ahead, ``pytest_collection_finish``): the ``ui`` command's test reads what it printed, the tracking-server test logs a
    fit and a sweep to it. Each test uses its own experiment. At the end the command is stopped as a ``timeout``
    stops it (SIGTERM), and nothing may be left listening."""
    from tests.helpers import MlflowUI

    ui = request.config.stash.get(_UI, None) or _UIProcess(_migrated_mlflow_db)
    request.config.stash[_UI] = ui
    try:
        output = ui.wait_for_links()
        yield MlflowUI(f"http://127.0.0.1:{ui.port}", ui.port, ui.store_uri, ui.artifacts, ui.experiment_id, output)
    finally:
        ui.stop()
        del request.config.stash[_UI]
        shutil.rmtree(ui.root, ignore_errors=True)
    with socket.socket() as s:
        if s.connect_ex(("127.0.0.1", ui.port)) == 0:
            pytest.fail(f"something still listens on port {ui.port} after python main.py ui was stopped")


@pytest.fixture(scope="session")
def fork_server() -> None:
    """This session's fork server for ``tests.helpers.forked`` and ``fork_main`` (started when collection is
    done where a collected test requests this fixture; here otherwise)."""
    from tests.fork_server import start_fork_server

    start_fork_server()


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
    config = session.config
    if not config.option.collectonly and any(Path(arg.split("::")[0]).is_dir() for arg in config.args):
        # A folder's tests (the default suite: testpaths) hold tests that fork: the fork server's ~7 s of imports
        # run on the other core while this process collects (~20 s), and pytest_collection_finish finds it ready.
        from tests.fork_server import start_fork_server

        start_fork_server()


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
