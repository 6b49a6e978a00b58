"""A sweep worker: one process that has torch, Lightning and MLflow imported and runs the training commands
its runner sends, one after the other (``sweeps.runner.WorkerPool`` starts it).

Why: a point run as ``python main.py fit`` then ``python main.py test`` starts two interpreters, each
importing torch, Lightning and MLflow: 5 to 9 s of CPU each on the development machine (2026-12-02), more
than the training of a small point. Workers are forked from a fork server that imported them once.

Requests (``multiprocessing`` connection, one at a time): ``{"plan": [<sweep arguments>]}``: the worker
checks the sweep file against the base config (``sweeps.cli.build_plan``) and answers with the plan, so that
the runner's own process never imports torch. ``{"args": [...], "log": "<file>"}``: the worker runs
``cli_messages.run_training(args)`` with its stdout and stderr (file descriptors 1 and 2, so C extensions
and child processes too) appended to the log file, and answers ``{"rc": <exit code>}``. The connection
closed: the worker exits. A crash that kills the worker (a segfault, the OOM killer) is seen by the runner
as the end of the connection; it counts the point as failed and starts another worker.

Between points the worker puts back what a point may leave behind that would change the next one: SIGINT's
handler (Lightning ignores Ctrl-C from its first one on) and torch's intra-op thread count (a config sets it
with ``run.num_threads``). Each point seeds itself (``seed_everything``) and opens its own MLflow run.
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing.connection import Connection


@contextmanager
def output_to(log: str | None) -> Iterator[None]:
    """File descriptors 1 and 2 (and ``sys.stdout``/``sys.stderr``) append to ``log`` inside the block."""
    if log is None:
        yield
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for f in (fd, *saved):
            os.close(f)


def run_command(args: list[str], log: str | None) -> int:
    """One training command, as ``python main.py <args>`` would run it; its output to ``log``."""
    import torch

    from cli_messages import run_training

    threads = torch.get_num_threads()
    with output_to(log):
        print(f"$ python main.py {shlex.join(args)}   # sweep worker pid {os.getpid()}", flush=True)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            return run_training(args)
        except KeyboardInterrupt:
            return 130
        except BaseException:  # a point's crash must not end the worker
            traceback.print_exc()
            return 1
        finally:
            torch.set_num_threads(threads)


def make_plan(argv: list[str]) -> dict[str, object]:
    """``{"plan": <the SweepPlan of `sweep <argv>`>}``, or ``{"error": ..., "sweep_error": ...}``."""
    from sweeps.cli import build_plan, sweep_parser
    from sweeps.spec import SweepError

    try:
        return {"plan": build_plan(sweep_parser().parse_args(argv))}
    except SweepError as err:
        return {"error": str(err), "sweep_error": True}
    except Exception:  # noqa: BLE001 - handed to the runner, which raises it
        return {"error": traceback.format_exc(), "sweep_error": False}


def warm_up(command: list[str] | None) -> None:
    """Pay what the first point would pay once: the imports (torch, Lightning, the project; MLflow and its
    sqlite store, which the logger imports lazily: 5-8 s of CPU in all; done already when the worker was
    forked from the runner's fork server) and, with ``command`` (the sweep's ``fit --config <base>
    --print_config``), jsonargparse's first look at the config's classes. Touches no store: the runner may
    still be creating it."""
    import lightning_cli  # noqa: F401
    from sweeps.runner import import_tracking

    import_tracking()

    if command:
        run_command(command, os.devnull)


def worker_main(conn: Connection, env: dict[str, str], cwd: str, warmup: list[str] | None = None) -> None:
    """A worker's life: take the runner's environment and folder, warm up, then answer each request
    received on ``conn`` until the runner closes it."""
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    sys.argv = [sys.argv[0] if sys.argv else "main.py"]
    try:
        warm_up(warmup)
        while True:
            try:
                request = conn.recv()
            except EOFError:  # the runner is done with this worker
                return
            if "plan" in request:
                answer = make_plan(list(request["plan"]))
            else:
                answer = {"rc": run_command(list(request["args"]), request.get("log"))}
            conn.send(answer)
    except KeyboardInterrupt:  # Ctrl-C in the terminal reaches the whole process group, idle workers too
        return
