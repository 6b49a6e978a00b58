"""The claim of the README's LMC-DM row on one endpoint pair (slow: two endpoint fits and four aligner fits).

The page reports, from `configs/lmc_dual_merge/modes_sweep.yaml` over 3 endpoint pairs, the barrier of naive
interpolation, weight matching and learned (one-sided, dual) transforms. Here seed 0's pair through the same
CLI commands: weight matching lowers the naive barrier, learned transforms lower it further, and every
transformed path keeps the endpoints' losses and functions. A transform that is not function-preserving, a
wrong weight matching or an optimiser that does not reach phi breaks these.
"""

from __future__ import annotations

from pathlib import Path

import mlflow
import pytest

from main import cli_main

REPO = Path(__file__).resolve().parents[2]
SWEEP = [
    "--trainer.max_steps",
    "150",
    "--trainer.val_check_interval",
    "150",
    "--data.batch_size",
    "32",
    "--data.eval_batch_size",
    "64",
    "--trainer.enable_progress_bar",
    "false",
]


def _metrics(name: str) -> dict[str, float]:
    c = mlflow.MlflowClient()
    run = c.search_runs([c.get_experiment_by_name("lmc_dual_merge").experiment_id], f"tags.mlflow.runName = '{name}'")[
        0
    ]
    return run.data.metrics


@pytest.mark.slow
def test_alignment_lowers_the_barrier_and_keeps_the_endpoints(paperlab_tmp: Path) -> None:
    endpoint = str(REPO / "configs/lmc_dual_merge/endpoint.yaml")
    for name, seed in (("endpoint_a_s0", "0"), ("endpoint_b_s0", "100")):
        assert (
            cli_main(
                [
                    "fit",
                    "--config",
                    endpoint,
                    "--run.name",
                    name,
                    "--seed_everything",
                    seed,
                    "--data.seed",
                    seed,
                    "--trainer.enable_progress_bar",
                    "false",
                ]
            )
            == 0
        )
    got = {}
    for mode in ("naive", "weight_matching", "one_sided", "dual"):
        assert (
            cli_main(
                [
                    "fit",
                    "--config",
                    str(REPO / "configs/lmc_dual_merge/aligner.yaml"),
                    "--model.mode",
                    mode,
                    "--model.ckpt_a",
                    "checkpoints/lmc_dual_merge/endpoint_a_s{seed}/last.ckpt",
                    "--model.ckpt_b",
                    "checkpoints/lmc_dual_merge/endpoint_b_s{seed}/last.ckpt",
                    "--seed_everything",
                    "0",
                    "--run.name",
                    mode,
                    *SWEEP,
                ]
            )
            == 0
        )
        got[mode] = _metrics(mode)
    barrier = {m: v["val/barrier"] for m, v in got.items()}
    assert barrier["weight_matching"] < barrier["naive"], barrier
    assert max(barrier["one_sided"], barrier["dual"]) < barrier["weight_matching"], barrier
    for mode, values in got.items():
        assert values["val/loss_at_00"] == pytest.approx(got["naive"]["val/loss_at_00"], abs=1e-4), mode
        assert values["val/loss_at_10"] == pytest.approx(got["naive"]["val/loss_at_10"], abs=1e-4), mode
        assert values["diag/function_preservation/passed"] == 1.0, mode
