"""Tie checkpoints to their MLflow run: one directory per (experiment, run name), the run id beside them.

``checkpoints/<experiment>/<run name>/`` holds ``last.ckpt``, the best checkpoint and ``mlflow_run.json``.
``--ckpt_path last`` / ``best`` / a file there finds the run id in that file, so a resume, a ``validate`` or a
``test`` logs into the run that produced the checkpoint instead of opening a new one.

Run identity: a fresh fit of a run name that is taken (a folder with files, or an MLflow run of that name in
the experiment) is the next *instance* of that name, ``yinyang #2``, ``yinyang #3``, ... (MLflow run name and
folder ``yinyang_#2``); the earlier instances' files stay where they are. ``--ckpt_path last|best`` without
``--run.name`` means the newest instance that has a ``last.ckpt``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import time
import zipfile
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback

from errors import PaperlabError
from tracking.figures import mlflow_logger
from tracking.mlflow_logger import PaperlabMLFlowLogger
from tracking.names import INSTANCE, RUN_FILE, folder_name, instance_name
from tracking.uri import prepare_store, retry_locked

LAST = "last.ckpt"


def _has_files(directory: Path) -> bool:
    return directory.is_dir() and any(p.is_file() for p in directory.iterdir())


def taken_instances(base: str, experiment_dir: Path, mlflow_names: Iterable[str] = ()) -> dict[int, Path | None]:
    """The instances of ``base`` already taken, ``{n: its folder if it has files there, else None}``: a folder
    with files under ``experiment_dir``, or a run of that name in the MLflow experiment (``mlflow_names``)."""
    taken: dict[int, Path | None] = {}
    for name in mlflow_names:
        match = INSTANCE.match(name)
        if name == base:
            taken[1] = None
        elif match and match["base"] == base:
            taken[int(match["n"])] = None
    experiment_dir = Path(experiment_dir)
    if experiment_dir.is_dir():
        stem = folder_name(base)
        for path in experiment_dir.iterdir():
            if path.name == stem:
                n = 1
            else:
                match = re.fullmatch(r".*_#([0-9]+)", path.name)
                if not match or folder_name(instance_name(base, int(match[1]))) != path.name:
                    continue
                n = int(match[1])
            if _has_files(path):
                taken[n] = path
    return taken


def next_instance(base: str, experiment_dir: Path, mlflow_names: Iterable[str] = ()) -> int:
    """The number a fresh fit of ``base`` gets: 1 when the name is free, else one past the highest taken."""
    taken = taken_instances(base, experiment_dir, mlflow_names)
    return max(taken) + 1 if taken else 1


def latest_instance(base: str, experiment_dir: Path) -> int:
    """The instance ``--ckpt_path last|best`` means without ``--run.name``: the newest with a ``last.ckpt``
    (1 when none has one: the error then names the plain name's folder)."""
    with_last = [n for n, path in taken_instances(base, experiment_dir).items()
                 if path is not None and (path / "last.ckpt").is_file()]
    return max(with_last, default=1)


def mlflow_runs_named(tracking_uri: str, experiment: str, base: str, names: Iterable[str] | None = None) -> list[Any]:
    """The experiment's runs (deleted ones too: they can be restored) that are ``base`` or an instance of it,
    newest first; with ``names`` (each starting with ``base``), the runs of those names instead."""
    import mlflow
    from mlflow.entities import ViewType

    prepare_store(tracking_uri, experiment)
    client = mlflow.MlflowClient(tracking_uri)
    found = retry_locked(client.get_experiment_by_name, experiment)
    if found is None:
        return []
    # LIKE on the name up to its first quote (a quote would end the filter's string): a superset, cut below
    prefix = re.split(r"['\"\\]", base, maxsplit=1)[0]
    runs: list[Any] = []
    token = None
    while True:
        page = retry_locked(client.search_runs, [found.experiment_id],
                            filter_string=f"attributes.run_name LIKE '{prefix}%'", run_view_type=ViewType.ALL,
                            order_by=["attributes.start_time DESC"], max_results=1000, page_token=token)
        runs += list(page)
        token = page.token
        if not token:
            break
    if names is not None:
        wanted = set(names)
        return [r for r in runs if r.info.run_name in wanted]
    return [r for r in runs if (n := r.info.run_name) == base
            or ((m := INSTANCE.match(n or "")) is not None and m["base"] == base)]


def mlflow_run_names(tracking_uri: str, experiment: str, base: str) -> list[str]:
    """Names of the experiment's runs (deleted ones too) that are ``base`` or an instance of it."""
    return [r.info.run_name for r in mlflow_runs_named(tracking_uri, experiment, base)]


# The process that runs a fit, as a run tag: ``<host>:<pid>:<start time>``. A process killed with -9 (or the
# OOM killer, a power cut) cannot end its run, which MLflow then shows RUNNING forever; the next command on
# the run's name looks the process up and, when it is gone, marks the run KILLED. The start time (clock
# ticks since boot, /proc/<pid>/stat) tells a reused pid from the process that opened the run.
PROCESS_TAG = "paperlab.process"


def _start_ticks(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rpartition(")")[2].split()[19]  # field 22, counted after the command name


def this_process() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{_start_ticks(os.getpid()) or ''}"


def process_gone(ident: str) -> bool:
    """Whether the process ``this_process()`` described has ended; False when it cannot be told (another
    host, or no tag): such a run is left as it is."""
    host, _, rest = ident.partition(":")
    pid_text, _, ticks = rest.partition(":")
    if host != socket.gethostname() or not pid_text.isdigit():
        return False
    pid = int(pid_text)
    if ticks:
        return _start_ticks(pid) != ticks
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False


def close_orphaned_runs(tracking_uri: str, runs: Iterable[Any]) -> list[Any]:
    """Mark KILLED every run of ``runs`` that is RUNNING although the process that opened it has ended (see
    ``PROCESS_TAG``); return them. A run of a live process or of another host is not touched."""
    import mlflow

    closed = [r for r in runs if r.info.status == "RUNNING" and process_gone(r.data.tags.get(PROCESS_TAG, ""))]
    client = mlflow.MlflowClient(tracking_uri)
    for run in closed:
        retry_locked(client.set_tag, run.info.run_id, "paperlab.ended", "its process ended without closing the run")
        retry_locked(client.set_terminated, run.info.run_id, "KILLED")
    return closed


class CheckpointNotFound(PaperlabError, FileNotFoundError):
    """``--ckpt_path`` names a checkpoint that does not exist."""


def read_run_record(directory: Path) -> dict[str, Any] | None:
    path = Path(directory) / RUN_FILE
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def run_id_for_checkpoint(ckpt: Path, tracking_uri: str) -> str | None:
    """The MLflow run that wrote ``ckpt``, if it was logged to the same tracking URI."""
    record = read_run_record(Path(ckpt).parent)
    if record and record.get("tracking_uri") == tracking_uri:
        return record.get("run_id")
    return None


class CorruptCheckpoint(PaperlabError):
    """``--ckpt_path`` names a file that is not a complete checkpoint (truncated, overwritten, not one)."""


def check_checkpoint(path: Path, option: str) -> None:
    """Raise ``CorruptCheckpoint`` (one line: the file, what is wrong, what to do) unless ``path`` is a
    complete ``torch.save`` archive whose every member reads back with its CRC.

    Checked before a command opens its run, so a bad file ends nothing (a finished run stays FINISHED).
    ``torch.load`` would fail too, but deep inside Lightning, after the run was taken over, with a traceback
    whose advice (``weights_only=False``) is wrong for a damaged file. A zip read is cheap next to the load.
    """
    path = Path(path)
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
            names = archive.namelist()
        problem = (f"member {bad} fails its CRC check" if bad is not None
                   else None if any(n.endswith("/data.pkl") for n in names) else "it holds no pickled state")
    except zipfile.BadZipFile as err:
        problem = f"not a complete checkpoint archive: {err}" if path.stat().st_size else "the file is empty"
    except (OSError, EOFError, zlib.error, ValueError) as err:
        problem = f"it cannot be read: {err}"
    if problem is None:
        return
    directory = path.parent
    others = [str(p) for p in sorted(directory.glob("best-*.ckpt")) if p != path]
    others += [str(p) for p in sorted(directory.with_name(directory.name + ".archive").glob("*/*.ckpt"))[-2:]]
    instead = f"--ckpt_path {others[0]}" if others else "--ckpt_path with an archived or best checkpoint"
    raise CorruptCheckpoint(
        f"checkpoint {path} (--ckpt_path {option}) is damaged ({problem}); use {instead}, or start a fresh fit "
        "without --ckpt_path (the run and its other files are unchanged)"
    )


def best_checkpoint(directory: Path) -> Path | None:
    """The run's best checkpoint, ``best-epoch<NNN>.ckpt``, found by name: ``BestCheckpoint`` keeps one (a kill
    between writing a new best and removing the old one leaves two, and the newer epoch is the better one).
    Found without loading ``last.ckpt``, so a damaged ``last.ckpt`` does not stop ``test --ckpt_path best``."""
    found = sorted(Path(directory).glob("best-epoch*.ckpt"), key=lambda p: (len(p.stem), p.stem))
    return found[-1] if found else None


def resolve_checkpoint(ckpt_path: str | None, directory: Path, never_checkpointed: str | None = None) -> str | None:
    """``last`` and ``best`` -> files in ``directory``; a path -> itself; clear errors when missing or damaged.

    ``never_checkpointed``: the run of this name that was started but wrote no checkpoint before it ended
    (``orphaned_runs``), for the error to say so instead of doubting the name."""
    if ckpt_path is None:
        return None
    directory = Path(directory)
    if ckpt_path in ("last", "best"):
        found = directory / LAST if ckpt_path == "last" else best_checkpoint(directory)
        if found is None or not found.is_file():
            if never_checkpointed:
                raise CheckpointNotFound(
                    f"nothing to resume (--ckpt_path {ckpt_path}): the run {never_checkpointed} never wrote a checkpoint "
                    f"(it ended before its first epoch did): start it again without --ckpt_path"
                )
            if ckpt_path == "best" and (directory / LAST).is_file():
                raise CheckpointNotFound(f"no best-epoch*.ckpt in {directory}/ (--ckpt_path best); it holds last.ckpt: "
                                         "--ckpt_path last")
            runs = sorted(p.parent.name for p in directory.parent.glob("*/last.ckpt"))
            known = f"; runs with checkpoints: {', '.join(runs[:8])}" if runs else ""
            raise CheckpointNotFound(
                f"no checkpoint in {directory}/ (--ckpt_path {ckpt_path}). The run name is the config's stem plus the "
                "command-line overrides: pass the same overrides as the fit, or --run.name NAME" + known
            )
        check_checkpoint(found, ckpt_path)
        return str(found)
    if not Path(ckpt_path).is_file():
        raise CheckpointNotFound(f"no such checkpoint file: --ckpt_path {ckpt_path}")
    check_checkpoint(Path(ckpt_path), ckpt_path)
    return ckpt_path


class CheckpointFolderUnwritable(PaperlabError, OSError):
    """The run's checkpoint folder cannot be created or written."""


def check_checkpoint_folder(directory: Path) -> None:
    """Create ``directory`` and write and remove a probe file in it, before the run exists: a read-only folder or
    a file in the way is one line here, instead of a traceback at the first checkpoint and an empty FAILED run."""
    directory = Path(directory)
    probe = directory / f".paperlab-probe-{os.getpid()}"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        blocker = next((p for p in [directory, *directory.parents] if p.exists() and not p.is_dir()), None)
        why = f"{blocker} is a file, not a folder" if blocker else (err.strerror or str(err)).lower()
        raise CheckpointFolderUnwritable(
            f"cannot write checkpoints into {directory}/ ({why}): choose a writable folder with "
            "--run.checkpoint_root DIR"
        ) from err


def archive_previous(directory: Path) -> Path | None:
    """Move everything an earlier run wrote (checkpoints, its run file, predictions) out of the way before a
    fresh fit writes into ``directory``: a fit that names its run exactly (``--run.name``, as sweeps do) and
    reuses the name. The CLI's summary says where they went.

    They go to ``<directory>.archive/<old run id>/``, beside the run's folder rather than inside it, so the
    fresh run starts from an empty folder.
    """
    directory = Path(directory)
    old = sorted(p for p in directory.iterdir() if p.is_file()) if directory.is_dir() else []
    if not old:
        return None
    record = read_run_record(directory) or {}
    dest = directory.with_name(directory.name + ".archive") / (record.get("run_id") or time.strftime("%Y%m%d-%H%M%S"))
    dest.mkdir(parents=True, exist_ok=True)
    for p in old:
        shutil.move(str(p), dest / p.name)
    return dest


def write_run_record(directory: Path, logger: PaperlabMLFlowLogger, **extra: Any) -> None:
    """``directory/mlflow_run.json``: the run id, experiment and tracking URI of ``logger``'s run, and
    ``extra`` (a seed-parallel fit's folder: its ``seeds``)."""
    directory.mkdir(parents=True, exist_ok=True)
    record = {
        "run_id": logger.run_id,
        "experiment_name": logger.experiment_name,
        "experiment_id": logger.experiment_id,
        "tracking_uri": logger.tracking_uri,
        **extra,
    }
    (directory / RUN_FILE).write_text(json.dumps(record, indent=2) + "\n")


class RunRegistry(Callback):
    """Writes ``mlflow_run.json`` (run id, experiment, tracking URI) into the checkpoint directory.

    Written at fit start, after ``ModelCheckpoint.setup`` has looked at the folder, so a fresh run does not
    warn about a non-empty checkpoint directory.
    """

    def __init__(self, dirpath: str) -> None:
        self.dirpath = dirpath

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        logger = mlflow_logger(trainer)
        if not isinstance(logger, PaperlabMLFlowLogger) or not trainer.is_global_zero:
            return
        write_run_record(Path(self.dirpath), logger)
        if logger.run_id is not None and trainer.ckpt_path is not None:  # a resume: this process owns the run now
            logger.set_tags({PROCESS_TAG: this_process()})
