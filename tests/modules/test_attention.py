"""The shared pre-norm cross-attention block against a naive per-head loop."""

from __future__ import annotations

import math

import pytest
import torch

from errors import ConfigError
from modules.components.attention import CrossAttentionBlock


def _naive(block: CrossAttentionBlock, q: torch.Tensor, c: torch.Tensor, kc: torch.Tensor | None = None,
           mask: torch.Tensor | None = None) -> torch.Tensor:
    """The block written out: q + W_o concat_h softmax(q_h k_h^T / sqrt(d_h)) v_h, then + MLP(LN(.))."""
    attn, h = block.attn, block.attn.n_heads
    d = q.shape[-1]
    dh = d // h
    qn = block.norm_q(q)
    cn = block.norm_c(c)
    kn = cn if kc is None else (block.norm_k or block.norm_c)(kc)
    out = torch.zeros_like(q)
    for b in range(q.shape[0]):
        heads = []
        for head in range(h):
            sl = slice(head * dh, (head + 1) * dh)
            qq = (qn[b] @ attn.q.weight.T + attn.q.bias)[:, sl]
            kk = (kn[b] @ attn.k.weight.T + attn.k.bias)[:, sl]
            vv = (cn[b] @ attn.v.weight.T + attn.v.bias)[:, sl]
            scores = qq @ kk.T / math.sqrt(dh)
            if mask is not None:
                scores = scores.masked_fill(~mask[b][None, :], float("-inf"))
            heads.append(torch.softmax(scores, -1) @ vv)
        out[b] = torch.cat(heads, -1) @ attn.o.weight.T + attn.o.bias
    x = q + out
    return x + block.mlp(block.norm_m(x))


@pytest.mark.parametrize("keys", [False, True])
def test_cross_attention_block_matches_a_naive_loop(keys: bool) -> None:
    torch.manual_seed(0)
    block = CrossAttentionBlock(8, n_heads=2, mlp_ratio=2, separate_key_norm=keys).double()
    for p in block.parameters():  # move LayerNorms off their identity initialisation
        p.data += 0.1 * torch.randn_like(p)
    q, c = torch.randn(3, 5, 8, dtype=torch.float64), torch.randn(3, 7, 8, dtype=torch.float64)
    kc = torch.randn(3, 7, 8, dtype=torch.float64) if keys else None
    torch.testing.assert_close(block(q, c, key_context=kc), _naive(block, q, c, kc))
    mask = torch.rand(3, 7) > 0.4
    mask[:, 0] = True
    torch.testing.assert_close(block(q, c, key_context=kc, context_mask=mask), _naive(block, q, c, kc, mask))


def test_keys_choose_which_value_is_read() -> None:
    """With key_context, the query reads the value whose *key* matches it, whatever the values' own content."""
    torch.manual_seed(0)
    block = CrossAttentionBlock(4, n_heads=1).double()
    c = torch.randn(1, 6, 4, dtype=torch.float64)
    k1 = torch.randn(1, 6, 4, dtype=torch.float64)
    k2 = k1[:, torch.randperm(6)]
    q = torch.randn(1, 2, 4, dtype=torch.float64)
    assert not torch.allclose(block(q, c, key_context=k1), block(q, c, key_context=k2))
    # permuting context and keys together changes nothing (a set, not a sequence)
    perm = torch.randperm(6)
    torch.testing.assert_close(block(q, c, key_context=k1), block(q, c[:, perm], key_context=k1[:, perm]))


def test_count_independent_of_token_numbers_and_shapes() -> None:
    block = CrossAttentionBlock(16, n_heads=4, mlp_ratio=4)
    n = sum(p.numel() for p in block.parameters())
    assert n == 3 * 32 + 4 * (16 * 16 + 16) + (16 * 64 + 64) + (64 * 16 + 16)
    for nq, nc in ((1, 1), (3, 50), (40, 2)):
        assert block(torch.randn(2, nq, 16), torch.randn(2, nc, 16)).shape == (2, nq, 16)


def test_bad_shapes() -> None:
    block = CrossAttentionBlock(8, n_heads=2)
    with pytest.raises(ConfigError, match="query"):
        block(torch.randn(2, 3, 8), torch.randn(3, 4, 8))
    with pytest.raises(ConfigError, match="key_context"):
        block(torch.randn(2, 3, 8), torch.randn(2, 4, 8), key_context=torch.randn(2, 5, 8))
    with pytest.raises(ConfigError, match="multiple of n_heads"):
        CrossAttentionBlock(10, n_heads=4)
