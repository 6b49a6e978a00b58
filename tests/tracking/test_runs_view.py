"""The runs-table link: what the installed MLflow UI honours, the saved view behind it, and ``python main.py ui``."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import mlflow
import pytest

from tests.helpers import REPO, MlflowUI, store_with_a_run
from tracking.runs_view import (
    LATEST_VIEW_TAG,
    VIEW_KEY_PARAM,
    VIEW_TAG_PREFIX,
    WORKFLOW,
    experiment_view,
    overridden_keys,
    override_params,
    runs_url,
    save_view,
    ui_base_url,
    view_state,
)

JS = Path(mlflow.__file__).parent / "server" / "js" / "build" / "static" / "js"
PARAMS = ["model.init_args.optimizer.init_args.lr", "model.init_args.net.class_path",
          "model.init_args.net.init_args.hidden", "trainer.max_epochs", "data.init_args.batch_size"]


def _bundle() -> str:
    return "\n".join(p.read_text(errors="replace") for p in sorted(JS.glob("*.js")))


def test_the_installed_ui_honours_the_link_it_is_given() -> None:
    """The names the link relies on, as MLflow 3.17's UI bundle spells them: an upgrade that drops one fails
    here, not in a user's browser."""
    js = _bundle()
    assert f'e.GENAI="genai",e.MACHINE_LEARNING="{WORKFLOW[1]}"' in js  # the switch's values
    assert f'get("{WORKFLOW[0]}")' in js  # read from the URL, before local storage
    assert '"/experiments/:experimentId/:tabName"' in js and 'e.Runs="runs"' in js  # the runs tab's route
    assert f'"{VIEW_KEY_PARAM}"' in js and f'"{VIEW_TAG_PREFIX}"' in js  # saved views: URL key, experiment tag
    # the saved view's envelope and state: search facets and the table's columns
    assert "typeof i.name||\"number\"!==typeof i.createdAt||\"string\"!==typeof i.state" in js
    assert '["searchFilter","orderByKey","orderByAsc","startTime","lifecycleFilter"' in js
    assert '["selectedColumns","columnOrder"' in js
    assert 'I=(e,t)=>e+".`"+t+"`"' in js  # a column key: metrics.`val/acc`


def test_overrides_map_to_the_logged_params() -> None:
    assert override_params(["model.optimizer.lr", "trainer.max_epochs"], PARAMS) == [
        "model.init_args.optimizer.init_args.lr", "trainer.max_epochs"]
    assert override_params(["model.init_args.optimizer.init_args.lr"], PARAMS) == [
        "model.init_args.optimizer.init_args.lr"]
    # a whole class: its class_path and what is under it
    assert override_params(["model.net"], PARAMS) == ["model.init_args.net.class_path",
                                                       "model.init_args.net.init_args.hidden"]
    assert override_params(["model.nope"], PARAMS) == []
    assert overridden_keys("--model.optimizer.lr 0.003 --model.net.hidden [64, 64] --trainer.max_epochs 1") == [
        "model.optimizer.lr", "model.net.hidden", "trainer.max_epochs"]


def test_the_link_opens_the_runs_tab_in_model_training_mode() -> None:
    assert ui_base_url("sqlite:///mlflow.db") == "http://127.0.0.1:5000"
    assert ui_base_url("http://tracking:5000/") == "http://tracking:5000"
    assert runs_url("http://127.0.0.1:5000", "7") == (
        "http://127.0.0.1:5000/#/experiments/7/runs?workflowType=machine_learning")
    assert runs_url("http://h:1", "7", "abc").endswith("/#/experiments/7/runs?workflowType=machine_learning"
                                                      "&viewStateShareKey=abc")


def test_a_saved_view_is_written_once_and_read_as_the_ui_reads_it(paperlab_tmp: Path) -> None:
    client = mlflow.MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    exp = client.create_experiment("views")
    state = view_state(["val/acc_best", "val/acc"], ["model.init_args.optimizer.init_args.lr"])
    key = save_view(client, exp, state, "paperlab: val/acc by lr")
    assert save_view(client, exp, dict(state), "another name") == key  # same columns, same view
    tags = client.get_experiment(exp).tags
    assert [k for k in tags if k.startswith(VIEW_TAG_PREFIX)] == [VIEW_TAG_PREFIX + key]
    assert tags[LATEST_VIEW_TAG] == key
    envelope = json.loads(tags[VIEW_TAG_PREFIX + key])  # the UI's check: name, createdAt, state as a string
    assert isinstance(envelope["name"], str) and isinstance(envelope["createdAt"], int)
    got = json.loads(envelope["state"])
    assert got["selectedColumns"] == ["metrics.`val/acc_best`", "metrics.`val/acc`",
                                      "params.`model.init_args.optimizer.init_args.lr`"]
    assert got["orderByKey"] == "attributes.start_time" and got["orderByAsc"] is False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_experiment_view_collects_monitored_metrics_and_overridden_params(paperlab_tmp: Path) -> None:
    uri, exp = store_with_a_run(paperlab_tmp / "mlflow.db")
    state = experiment_view(mlflow.MlflowClient(uri), exp)
    assert state is not None and state["selectedColumns"] == [
        "metrics.`val/acc_best`", "metrics.`val/acc`", "params.`model.init_args.optimizer.init_args.lr`"]


def test_ui_command_serves_the_store_and_prints_a_link_per_experiment(mlflow_ui: MlflowUI) -> None:
    # the session's server (tests/conftest.py) is this command, started on a store with one run; stopping it
    # leaves nothing listening (checked when the session ends)
    base, exp = mlflow_ui.url, mlflow_ui.experiment_id
    link = next((ln.split()[-1] for ln in mlflow_ui.output.splitlines() if "/#/experiments/" in ln), None)
    assert link is not None, mlflow_ui.output
    assert link.startswith(f"{base}/#/experiments/{exp}/runs?workflowType=machine_learning&viewStateShareKey=")
    with urllib.request.urlopen(f"{base}/health", timeout=10) as resp:
        assert resp.status == 200
    # the saved view the link names, as the UI fetches it
    key = link.rsplit("=", 1)[1]
    with urllib.request.urlopen(f"{base}/ajax-api/2.0/mlflow/experiments/get?experiment_id={exp}",
                                timeout=10) as resp:
        tags = {t["key"]: t["value"] for t in json.load(resp)["experiment"]["tags"]}
    state = json.loads(json.loads(tags[VIEW_TAG_PREFIX + key])["state"])
    assert "params.`model.init_args.optimizer.init_args.lr`" in state["selectedColumns"]
    with urllib.request.urlopen(f"{base}/", timeout=10) as resp:  # the UI itself
        assert b"<!doctype html>" in resp.read().lower()


CHROMIUM = next((b for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)


@pytest.mark.slow  # a real fit and a headless browser
@pytest.mark.skipif(CHROMIUM is None, reason="no chromium/chromium-browser/google-chrome on PATH")
def test_the_printed_link_shows_the_runs_table_in_a_browser(paperlab_tmp: Path, capsys) -> None:
    from main import cli_main

    config = str(REPO / "configs/mlp_classifier/digits.yaml")
    assert cli_main(["fit", "--config", config, "--trainer.max_epochs", "1", "--model.optimizer.lr", "0.01"]) == 0
    link = next(ln.split()[-1] for ln in capsys.readouterr().out.splitlines() if "runs table:" in ln)
    port = _free_port()
    link = link.replace("127.0.0.1:5000", f"127.0.0.1:{port}")
    proc = subprocess.Popen([sys.executable, str(REPO / "main.py"), "ui", "--port", str(port)], cwd=paperlab_tmp,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    try:
        while "/#/experiments/" not in (proc.stdout.readline() or "/#/experiments/"):
            pass
        dom = subprocess.run([CHROMIUM, "--headless", "--disable-gpu", "--no-sandbox", "--virtual-time-budget=30000",
                              "--dump-dom", link], capture_output=True, text=True, timeout=180).stdout
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    # the runs table (ag-grid) with the run, its overridden param and the monitored metric as columns
    assert "ag-root" in dom and "digits max_epochs=1 lr=0.01" in dom, dom[-3000:]
    assert "val/acc_best" in dom and "lr" in dom
