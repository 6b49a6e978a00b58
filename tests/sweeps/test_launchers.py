"""Handing points to cluster launchers: the SLURM array script and torchrun command lines (--dry-run)."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import warnings
from pathlib import Path

import pytest
import yaml

from main import cli_main
from tests.helpers import REPO, runs_of
from tests.sweeps.common import BASE, write_sweep


def _sweep(tmp: Path) -> Path:
    return write_sweep(tmp, grid={"model.net.activation": ["relu", "tanh"]}, seeds=[0, 1], test=True)


def test_slurm_dry_run_prints_an_array_script_with_one_task_per_point(
    paperlab_tmp: Path, capsys: pytest.CaptureFixture
) -> None:
    sweep = _sweep(paperlab_tmp)
    assert (
        cli_main(
            [
                "sweep",
                "--config",
                str(sweep),
                "--launcher",
                "slurm",
                "--dry-run",
                "--max-parallel",
                "2",
                "--slurm-option",
                "partition=gpu",
                "--slurm-option",
                "time=01:00:00",
                "--slurm-setup",
                "source .venv/bin/activate",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    script = out[out.index("#!/bin/bash") :]
    for line in (
        "#SBATCH --array=0-3%2",
        "#SBATCH --partition=gpu",
        "#SBATCH --time=01:00:00",
        "#SBATCH --nodes=1",
        "#SBATCH --job-name=sweep-tiny",
        "source .venv/bin/activate",
        f"export MLFLOW_TRACKING_URI={os.environ['MLFLOW_TRACKING_URI']}",
    ):
        assert line in script.splitlines(), line
    task = script.strip().splitlines()[-1]
    argv = shlex.split(task.replace('"$SLURM_ARRAY_TASK_ID"', "3"))
    assert argv[1:] == [str(REPO / "main.py"), "sweep", "--config", str(sweep), "--point", "3"]
    if shutil.which("bash"):
        path = paperlab_tmp / "s.sbatch"
        path.write_text(script)
        assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
    assert runs_of("mlp_classifier") == [] and not (paperlab_tmp / "checkpoints").exists()

    # Without --dry-run the script is written and the parent run created, so that every task shares it.
    assert cli_main(["sweep", "--config", str(sweep), "--launcher", "slurm"]) == 0
    written = paperlab_tmp / "checkpoints/mlp_classifier/_sweeps/tiny/tiny.sbatch"
    assert "#SBATCH --array=0-3" in written.read_text()
    (parent,) = runs_of("mlp_classifier")
    assert parent.data.tags["sweep.role"] == "parent" and parent.info.status == "RUNNING"


def test_an_array_task_runs_exactly_its_point_under_the_shared_parent(
    paperlab_tmp: Path, capsys: pytest.CaptureFixture
) -> None:
    sweep = write_sweep(paperlab_tmp, grid={"model.net.activation": ["relu", "tanh"]}, seeds=[0])
    assert cli_main(["sweep", "--config", str(sweep), "--launcher", "slurm"]) == 0
    with warnings.catch_warnings(record=True) as caught:  # the point's argv is its own, not the sweep's
        warnings.simplefilter("always")
        assert cli_main(["sweep", "--config", str(sweep), "--point", "1", "--in-process"]) == 0
    assert not [w for w in caught if "args parameter is intended" in str(w.message)]
    runs = runs_of("mlp_classifier")
    parent = next(r for r in runs if r.data.tags.get("sweep.role") == "parent")
    (child,) = [r for r in runs if r is not parent]
    assert child.info.run_name == "tiny-activation=tanh-s0" and child.data.tags["sweep.index"] == "1"
    assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id
    assert parent.info.status == "RUNNING"  # point 0 is still to come
    assert cli_main(["sweep", "--config", str(sweep), "--point", "0", "--in-process"]) == 0
    parent = next(r for r in runs_of("mlp_classifier") if r.data.tags.get("sweep.role") == "parent")
    assert parent.info.status == "FINISHED"  # the last task closes the parent
    assert cli_main(["sweep", "--config", str(sweep), "--point", "2", "--in-process"]) == 101
    assert "--point must lie in 0..1" in capsys.readouterr().err


def test_multi_process_points_go_through_srun_with_matching_trainer_arguments(
    paperlab_tmp: Path, capsys: pytest.CaptureFixture
) -> None:
    sweep = _sweep(paperlab_tmp)
    assert (
        cli_main(
            [
                "sweep",
                "--config",
                str(sweep),
                "--launcher",
                "slurm",
                "--dry-run",
                "--nodes",
                "2",
                "--devices-per-node",
                "4",
                "--slurm-option",
                "gpus-per-node=4",
            ]
        )
        == 0
    )
    script = capsys.readouterr().out
    assert "#SBATCH --nodes=2" in script and "#SBATCH --ntasks-per-node=4" in script
    assert "--nodes 2 --devices-per-node 4 --exec-prefix srun" in script
    # What such an array task then runs for its point:
    assert (
        cli_main(
            [
                "sweep",
                "--config",
                str(sweep),
                "--dry-run",
                "--point",
                "0",
                "--nodes",
                "2",
                "--devices-per-node",
                "4",
                "--exec-prefix",
                "srun",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    fit = next(line for line in out.splitlines() if line.startswith("srun python main.py fit"))
    assert "--trainer.num_nodes 2 --trainer.devices 4 --trainer.strategy ddp" in fit
    assert out.count("python main.py fit") == 1


def test_torchrun_dry_run_prints_the_per_node_command_and_the_cli_accepts_it(
    paperlab_tmp: Path, capsys: pytest.CaptureFixture
) -> None:
    sweep = _sweep(paperlab_tmp)
    assert (
        cli_main(
            [
                "sweep",
                "--config",
                str(sweep),
                "--launcher",
                "torchrun",
                "--dry-run",
                "--nodes",
                "2",
                "--devices-per-node",
                "4",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    fits = [line for line in out.splitlines() if " main.py fit " in line]
    assert len(fits) == 4
    head = (
        "torchrun --nnodes=2 --nproc-per-node=4 --node-rank=${NODE_RANK} --master-addr=${MASTER_ADDR} "
        "--master-port=${MASTER_PORT:-29500} main.py fit "
    )
    assert all(line.startswith(head) for line in fits), fits[0]
    assert "NODE_RANK=0..1" in out
    # The trainer arguments in those lines parse with the real CLI.
    args = shlex.split(fits[0].split(" main.py ", 1)[1])
    assert cli_main([*args, "--print_config"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    # (devices is typed int | str | list: jsonargparse keeps "4", which Lightning reads as 4 devices)
    assert printed["trainer"]["num_nodes"] == 2 and str(printed["trainer"]["devices"]) == "4"
    assert printed["trainer"]["strategy"] == "ddp"
    assert printed["model"]["init_args"]["net"]["init_args"]["activation"] == "relu"

    # Several nodes cannot be started from here: a clear error, nothing runs.
    assert cli_main(["sweep", "--config", str(sweep), "--launcher", "torchrun", "--nodes", "2"]) == 101
    assert "start the printed command on each node" in capsys.readouterr().err
    assert runs_of("mlp_classifier") == []
    # One node: the runner starts each point as torchrun --standalone.
    assert (
        cli_main(
            [
                "sweep",
                "--config",
                str(sweep),
                "--launcher",
                "torchrun",
                "--devices-per-node",
                "2",
                "--dry-run",
            ]
        )
        == 0
    )
    assert "torchrun --standalone --nproc-per-node=2 main.py fit " in capsys.readouterr().out


def test_base_config_path_resolves_from_the_repo_root(
    paperlab_tmp: Path, capsys: pytest.CaptureFixture
) -> None:
    sweep = paperlab_tmp / "rel.yaml"
    sweep.write_text(yaml.safe_dump({"base": str(BASE.relative_to(REPO)), "seeds": [0, 1]}))
    assert cli_main(["sweep", "--config", str(sweep), "--dry-run"]) == 0
    assert "rel-base-s1" in capsys.readouterr().out
