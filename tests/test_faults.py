"""Faults a user hits (issue 21): damaged checkpoints, kills before the first checkpoint, killed sweeps, locked
and read-only stores, unwritable checkpoint folders, a full disk, a diverging loss.

Each test asserts what the user is owed: no run left RUNNING, no second FINISHED run of one point, nothing
lost that was reported saved, and one ``error:`` line (plus the hint to set PAPERLAB_TRACEBACK) instead of a
traceback. The slow ones (subprocesses, kill -9 at seeded random moments, a lock held for seconds) are
``@pytest.mark.slow``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import yaml

from main import cli_main
from tests.helpers import REPO, SIGKILL, client, run_main, runs_of

DIGITS = str(REPO / "configs/mlp_classifier/digits.yaml")
YINYANG = str(REPO / "configs/mlp_classifier/yinyang.yaml")
TINY = ["--trainer.max_epochs", "1", "--trainer.limit_train_batches", "3", "--trainer.limit_val_batches", "2",
        "--trainer.limit_test_batches", "2", "--trainer.num_sanity_val_steps", "0",
        "--trainer.enable_model_summary", "false"]


def _error_lines(err: str) -> list[str]:
    """The lines a failing command printed that are not Lightning's start-up chatter."""
    chatter = ("Seed set to", "GPU available", "TPU available", "HPU available", "note: ")
    return [ln for ln in err.splitlines() if ln.strip() and not ln.startswith(chatter)]


def _assert_one_error_line(err: str, *needles: str) -> str:
    lines = _error_lines(err)
    assert "Traceback" not in err, err[-3000:]
    assert len(lines) <= 2 and lines[0].startswith("error: "), lines  # the error and the PAPERLAB_TRACEBACK hint
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def _statuses(experiment: str = "mlp_classifier") -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for run in runs_of(experiment):
        out.setdefault(run.info.run_name, []).append(run.info.status)
    return out


# --- checkpoints: atomic in their own folder, checked before they are loaded ---------------------------------


def test_a_checkpoint_is_written_beside_its_target_fsynced_then_renamed(tmp_path: Path, monkeypatch) -> None:
    from callbacks.checkpoints import AtomicCheckpointIO

    calls: list[tuple[str, object]] = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append(("fsync", fd)), real_fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda a, b: (calls.append(("replace", (Path(a), Path(b)))), real_replace(a, b))[1])
    target = tmp_path / "run" / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint({"step": 1}, target)
    assert [c[0] for c in calls] == ["fsync", "replace"]  # the data is on disk before the name points at it
    src, dst = calls[1][1]
    assert dst == target and src.parent == target.parent  # a rename within the folder: atomic, never a copy
    assert torch.load(target, weights_only=False) == {"step": 1}


def test_a_full_disk_keeps_the_previous_checkpoint_leaves_no_partial_file_and_says_so_in_one_line(
    tmp_path: Path, monkeypatch
) -> None:
    from callbacks.checkpoints import AtomicCheckpointIO, CheckpointWriteError

    io = AtomicCheckpointIO()
    target = tmp_path / "best-epoch001.ckpt"
    io.save_checkpoint({"step": 1, "w": torch.ones(1000)}, target)

    def full(fd: int) -> None:  # the data went to the page cache; the disk refuses it at fsync
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(CheckpointWriteError) as err:
        io.save_checkpoint({"step": 2, "w": torch.zeros(100_000)}, target)
    message = str(err.value)
    assert "\n" not in message and str(target) in message and "No space left on device" in message
    assert "intact" in message and "--run.checkpoint_root" in message
    assert sorted(p.name for p in tmp_path.iterdir()) == [target.name]  # no temporary file left
    assert torch.load(target, weights_only=False)["step"] == 1


def test_a_full_disk_during_a_fit_fails_the_run_in_one_line_and_every_file_left_is_complete(
    paperlab_tmp: Path, monkeypatch, capsys
) -> None:
    from tracking.run_registry import check_checkpoint

    real = os.fsync
    count = {"n": 0}

    def fills_up(fd: int) -> None:
        count["n"] += 1
        if count["n"] > 1:  # the first checkpoint is written, every later one meets a full disk
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(fd)

    monkeypatch.setattr(os, "fsync", fills_up)
    assert cli_main(["fit", "--config", DIGITS, *TINY, "--trainer.max_epochs", "3", "--run.name", "full",
                     "--run.checkpoint_interval_s", "0"]) == 1
    _assert_one_error_line(capsys.readouterr().err, "No space left on device")
    folder = paperlab_tmp / "checkpoints/mlp_classifier/full"
    assert not list(folder.glob(".*.tmp"))
    for ckpt in folder.glob("*.ckpt"):
        check_checkpoint(ckpt, "x")  # complete: raises for a partial file
    assert _statuses() == {"full": ["FAILED"]}


def test_a_damaged_last_ckpt_is_one_line_leaves_the_finished_run_alone_and_best_still_tests(
    paperlab_tmp: Path, capsys
) -> None:
    args = ["--config", DIGITS, *TINY, "--run.name", "r"]
    assert cli_main(["fit", *args]) == 0
    last = paperlab_tmp / "checkpoints/mlp_classifier/r/last.ckpt"
    data = last.read_bytes()
    for damaged in (data[: len(data) // 2], random.Random(0).randbytes(len(data))):  # truncated, overwritten
        last.write_bytes(damaged)
        capsys.readouterr()
        assert cli_main(["fit", *args, "--ckpt_path", "last"]) == 1
        line = _assert_one_error_line(capsys.readouterr().err, str(last.relative_to(paperlab_tmp)), "damaged")
        assert "best-epoch" in line and "fresh fit" in line  # what to do instead
        (run,) = runs_of("mlp_classifier")
        assert run.info.status == "FINISHED"  # the failed resume did not touch the run

    assert cli_main(["test", *args, "--ckpt_path", "best"]) == 0  # best is found without reading last.ckpt
    (run,) = runs_of("mlp_classifier")
    assert run.info.status == "FINISHED" and "test/acc" in run.data.metrics


# --- a run killed before its first checkpoint ---------------------------------------------------------------


def _dead_process_tag() -> str:
    """The ``paperlab.process`` tag of a process that has ended (a kill -9 leaves its run so)."""
    from tracking.run_registry import _start_ticks

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    ticks = _start_ticks(proc.pid) or ""
    proc.wait()
    return f"{socket.gethostname()}:{proc.pid}:{ticks or '0'}"


def test_a_run_killed_before_its_first_checkpoint_is_marked_killed_and_the_resume_says_why(
    paperlab_tmp: Path, capsys
) -> None:
    from tracking.run_registry import PROCESS_TAG, this_process
    from tracking.uri import prepare_store

    uri = os.environ["MLFLOW_TRACKING_URI"]
    prepare_store(uri, "mlp_classifier")
    exp = client().get_experiment_by_name("mlp_classifier").experiment_id
    dead = client().create_run(exp, run_name="r", tags={PROCESS_TAG: _dead_process_tag()}).info.run_id
    alive = client().create_run(exp, run_name="other", tags={PROCESS_TAG: this_process()}).info.run_id

    assert cli_main(["fit", "--config", DIGITS, *TINY, "--run.name", "r", "--ckpt_path", "last"]) == 1
    err = capsys.readouterr().err
    _assert_one_error_line(err, "never wrote a checkpoint", dead, "without --ckpt_path")
    assert "marked KILLED" in err
    assert client().get_run(dead).info.status == "KILLED"
    assert client().get_run(alive).info.status == "RUNNING"  # a live process's run is left alone


@pytest.mark.slow
def test_kill_9_before_the_first_checkpoint_then_the_next_command_closes_the_run(paperlab_tmp: Path) -> None:
    killer = paperlab_tmp / "killer.yaml"
    killer.write_text(yaml.safe_dump({"trainer": {"callbacks": [
        {"class_path": "tests.helpers.SignalAtStep", "init_args": {"step": 2, "signum": int(SIGKILL)}}]}}))
    args = ["--config", DIGITS, "--trainer.max_epochs", "2", "--trainer.num_sanity_val_steps", "0", "--run.name", "early"]
    proc = run_main(["fit", *args, "--config", str(killer)], cwd=paperlab_tmp)
    assert proc.returncode == -int(SIGKILL), proc.stderr[-2000:]
    assert _statuses() == {"early": ["RUNNING"]}

    proc = run_main(["fit", *args, "--ckpt_path", "last"], cwd=paperlab_tmp)
    assert proc.returncode == 1
    _assert_one_error_line(proc.stderr, "never wrote a checkpoint")
    assert _statuses() == {"early": ["KILLED"]}


# --- divergence -------------------------------------------------------------------------------------------


def test_a_diverging_loss_fails_the_run_in_one_line_naming_the_step(paperlab_tmp: Path, capsys) -> None:
    assert cli_main(["fit", "--config", DIGITS, *TINY, "--trainer.limit_train_batches", "12",
                     "--model.optimizer.lr", "1e6", "--run.name", "lr"]) == 1
    line = _assert_one_error_line(capsys.readouterr().err, "diverged at step", "bound")
    assert "no checkpoint had been written" in line and "last good checkpoint" not in line
    assert _statuses() == {"lr": ["FAILED"]}


def test_the_guard_checks_every_n_steps_and_names_the_last_checkpoint_only_when_it_exists(tmp_path: Path) -> None:
    import lightning as L

    from callbacks.checkpoints import LastCheckpoint
    from callbacks.guards import DivergedLossError, FiniteLossGuard, NonFiniteLossError

    class Losses(L.LightningModule):
        """Step s's loss is ``values[s]``; epochs of ``per_epoch`` steps."""

        def __init__(self, values: list[float], per_epoch: int) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(()))
            self.values, self.per_epoch = values, per_epoch

        def training_step(self, batch, i):  # noqa: ANN001, ANN201
            return self.w * self.values[self.global_step]

        def train_dataloader(self):  # noqa: ANN201
            return torch.utils.data.DataLoader(torch.zeros(self.per_epoch, 1), batch_size=1)

        def configure_optimizers(self):  # noqa: ANN201
            return torch.optim.SGD(self.parameters(), lr=0.0)

    def fit(values: list[float], guard: FiniteLossGuard, *callbacks, per_epoch: int = 0) -> None:  # noqa: ANN002
        per_epoch = per_epoch or len(values)
        L.Trainer(max_epochs=len(values) // per_epoch, logger=False, enable_checkpointing=bool(callbacks),
                  enable_progress_bar=False, enable_model_summary=False,
                  callbacks=[guard, *callbacks]).fit(Losses(values, per_epoch))

    fit([2.0] * 5 + [2e4 - 1] * 5, FiniteLossGuard(check_every_n_steps=5))  # under 1e4 x the first: trains on
    with pytest.raises(DivergedLossError, match=r"at step 7 .*no checkpoint had been written"):
        fit([2.0] * 7 + [2e4 + 1] * 3, FiniteLossGuard(check_every_n_steps=5))
    with pytest.raises(DivergedLossError, match="at step 1 "):
        fit([0.5, 1e5], FiniteLossGuard(check_every_n_steps=5, max_loss=10.0))
    fit([0.01, 9e3], FiniteLossGuard())  # a loss that starts near zero is held to 1e4, not to 100
    with pytest.raises(NonFiniteLossError, match="no checkpoint had been written yet"):
        fit([1.0] * 3 + [float("nan")], FiniteLossGuard(check_every_n_steps=2), per_epoch=4)
    last = LastCheckpoint(str(tmp_path), min_interval_s=0.0)
    with pytest.raises(NonFiniteLossError, match=f"at step 5 .*the last checkpoint before it, {tmp_path}/last.ckpt"):
        fit([1.0] * 5 + [float("nan")] * 3, FiniteLossGuard(check_every_n_steps=2), last, per_epoch=4)
    assert torch.load(tmp_path / "last.ckpt", weights_only=False)["global_step"] == 4  # from before the NaN
    assert FiniteLossGuard(divergence_factor=None)  # only NaN/inf then


# --- the store ---------------------------------------------------------------------------------------------


def test_a_locked_store_is_retried_then_given_up_in_one_line(monkeypatch) -> None:
    import tracking.uri as uri

    tries = {"n": 0}

    def locked_twice() -> str:
        tries["n"] += 1
        if tries["n"] <= 2:
            raise RuntimeError("(sqlite3.OperationalError) database is locked")
        return "written"

    assert uri.retry_locked(locked_twice) == "written" and tries["n"] == 3

    def always_locked() -> None:
        raise RuntimeError("(sqlite3.OperationalError) database is locked")

    monkeypatch.setattr(uri, "STORE_LOCK_WAIT_S", 0.5)
    t0 = time.monotonic()
    with pytest.raises(uri.StoreUnavailable, match="still locked by another process after 0 s") as err:
        uri.retry_locked(always_locked)
    assert time.monotonic() - t0 < 2 and "\n" not in str(err.value)
    with pytest.raises(ValueError):  # anything but a lock is not retried
        uri.retry_locked(lambda: (_ for _ in ()).throw(ValueError("other")))


def test_mlflow_lock_tracebacks_become_one_warning_line() -> None:
    import logging

    from tracking.uri import quiet_lock_errors

    quiet_lock_errors()
    logger = logging.getLogger("mlflow.store.db.utils")
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger.addHandler(handler)
    try:
        for _ in range(3):
            try:
                raise RuntimeError("database is locked")
            except RuntimeError as e:
                logger.exception("SQLAlchemy database error. The following exception is caught.\n%s", e)
        logger.error("something else")
    finally:
        logger.removeHandler(handler)
    locked = [r for r in records if "locked" in r.getMessage()]
    assert len(locked) <= 1 and all(r.exc_info is None and r.levelname == "WARNING" for r in locked)
    assert [r.getMessage() for r in records][-1] == "something else"


def test_a_checkpoint_folder_in_the_way_is_one_line_before_any_run_exists(paperlab_tmp: Path, capsys) -> None:
    (paperlab_tmp / "blocked").write_text("a file, not a folder")
    assert cli_main(["fit", "--config", DIGITS, *TINY, "--run.checkpoint_root", "blocked"]) == 1
    _assert_one_error_line(capsys.readouterr().err, "is a file, not a folder", "--run.checkpoint_root")
    assert runs_of("mlp_classifier") == []  # no empty FAILED run


def _read_only(folder: Path, fill) -> bool:  # noqa: ANN001
    """``fill()`` then make ``folder`` read-only: ``chmod`` for a user; for root, who writes through
    permissions, a tmpfs mounted there and remounted read-only (True: unmount it after)."""
    if os.geteuid() != 0:
        fill()
        for p in [folder, *folder.rglob("*")]:
            os.chmod(p, 0o555 if p.is_dir() else 0o444)
        return False
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(folder)], capture_output=True).returncode:
        pytest.skip("root, and no tmpfs to mount read-only: root writes through permissions")
    fill()
    subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True)
    return True


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "geteuid"), reason="POSIX permissions")
@pytest.mark.parametrize("what", ["store", "checkpoint folder"])
def test_a_read_only_store_or_checkpoint_folder_is_one_line_before_any_run_exists(
    what: str, paperlab_tmp: Path, _migrated_mlflow_db: Path
) -> None:
    ro = paperlab_tmp / "ro"
    ro.mkdir()
    db = ro / "mlflow.db" if what == "store" else paperlab_tmp / "mlflow.db"
    ckpts = ro / "ckpts" if what == "checkpoint folder" else paperlab_tmp / "ckpts"
    mounted = _read_only(ro, lambda: db.write_bytes(_migrated_mlflow_db.read_bytes()) if what == "store" else ckpts.mkdir())
    try:
        proc = run_main(["fit", "--config", DIGITS, *TINY, "--run.checkpoint_root", str(ckpts)], cwd=paperlab_tmp,
                        env={"MLFLOW_TRACKING_URI": f"sqlite:///{db}"})
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as con:  # closed: unmountable
            runs = con.execute("select count(*) from runs").fetchone()[0]
    finally:
        if mounted:
            subprocess.run(["umount", str(ro)], check=True)
    assert proc.returncode != 0
    _assert_one_error_line(proc.stderr, "read-only" if what == "store" else "cannot write checkpoints into")
    assert runs == 0  # no empty FAILED run


@pytest.mark.slow
def test_a_store_locked_at_start_up_is_waited_for_without_tracebacks(paperlab_tmp: Path) -> None:
    db = paperlab_tmp / "mlflow.db"
    held = threading.Event()

    def hold(seconds: float) -> None:
        con = sqlite3.connect(db, isolation_level=None)
        con.execute("BEGIN EXCLUSIVE")
        held.set()
        time.sleep(seconds)
        con.execute("ROLLBACK")
        con.close()

    locker = threading.Thread(target=hold, args=(25.0,))  # past sqlite's 5 s and MLflow's 20 s busy timeouts
    locker.start()
    held.wait()
    try:
        proc = run_main(["fit", "--config", DIGITS, *TINY, "--run.name", "locked"], cwd=paperlab_tmp)
    finally:
        locker.join()
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert sum("locked" in ln for ln in proc.stderr.splitlines()) <= 1
    assert _statuses() == {"locked": ["FINISHED"]}


# --- kill -9 at random moments of a fit ----------------------------------------------------------------------


@pytest.mark.slow
def test_kill_9_at_seeded_random_moments_loses_no_saved_epoch_and_leaves_nothing_running(paperlab_tmp: Path) -> None:
    """Kill -9 a fit at random moments (seeded), resume with ``--ckpt_path last`` (or start again when it
    never checkpointed), until it finishes: one FINISHED run, every val/acc step of an uninterrupted run
    once, no run RUNNING."""
    args = ["--config", YINYANG, "--trainer.max_epochs", "6", "--trainer.num_sanity_val_steps", "0",
            "--data.init_args.train_size", "600", "--data.init_args.val_size", "200", "--run.checkpoint_interval_s", "0"]
    rng = random.Random(21)
    env = {**os.environ, "CI": "1", "PYTHONPATH": str(REPO)}
    for _ in range(3):
        delay = rng.uniform(4, 14)
        proc = subprocess.Popen([sys.executable, str(REPO / "main.py"), "fit", *args, "--run.name", "k",
                                 *(["--ckpt_path", "last"] if (paperlab_tmp / "checkpoints/mlp_classifier/k/last.ckpt")
                                   .is_file() else [])], cwd=paperlab_tmp, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        try:
            proc.wait(timeout=delay)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
    last = paperlab_tmp / "checkpoints/mlp_classifier/k/last.ckpt"
    proc = run_main(["fit", *args, "--run.name", "k", *(["--ckpt_path", "last"] if last.is_file() else [])],
                    cwd=paperlab_tmp)
    assert proc.returncode == 0, proc.stderr[-3000:]
    statuses = _statuses()
    assert statuses["k"].count("FINISHED") == 1 and "RUNNING" not in statuses["k"], statuses
    (run,) = [r for r in runs_of("mlp_classifier") if r.info.status == "FINISHED"]
    steps = [m.step for m in client().get_metric_history(run.info.run_id, "val/acc")]
    assert sorted(steps) == [19 * e - 1 for e in range(1, 7)], steps


# --- sweeps ------------------------------------------------------------------------------------------------


def _point_runs(name: str) -> list:
    return [r for r in runs_of("mlp_classifier") if r.info.run_name == name]


def test_a_rerun_adopts_an_untagged_finished_point_resumes_a_killed_one_and_compare_collapses_reruns(
    paperlab_tmp: Path, capsys
) -> None:
    from mlflow.entities import Metric

    from sweeps.compare import compare
    from tests.sweeps.common import write_sweep

    sweep = write_sweep(paperlab_tmp, grid={"model.net.activation": ["relu", "tanh"]}, seeds=[0],
                        overrides={"trainer.max_epochs": 2})
    assert cli_main(["sweep", "--config", str(sweep), "--in-process"]) == 0
    adopted, resumed = "tiny-activation=relu-s0", "tiny-activation=tanh-s0"
    (a,) = _point_runs(adopted)
    (b,) = _point_runs(resumed)
    # the runner killed after the fit ended and before it tagged the point; and a point killed mid-fit (its run
    # left RUNNING, its last.ckpt from before the kill)
    client().delete_tag(a.info.run_id, "sweep.done")
    client().update_run(b.info.run_id, status="RUNNING")
    client().delete_tag(b.info.run_id, "sweep.done")
    parent = a.data.tags["mlflow.parentRunId"]
    client().update_run(parent, status="RUNNING")  # the killed runner never closed its parent run
    ckpt = paperlab_tmp / "checkpoints/mlp_classifier" / adopted / "last.ckpt"
    stamp = ckpt.stat().st_mtime_ns
    capsys.readouterr()

    assert cli_main(["sweep", "--config", str(sweep), "--in-process"]) == 0
    assert [r.info.run_id for r in _point_runs(adopted)] == [a.info.run_id]  # not trained a second time
    assert ckpt.stat().st_mtime_ns == stamp
    assert _point_runs(adopted)[0].data.tags["sweep.done"] == "fit"
    (again,) = _point_runs(resumed)  # resumed into its own run, not a new one
    assert again.info.run_id == b.info.run_id and again.info.status == "FINISHED"
    log = (paperlab_tmp / "checkpoints/mlp_classifier/_sweeps/tiny" / f"{resumed}.log").read_text()
    assert "--ckpt_path last" in log
    assert client().get_run(parent).info.status == "FINISHED"

    # a second FINISHED run of one point (an older sweep's rerun): compare without --sweep counts the point once
    exp = client().get_experiment_by_name("mlp_classifier").experiment_id
    dup = client().create_run(exp, run_name=adopted, tags=dict(a.data.tags)).info.run_id
    client().log_batch(dup, metrics=[Metric("val/loss", 9.0, 0, 0)])
    client().set_terminated(dup, "FINISHED")
    for sweep_name in ("tiny", None):
        result = compare(client(), "mlp_classifier", "val/loss", sweep=sweep_name)
        assert sum(g.n for g in result.groups) == 2
        assert result.excluded.get("an older run of the same sweep point") == 1


@pytest.mark.slow
def test_a_sweep_killed_at_seeded_random_moments_ends_with_one_finished_run_per_point(paperlab_tmp: Path) -> None:
    from tests.sweeps.common import write_sweep

    sweep = write_sweep(paperlab_tmp, grid={"model.net.activation": ["relu", "tanh", "gelu"]}, seeds=[0],
                        overrides={"trainer.max_epochs": 4, "trainer.limit_train_batches": 20,
                                   "data.init_args.train_size": 1000})
    env = {**os.environ, "PYTHONPATH": str(REPO), "CI": "1"}
    rng = random.Random(3)
    for _ in range(3):
        proc = subprocess.Popen([sys.executable, str(REPO / "main.py"), "sweep", "--config", str(sweep),
                                 "--workers", "2"], cwd=paperlab_tmp, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            proc.wait(timeout=rng.uniform(8, 25))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the runner and its workers, as a crash would
            proc.wait()
    assert cli_main(["sweep", "--config", str(sweep), "--workers", "2"]) == 0
    per_point: dict[str, list[str]] = {}
    for run in runs_of("mlp_classifier"):
        if run.data.tags.get("sweep.role") != "parent":
            per_point.setdefault(run.info.run_name, []).append(run.info.status)
    assert len(per_point) == 3 and all(s.count("FINISHED") == 1 and "RUNNING" not in s for s in per_point.values()), \
        per_point
