"""Everything the commands write into the working directory is ignored by git; nothing tracked is."""

from __future__ import annotations

import subprocess
from pathlib import Path

from main import cli_main
from tests.helpers import REPO, TINY


def _ignored(paths: list[str]) -> set[str]:
    """The paths (relative to the repository root) that the repository's .gitignore ignores."""
    proc = subprocess.run(["git", "check-ignore", "--no-index", "--stdin"], cwd=REPO, input="\n".join(paths),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode in (0, 1), proc.stderr  # 1: none ignored
    return set(proc.stdout.splitlines())


def test_every_file_the_commands_write_is_ignored(paperlab_tmp: Path) -> None:
    """fit (twice: the second archives the first), predict and compare, run where a user runs them."""
    config = str(REPO / "configs/mlp_classifier/yinyang.yaml")
    for _ in range(2):
        assert cli_main(["fit", "--config", config, *TINY, "--run.name", "y"]) == 0
    assert cli_main(["predict", "--config", config, "--ckpt_path", "best", "--run.name", "y"]) == 0
    assert cli_main(["compare", "--experiment", "mlp_classifier", "--metric", "val/acc", "--no-log"]) == 0
    written = sorted(str(p.relative_to(paperlab_tmp)) for p in paperlab_tmp.rglob("*") if p.is_file())
    for expected in ("checkpoints/mlp_classifier/y/predictions.pt", "checkpoints/mlp_classifier/y.archive/", "compare/",
                     "mlruns/", "mlflow.db"):
        assert any(w.startswith(expected) for w in written), (expected, written)
    assert sorted(set(written) - _ignored(written)) == []


def test_the_other_output_locations_are_ignored() -> None:
    """What the test above does not run: sweep logs and scripts, sqlite's side files, a local tracking
    server's artifacts, Lightning's default log folder, packaging."""
    paths = ["checkpoints/mlp_classifier/_sweeps/lr/lr-p0-s0.log", "checkpoints/mlp_classifier/_sweeps/lr/lr.sbatch",
             "mlflow.db-journal", "mlflow.db-wal", "mlflow.db-shm", "mlartifacts/1/abc/artifacts/config.yaml",
             "lightning_logs/version_0/hparams.yaml", "paperlab.egg-info/PKG-INFO", "build/lib/main.py"]
    assert sorted(set(paths) - _ignored(paths)) == []


def test_no_tracked_file_is_ignored() -> None:
    proc = subprocess.run(["git", "ls-files", "--cached", "--ignored", "--exclude-standard"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout == "", proc.stdout[:2000]
