"""The fault campaign of issue 21, rerun after the fixes: what a user's faults do to runs, checkpoints and output.

Every scenario runs ``python main.py ...`` in subprocesses in a scratch folder with its own sqlite store
(``--workdir``, default a fresh temporary folder), the way a user would, and reports per scenario: trials,
failures (a trial whose end state is wrong: a run left RUNNING, two FINISHED runs of one name or sweep point,
a history that differs from an uninterrupted run's, a partial checkpoint, an empty FAILED run, a traceback),
epochs lost to kills, and the error output in lines (Lightning's start-up info lines not counted).

Scenarios (``--only`` picks some):

  kill        kill -9 a 20-epoch yinyang fit at seeded random moments (``--kills`` trials), then the same
              command with ``--ckpt_path last`` (or, when nothing was checkpointed, that command's message and a
              fresh fit) until it finishes; its val/acc history against an uninterrupted run's (1e-6)
  early       kill -9 at step 2 (before any checkpoint), then ``--ckpt_path last``, then a fresh fit
  corrupt     ``last.ckpt`` of a finished run truncated to half / overwritten with random bytes, then
              ``fit --ckpt_path last`` and ``test --ckpt_path best``
  sweep       a 2 x 2 activation sweep (yinyang, 20 epochs, test step) killed (the runner and its workers, kill -9)
              at seeded random moments three times, then run to its end; duplicates, resumed points, compare
  lock        the store locked (BEGIN EXCLUSIVE) for 25 s at start-up, for 90 s at start-up, and for 25 s in
              the middle of training
  readonly    a read-only store and a read-only checkpoint folder (the command runs as ``nobody`` when this
              is root), a file where the checkpoint folder should be
  full        a full disk: the checkpoint root on a tmpfs with about 100 KB free (root only; skipped otherwise)
  diverge     ``--model.optimizer.lr 1e6``

    python bench/faults_campaign.py --kills 8          # all scenarios, about 15 min on 2 quiet cores
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback

REPO = Path(__file__).resolve().parent.parent
YINYANG = str(REPO / "configs/mlp_classifier/yinyang.yaml")
FIT = ["--config", YINYANG, "--trainer.max_epochs", "20", "--trainer.num_sanity_val_steps", "0"]
CHATTER = ("Seed set to", "GPU available", "TPU available", "HPU available", "💡 Tip")


class EpochProbe(Callback):
    """Appends ``start <epoch>`` at the start of training and ``end <epoch>`` at every epoch end to ``path``: what
    a killed fit had trained, against what its resume starts from."""

    def __init__(self, path: str) -> None:
        self.path = path

    def _say(self, text: str) -> None:
        with open(self.path, "a") as f:
            f.write(text + "\n")

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._say(f"start {trainer.current_epoch}")

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._say(f"end {trainer.current_epoch}")


class Campaign:
    def __init__(self, workdir: Path) -> None:
        self.dir = workdir
        self.db = workdir / "mlflow.db"
        self.uri = f"sqlite:///{self.db}"
        self.env = {**os.environ, "CI": "1", "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'bench'}",
                    "MLFLOW_TRACKING_URI": self.uri}
        self.rows: list[dict[str, Any]] = []

    # --- plumbing ----------------------------------------------------------------------------------------
    def main(self, args: list[str], **kw: Any) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(REPO / "main.py"), *args], cwd=kw.pop("cwd", self.dir),
                              env=kw.pop("env", self.env), capture_output=True, text=True, timeout=900, **kw)

    def popen(self, args: list[str]) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, str(REPO / "main.py"), *args], cwd=self.dir, env=self.env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)

    @staticmethod
    def error_lines(stderr: str) -> list[str]:
        return [ln for ln in stderr.splitlines() if ln.strip() and not ln.startswith(CHATTER)
                and not ln.startswith("note: ")]

    def runs(self, name: str | None = None) -> list[Any]:
        import mlflow
        from mlflow.entities import ViewType

        client = mlflow.MlflowClient(self.uri)
        exp = client.get_experiment_by_name("mlp_classifier")
        if exp is None:
            return []
        runs = client.search_runs([exp.experiment_id], run_view_type=ViewType.ALL, max_results=5000)
        return [r for r in runs if name is None or r.info.run_name == name]

    def history(self, run_id: str) -> list[tuple[int, float]]:
        import mlflow

        return sorted((m.step, m.value) for m in mlflow.MlflowClient(self.uri).get_metric_history(run_id, "val/acc"))

    def probe_config(self, name: str) -> tuple[str, Path]:
        probe = self.dir / f"probe_{name}.txt"
        cfg = self.dir / f"probe_{name}.yaml"
        cfg.write_text(json.dumps({"trainer": {"callbacks": [
            {"class_path": "faults_campaign.EpochProbe", "init_args": {"path": str(probe)}}]}}))
        return str(cfg), probe

    def report(self, scenario: str, **row: Any) -> None:
        row = {"scenario": scenario, **row}
        self.rows.append(row)
        print(json.dumps(row), flush=True)

    # --- scenarios ---------------------------------------------------------------------------------------
    def kill(self, kills: int, seed: int) -> None:
        rng = random.Random(seed)
        ref = self.main(["fit", *FIT, "--run.name", "ref"])
        assert ref.returncode == 0, ref.stderr[-2000:]
        (ref_run,) = self.runs("ref")
        reference = self.history(ref_run.info.run_id)
        failures, lost, lines, before_ckpt, dup, running = 0, [], 0, 0, 0, 0
        for i in range(kills):
            name = f"kill{i}"
            cfg, probe = self.probe_config(name)
            ckpt = self.dir / "checkpoints/mlp_classifier" / name / "last.ckpt"
            proc = self.popen(["fit", *FIT, "--config", cfg, "--run.name", name])
            delay = rng.uniform(3, 25)
            try:
                proc.wait(timeout=delay)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            trained = [int(ln.split()[1]) for ln in probe.read_text().splitlines() if ln.startswith("end")] \
                if probe.is_file() else []
            done_at_kill = max(trained) + 1 if trained else 0
            said = ""
            if ckpt.is_file():
                res = self.main(["fit", *FIT, "--config", cfg, "--run.name", name, "--ckpt_path", "last"])
            else:
                before_ckpt += 1
                had_run = bool(self.runs(name))  # a kill during start-up may come before the run exists
                res = self.main(["fit", *FIT, "--config", cfg, "--run.name", name, "--ckpt_path", "last"])
                lines += len(self.error_lines(res.stderr))
                said = (self.error_lines(res.stderr) or [""])[0]
                expected = "never wrote a checkpoint" if had_run else "no checkpoint in"
                failures += not (res.returncode == 1 and expected in res.stderr)
                res = self.main(["fit", *FIT, "--config", cfg, "--run.name", name])
            starts = [int(ln.split()[1]) for ln in probe.read_text().splitlines() if ln.startswith("start")]
            lost.append(max(0, done_at_kill - starts[-1]))
            statuses = [r.info.status for r in self.runs(name)]
            finished = [r for r in self.runs(name) if r.info.status == "FINISHED"]
            dup += max(0, len(finished) - 1)
            running += statuses.count("RUNNING")
            same = len(finished) == 1 and len(h := self.history(finished[0].info.run_id)) == len(reference) and all(
                a[0] == b[0] and abs(a[1] - b[1]) <= 1e-6 for a, b in zip(h, reference, strict=True))
            failures += res.returncode != 0 or not same or "RUNNING" in statuses
            print(f"  kill {i}: at {delay:.1f} s, {done_at_kill} epoch(s) done, resumed from epoch {starts[-1]}, "
                  f"statuses {statuses}, history equal: {same}" + (f"; the resume said: {said}" if said else ""),
                  flush=True)
        self.report("kill -9 at a random moment, then resume", trials=kills, failures=failures,
                    killed_before_first_checkpoint=before_ckpt, epochs_lost=sum(lost), epochs_lost_max=max(lost),
                    duplicate_finished=dup, left_running=running, error_lines=lines)

    def early(self) -> None:
        killer = self.dir / "killer.yaml"
        killer.write_text(json.dumps({"trainer": {"callbacks": [
            {"class_path": "tests.helpers.SignalAtStep", "init_args": {"step": 2, "signum": int(signal.SIGKILL)}}]}}))
        args = [*FIT, "--run.name", "early"]
        killed = self.main(["fit", *args, "--config", str(killer)])
        left = [r.info.status for r in self.runs("early")]
        res = self.main(["fit", *args, "--ckpt_path", "last"])
        after = [r.info.status for r in self.runs("early")]
        again = self.main(["fit", *args])
        final = [r.info.status for r in self.runs("early")]
        ok = (killed.returncode == -9 and left == ["RUNNING"] and res.returncode == 1 and after == ["KILLED"]
              and "never wrote a checkpoint" in res.stderr and again.returncode == 0)
        print(f"  early: after the kill {left}, the resume said: {self.error_lines(res.stderr)[:1]}; then {after}; "
              f"after a fresh fit {sorted(final)}", flush=True)
        self.report("kill -9 before the first checkpoint", trials=1, failures=int(not ok),
                    left_running=final.count("RUNNING"), error_lines=len(self.error_lines(res.stderr)),
                    duplicate_finished=max(0, final.count("FINISHED") - 1))

    def corrupt(self, seed: int) -> None:
        from tracking.run_registry import check_checkpoint

        args = [*FIT, "--trainer.max_epochs", "5", "--run.name", "corrupt"]
        assert self.main(["fit", *args]).returncode == 0
        last = self.dir / "checkpoints/mlp_classifier/corrupt/last.ckpt"
        data = last.read_bytes()
        failures, lines = 0, []
        for damage, bad in (("truncated", data[: len(data) // 2]), ("random", random.Random(seed).randbytes(len(data)))):
            last.write_bytes(bad)
            res = self.main(["fit", *args, "--ckpt_path", "last"])
            test = self.main(["test", *args, "--ckpt_path", "best"])
            statuses = [r.info.status for r in self.runs("corrupt")]
            lines.append(len(self.error_lines(res.stderr)))
            ok = res.returncode == 1 and "damaged" in res.stderr and statuses == ["FINISHED"] and test.returncode == 0
            failures += not ok
            print(f"  corrupt ({damage}): rc {res.returncode}, {self.error_lines(res.stderr)[:1]}, statuses {statuses}, "
                  f"test --ckpt_path best rc {test.returncode}", flush=True)
        for ckpt in last.parent.glob("best-*.ckpt"):
            check_checkpoint(ckpt, "best")
        self.report("corrupt / truncated last.ckpt", trials=2, failures=failures, error_lines_max=max(lines))

    def sweep(self, seed: int) -> None:
        spec = self.dir / "acts.yaml"
        spec.write_text(json.dumps({"name": "acts", "base": YINYANG, "grid": {"model.net.activation": ["relu", "tanh"]},
                                    "overrides": {"trainer.max_epochs": 20}, "seeds": [0, 1], "test": True}))
        rng = random.Random(seed)
        args = ["sweep", "--config", str(spec), "--workers", "2"]
        kills = []
        for _ in range(3):
            proc = self.popen(args)
            delay = rng.uniform(15, 45)
            try:
                proc.wait(timeout=delay)
                kills.append(None)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                kills.append(round(delay, 1))
        final = self.main(args)
        per_point: dict[str, list[str]] = {}
        for run in self.runs():
            if run.data.tags.get("sweep.name") == "acts" and run.data.tags.get("sweep.role") != "parent":
                per_point.setdefault(run.info.run_name, []).append(run.info.status)
        logs = self.dir / "checkpoints/mlp_classifier/_sweeps/acts"
        resumed = sum("--ckpt_path last" in p.read_text() for p in logs.glob("*.log"))
        import mlflow

        from sweeps.load import load_runs

        kept, _, excluded = load_runs(mlflow.MlflowClient(self.uri), "mlp_classifier", None)
        n_points = sum(1 for r in kept if r.data.tags.get("sweep.name") == "acts")
        dup = sum(max(0, s.count("FINISHED") - 1) for s in per_point.values())
        running = sum(s.count("RUNNING") for s in per_point.values())
        ok = final.returncode == 0 and len(per_point) == 4 and dup == 0 and running == 0 and n_points == 4
        print(f"  sweep: killed at {kills}, per point {per_point}, points resumed from their last.ckpt: {resumed}, "
              f"compare without --sweep counts {n_points} point runs (left out: {excluded})", flush=True)
        self.report("sweep killed 3 times, then rerun", trials=3, failures=int(not ok), duplicate_finished=dup,
                    left_running=running, points_resumed=resumed, compare_n=n_points,
                    error_lines=len(self.error_lines(final.stderr)))

    def _hold(self, seconds: float, held: threading.Event) -> None:
        con = sqlite3.connect(self.db, isolation_level=None)
        con.execute("BEGIN EXCLUSIVE")
        held.set()
        time.sleep(seconds)
        con.execute("ROLLBACK")
        con.close()

    def lock(self) -> None:
        for label, hold, after in (("at start-up for 25 s", 25, 0), ("at start-up for 90 s", 90, 0),
                                   ("mid-training for 25 s", 25, 12)):
            name = f"lock{hold}_{after}"
            held = threading.Event()
            t0 = time.monotonic()
            proc = self.popen(["fit", *FIT, "--trainer.max_epochs", "40", "--run.name", name])
            time.sleep(after)
            locker = threading.Thread(target=self._hold, args=(hold, held))
            locker.start()
            held.wait()
            _, stderr = proc.communicate(timeout=900)
            seconds = time.monotonic() - t0
            locker.join()
            statuses = [r.info.status for r in self.runs(name)]
            lines = self.error_lines(stderr)
            expect_ok = hold < 60
            ok = ("Traceback" not in stderr and (proc.returncode == 0) == expect_ok and "RUNNING" not in statuses
                  and (expect_ok or (len(lines) <= 2 and statuses == [])))
            print(f"  lock {label}: rc {proc.returncode} after {seconds:.0f} s, statuses {statuses}, "
                  f"output {lines[:3]}", flush=True)
            self.report(f"store locked {label}", trials=1, failures=int(not ok), error_lines=len(lines),
                        tracebacks=stderr.count("Traceback"), seconds=round(seconds))

    def readonly(self) -> None:
        """Read-only as the permissions say for a user; for root (who writes through permissions) a read-only
        tmpfs mount."""
        base = Path(tempfile.mkdtemp(prefix="paperlab-ro-"))
        migrated = self.dir / "template.db"
        if not migrated.is_file():
            subprocess.run([sys.executable, "-c", f"import mlflow; mlflow.MlflowClient('sqlite:///{migrated}').search_experiments()"],
                           check=True, capture_output=True)
        for what in ("store", "checkpoint folder", "file in the way"):
            folder = base / what.replace(" ", "_")
            folder.mkdir()
            ro = folder / "ro"
            ro.mkdir()
            db = (ro if what == "store" else folder) / "mlflow.db"
            ckpts = (ro if what == "checkpoint folder" else folder) / "ckpts"
            mounted = what != "file in the way" and make_read_only(ro, lambda db=db, ckpts=ckpts, what=what: (
                db.write_bytes(migrated.read_bytes()), ckpts.mkdir() if what == "checkpoint folder" else None))
            if what == "file in the way":
                db.write_bytes(migrated.read_bytes())
                ckpts.write_text("a file")
            elif what == "store":
                ckpts.mkdir()
            else:
                db.write_bytes(migrated.read_bytes())
            env = {**self.env, "MLFLOW_TRACKING_URI": f"sqlite:///{db}"}
            try:
                res = self.main(["fit", *FIT, "--run.checkpoint_root", str(ckpts)], cwd=folder, env=env)
                with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as con:  # closed: unmountable
                    n_runs = con.execute("select count(*) from runs").fetchone()[0]
            finally:
                if mounted:
                    subprocess.run(["umount", str(ro)])
            lines = self.error_lines(res.stderr)
            ok = res.returncode != 0 and n_runs == 0 and "Traceback" not in res.stderr and len(lines) <= 2
            print(f"  {what}: rc {res.returncode}, runs created {n_runs}, {lines[:1]}", flush=True)
            self.report(f"read-only / blocked: {what}", trials=1, failures=int(not ok), error_lines=len(lines),
                        empty_failed_runs=n_runs)

    def full(self) -> None:
        if os.geteuid() != 0:
            self.report("disk full (tmpfs)", trials=0, failures=0, note="needs root to mount a tmpfs")
            return
        from tracking.run_registry import check_checkpoint

        mnt = Path(tempfile.mkdtemp(prefix="paperlab-full-"))
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=400k", "tmpfs", str(mnt)]).returncode != 0:
            self.report("disk full (tmpfs)", trials=0, failures=0, note="mount refused")
            return
        try:
            (mnt / "filler").write_bytes(b"\0" * (400 * 1024 - 160 * 1024))  # about 160 KB left for checkpoints
            res = self.main(["fit", *FIT, "--run.checkpoint_root", str(mnt), "--run.name", "full",
                             "--model.net.hidden", "[64,64]"])
            files = [p for p in (mnt / "mlp_classifier/full").glob("*") if p.suffix in (".ckpt", ".tmp")]
            partial = 0
            for p in files:
                try:
                    check_checkpoint(p, "x")
                except Exception:  # noqa: BLE001 - counted
                    partial += 1
            statuses = [r.info.status for r in self.runs("full")]
            lines = self.error_lines(res.stderr)
            ok = partial == 0 and "Traceback" not in res.stderr and len(lines) <= 2 and "RUNNING" not in statuses
            print(f"  full: rc {res.returncode}, files {[p.name for p in files]}, partial {partial}, statuses "
                  f"{statuses}, {lines[:1]}", flush=True)
            self.report("disk full (tmpfs)", trials=1, failures=int(not ok), partial_files=partial,
                        error_lines=len(lines), statuses=statuses)
        finally:
            subprocess.run(["umount", str(mnt)])

    def diverge(self) -> None:
        res = self.main(["fit", *FIT, "--model.optimizer.lr", "1e6", "--run.name", "diverge"])
        statuses = [r.info.status for r in self.runs("diverge")]
        lines = self.error_lines(res.stderr)
        ok = res.returncode == 1 and statuses == ["FAILED"] and "diverged at step" in res.stderr and len(lines) <= 2
        print(f"  diverge: rc {res.returncode}, statuses {statuses}, {lines[:1]}", flush=True)
        self.report("lr 1e6 (finite divergence)", trials=1, failures=int(not ok), error_lines=len(lines))


def make_read_only(folder: Path, fill: Any) -> bool:
    """Make ``folder`` read-only after ``fill()`` has put its files there: ``chmod`` for a user; for root, who
    writes through permissions, a tmpfs mounted there and remounted read-only (True: unmount it after)."""
    if os.geteuid() != 0:
        fill()
        for p in [folder, *folder.rglob("*")]:
            os.chmod(p, 0o555 if p.is_dir() else 0o444)
        return False
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(folder)], check=True)
    fill()
    subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True)
    return True


SCENARIOS = ("kill", "early", "corrupt", "sweep", "lock", "readonly", "full", "diverge")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=8)
    parser.add_argument("--seed", type=int, default=21)
    parser.add_argument("--only", nargs="*", choices=SCENARIOS, default=list(SCENARIOS))
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="paperlab-faults-"))
    workdir.mkdir(parents=True, exist_ok=True)
    sys.path[:0] = [str(REPO)]
    campaign = Campaign(workdir)
    # a fresh store's schema migration logs INFO lines on the first command: not a fault's output
    subprocess.run([sys.executable, "-c", f"import mlflow; mlflow.MlflowClient({campaign.uri!r}).search_experiments()"],
                   check=True, capture_output=True)
    sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    print(f"fault campaign in {workdir} (git {sha or 'snapshot'})", flush=True)
    t0 = time.monotonic()
    for name in args.only:
        if name == "kill":
            campaign.kill(args.kills, args.seed)
        elif name in ("corrupt", "sweep"):
            getattr(campaign, name)(args.seed)
        else:
            getattr(campaign, name)()
    print(f"\n{'scenario':48s} trials failures  details   ({time.monotonic() - t0:.0f} s)")
    for row in campaign.rows:
        extra = {k: v for k, v in row.items() if k not in ("scenario", "trials", "failures")}
        print(f"{row['scenario']:48s} {row['trials']:>6} {row['failures']:>8}  {json.dumps(extra)}")


if __name__ == "__main__":
    main()
