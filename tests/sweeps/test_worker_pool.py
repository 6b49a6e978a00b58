"""``WorkerPool.start`` returns at once (the fork server's imports overlap the runner's own start-up), the
runner's first request waits for a worker, a worker that cannot start is an error on the runner's thread,
not a hang, and closing the pool (Ctrl-C) while it starts does not wait for the workers. The real workers
are tested end to end in test_runner.py."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from sweeps import runner


class _GatedWorker:
    """A worker that is up only once ``gate`` is set, as a real one is once its fork server has imported."""

    gate = threading.Event()
    constructing = threading.Event()  # set once the pool's thread is inside a worker's start
    started: list[_GatedWorker] = []
    closed: list[_GatedWorker] = []

    def __init__(self, ctx: Any, cwd: Path, warmup: list[str] | None) -> None:
        self.constructing.set()
        assert self.gate.wait(10), "the test never opened the gate"
        self.busy = False
        self.started.append(self)

    def alive(self) -> bool:
        return True

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        return {"plan": f"plan of {request['plan']}"}

    def close(self, timeout: float = 10.0) -> None:
        self.closed.append(self)


class _FailingWorker(_GatedWorker):
    def __init__(self, ctx: Any, cwd: Path, warmup: list[str] | None) -> None:
        raise OSError("fork failed: no more processes")


def _in_thread(fn: Any) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def target() -> None:
        try:
            out["value"] = fn()
        except BaseException as err:  # noqa: BLE001 - handed to the test
            out["error"] = err

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, out


def test_start_returns_before_the_workers_are_up_and_the_first_request_waits_for_one(monkeypatch) -> None:
    monkeypatch.setattr(runner, "_Worker", _GatedWorker)
    _GatedWorker.gate.clear()
    pool = runner.WorkerPool(2)
    pool.start()  # no worker can start yet: a blocking start would never return here
    thread, out = _in_thread(lambda: pool.plan(["sweep.yaml"]))
    thread.join(0.3)
    assert thread.is_alive() and not out, "the request must wait for a worker"
    _GatedWorker.gate.set()
    thread.join(10)
    assert out == {"value": "plan of ['sweep.yaml']"}
    pool.close()


def test_a_worker_that_cannot_start_is_an_error_on_the_runners_thread(monkeypatch) -> None:
    monkeypatch.setattr(runner, "_Worker", _FailingWorker)
    pool = runner.WorkerPool(1)
    pool.start()
    thread, out = _in_thread(lambda: pool.plan(["sweep.yaml"]))
    thread.join(10)
    assert not thread.is_alive(), "a worker that cannot start left the runner waiting"
    with pytest.raises(RuntimeError, match="could not start a sweep worker") as info:
        raise out["error"]
    assert isinstance(info.value.__cause__, OSError)


def test_closing_while_the_workers_start_returns_at_once_and_a_late_worker_is_closed(monkeypatch) -> None:
    monkeypatch.setattr(runner, "_Worker", _GatedWorker)
    _GatedWorker.gate.clear()
    _GatedWorker.constructing.clear()
    _GatedWorker.started.clear()
    _GatedWorker.closed.clear()
    pool = runner.WorkerPool(2)
    pool.start()
    # a loaded machine may not have entered the first worker's start yet; the close must find it inside
    assert _GatedWorker.constructing.wait(10), "the pool never began to start a worker"
    thread, out = _in_thread(pool.close)
    thread.join(2)
    assert not thread.is_alive(), "close waited for a worker that was still starting"
    _GatedWorker.gate.set()  # the first worker comes up after the close: it is closed, and no second one starts
    deadline = time.monotonic() + 10
    while not _GatedWorker.closed and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)
    assert len(_GatedWorker.started) == 1 and _GatedWorker.closed == _GatedWorker.started
    with pytest.raises(RuntimeError, match="closed"):
        pool.plan(["sweep.yaml"])
