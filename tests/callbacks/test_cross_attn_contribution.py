"""CrossAttnContribution: the logged ratios are the module's, averaged over ranks; a module without the protocol is
refused in one line."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from callbacks.cross_attn_contribution import CrossAttnContribution
from modules.protocols import CrossAttentionShare


def test_finalize_averages_ranks_and_names_layers() -> None:
    diag = CrossAttnContribution(plot=False)
    out = diag.finalize({"share": torch.tensor([0.2, 0.6]) * 2, "ranks": torch.tensor(2.0)})
    assert out == pytest.approx({"layer0": 0.2, "layer1": 0.6, "mean": 0.4})


def test_a_module_without_the_protocol_is_not_supported() -> None:
    assert not isinstance(nn.Linear(2, 2), CrossAttentionShare)
