"""Function-preserving transforms of a ``TinyGPT(norm="rmsnorm", tie_weights=False)`` and weight matching.

The residual stream ``h`` (row vectors of width d) is read through RMSNorms and written by ``attn.proj`` and
``mlp.proj``. These maps leave the network's function exactly unchanged:

- **norm absorption** (always applied first): an RMSNorm's gain g is folded into the linear layer that reads
  it (``attn.qkv``, ``mlp.fc``, ``head``: W -> W diag(g)) and the gain is set to 1. With unit gains
  RMSNorm(h Q) = RMSNorm(h) Q for every orthogonal Q, which the rotation needs.
- **residual rotation** Q (d, d) orthogonal: h -> h Q, so embeddings E -> E Q, read-ins W -> W Q (``nn.Linear``
  weights are (out, in): out = x W^T), write-outs W -> Q^T W and their biases b -> b Q.
- **head permutation** per layer: new head j = old head perm[j] (its q, k, v rows and its ``attn.proj``
  columns move together).
- **head-internal maps** per layer and (new) head: ``qk_maps[l][h]`` M: q_h -> q_h M, k_h -> k_h M^(-T), so
  q k^T is unchanged; ``vo_maps[l][h]`` N: v_h -> v_h N, W_O,h -> W_O,h N^(-T). Attention's 1/sqrt(d_h) scale
  is a constant and is unaffected.
- **FFN permutation** per layer: new hidden unit j = old unit perm[j] (``mlp.fc`` rows, ``mlp.proj`` columns);
  exact for any elementwise activation.

Applied in this order: fold, rotate, permute heads, head maps (indexed by the new heads), permute FFN units.

After the fold every other map acts *linearly* on the parameter vector, so interpolation commutes with it:
(1 - a) T(x) + a T(y) = T((1 - a) x + a y). Hence two-sided ("dual") alignment reaches exactly the paths that
one-sided alignment reaches (T_A^(-1) T_B is again such a map); it can only differ by how it is optimised.

``apply_transforms`` takes the maps as matrices (permutations as (n, n) matrices P with new = P @ old) and is
differentiable, so relaxed (Sinkhorn) permutations and learned rotations pass through it;
``transform_state_dict`` is the checked public form with index permutations.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from torch import Tensor

from errors import ConfigError

#: read-in layer of each norm, per block (the head reads ``ln_f``)
_READS = {"ln_1": "attn.qkv", "ln_2": "mlp.fc"}


def n_layers(sd: Mapping[str, Tensor]) -> int:
    """The number of blocks of a TinyGPT state dict."""
    layers = {int(k.split(".")[1]) for k in sd if k.startswith("blocks.")}
    return max(layers) + 1 if layers else 0


def check_state_dict(sd: Mapping[str, Tensor], n_head: int) -> None:
    """Refuse state dicts these transforms are not exact for (LayerNorm, tied head, a bad head count)."""
    if "tok_emb.weight" not in sd or "head.weight" not in sd or "blocks.0.attn.qkv.weight" not in sd:
        raise ConfigError("transform_state_dict needs a TinyGPT state dict (tok_emb, blocks.*, head)")
    if any(k.endswith(("ln_1.bias", "ln_2.bias")) or k == "ln_f.bias" for k in sd):
        raise ConfigError(
            "the model has LayerNorm biases: residual rotations are exact only for "
            "TinyGPT(norm='rmsnorm'); train the endpoints with norm: rmsnorm"
        )
    if sd["head.weight"].data_ptr() == sd["tok_emb.weight"].data_ptr():
        raise ConfigError(
            "the head is tied to the token embedding (a read-in and the stream's input share one "
            "matrix, so no rotation is exact): train the endpoints with tie_weights: false"
        )
    d = sd["tok_emb.weight"].shape[1]
    if n_head < 1 or d % n_head:
        raise ConfigError(f"n_head={n_head} does not divide the width {d}")


def _perm_matrix(perm: Any, n: int, what: str, like: Tensor) -> Tensor:
    """Index permutation (new j = old perm[j]) -> the (n, n) matrix P with new = P @ old; checked."""
    p = torch.as_tensor(perm).flatten()
    if p.is_floating_point() and not bool((p == p.round()).all()):
        raise ConfigError(f"{what} must be an index permutation of 0..{n - 1}, got non-integers")
    p = p.long()
    if p.numel() != n or not torch.equal(p.sort().values, torch.arange(n)):
        raise ConfigError(f"{what} is not a permutation of 0..{n - 1}: {p.tolist()[:12]}")
    out = torch.zeros(n, n, dtype=like.dtype, device=like.device)
    out[torch.arange(n), p.to(like.device)] = 1
    return out


def fold_norms(sd: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """RMSNorm gains folded into the layers that read them; gains set to 1 (same function)."""
    out = dict(sd)
    for l in range(n_layers(sd)):
        for norm, reader in _READS.items():
            g = sd[f"blocks.{l}.{norm}.weight"]
            out[f"blocks.{l}.{reader}.weight"] = sd[f"blocks.{l}.{reader}.weight"] * g
            out[f"blocks.{l}.{norm}.weight"] = torch.ones_like(g)
    g = sd["ln_f.weight"]
    out["head.weight"] = sd["head.weight"] * g
    out["ln_f.weight"] = torch.ones_like(g)
    return out


def apply_transforms(
    sd: Mapping[str, Tensor],
    n_head: int,
    *,
    fold: bool = True,
    rotation: Tensor | None = None,
    head_perm: Sequence[Tensor] | None = None,
    qk_maps: Sequence[Tensor] | None = None,
    vo_maps: Sequence[Tensor] | None = None,
    ffn_perm: Sequence[Tensor] | None = None,
) -> dict[str, Tensor]:
    """The transformed state dict, maps given as matrices (differentiable; see the module docstring).

    ``head_perm[l]`` (H, H) and ``ffn_perm[l]`` (F, F) act as new = P @ old (any matrix: a relaxed
    permutation is not function-preserving, a permutation matrix is); ``qk_maps[l]``, ``vo_maps[l]``
    (H, d_h, d_h) invertible. Rotation and head maps presuppose unit norm gains (``fold=True``).
    """
    out = fold_norms(sd) if fold else dict(sd)
    q = rotation
    if q is not None:
        for name in ("tok_emb.weight", "pos_emb.weight", "head.weight"):
            out[name] = out[name] @ q
    d = out["tok_emb.weight"].shape[1]
    dh = d // n_head
    for l in range(n_layers(sd)):
        pre = f"blocks.{l}."
        qkv_w, proj_w = out[pre + "attn.qkv.weight"], out[pre + "attn.proj.weight"]
        qkv_b, proj_b = out.get(pre + "attn.qkv.bias"), out.get(pre + "attn.proj.bias")
        fc_w, fc_b = out[pre + "mlp.fc.weight"], out.get(pre + "mlp.fc.bias")
        mp_w, mp_b = out[pre + "mlp.proj.weight"], out.get(pre + "mlp.proj.bias")
        if q is not None:
            qkv_w, fc_w = qkv_w @ q, fc_w @ q
            proj_w, mp_w = q.T @ proj_w, q.T @ mp_w
            proj_b = proj_b @ q if proj_b is not None else None
            mp_b = mp_b @ q if mp_b is not None else None
        # per head: W_q, W_k, W_v as (H, d_h, d) and their biases (H, d_h); W_O as (d, H, d_h)
        w3 = qkv_w.reshape(3, n_head, dh, d)
        b3 = qkv_b.reshape(3, n_head, dh) if qkv_b is not None else None
        wo = proj_w.reshape(d, n_head, dh)
        if head_perm is not None:
            p = head_perm[l]
            w3 = torch.einsum("ji,sidk->sjdk", p, w3)
            b3 = torch.einsum("ji,sid->sjd", p, b3) if b3 is not None else None
            wo = torch.einsum("ji,kid->kjd", p, wo)
        wq, wk, wv = w3[0], w3[1], w3[2]
        bq, bk, bv = (b3[0], b3[1], b3[2]) if b3 is not None else (None, None, None)
        if qk_maps is not None:
            m = qk_maps[l]  # (H, d_h, d_h): q_h -> q_h M is W_q,h -> M^T W_q,h; k_h -> k_h M^-T is M^-1 W_k,h
            m_inv = torch.linalg.inv(m)
            wq, wk = m.transpose(1, 2) @ wq, m_inv @ wk
            if bq is not None:
                bq = (bq[:, None, :] @ m).squeeze(1)
                bk = (bk[:, None, :] @ m_inv.transpose(1, 2)).squeeze(1)
        if vo_maps is not None:
            n = vo_maps[l]
            n_inv = torch.linalg.inv(n)
            wv = n.transpose(1, 2) @ wv
            bv = (bv[:, None, :] @ n).squeeze(1) if bv is not None else None
            wo = torch.einsum("khd,hed->khe", wo, n_inv)  # W_O,h N^-T: (d, d_h) @ (N^-1)^T
        out[pre + "attn.qkv.weight"] = torch.stack([wq, wk, wv]).reshape(3 * d, d)
        if bq is not None:
            out[pre + "attn.qkv.bias"] = torch.stack([bq, bk, bv]).reshape(3 * d)
        out[pre + "attn.proj.weight"] = wo.reshape(d, d)
        if proj_b is not None:
            out[pre + "attn.proj.bias"] = proj_b
        if ffn_perm is not None:
            p = ffn_perm[l]
            fc_w, mp_w = p @ fc_w, mp_w @ p.T
            fc_b = p @ fc_b if fc_b is not None else None
        out[pre + "mlp.fc.weight"], out[pre + "mlp.proj.weight"] = fc_w, mp_w
        if fc_b is not None:
            out[pre + "mlp.fc.bias"] = fc_b
        if mp_b is not None:
            out[pre + "mlp.proj.bias"] = mp_b
    return out


def transform_state_dict(
    sd: Mapping[str, Tensor],
    n_head: int,
    rotation: Tensor | None = None,
    head_perm: Sequence[Any] | Tensor | None = None,
    ffn_perm: Sequence[Any] | Tensor | None = None,
    qk_maps: Sequence[Tensor] | Tensor | None = None,
    vo_maps: Sequence[Tensor] | Tensor | None = None,
) -> dict[str, Tensor]:
    """An exactly function-equivalent state dict of ``TinyGPT(norm="rmsnorm", tie_weights=False)``.

    Args:
        sd: the network's state dict.
        n_head: its number of heads.
        rotation: Q (d, d) orthogonal: the residual stream h -> h Q (None: identity).
        head_perm: per layer, new head j = old head ``perm[j]`` (None: identity).
        ffn_perm: per layer, new hidden unit j = old unit ``perm[j]`` (None: identity).
        qk_maps: per layer, (n_head, d_h, d_h) invertible M: q_h -> q_h M, k_h -> k_h M^(-T) (None: identity).
        vo_maps: per layer, (n_head, d_h, d_h) invertible N: v_h -> v_h N, W_O,h -> W_O,h N^(-T).
    The RMSNorm gains are always folded into the read-ins after them (unit gains left).
    """
    check_state_dict(sd, n_head)
    ref = sd["tok_emb.weight"]
    d, layers = ref.shape[1], n_layers(sd)
    ffn = sd["blocks.0.mlp.fc.weight"].shape[0]
    dh = d // n_head
    if rotation is not None:
        rotation = torch.as_tensor(rotation, dtype=ref.dtype, device=ref.device)
        if rotation.shape != (d, d):
            raise ConfigError(f"rotation must be ({d}, {d}), got {tuple(rotation.shape)}")
        err = float(
            (rotation.T.double() @ rotation.double() - torch.eye(d, dtype=torch.float64, device=ref.device)).abs().max()
        )
        if err > 1e-4:
            raise ConfigError(
                f"rotation is not orthogonal (max |Q^T Q - I| = {err:.2g}); only orthogonal Q preserve RMSNorm"
            )

    def per_layer(value: Any, what: str) -> list[Any]:
        if len(value) != layers:
            raise ConfigError(f"{what} needs one entry per layer ({layers}), got {len(value)}")
        return list(value)

    heads = (
        [_perm_matrix(p, n_head, f"head_perm[{i}]", ref) for i, p in enumerate(per_layer(head_perm, "head_perm"))]
        if head_perm is not None
        else None
    )
    units = (
        [_perm_matrix(p, ffn, f"ffn_perm[{i}]", ref) for i, p in enumerate(per_layer(ffn_perm, "ffn_perm"))]
        if ffn_perm is not None
        else None
    )
    maps: dict[str, list[Tensor] | None] = {}
    for what, value in (("qk_maps", qk_maps), ("vo_maps", vo_maps)):
        if value is None:
            maps[what] = None
            continue
        mats = [torch.as_tensor(m, dtype=ref.dtype, device=ref.device) for m in per_layer(value, what)]
        for i, m in enumerate(mats):
            if m.shape != (n_head, dh, dh):
                raise ConfigError(f"{what}[{i}] must be ({n_head}, {dh}, {dh}), got {tuple(m.shape)}")
            if not bool(torch.isfinite(torch.linalg.cond(m.double())).all()):
                raise ConfigError(f"{what}[{i}] holds a singular matrix: the head maps must be invertible")
        maps[what] = mats
    return apply_transforms(
        sd,
        n_head,
        fold=True,
        rotation=rotation,
        head_perm=heads,
        qk_maps=maps["qk_maps"],
        vo_maps=maps["vo_maps"],
        ffn_perm=units,
    )


def procrustes(a: Tensor, b: Tensor) -> Tensor:
    """The orthogonal R minimising ||a - b R||_F (rows of both are vectors in one space): U V^T of b^T a."""
    u, _, vt = torch.linalg.svd(b.T @ a)
    return u @ vt


def _assign(similarity: Tensor) -> Tensor:
    """perm maximising sum_i similarity[i, perm[i]] (the Hungarian algorithm)."""
    _, cols = linear_sum_assignment(similarity.detach().double().cpu().numpy(), maximize=True)
    return torch.as_tensor(np.asarray(cols), dtype=torch.long)


def weight_matching(sd_a: Mapping[str, Tensor], sd_b: Mapping[str, Tensor], n_head: int) -> dict[str, Any]:
    """Transforms of B that bring its weights close to A's (Ainsworth et al. 2023, with a rotation).

    Both networks' gains are folded; the rotation is the Procrustes fit of B's token and position embeddings
    and head onto A's (all three are stream-space rows, h -> h Q); then, with B rotated, each layer's heads
    and FFN units are matched to A's by the Hungarian algorithm on the summed inner products of their
    weights (q, k, v rows and ``attn.proj`` columns; ``mlp.fc`` rows and ``mlp.proj`` columns). Given the
    stream, the layers' permutations do not interact, so one pass is the optimum of that objective.

    Returns ``dict(rotation, head_perm, ffn_perm)`` for ``transform_state_dict(sd_b, n_head, **it)``.
    """
    check_state_dict(sd_a, n_head)
    check_state_dict(sd_b, n_head)
    for k in sd_a:
        if k not in sd_b or sd_a[k].shape != sd_b[k].shape:
            raise ConfigError(f"the endpoints differ at {k}: weight matching needs one architecture")
    fa = {k: v.detach().double() for k, v in fold_norms(sd_a).items()}
    fb = {k: v.detach().double() for k, v in fold_norms(sd_b).items()}
    rows = ("tok_emb.weight", "pos_emb.weight", "head.weight")
    rotation = procrustes(torch.cat([fa[k] for k in rows]), torch.cat([fb[k] for k in rows]))
    rb = apply_transforms(fb, n_head, fold=False, rotation=rotation)
    d = fa["tok_emb.weight"].shape[1]
    dh = d // n_head
    head_perm, ffn_perm = [], []
    for l in range(n_layers(sd_a)):
        pre = f"blocks.{l}."

        def head_features(s: Mapping[str, Tensor], pre: str = pre) -> Tensor:
            w3 = s[pre + "attn.qkv.weight"].reshape(3, n_head, dh, d).permute(1, 0, 2, 3).reshape(n_head, -1)
            wo = s[pre + "attn.proj.weight"].reshape(d, n_head, dh).permute(1, 0, 2).reshape(n_head, -1)
            return torch.cat([w3, wo], 1)

        head_perm.append(_assign(head_features(fa) @ head_features(rb).T))

        def unit_features(s: Mapping[str, Tensor], pre: str = pre) -> Tensor:
            return torch.cat([s[pre + "mlp.fc.weight"], s[pre + "mlp.proj.weight"].T], 1)

        ffn_perm.append(_assign(unit_features(fa) @ unit_features(rb).T))
    return {"rotation": rotation.to(sd_b["tok_emb.weight"].dtype), "head_perm": head_perm, "ffn_perm": ffn_perm}


__all__ = [
    "apply_transforms",
    "check_state_dict",
    "fold_norms",
    "n_layers",
    "procrustes",
    "transform_state_dict",
    "weight_matching",
]
