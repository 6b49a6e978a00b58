"""The prediction writer's sample indices under DDP, against the loader's own sharding and a real 2-process run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from callbacks.predictions import sharded_indices
from datamodules.base import BatchedTensorLoader
from main import cli_main
from tests.helpers import REPO, TINY, run_main


@pytest.mark.parametrize(("n", "batch", "world"), [(10, 4, 2), (11, 4, 3), (7, 3, 2), (9, 9, 4), (5, 2, 1)])
def test_sharded_indices_are_the_samples_each_rank_received(n: int, batch: int, world: int) -> None:
    """Each rank's rows, placed from the per-batch row counts of all ranks, are exactly the split indices its
    ``BatchedTensorLoader`` shard yields (the loader carries the indices as its data here)."""
    index = torch.arange(n)
    shards = [list(BatchedTensorLoader((index,), batch, rank=r, world_size=world)) for r in range(world)]
    counts = torch.tensor([[len(b[0]) for b in shard] for shard in shards])
    for rank, shard in enumerate(shards):
        expected = torch.cat([b[0] for b in shard])
        assert torch.equal(sharded_indices(counts, rank, world), expected)
    assert torch.equal(torch.cat([sharded_indices(counts, r, world) for r in range(world)]).sort().values, index)


@pytest.mark.slow
def test_ddp_predict_labels_each_ranks_rows_with_their_split_indices(paperlab_tmp: Path) -> None:
    """2 CPU processes: every rank's file holds its rows with their split indices; together they are the
    single-process predictions, row for row (101 samples: the ranks' shares of the last batch differ)."""
    config = str(REPO / "configs/mlp_classifier/yinyang.yaml")
    common = ["--config", config, "--run.name", "y", "--data.init_args.test_size", "101"]
    assert cli_main(["fit", *common, *TINY]) == 0
    assert cli_main(["predict", *common, "--ckpt_path", "best"]) == 0
    folder = paperlab_tmp / "checkpoints/mlp_classifier/y"
    single = torch.load(folder / "predictions.pt")
    proc = run_main(["predict", *common, "--ckpt_path", "best", "--trainer", str(REPO / "configs/trainer/ddp_cpu.yaml")],
                    cwd=paperlab_tmp)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [torch.load(folder / f"predictions_rank{r}.pt") for r in range(2)]
    assert torch.equal(torch.cat([t["index"] for t in ranks]).sort().values, torch.arange(101))
    for table in ranks:
        assert torch.allclose(table["prediction"], single["prediction"][table["index"]], atol=1e-6)
        assert torch.equal(table["target"], single["target"][table["index"]])
