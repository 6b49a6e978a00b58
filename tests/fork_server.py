"""This test session's fork server (``tests.helpers.forked`` and ``fork_main``), in a module of the standard
library's imports only, so that ``tests/conftest.py`` can start it before anything heavy is imported."""

from __future__ import annotations

import os
from typing import Any

# What the fork server of fork_main imports once (the sweep workers' fork server, if it started first, has these)
_FORK_PRELOAD = ["main", "lightning_cli", "mlflow", "mlflow.store.tracking.sqlalchemy_store", "tests.helpers"]


def start_fork_server(wait: bool = False) -> Any:
    """Start this process's fork server if it is not running, and return the ``forkserver`` context. The server
    imports ``_FORK_PRELOAD`` (about 7 s of CPU) in its own process and the first fork waits for that; with
    ``wait``, this does (``tests/conftest.py`` starts it at session start, so that its imports overlap
    collection, and waits for it when collection is done: session set-up, not a cost of whichever test forks
    first)."""
    import multiprocessing
    import multiprocessing.forkserver

    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(_FORK_PRELOAD)  # no effect once this process's fork server runs
    multiprocessing.forkserver.ensure_running()
    if wait:  # a first child is forked once the server has its imports
        proc = ctx.Process(target=os.getpid)
        proc.start()
        proc.join()
    return ctx
