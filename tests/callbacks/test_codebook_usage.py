"""CodebookUsage (002-08): perplexity, used codes and dead fraction from a module's code counts."""

from __future__ import annotations

import math

import pytest
import torch

from callbacks.codebook_usage import CodebookUsage
from callbacks.diagnostic import Moment
from modules.protocols import CodebookCounts
from modules.spike_tokenizers import SpikeTokenizerAE


def test_finalize_against_hand_counts() -> None:
    diag = CodebookUsage()
    out = diag.finalize({"counts": torch.tensor([4.0, 0.0, 4.0, 0.0])})
    assert out["perplexity"] == pytest.approx(2.0) and out["used"] == 2.0 and out["dead_frac"] == 0.5


@pytest.mark.parametrize("kind, size", [("vqvae", 16), ("count", 8), ("pop_ae", 0)])
def test_measure_counts_every_code_of_the_batch(kind: str, size: int) -> None:
    torch.manual_seed(0)
    task = SpikeTokenizerAE(kind=kind, d_token=8, codebook_size=16, hidden=16, input_shape=(8, 6))
    assert isinstance(task, CodebookCounts)
    counts = torch.poisson(torch.full((4, 8, 6), 1.0))
    mask = torch.ones(4, 6, dtype=torch.bool)
    batch = (counts, mask)
    task.train()
    stats = CodebookUsage().measure(None, task, Moment("step", 0, 0, batch))  # type: ignore[arg-type]
    assert task.training  # measuring leaves the module's mode as it was
    if size == 0:
        assert stats is None
        return
    assert stats is not None and stats["counts"].shape == (size,)
    n_tokens = 4 * 8 * 6 if kind == "count" else 4 * 2  # units x bins, or population patches of 4 bins
    assert int(stats["counts"].sum()) == n_tokens
    assert math.isfinite(CodebookUsage().finalize(stats)["perplexity"])
