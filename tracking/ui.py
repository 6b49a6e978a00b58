"""``python main.py ui [--port 5000] [--host 127.0.0.1]``: the MLflow UI on paperlab's store, and a link per
experiment that opens its runs table in Model-training mode with the columns worth comparing.

On a local store (``sqlite:///mlflow.db``, or ``MLFLOW_TRACKING_URI``) it runs ``mlflow ui`` on that store
until Ctrl-C; on a tracking server (``MLFLOW_TRACKING_URI=http://...``) the server is the UI, so it only
prints the links. Each experiment's link is a saved view (``tracking.runs_view``) over its runs: every
monitored metric (``<m>_best`` and ``<m>``) and every param some run's command line overrode. Imports no
torch or Lightning.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable

from errors import PaperlabError
from tracking.runs_view import UI_HOST, UI_PORT, experiment_view, runs_url, save_view, ui_base_url
from tracking.uri import check_tracking_server, default_tracking_uri, prepare_store, retry_locked

STARTUP_TIMEOUT_S = 120.0


def experiment_links(tracking_uri: str, base_url: str) -> list[tuple[str, str]]:
    """``(experiment name, runs-table link)`` for every experiment with runs, newest experiment first."""
    import mlflow

    client = mlflow.MlflowClient(tracking_uri)
    out = []
    for exp in retry_locked(client.search_experiments, order_by=["creation_time DESC"]):
        if not retry_locked(client.search_runs, [exp.experiment_id], max_results=1):
            continue
        state = experiment_view(client, exp.experiment_id)
        key = save_view(client, exp.experiment_id, state, "paperlab: all runs") if state else None
        out.append((exp.name, runs_url(base_url, exp.experiment_id, key)))
    return out


def _port_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


def serve(tracking_uri: str, host: str, port: int, echo: Callable[[str], None] = print) -> int:
    """Run ``mlflow ui`` on the store until it exits or Ctrl-C; print the links once it answers."""
    base = ui_base_url(tracking_uri, host, port)
    if not _port_free(host, port):
        echo(f"error: {host}:{port} is in use (an MLflow UI already running?): choose another with --port")
        return 2
    prepare_store(tracking_uri)  # the schema, under the file lock, before the server and the links read it
    links = experiment_links(tracking_uri, base)
    # one worker: a personal UI (mlflow's default starts four)
    command = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", tracking_uri, "--host", host,
               "--port", str(port), "--workers", "1"]
    echo(f"starting the MLflow UI on {base} for {tracking_uri} (Ctrl-C stops it)")
    # its own session: the server's workers are stopped together below, and only they
    proc = subprocess.Popen(command, start_new_session=True)
    # SIGTERM (a `timeout`, a job scheduler) ends this process through the `finally` below, as Ctrl-C does,
    # so the server never outlives it
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not _answers(base):
            if proc.poll() is not None:
                echo(f"error: mlflow ui exited with code {proc.returncode}")
                return 1
            if time.monotonic() > deadline:
                echo(f"error: the MLflow UI did not answer on {base} within {STARTUP_TIMEOUT_S:.0f} s")
                return 1
            time.sleep(0.5)
        _print_links(links, base, echo)
        return proc.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)
        _stop(proc)


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _stop(proc: subprocess.Popen) -> None:
    """Stop the server and the workers it started (its process group)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=15)
            return
        except subprocess.TimeoutExpired:
            continue


def _print_links(links: list[tuple[str, str]], base: str, echo: Callable[[str], None]) -> None:
    if not links:
        echo(f"MLflow UI: {base} (no runs yet: python main.py fit --config configs/<method>/<experiment>.yaml)")
        return
    echo("runs tables (Model training mode, monitored metrics and overridden params as columns):")
    width = max(len(name) for name, _ in links)
    for name, link in links:
        echo(f"  {name:{width}}  {link}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python main.py ui",
        description="Serve the MLflow UI on paperlab's store (MLFLOW_TRACKING_URI or sqlite:///mlflow.db) and "
        "print, per experiment, a link to its runs table in Model-training mode.",
    )
    parser.add_argument("--port", type=int, default=UI_PORT, help=f"port of the UI (default {UI_PORT})")
    parser.add_argument("--host", default=UI_HOST, help=f"address the UI listens on (default {UI_HOST})")
    args = parser.parse_args(argv)
    uri = default_tracking_uri()
    try:
        if uri.startswith(("http://", "https://")):
            check_tracking_server(uri)  # the server is the UI: nothing to start
            _print_links(experiment_links(uri, ui_base_url(uri)), ui_base_url(uri), print)
            return 0
        return serve(uri, args.host, args.port)
    except PaperlabError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
