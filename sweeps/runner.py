"""Run the points of a sweep: one parent MLflow run, one child run per point, resumable and failure-isolated.

Every point is a normal ``python main.py fit`` (then ``test --ckpt_path best``) with the point's overrides,
``--run.name <sweep>-<point>-s<seed>`` and ``--run.parent_run_id <parent>``. Progress is kept in MLflow
itself, not in a side file: when all of a point's steps succeed the runner tags its child run
``sweep.done = fit`` (or ``test``). A re-run skips the points whose child run is FINISHED (a FINISHED child
without the tag is a fit the killed runner did not get to tag: it is adopted, never trained twice), resumes a
point whose unfinished child left a ``last.ckpt`` (``--ckpt_path last``, into that same run), and runs the
rest (only the test if the fit is already done), so a sweep resumes after Ctrl-C, a crash, or a SLURM array
task that died. A point that fails ends as a FAILED child run (created if the CLI never got as
far as opening one) with its log attached, and the other points go on.

How a command runs is the executor's business: ``WorkerPool`` (the local default: warm worker processes forked
from a fork server that imported torch, Lightning and MLflow once, see ``sweeps/worker.py``), ``Subprocesses``
(``python main.py`` per command: ``--exec-prefix``, torchrun, points of several processes) or ``InProcess``.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sweeps.spec import REPO, Point, SweepSpec, canonical, expand, is_arm_key, label_value, safe_name
from tracking.names import RUN_FILE, folder_name, parent_name

PARENT_ROLE = "parent"
DONE_TAG = "sweep.done"


def _run_record(directory: Path) -> dict[str, Any] | None:
    try:
        return json.loads((Path(directory) / RUN_FILE).read_text())
    except (OSError, ValueError):
        return None


@dataclass
class SweepPlan:
    """Everything a run of the sweep needs, resolved once before any point starts."""

    spec: SweepSpec
    points: list[Point]
    experiment: str
    checkpoint_root: Path
    tracking_uri: str
    extra_args: list[str] = field(default_factory=list)  # launcher overrides (nodes, devices) for every step
    monitor: str | None = None  # the task's monitored metric (val/acc): what `compare` is pointed at

    @property
    def log_dir(self) -> Path:
        return self.checkpoint_root / self.experiment / "_sweeps" / self.spec.name

    def ckpt_dir(self, point: Point) -> Path:
        return self.checkpoint_root / self.experiment / point.run_name

    def child_tags(self, point: Point) -> dict[str, str]:
        user = point.overrides.get("run.tags") or {}
        return {
            **{str(k): str(v) for k, v in user.items()},
            "sweep.name": self.spec.name,
            "sweep.point": point.label,
            "sweep.seed": str(point.seed),
            "sweep.index": str(point.index),
        }

    def _common(self, point: Point, name: str | None = None, seeded: bool = True, arms: bool = False) -> list[str]:
        """The config, the point's overrides (``--run.tags`` apart; ``arms``: its optimizer hyperparameters
        apart too, each row gives its own), its seed and its run name."""
        overrides = {k: v for k, v in point.overrides.items() if k != "run.tags" and not (arms and is_arm_key(k))}
        args = Point(point.index, point.label, point.values, overrides, point.seed, point.run_name).cli_args()
        if not seeded:
            args = args[:-2]  # cli_args ends with --seed_everything <seed>
        return ["--config", str(self.spec.base), *args, *self.extra_args, "--run.name", name or point.run_name,
                "--run.experiment", self.experiment]

    def fit_args(self, point: Point, parent_id: str) -> list[str]:
        return [
            "fit",
            *self._common(point),
            "--run.parent_run_id",
            parent_id,
            "--run.tags",
            json.dumps(self.child_tags(point)),
        ]

    def test_args(self, point: Point) -> list[str]:
        return ["test", *self._common(point), "--ckpt_path", "best"]

    def jobs(self, points: list[Point]) -> list[list[Point]]:
        """The processes that run ``points``: one fit per point, or with ``vectorize_seeds`` one fit per swept
        value holding its seeds (in the order of ``points``)."""
        if not self.spec.vectorize_seeds:
            return [[p] for p in points]
        groups: dict[str, list[Point]] = {}
        for p in points:
            groups.setdefault(self._group_key(p), []).append(p)
        return list(groups.values())

    def _group_key(self, point: Point) -> str:
        """Points of one key share a process: a swept value's seeds, or with ``vectorize_arms`` every point
        whose overrides differ in the optimizer's hyperparameters and the seed only."""
        if not self.spec.vectorize_arms:
            return point.label
        return canonical({k: v for k, v in point.overrides.items() if not is_arm_key(k)})

    def group_name(self, point: Point) -> str:
        """The name of the seed-parallel fit of a point's seeds: its run names without ``-s<seed>``; with
        ``vectorize_arms``, the sweep's name, the values of the point that are not optimizer hyperparameters
        (``base`` when there are none) and ``arms``."""
        if not self.spec.vectorize_arms:
            return point.run_name.removesuffix(f"-s{point.seed}")
        swept = {*self.spec.grid, *(k for p in self.spec.points for k in p)}  # the same in every point of a group
        parts = [f"{k.rsplit('.', 1)[-1]}={label_value(v)}" for k, v in point.overrides.items()
                 if k in swept and not is_arm_key(k)]
        return f"{self.spec.name}-{safe_name('-'.join(parts)) if parts else 'base'}-arms"

    def group_dir(self, point: Point) -> Path:
        """The folder of the seed-parallel fit of a point's seeds (the CLI's ``<run name> seeds`` as a folder):
        its resumable ``last.ckpt``."""
        return self.checkpoint_root / self.experiment / folder_name(parent_name(self.group_name(point)))

    def log_file(self, point: Point) -> Path:
        """Where the commands of ``point`` write their output (one file per seed-parallel fit)."""
        return self.log_dir / f"{self.group_name(point) if self.spec.vectorize_seeds else point.run_name}.log"

    def seeds_fit_args(self, points: list[Point], parent_id: str) -> list[str]:
        """One ``fit --run.seeds`` of the seeds of one swept value, each seed's run named and tagged as the
        plain fit of that point would be (``--run.seed_runs``), directly under the sweep's parent run."""
        first = points[0]
        arms = self.spec.vectorize_arms
        config = self._common(first, name=self.group_name(first), seeded=False, arms=arms)
        user = {str(k): str(v) for k, v in (first.overrides.get("run.tags") or {}).items()}
        shared = ["--run.parent_run_id", parent_id, "--run.tags", json.dumps(user)]
        if arms:
            # one row per point: its seed, its optimizer hyperparameters, its plain fit's run name and tags
            rows = [{"seed": p.seed, "name": p.run_name, "tags": self.child_tags(p),
                     "overrides": {k: v for k, v in p.overrides.items() if is_arm_key(k)}} for p in points]
            return ["fit", *config, "--run.rows", json.dumps(rows), *shared]
        runs = {str(p.seed): {"name": p.run_name, "tags": self.child_tags(p)} for p in points}
        return ["fit", *config, "--run.seeds", json.dumps([p.seed for p in points]), "--run.seed_runs",
                json.dumps(runs), *shared]


@dataclass
class Outcome:
    point: Point
    status: str  # FINISHED, FAILED, SKIPPED, KILLED
    run_id: str | None = None
    seconds: float = 0.0
    message: str = ""


# ---------------------------------------------------------------------------------------------------------
# MLflow bookkeeping


def client_for(uri: str) -> Any:
    import mlflow

    return mlflow.MlflowClient(uri)


def newest_runs(client: Any, experiment: str, filter_string: str, max_results: int = 50000) -> list[Any]:
    """The live runs of ``experiment`` that match ``filter_string``, newest first ([] without the experiment)."""
    from mlflow.entities import ViewType

    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return []
    return client.search_runs([exp.experiment_id], filter_string=filter_string, run_view_type=ViewType.ACTIVE_ONLY,
                              order_by=["attributes.start_time DESC"], max_results=max_results)


def find_parent(client: Any, experiment: str, name: str) -> Any | None:
    """The newest live parent run of sweep ``name`` in ``experiment`` (None if the sweep never ran)."""
    runs = newest_runs(client, experiment, f"tags.`sweep.name` = '{name}' and tags.`sweep.role` = '{PARENT_ROLE}'",
                       max_results=1)
    return runs[0] if runs else None


def ensure_parent(client: Any, plan: SweepPlan) -> str:
    """Reuse the sweep's parent run (a re-run resumes it) or create it; attach the sweep file either way."""
    spec = plan.spec
    parent = find_parent(client, plan.experiment, spec.name)
    if parent is None:
        exp = client.get_experiment_by_name(plan.experiment)
        exp_id = exp.experiment_id if exp is not None else client.create_experiment(plan.experiment)
        parent = client.create_run(
            exp_id, run_name=spec.name, tags={"sweep.name": spec.name, "sweep.role": PARENT_ROLE}
        )
    run_id = parent.info.run_id
    if parent.info.status != "RUNNING":
        client.update_run(run_id, status="RUNNING")
    # Tags, not params: params are immutable and a re-run may come from an edited sweep file.
    tags = {
        "sweep.base": _display_path(spec.base),
        "sweep.seeds": json.dumps(spec.seeds),
        "sweep.test": str(spec.test).lower(),
        "sweep.size": str(len(plan.points)),
        "sweep.digest": spec.digest(),
        "sweep.file": _display_path(spec.path) if spec.path else "",
    }
    tags.update({f"sweep.grid.{k}": json.dumps(v)[:5000] for k, v in spec.grid.items()})
    if spec.description:
        tags["mlflow.note.content"] = spec.description
    from mlflow.entities import RunTag

    client.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()])
    _log_text(client, run_id, spec.text, f"sweep/{spec.path.name if spec.path else 'sweep.yaml'}")
    points = [
        {"index": p.index, "run_name": p.run_name, "point": p.label, "seed": p.seed, "values": p.values}
        for p in plan.points
    ]
    _log_text(client, run_id, json.dumps(points, indent=1, default=str) + "\n", "sweep/points.json")
    return run_id


def _display_path(path: Path | None) -> str:
    if path is None:
        return ""
    try:
        return str(Path(path).resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def _log_text(client: Any, run_id: str, text: str, artifact_file: str) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        local = Path(tmp) / Path(artifact_file).name
        local.write_text(text)
        parent = str(Path(artifact_file).parent)
        client.log_artifact(run_id, str(local), artifact_path=None if parent == "." else parent)


def children(client: Any, plan: SweepPlan, parent_id: str) -> dict[str, list[Any]]:
    """The parent's child runs grouped by run name, newest first."""
    out: dict[str, list[Any]] = {}
    for run in newest_runs(client, plan.experiment, f"tags.`mlflow.parentRunId` = '{parent_id}'"):
        out.setdefault(run.info.run_name, []).append(run)
    return out


def point_state(runs: list[Any], want_test: bool) -> tuple[str, Any | None]:
    """``done``, ``needs_test`` (fit FINISHED, no test) or ``todo``, with the run concerned.

    A FINISHED child without the ``sweep.done`` tag is a fit that ended well in a sweep killed before it
    could tag it (the fit's process ends the run FINISHED only when training succeeded; a failed step ends
    it FAILED): it counts as a done fit and is adopted (``_run_point`` tags it), never trained a second time.
    """
    for run in runs:
        done = run.data.tags.get(DONE_TAG, "fit")
        if run.info.status == "FINISHED" and done in ("fit", "test"):
            if done == "test" or not want_test:
                return "done", run
            return "needs_test", run
    return "todo", None


def resumable_run(runs: list[Any], ckpt_dir: Path) -> str | None:
    """The point's child run that a killed sweep left unfinished (RUNNING, or KILLED by a Ctrl-C or by the
    rerun's clean-up) with a complete ``last.ckpt`` of its own in the point's folder: the fit resumes it
    (``--ckpt_path last``, into the same run) instead of training from scratch into a new one."""
    return unfinished_recorded_run(runs, ckpt_dir) if _complete(Path(ckpt_dir) / "last.ckpt") else None


def unfinished_recorded_run(runs: list[Any], directory: Path) -> str | None:
    """The run ``directory``'s run record names, when it is one of ``runs`` left unfinished (RUNNING or KILLED)."""
    run_id = (_run_record(directory) or {}).get("run_id")
    return run_id if run_id in {r.info.run_id for r in runs if r.info.status in ("RUNNING", "KILLED")} else None


def _complete(path: Path) -> bool:
    """Whether ``path`` is a complete checkpoint archive (a zip whose members pass their CRC check)."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as archive:
            return archive.testzip() is None
    except (OSError, zipfile.BadZipFile, ValueError):
        return False


# ---------------------------------------------------------------------------------------------------------
# Executors: how one CLI invocation of a point is started.


class InProcess:
    """Runs ``cli_messages.run_training`` in this process: no interpreter start-up (tests, quick looks); one worker.

    What the CLI prints through ``sys.stdout``/``sys.stderr`` (its one-line errors) also goes to the log.
    """

    def __call__(self, args: list[str], log_file: Path | None) -> int:
        import contextlib

        from cli_messages import run_training

        with contextlib.ExitStack() as stack:
            if log_file is not None:
                log = stack.enter_context(open(log_file, "a"))
                log.write(f"$ python main.py {shlex.join(args)}\n")
                stack.enter_context(contextlib.redirect_stdout(_Tee(sys.stdout, log)))
                stack.enter_context(contextlib.redirect_stderr(_Tee(sys.stderr, log)))
            try:
                return run_training(args)
            except KeyboardInterrupt:
                raise
            except BaseException:  # a point's crash must not end the sweep
                traceback.print_exc()
                return 1

    def stop_all(self) -> None:
        pass


class _Tee(io.TextIOBase):
    def __init__(self, *streams: Any) -> None:
        self.streams = streams

    def write(self, text: str) -> int:
        for stream in self.streams:
            stream.write(text)
        return len(text)

    def flush(self) -> None:
        for stream in self.streams:
            stream.flush()


class Subprocesses:
    """Runs ``[prefix...] python main.py <args>`` as a child process, its output in a log file."""

    def __init__(self, prefix: list[str] | None = None, cwd: Path | None = None) -> None:
        self.prefix = list(prefix or [])
        self.cwd = cwd or Path.cwd()
        self._live: set[subprocess.Popen] = set()
        self._lock = threading.Lock()

    def command(self, args: list[str]) -> list[str]:
        main = str(REPO / "main.py")
        if self.prefix and Path(self.prefix[0]).name == "torchrun":
            return [*self.prefix, main, *args]  # torchrun starts the interpreter itself
        return [*self.prefix, sys.executable, main, *args]

    def __call__(self, args: list[str], log_file: Path | None) -> int:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        }
        out = open(log_file, "a") if log_file else subprocess.DEVNULL  # noqa: SIM115 - closed below
        try:
            if log_file:
                out.write(f"$ {shlex.join(self.command(args))}\n")
                out.flush()
            proc = subprocess.Popen(
                self.command(args), cwd=self.cwd, env=env, stdout=out, stderr=subprocess.STDOUT
            )
            with self._lock:
                self._live.add(proc)
            rc = proc.wait()  # an interrupt here leaves proc in _live, for stop_all to stop it
            with self._lock:
                self._live.discard(proc)
            return rc
        finally:
            if log_file:
                out.close()

    def stop_all(self, grace: float = 10.0) -> None:
        """Stop the running points: SIGINT (Lightning's graceful Ctrl-C: checkpoint, run KILLED), then
        SIGTERM, then SIGKILL. SIGINT alone fails: a shell starts background jobs with SIGINT ignored."""
        with self._lock:
            live = list(self._live)
        for sig, wait_s in ((signal.SIGINT, grace), (signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
            alive = [p for p in live if p.poll() is None]
            if not alive:
                return
            for proc in alive:
                proc.send_signal(sig)
            deadline = time.monotonic() + wait_s
            for proc in alive:
                try:
                    proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass


# what every worker needs, imported once by the fork server (see WorkerPool): 5-8 s of CPU per process
#: what an MLflow client on the sqlite store imports (2-4 s of CPU): the runner's own and every worker's
TRACKING_MODULES = ["mlflow", "mlflow.store.tracking.sqlalchemy_store"]
PRELOAD = ["lightning_cli", *TRACKING_MODULES, "sweeps.worker"]


def import_tracking() -> None:
    """Import ``TRACKING_MODULES``: the runner calls it while the workers' fork server imports ``PRELOAD`` on the
    other core, so that it is off the sweep's start-up; a worker calls it in its warm-up (a no-op when forked
    from that server)."""
    for name in TRACKING_MODULES:
        importlib.import_module(name)


def _context() -> Any:
    """``forkserver`` (every worker forked from one process that imported ``PRELOAD``), else ``spawn``."""
    import multiprocessing

    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(PRELOAD)  # no effect once this process's fork server runs: it has them
        return ctx
    return multiprocessing.get_context("spawn")


class _Worker:
    """One worker process (``sweeps.worker.worker_main``) and its end of their pipe."""

    def __init__(self, ctx: Any, cwd: Path, warmup: list[str] | None) -> None:
        from sweeps.worker import worker_main

        self.conn, theirs = ctx.Pipe()
        # this process's environment now, not the fork server's from when it started (a test sets its own)
        self.proc = ctx.Process(target=worker_main, args=(theirs, dict(os.environ), str(cwd), warmup),
                                name="paperlab-sweep-worker", daemon=True)
        self.proc.start()
        theirs.close()
        self.busy = False

    def alive(self) -> bool:
        return self.proc.is_alive()

    def ask(self, request: dict[str, Any]) -> dict[str, Any] | None:
        """Send one request and wait for its answer; None when the worker died (see ``proc.exitcode``)."""
        try:
            self.conn.send(request)
            return self.conn.recv()
        except (EOFError, OSError):
            self.proc.join()
            return None

    def run(self, args: list[str], log_file: Path | None) -> int:
        """Run one command and return its exit code; a worker that died answers with its own."""
        answer = self.ask({"args": args, "log": str(log_file) if log_file else None})
        if answer is None:  # the worker is gone: its exit status (negative: the signal that killed it)
            rc = self.proc.exitcode
            if log_file is not None:
                with open(log_file, "a") as log:
                    log.write(f"\nthe sweep worker running this command died (exit status {rc})\n")
            return rc or 1
        return int(answer["rc"])

    def signal(self, sig: int) -> None:
        if self.proc.is_alive() and self.proc.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, sig)

    def close(self, timeout: float = 10.0) -> None:
        """End of input: the worker exits once its command is done, killed after ``timeout`` seconds. An idle
        worker (``timeout=0``) is terminated at once: its last command returned with its run closed and its
        files written, and its interpreter's own exit (torch's teardown) costs a second or two."""
        with contextlib.suppress(OSError):
            self.conn.close()
        if timeout <= 0:
            self.proc.terminate()
        self.proc.join(max(timeout, 5.0))
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()


class WorkerPool:
    """Runs each command in one of ``size`` long-lived worker processes (``sweeps/worker.py``).

    The workers are forked from one fork server that imported torch, Lightning and MLflow once
    (``PRELOAD``): a point's fit and test then cost their own time plus the command line's parsing, not two
    interpreter start-ups (5-8 s of CPU each), and a second worker, or one that replaces a crashed worker,
    costs no import at all. ``start`` launches them at once, so that the imports overlap this process's
    own start. The sweep's checks run in a worker too (``plan``): this process never imports torch. A point
    still runs in a process of its own, apart from the runner, so a point that crashes its interpreter
    fails alone.
    """

    def __init__(self, size: int, cwd: Path | None = None, warmup: list[str] | None = None) -> None:
        self.size = max(1, size)
        self.cwd = cwd or Path.cwd()
        self.warmup = warmup  # a command each worker runs first, output discarded (see sweeps/worker.py)
        self._ctx = _context()
        self._idle: list[_Worker] = []
        self._all: list[_Worker] = []
        self._lock = threading.Condition()
        self._starter: threading.Thread | None = None
        self._start_error: BaseException | None = None
        self._closed = False

    def _new(self) -> _Worker:
        return _Worker(self._ctx, self.cwd, self.warmup)

    def start(self) -> None:
        """Start the workers and return at once. The first worker a process starts launches its fork server,
        which imports ``PRELOAD`` before it forks (5-10 s): that runs beside this process's own start-up (the
        runner imports MLflow meanwhile, ``import_tracking``), and ``_take`` waits for a worker."""
        with self._lock:
            if self._starter is None:
                self._starter = threading.Thread(target=self._start_workers, name="paperlab-sweep-pool", daemon=True)
                self._starter.start()

    def _start_workers(self) -> None:
        """Start workers up to ``size``, each outside the lock (the first waits for the fork server's imports),
        so that ``close`` (Ctrl-C while the sweep starts) does not wait for them; one started after ``close``
        is closed at once."""
        try:
            while True:
                with self._lock:
                    if self._closed or len(self._all) >= self.size:
                        return
                worker = self._new()
                with self._lock:
                    closed = self._closed
                    if not closed:
                        self._all.append(worker)
                        self._idle.append(worker)
                        self._lock.notify_all()
                if closed:
                    worker.close(0)
                    return
        except BaseException as err:  # noqa: BLE001 - raised by _take, on the runner's thread
            with self._lock:
                self._start_error = err
                self._lock.notify_all()

    def _take(self) -> _Worker:
        with self._lock:
            if self._starter is None:
                self.start()
            while not self._idle:
                if self._start_error is not None:
                    raise RuntimeError("could not start a sweep worker") from self._start_error
                if self._closed:
                    raise RuntimeError("the sweep's workers were closed")
                self._lock.wait()
            worker = self._idle.pop(0)
            if not worker.alive():  # died since its last command: replaced
                self._all.remove(worker)
                worker = self._new()
                self._all.append(worker)
            worker.busy = True
            return worker

    def _give_back(self, worker: _Worker) -> None:
        with self._lock:
            worker.busy = False
            self._idle.append(worker)
            self._lock.notify()

    def plan(self, argv: list[str]) -> SweepPlan:
        """The sweep's plan (``sweeps.cli.build_plan``), built by a worker: the checks import the trainer,
        which the worker has imported anyway; this process never does."""
        from sweeps.spec import SweepError

        worker = self._take()
        try:
            answer = worker.ask({"plan": list(argv)})
        finally:
            self._give_back(worker)
        if answer is None:
            raise SweepError(f"a sweep worker died while checking the sweep (exit status {worker.proc.exitcode})")
        if "plan" not in answer:
            if answer.get("sweep_error"):
                raise SweepError(answer["error"])
            raise RuntimeError(f"a sweep worker failed while checking the sweep:\n{answer['error']}")
        return answer["plan"]

    def __call__(self, args: list[str], log_file: Path | None) -> int:
        worker = self._take()
        try:
            return worker.run(args, log_file)
        finally:
            self._give_back(worker)

    def stop_all(self, grace: float = 10.0) -> None:
        """Stop the running points as ``Subprocesses.stop_all`` does (SIGINT: Lightning's graceful Ctrl-C,
        then SIGTERM, then SIGKILL), then the idle workers."""
        with self._lock:
            busy = [w for w in self._all if w.busy]
        for sig, wait_s in ((signal.SIGINT, grace), (signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
            alive = [w for w in busy if w.alive()]
            if not alive:
                break
            for worker in alive:
                worker.signal(sig)
            deadline = time.monotonic() + wait_s
            for worker in alive:
                worker.proc.join(max(0.1, deadline - time.monotonic()))
        self.close()

    def close(self, timeout: float = 10.0) -> None:
        """Idle workers end at once; one still running a command gets ``timeout`` seconds to finish it."""
        with self._lock:
            self._closed = True
            workers, self._all, self._idle = list(self._all), [], []
            self._lock.notify_all()
        for worker in workers:
            worker.close(timeout if worker.busy else 0)


# ---------------------------------------------------------------------------------------------------------


class SweepRunner:
    """Runs a sweep's points (all, or the ``only`` indices) with ``workers`` at once."""

    def __init__(
        self,
        plan: SweepPlan,
        executor: Callable[[list[str], Path | None], int] | None = None,
        workers: int = 1,
        echo: Callable[[str], None] = print,
    ) -> None:
        self.plan = plan
        self.executor = executor or Subprocesses()
        self.workers = max(1, workers)
        self.echo = echo
        self.client = client_for(plan.tracking_uri)
        self.parent_id: str | None = None

    def run(self, only: list[int] | None = None) -> list[Outcome]:
        plan = self.plan
        self.parent_id = ensure_parent(self.client, plan)
        todo = [p for p in plan.points if only is None or p.index in only]
        existing = children(self.client, plan, self.parent_id)
        plan.log_dir.mkdir(parents=True, exist_ok=True)
        self.echo(
            f"sweep {plan.spec.name}: {len(todo)} point(s), experiment '{plan.experiment}', "
            f"parent run {self.parent_id}, logs in {plan.log_dir}/"
        )
        outcomes: list[Outcome] = []
        running: dict[Future, list[Point]] = {}
        interrupted = False
        restore = _sigterm_as_interrupt()
        pool = ThreadPoolExecutor(max_workers=self.workers) if self.workers > 1 else None
        jobs = plan.jobs(todo)
        try:
            if pool is None:  # in the main thread: Lightning's own signal handling stays intact
                for job in jobs:
                    running = {Future(): job}
                    for outcome in self._run_job(job, existing):
                        outcomes.append(outcome)
                        self._report(outcome, len(outcomes), len(todo))
                running = {}
            else:
                pending = list(jobs)
                while pending or running:
                    while pending and len(running) < self.workers:
                        job = pending.pop(0)
                        running[pool.submit(self._run_job, job, existing)] = job
                    finished, _ = wait(list(running), timeout=0.5, return_when=FIRST_COMPLETED)
                    for fut in finished:
                        running.pop(fut)
                        for outcome in fut.result():
                            outcomes.append(outcome)
                            self._report(outcome, len(outcomes), len(todo))
        except KeyboardInterrupt:
            interrupted = True
            self.echo("interrupted: stopping the running points (run the same command again to resume)")
            self.executor.stop_all()
            done = {o.point.run_name for o in outcomes}
            for point in (p for job in running.values() for p in job if p.run_name not in done):
                outcomes.append(Outcome(point, "KILLED", message="interrupted"))
                self._close_interrupted(point)
        finally:
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
            close = getattr(self.executor, "close", None)
            if close is not None:
                close()
            restore()
            self._close_parent(interrupted, partial=only is not None)
        return outcomes

    def _close_interrupted(self, point: Point) -> None:
        """A child killed before it could close its run (SIGKILL after the grace) must not stay RUNNING."""
        for run in children(self.client, self.plan, self.parent_id).get(point.run_name, []):
            if run.info.status == "RUNNING":
                self.client.set_terminated(run.info.run_id, "KILLED")

    def _report(self, outcome: Outcome, i: int, n: int) -> None:
        extra = f" ({outcome.seconds:.1f} s)" if outcome.status != "SKIPPED" else " (already done)"
        msg = f": {outcome.message}" if outcome.message and outcome.status != "SKIPPED" else ""
        self.echo(f"[{i}/{n}] {outcome.status:8s} {outcome.point.run_name}{extra}{msg}")

    def _run_job(self, job: list[Point], existing: dict[str, list[Any]]) -> list[Outcome]:
        if self.plan.spec.vectorize_seeds:
            return self._run_seeds(job, existing)
        return [self._run_point(point, existing.get(point.run_name, [])) for point in job]

    def _run_seeds(self, points: list[Point], existing: dict[str, list[Any]]) -> list[Outcome]:
        """The seeds of one swept value (``vectorize_seeds``): those not fitted yet as one seed-parallel fit
        (a killed stack resumes, ``_seeds_resumable``; otherwise they fit from scratch), then each seed's test
        as a plain ``test --ckpt_path best``. Each seed keeps its own outcome: a seed whose loss became
        NaN ends FAILED and the others go on."""
        plan = self.plan
        outcomes: dict[str, Outcome] = {}
        states: dict[str, tuple[str, Any]] = {}
        for point in points:
            state, run = states[point.run_name] = self._state(existing.get(point.run_name, []))
            if state == "done":
                outcomes[point.run_name] = Outcome(point, "SKIPPED", run_id=run.info.run_id)
        t0 = time.time()
        log_file = plan.log_file(points[0])
        fit = [p for p in points if states[p.run_name][0] == "todo"]
        # these seeds are redone now, resumed into the same runs when the stack left its last.ckpt
        for point in fit:
            self._close_running(existing.get(point.run_name, []))
        run_ids = {p.run_name: states[p.run_name][1].info.run_id for p in points
                   if states[p.run_name][0] == "needs_test"}
        if fit:
            resume = ["--ckpt_path", "last"] if self._seeds_resumable(fit, existing) else []
            rc = self.executor(plan.seeds_fit_args(fit, self.parent_id) + resume, log_file)
            for point in fit:
                run_id = self._child_run_id(point, t0)
                status = self.client.get_run(run_id).info.status if run_id is not None else None
                if rc == 0 and status == "FINISHED":
                    self.client.set_tag(run_id, DONE_TAG, "fit")
                    run_ids[point.run_name] = run_id
                    continue
                why = f"fit exited with code {rc}" if rc != 0 else f"the seed's fit ended {status or 'without a run'}"
                run_id = self._mark_failed(point, run_id, t0, log_file, why)
                outcomes[point.run_name] = Outcome(point, "FAILED", run_id, time.time() - t0, why)
        for point in points:
            if point.run_name in run_ids:
                outcomes[point.run_name] = self._finish(point, run_ids[point.run_name], t0, log_file)
        return [outcomes[p.run_name] for p in points]

    def _seeds_resumable(self, fit: list[Point], existing: dict[str, list[Any]]) -> bool:
        """Whether a killed seed-parallel fit of exactly these seeds can resume: its stack of these seeds left a
        complete ``last.ckpt`` and every seed's folder records a run of it that was left unfinished (RUNNING or
        KILLED). Otherwise (one seed killed of a stack whose others finished, seeds added) they fit afresh."""
        group = self.plan.group_dir(fit[0])
        record = _run_record(group) or {}
        same = (record.get("rows") == [p.run_name for p in fit] if self.plan.spec.vectorize_arms
                else record.get("seeds") == [p.seed for p in fit])
        if not same or not _complete(group / "last.ckpt"):
            return False
        # a seed's own last.ckpt is written when the stack ends: its folder has the run record only
        return all(unfinished_recorded_run(existing.get(p.run_name, []), self.plan.ckpt_dir(p)) for p in fit)

    def _run_point(self, point: Point, previous: list[Any]) -> Outcome:
        plan = self.plan
        state, run = self._state(previous)
        if state == "done":
            return Outcome(point, "SKIPPED", run_id=run.info.run_id)
        # the point is redone from the newest checkpoint of its own run when it has one
        resume = resumable_run(previous, plan.ckpt_dir(point)) if state == "todo" else None
        self._close_running(previous)
        t0 = time.time()
        log_file = plan.log_file(point)
        run_id = run.info.run_id if run is not None else None
        if state == "todo":
            rc = self.executor(plan.fit_args(point, self.parent_id) + (["--ckpt_path", "last"] if resume else []),
                               log_file)
            if rc != 0:
                run_id = self._mark_failed(point, run_id, t0, log_file, f"fit exited with code {rc}")
                return Outcome(point, "FAILED", run_id, time.time() - t0, f"fit exited with code {rc}")
            run_id = self._child_run_id(point, t0)
            if run_id is not None:
                self.client.set_tag(run_id, DONE_TAG, "fit")
        return self._finish(point, run_id, t0, log_file)

    def _state(self, previous: list[Any]) -> tuple[str, Any]:
        """``point_state`` of a point's earlier runs; a finished fit that a killed sweep did not tag is tagged."""
        state, run = point_state(previous, self.plan.spec.test)
        if run is not None and DONE_TAG not in run.data.tags:
            self.client.set_tag(run.info.run_id, DONE_TAG, "fit")
        return state, run

    def _close_running(self, previous: list[Any]) -> None:
        """A point's runs still marked RUNNING belong to a sweep that was killed: the point is redone now."""
        for old in previous:
            if old.info.status == "RUNNING":
                self.client.set_terminated(old.info.run_id, "KILLED")

    def _finish(self, point: Point, run_id: str | None, t0: float, log_file: Path) -> Outcome:
        """A fitted point's test (with ``test: true``) and its outcome."""
        if self.plan.spec.test:
            rc = self.executor(self.plan.test_args(point), log_file)
            if rc != 0:
                run_id = self._mark_failed(point, run_id, t0, log_file, f"test exited with code {rc}")
                return Outcome(point, "FAILED", run_id, time.time() - t0, f"test exited with code {rc}")
            if run_id is not None:
                self.client.set_tag(run_id, DONE_TAG, "test")
        if run_id is None:
            return Outcome(point, "FAILED", None, time.time() - t0, "the fit logged no MLflow run")
        return Outcome(point, "FINISHED", run_id, time.time() - t0, self._headline(run_id))

    def _child_run_id(self, point: Point, since: float) -> str | None:
        record = _run_record(self.plan.ckpt_dir(point))
        if record and record.get("run_id"):
            return record["run_id"]
        runs = [
            r
            for r in children(self.client, self.plan, self.parent_id).get(point.run_name, [])
            if r.info.start_time >= since * 1000 - 1000
        ]
        return runs[0].info.run_id if runs else None

    def _mark_failed(
        self, point: Point, run_id: str | None, since: float, log_file: Path, message: str
    ) -> str:
        """The point's child run ends FAILED with its log attached (created if the CLI never opened one)."""
        if run_id is None:
            runs = [
                r
                for r in children(self.client, self.plan, self.parent_id).get(point.run_name, [])
                if r.info.start_time >= since * 1000 - 1000
            ]
            run_id = runs[0].info.run_id if runs else None
        if run_id is not None:
            if self.client.get_run(run_id).info.status in ("RUNNING", "SCHEDULED", "FINISHED"):
                self.client.set_terminated(run_id, "FAILED")
        else:
            exp = self.client.get_experiment_by_name(self.plan.experiment)
            tags = {**self.plan.child_tags(point), "mlflow.parentRunId": self.parent_id}
            run_id = self.client.create_run(exp.experiment_id, run_name=point.run_name, tags=tags).info.run_id
            self.client.set_terminated(run_id, "FAILED")
        self.client.set_tag(run_id, "sweep.error", message)
        if log_file.is_file():
            self.client.log_artifact(run_id, str(log_file), artifact_path="sweep")
        return run_id

    def _headline(self, run_id: str) -> str:
        metrics = self.client.get_run(run_id).data.metrics
        keys = [k for k in metrics if k.startswith("test/")] or [k for k in metrics if k.endswith("_best")]
        return ", ".join(f"{k}={metrics[k]:.4g}" for k in sorted(keys)[:3])

    def _close_parent(self, interrupted: bool, partial: bool = False) -> None:
        """FINISHED once every point is done; KILLED if interrupted; FAILED when points failed and nothing is
        left to come. A partial run (``--point``, one SLURM array task) leaves the parent RUNNING while other
        points have not run yet or still run elsewhere: the last task closes it."""
        if self.parent_id is None:
            return
        runs = children(self.client, self.plan, self.parent_id)
        per_point = [runs.get(p.run_name, []) for p in self.plan.points]
        done = sum(point_state(r, self.plan.spec.test)[0] == "done" for r in per_point)
        self.client.log_metric(self.parent_id, "sweep/done", done)
        self.client.log_metric(self.parent_id, "sweep/todo", len(per_point) - done)
        if done == len(per_point):
            self.client.set_terminated(self.parent_id, "FINISHED")
        elif interrupted:
            self.client.set_terminated(self.parent_id, "KILLED")
        elif any(r.info.status == "RUNNING" for rs in per_point for r in rs):
            return
        elif partial and any(not rs for rs in per_point):
            return
        else:
            self.client.set_terminated(self.parent_id, "FAILED")


def _sigterm_as_interrupt() -> Callable[[], None]:
    """``scancel`` and ``kill`` send SIGTERM: stop the points as Ctrl-C would, so none is left RUNNING."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    return lambda: signal.signal(signal.SIGTERM, previous)


def point_states(plan: SweepPlan, parent: Any | None, client: Any | None) -> dict[str, str]:
    """Each point's state by run name: ``done``, ``needs_test`` or ``todo``."""
    existing = children(client, plan, parent.info.run_id) if parent is not None and client is not None else {}
    return {p.run_name: point_state(existing.get(p.run_name, []), plan.spec.test)[0] for p in plan.points}


def dry_run_table(plan: SweepPlan, parent: Any | None, client: Any | None,
                  states: dict[str, str] | None = None) -> list[str]:
    """One line per point: index, state (done / needs test / todo), run name, swept values."""
    states = states if states is not None else point_states(plan, parent, client)
    lines = [
        f"sweep {plan.spec.name}: {len(plan.points)} point(s) of {_display_path(plan.spec.base)} "
        f"in experiment '{plan.experiment}'" + (f", parent run {parent.info.run_id}" if parent else "")
    ]
    for p in plan.points:
        lines.append(f"  {p.index:4d}  {states[p.run_name]:10s}  {p.run_name}  {canonical(p.values)} seed={p.seed}")
    return lines


# ---------------------------------------------------------------------------------------------------------
# What the dry run estimates and what the sweep's last line points to.


def earlier_durations(client: Any, plan: SweepPlan) -> dict[str, list[float]]:
    """Seconds from start to end of every finished, done run of this sweep's points in MLflow (under any
    parent of a sweep of this name), by run name, newest first. A child's run spans its fit and its test."""
    names = {p.run_name for p in plan.points}
    runs = newest_runs(client, plan.experiment,
                       f"tags.`sweep.name` = '{plan.spec.name}' and attributes.status = 'FINISHED'")
    out: dict[str, list[float]] = {}
    for run in runs:
        name = run.info.run_name
        if name in names and run.data.tags.get(DONE_TAG) and run.info.end_time and run.info.start_time:
            out.setdefault(name, []).append((run.info.end_time - run.info.start_time) / 1000)
    return out


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    hours, rest = divmod(seconds, 3600)
    return (f"{hours} h " if hours else "") + f"{rest // 60} min" + (f" {rest % 60} s" if not hours else "")


def estimate_line(plan: SweepPlan, states: dict[str, str], durations: dict[str, list[float]], workers: int) -> str:
    """``estimated time: ...`` for the points not done, from the MLflow durations of earlier runs of the same
    points: a point's own newest run, else the median of all of them; a point that needs only its test is
    counted as a whole point (an upper bound). Points run ``workers`` at a time."""
    remaining = [p for p in plan.points if states.get(p.run_name) != "done"]
    if not remaining:
        return "estimated time: nothing to run, every point is done"
    known = [d[0] for d in durations.values() if d]
    if not known:
        return ("estimated time: unknown, no earlier finished run of these points in MLflow (a first run of the "
                "sweep records one)")
    import statistics

    median = statistics.median(known)
    costs = [durations[p.run_name][0] if durations.get(p.run_name) else median for p in remaining]
    own = sum(1 for p in remaining if durations.get(p.run_name))
    wall = max(sum(costs) / max(1, min(workers, len(costs))), max(costs))
    return (f"estimated time: {len(remaining)} of {len(plan.points)} point(s) to run, about {_duration(wall)} with "
            f"--workers {workers} (MLflow durations of {len(known)} earlier run(s) of these points, median "
            f"{median:.1f} s; {own} point(s) timed by their own earlier run, the others at the median)")


def ui_link(tracking_uri: str, experiment_id: str) -> str:
    """The MLflow UI's runs page of an experiment: the tracking server's own address, or ``mlflow ui``'s
    default address for a local store."""
    base = tracking_uri.rstrip("/") if tracking_uri.startswith(("http://", "https://")) else "http://127.0.0.1:5000"
    return f"{base}/#/experiments/{experiment_id}/runs?workflowType=machine_learning"


def compare_command(plan: SweepPlan) -> str:
    """``python main.py compare`` for this sweep: the test metric (or the best of the monitored one) grouped
    by every swept key that varies between the points (short form; none for a seed study)."""
    import shlex

    monitor = plan.monitor or "val/loss"
    metric = f"test/{monitor.split('/', 1)[-1]}" if plan.spec.test else f"{monitor}_best"
    keys = list(dict.fromkeys(k for p in plan.points for k in p.values))
    varying = [k for k in keys if len({canonical({"v": p.values.get(k)}) for p in plan.points}) > 1]
    by = "".join(f" --by {shlex.quote(k.replace('.init_args.', '.'))}" for k in varying)
    return (f"python main.py compare --experiment {shlex.quote(plan.experiment)} --sweep "
            f"{shlex.quote(plan.spec.name)} --metric {metric}{by}")


def last_line(plan: SweepPlan, client: Any) -> str:
    """The sweep's last line: how to compare its runs, and where the MLflow UI shows them."""
    exp = client.get_experiment_by_name(plan.experiment)
    ui = ui_link(plan.tracking_uri, exp.experiment_id if exp is not None else "0")
    served = "" if plan.tracking_uri.startswith(("http://", "https://")) else (
        f" (after: mlflow ui --backend-store-uri {plan.tracking_uri})")
    return f"compare: {compare_command(plan)} | MLflow UI: {ui}{served}"


__all__ = [
    "InProcess",
    "WorkerPool",
    "Outcome",
    "Subprocesses",
    "SweepPlan",
    "SweepRunner",
    "compare_command",
    "dry_run_table",
    "earlier_durations",
    "estimate_line",
    "last_line",
    "ensure_parent",
    "expand",
    "find_parent",
]
