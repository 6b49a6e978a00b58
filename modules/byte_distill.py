"""ByteDistill (paper 000-08): cross-tokenizer distillation by matching next-byte distributions (BLDA).

Decoded bytes are events every tokenizer shares; token boundaries are not. Each model's native softmax is
projected, at every byte position of the observed text, onto a 256-way next-byte distribution, and the
student (its own tokenizer) is trained on CE + alpha x mean over byte positions seen by both models of
D(P_teacher || P_student).

Projection along the observed tokenization (``byte_distributions``; our reconstruction, the paper's text is
not available). ``probs[i]`` is the softmax that predicted token ``ids[i]``; byte ``k`` of that token with
prefix ``s = bytes(ids[i])[:k]``:

- k = 0 (a token boundary): the first-byte marginal ``f_i(b) = sum_{t: bytes(t)[0] = b} probs[i, t]``;
- k >= 1: ``m(b)`` = mass of ``probs[i]`` on tokens starting with ``s + b`` (the token continues),
  ``e`` = mass on the token equal to ``s`` (the token ends here: a latent boundary), whose next byte is
  spread with the first-byte marginal ``f_{i+1}`` of the softmax at the next observed token start;
  ``P(b) = (m(b) + e f_{i+1}(b)) / (sum m + e)``. ``boundary_mode="drop"`` discards ``e``: ``m / sum m``
  (the mass-discarding ablation).

Baselines: ``loss="sft"`` (CE only) and ``loss="vocab_kd"``: token-level KD at byte offsets where both
tokenizations start a token, over the byte strings both vocabularies contain (each model's softmax
restricted to them and renormalised). A byte a model puts no mass on (no token of its vocabulary continues
the prefix) would make a KL infinite, so both byte distributions are mixed with ``SMOOTH`` of the uniform
distribution before the divergence.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor

from errors import ConfigError
from modules.base import Stage, StepOutput, WeightedMean
from modules.components.lm_task import IGNORE, CausalLMTask, default_lm, lm_batch, load_lm
from modules.components.supervised import NetFactory
from modules.components.tiny_gpt import TinyGPT
from modules.protocols import ProvidesTokenBytes

N_BYTES = 256
SMOOTH = 1e-4
BoundaryMode = Literal["next_first_byte", "drop"]
Divergence = Literal["fkl", "rkl", "js"]


# --- the byte projection ----------------------------------------------------------------------------------
@dataclass
class ByteTables:
    """Index tables of one vocabulary's byte strings (built once from ``token_bytes``).

    ``first_byte (V,)``; ``length (V,)``; ``prefix_of (V, max_len)``: the prefix id of ``bytes(t)[:k]``
    (-1 at k = 0 and past the token); per prefix: ``equal (P,)`` the token spelling it (-1: none) and its
    continuations ``ptr (P + 1,)`` into ``cont_token``, ``cont_byte`` (every token longer than the prefix
    that starts with it, with its next byte).
    """

    first_byte: Tensor
    length: Tensor
    prefix_of: Tensor
    equal: Tensor
    ptr: Tensor
    cont_token: Tensor
    cont_byte: Tensor

    @property
    def vocab_size(self) -> int:
        return int(self.first_byte.numel())

    def to(self, device: torch.device) -> ByteTables:
        return ByteTables(*(getattr(self, f).to(device) for f in self.__dataclass_fields__))


def build_tables(token_bytes: Sequence[bytes]) -> ByteTables:
    """The ``ByteTables`` of a vocabulary (see there); every token must be a non-empty byte string."""
    if any(len(b) == 0 for b in token_bytes):
        raise ConfigError("token_bytes holds an empty token; every token must spell at least one byte")
    prefixes: dict[bytes, int] = {}
    for tok in token_bytes:
        for k in range(1, len(tok)):
            prefixes.setdefault(tok[:k], len(prefixes))
    token_of = {tok: i for i, tok in enumerate(token_bytes)}
    n_pre, v = len(prefixes), len(token_bytes)
    max_len = max(len(t) for t in token_bytes)
    prefix_of = torch.full((v, max_len), -1, dtype=torch.long)
    conts: list[list[tuple[int, int]]] = [[] for _ in range(n_pre)]
    for i, tok in enumerate(token_bytes):
        for k in range(1, len(tok)):
            p = prefixes[tok[:k]]
            prefix_of[i, k] = p
            conts[p].append((i, tok[k]))
    ptr = torch.zeros(n_pre + 1, dtype=torch.long)
    ptr[1:] = torch.tensor([len(c) for c in conts], dtype=torch.long).cumsum(0)
    flat = [pair for c in conts for pair in c]
    return ByteTables(
        first_byte=torch.tensor([t[0] for t in token_bytes], dtype=torch.long),
        length=torch.tensor([len(t) for t in token_bytes], dtype=torch.long),
        prefix_of=prefix_of,
        equal=torch.tensor([token_of.get(s, -1) for s in prefixes], dtype=torch.long),
        ptr=ptr,
        cont_token=torch.tensor([t for t, _ in flat], dtype=torch.long),
        cont_byte=torch.tensor([b for _, b in flat], dtype=torch.long),
    )


def first_byte_marginal(probs: Tensor, tables: ByteTables) -> Tensor:
    """``(..., V) -> (..., 256)``: the mass of the tokens starting with each byte."""
    out = probs.new_zeros(*probs.shape[:-1], N_BYTES)
    return out.index_add(-1, tables.first_byte, probs)


def project_rows(
    probs: Tensor, rows: Tensor, tokens: Tensor, tables: ByteTables, mode: BoundaryMode
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The byte distributions of the tokens ``tokens (N,)`` predicted by rows ``rows (N,)`` of ``probs (R, V)``
    (row ``rows + 1`` follows each token). Returns ``(P (n_bytes, 256), owner, k, boundary)`` (each
    ``(n_bytes,)``): one row per byte in token order, the index into ``tokens`` each byte belongs to, its
    offset k in that token, and the token-ending mass fraction ``e / (sum m + e)`` (0 at k = 0)."""
    lengths = tables.length[tokens]
    owner = torch.repeat_interleave(torch.arange(len(tokens), device=probs.device), lengths)
    starts = torch.cumsum(lengths, 0) - lengths
    k = torch.arange(owner.numel(), device=probs.device) - starts[owner]
    f = first_byte_marginal(probs, tables)
    out = f[rows[owner]].clone()  # k = 0 rows; k >= 1 rows are overwritten below
    boundary = probs.new_zeros(owner.numel())
    inner = (k > 0).nonzero().squeeze(1)
    if inner.numel():
        q_row = rows[owner[inner]]
        pre = tables.prefix_of[tokens[owner[inner]], k[inner]]
        counts = tables.ptr[pre + 1] - tables.ptr[pre]
        q_rep = torch.repeat_interleave(torch.arange(inner.numel(), device=probs.device), counts)
        offset = torch.arange(q_rep.numel(), device=probs.device) - (torch.cumsum(counts, 0) - counts)[q_rep]
        pair = tables.ptr[pre][q_rep] + offset
        mass = probs[q_row[q_rep], tables.cont_token[pair]]
        m = probs.new_zeros(inner.numel() * N_BYTES).scatter_add(0, q_rep * N_BYTES + tables.cont_byte[pair], mass)
        m = m.view(inner.numel(), N_BYTES)
        eq = tables.equal[pre]
        e = torch.where(eq >= 0, probs[q_row, eq.clamp_min(0)], probs.new_zeros(()))
        total_m = m.sum(1)
        if mode == "drop":
            p = m / total_m.clamp_min(1e-30)[:, None]
        else:
            p = (m + e[:, None] * f[q_row + 1]) / (total_m + e).clamp_min(1e-30)[:, None]
        out = out.index_copy(0, inner, p)
        boundary = boundary.index_copy(0, inner, e / (total_m + e).clamp_min(1e-30))
    return out, owner, k, boundary


@functools.lru_cache(maxsize=4)
def _cached_tables(token_bytes: tuple[bytes, ...]) -> ByteTables:
    return build_tables(token_bytes)


def byte_distributions(
    probs: Tensor, ids: Tensor, token_bytes: Sequence[bytes], boundary_mode: BoundaryMode = "next_first_byte"
) -> Tensor:
    """One next-byte distribution per byte of ``ids`` (see the module docstring): ``(n_bytes, 256)``.

    Args:
        probs: ``(T + 1, V)``; ``probs[i]`` predicted ``ids[i]``, ``probs[T]`` follows the last token.
        ids: ``(T,)`` the observed tokens.
        token_bytes: the byte string of every token id (``V`` of them).
        boundary_mode: ``next_first_byte`` (token-ending mass spread with the next start's first-byte
            marginal) or ``drop`` (discarded).
    """
    if boundary_mode not in ("next_first_byte", "drop"):
        raise ConfigError(f"boundary_mode must be 'next_first_byte' or 'drop', got {boundary_mode!r}")
    if probs.dim() != 2 or ids.dim() != 1:
        raise ConfigError(f"probs must be (T + 1, V) and ids (T,), got {tuple(probs.shape)} and {tuple(ids.shape)}")
    if len(token_bytes) != probs.shape[1]:
        raise ConfigError(f"len(token_bytes) = {len(token_bytes)} but probs has V = {probs.shape[1]} columns")
    if probs.shape[0] != ids.numel() + 1:
        raise ConfigError(
            f"probs needs len(ids) + 1 = {ids.numel() + 1} rows (the last follows the last token), got {probs.shape[0]}"
        )
    sums = probs.sum(1)
    if (probs < 0).any() or not torch.allclose(sums, torch.ones_like(sums), atol=1e-4):
        raise ConfigError("every row of probs must be a distribution (non-negative, summing to 1): pass a softmax")
    if ids.numel() and (ids.min() < 0 or ids.max() >= probs.shape[1]):
        raise ConfigError(f"ids must lie in [0, {probs.shape[1]})")
    tables = _cached_tables(tuple(token_bytes)).to(probs.device)
    rows = torch.arange(ids.numel(), device=probs.device)
    return project_rows(probs, rows, ids.long(), tables, boundary_mode)[0]


def divergence(p: Tensor, q: Tensor, kind: Divergence) -> Tensor:
    """Per row ``D(p || q)`` of 256-way distributions (teacher ``p``, student ``q``), both smoothed."""
    p = (1 - SMOOTH) * p + SMOOTH / p.shape[-1]
    q = (1 - SMOOTH) * q + SMOOTH / q.shape[-1]

    def kl(a: Tensor, b: Tensor) -> Tensor:
        return (a * (a.log() - b.log())).sum(-1)

    if kind == "fkl":
        return kl(p, q)
    if kind == "rkl":
        return kl(q, p)
    mid = 0.5 * (p + q)
    return 0.5 * kl(p, mid) + 0.5 * kl(q, mid)


def shared_vocabulary(a: Sequence[bytes], b: Sequence[bytes]) -> tuple[Tensor, Tensor]:
    """Ids ``(in a, in b)`` of the byte strings both vocabularies contain, in ``a``'s order."""
    where = {t: i for i, t in enumerate(b)}
    pairs = [(i, where[t]) for i, t in enumerate(a) if t in where]
    return torch.tensor([p[0] for p in pairs], dtype=torch.long), torch.tensor([p[1] for p in pairs], dtype=torch.long)


def window_bytes(x: Tensor, y: Tensor, tables: ByteTables) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """For a batch of token windows: the real targets' ``(window, row, token, byte offset of the token)``,
    row being the flat index of the logits that predicted it (``window * width + position``)."""
    valid = y != IGNORE
    win, pos = valid.nonzero(as_tuple=True)
    tokens = y[win, pos]
    before = torch.cumsum(tables.length[y.clamp_min(0)] * valid, 1) - tables.length[y.clamp_min(0)] * valid
    offset = tables.length[x[:, 0]][win] + before[win, pos]
    return win, win * x.shape[1] + pos, tokens, offset


def teacher_default(shape: tuple[int, ...], n: int) -> TinyGPT:
    """The in-run teacher when no checkpoint is given (1.1M parameters at vocabulary 2048)."""
    return TinyGPT(shape, n, n_layer=4, n_head=4, n_embd=128, norm="rmsnorm")


class ByteDistillTeacher(CausalLMTask):
    """The teacher: a ``CausalLMTask`` on the teacher tokenizer's windows (``tokenizer_vocabs: [2048]``).

    Args: see ``CausalLMTask``.
    """

    paper_id = "000-08"
    monitor = "val/bpb"
    monitor_mode = "min"
    vectorizable = False  # --run.seeds: its step has not been checked under torch.func.vmap yet


class ByteDistillModule(CausalLMTask):
    """A student LM (tokenizer 0 of the batch) trained with CE + alpha x D(teacher || student) (module docstring).

    Args:
        net: the student network (linked sizes: tokenizer 0's windows and vocabulary).
        loss: ``sft`` (CE only), ``blda`` (byte-level distribution alignment) or ``vocab_kd`` (token KD at
            shared boundaries over the byte strings both vocabularies hold).
        alpha: weight of the distillation term.
        divergence: ``fkl`` KL(P_T || P_S), ``rkl`` KL(P_S || P_T) or ``js`` (Jensen-Shannon).
        boundary_mode: ``next_first_byte`` or ``drop`` (see ``byte_distributions``).
        teacher_ckpt: a ``ByteDistillTeacher`` checkpoint (``last.ckpt``); None: the first ``teacher_steps``
            optimiser steps train ``teacher_net`` on the teacher tokenizer's windows of this run's data.
        teacher_steps: steps of that first stage (ignored with a checkpoint or ``loss=sft``).
        teacher_vocab: the teacher's vocabulary; the batch must hold a tokenizer of that size after the first.
        teacher_net: the in-run teacher's network factory.
        input_shape, num_classes, optimizer, lr_scheduler: see ``CausalLMTask``.
    """

    paper_id = "000-08"
    monitor = "val/bpb"
    monitor_mode = "min"
    vectorizable = False  # --run.seeds: its step has not been checked under torch.func.vmap yet

    def __init__(
        self,
        net: NetFactory = default_lm,
        loss: Literal["sft", "blda", "vocab_kd"] = "blda",
        alpha: float = 1.0,
        divergence: Divergence = "fkl",
        boundary_mode: BoundaryMode = "next_first_byte",
        teacher_ckpt: str | None = None,
        teacher_steps: int = 300,
        teacher_vocab: int = 2048,
        teacher_net: NetFactory = teacher_default,
        input_shape: tuple[int, ...] = (64,),
        num_classes: int = 512,
        optimizer: OptimizerCallable = lambda p: torch.optim.AdamW(p, lr=3e-3, weight_decay=0.0),
        lr_scheduler: LRSchedulerCallable | None = None,
    ) -> None:
        super().__init__(net, input_shape, num_classes, optimizer, lr_scheduler)
        if alpha < 0:
            raise ConfigError(f"alpha must be >= 0, got {alpha}")
        if teacher_steps < 0:
            raise ConfigError(f"teacher_steps must be >= 0, got {teacher_steps}")
        self.loss_name, self.alpha, self.divergence_kind, self.boundary_mode = loss, alpha, divergence, boundary_mode
        self.teacher_vocab = teacher_vocab
        self.teacher: TinyGPT | None = None
        self.teacher_steps = 0
        if loss != "sft":
            if teacher_ckpt is not None:
                self.teacher = load_lm(teacher_ckpt)
                if self.teacher.vocab_size != teacher_vocab:
                    raise ConfigError(
                        f"the teacher checkpoint {teacher_ckpt} has vocabulary {self.teacher.vocab_size}, "
                        f"not teacher_vocab={teacher_vocab}; train the teacher on that tokenizer or set teacher_vocab"
                    )
                self.teacher.requires_grad_(False)
            else:
                if teacher_steps == 0:
                    raise ConfigError("teacher_ckpt=null needs teacher_steps > 0 (the teacher is trained first)")
                self.teacher = teacher_net(self.input_shape, teacher_vocab)
                self.teacher_steps = teacher_steps
        for stage_metrics in self.stage_metrics.values():
            for name in ("distill", "teacher_bpb", "teacher_loss"):
                stage_metrics[name] = WeightedMean()
        self._metric_names += ["distill", "teacher_bpb", "teacher_loss"]
        self.tables: list[ByteTables] = []
        self.shared_ids: tuple[Tensor, Tensor] | None = None
        self.teacher_index = -1

    # --- tokenizers, from the DataModule --------------------------------------------------------------------
    def setup(self, stage: str) -> None:
        if self.teacher is None:
            return
        data = self.trainer.datamodule
        if not isinstance(data, ProvidesTokenBytes):
            raise ConfigError(
                f"{self.loss_name} needs BPE data with several tokenizers "
                "(data: datamodules.bpe_text.BPETextDataModule, tokenizer_vocabs: [512, 2048])"
            )
        self.set_vocabularies(data.token_bytes())

    def set_vocabularies(self, vocabs: list[list[bytes]]) -> None:
        """Build the byte tables of every tokenizer of the batch; find the teacher's (its vocabulary size)."""
        sizes = [len(v) for v in vocabs]
        if sizes[0] != self.num_classes:
            raise ConfigError(
                f"the student's vocabulary is {self.num_classes} but the data's first tokenizer has {sizes[0]}"
            )
        matches = [i for i, n in enumerate(sizes) if i > 0 and n == self.teacher_vocab]
        if not matches:
            raise ConfigError(
                f"no tokenizer of the teacher's vocabulary {self.teacher_vocab} in the data "
                f"(tokenizer_vocabs = {sizes}); add it after the student's"
            )
        self.teacher_index = matches[0]
        self.tables = [build_tables(vocabs[0]), build_tables(vocabs[self.teacher_index])]
        self.shared_ids = shared_vocabulary(vocabs[self.teacher_index], vocabs[0])

    # --- the teacher ------------------------------------------------------------------------------------------
    @property
    def in_teacher_stage(self) -> bool:
        return self.teacher_steps > 0 and self.global_step < self.teacher_steps

    def teacher_batch(self, batch: Any) -> tuple[Tensor, Tensor, Tensor]:
        i = 3 * self.teacher_index
        return lm_batch(batch[i : i + 3])

    def optimizer_parameters(self) -> Any:
        trainer = self.attached_trainer()
        model = (trainer.model if trainer is not None else None) or self
        return [p for p in model.parameters() if p.requires_grad]

    # --- the losses ---------------------------------------------------------------------------------------------
    def byte_rows(
        self, logits: Tensor, x: Tensor, y: Tensor, tables: ByteTables, mode: BoundaryMode
    ) -> dict[str, Tensor]:
        """Every target byte's distribution and its key ``window * W + offset`` in a batch."""
        win, rows, tokens, offset = window_bytes(x, y, tables)
        probs = logits.float().softmax(-1).reshape(-1, logits.shape[-1])
        p, owner, k, boundary = project_rows(probs, rows, tokens, tables, mode)
        return {
            "p": p,
            "win": win[owner],
            "offset": offset[owner] + k,
            "k": k,
            "boundary": boundary,
            "token_start": offset,
            "token_row": rows,
            "token_win": win,
            "probs": probs,
        }

    def aligned(self, student: dict[str, Tensor], teacher: dict[str, Tensor], key: str) -> tuple[Tensor, Tensor]:
        """Indices (into the student's and the teacher's rows) of the byte offsets both have, by ``key``."""
        ws, wt = student[key[0]], teacher[key[0]]
        os_, ot = student[key[1]], teacher[key[1]]
        if not (os_.numel() and ot.numel()):
            empty = os_.new_zeros(0)
            return empty, empty
        width = int(torch.cat([os_, ot]).max()) + 1
        n_win = int(torch.cat([ws, wt]).max()) + 1
        grid = torch.full((n_win * width,), -1, dtype=torch.long, device=os_.device)
        grid[wt * width + ot] = torch.arange(ot.numel(), device=ot.device)
        hit = grid[ws * width + os_]
        keep = hit >= 0
        return keep.nonzero().squeeze(1), hit[keep]

    def distill_term(
        self, s_logits: Tensor, s_x: Tensor, s_y: Tensor, t_logits: Tensor, t_x: Tensor, t_y: Tensor
    ) -> tuple[Tensor, int]:
        """``(mean divergence, positions)`` of ``blda`` or ``vocab_kd`` on one batch."""
        mode = self.boundary_mode
        s = self.byte_rows(s_logits, s_x, s_y, self.tables[0], mode)
        t = self.byte_rows(t_logits.detach(), t_x, t_y, self.tables[1], mode)
        if self.loss_name == "blda":
            i_s, i_t = self.aligned(s, t, ("win", "offset"))
            d = divergence(t["p"][i_t], s["p"][i_s], self.divergence_kind)
            return d.mean() if d.numel() else s_logits.sum() * 0, d.numel()
        # vocab_kd: the next-token softmaxes at common token starts, restricted to the shared strings
        assert self.shared_ids is not None
        t_ids, s_ids = (ids.to(s_logits.device) for ids in self.shared_ids)
        i_s, i_t = self.aligned(
            {"win": s["token_win"], "start": s["token_start"]},
            {"win": t["token_win"], "start": t["token_start"]},
            ("win", "start"),
        )
        s_rows = s_logits.reshape(-1, s_logits.shape[-1])[s["token_row"][i_s]][:, s_ids].float().softmax(-1)
        t_rows = t_logits.reshape(-1, t_logits.shape[-1])[t["token_row"][i_t]][:, t_ids].float().softmax(-1)
        d = divergence(t_rows, s_rows, self.divergence_kind)
        return d.mean() if d.numel() else s_logits.sum() * 0, d.numel()

    def step(self, batch: Any, stage: Stage) -> StepOutput:
        if self.teacher is not None and self.teacher_index < 0:
            raise ConfigError("the vocabularies are not set: ByteDistillModule runs under a Trainer with BPE data")
        teacher_out: dict[str, Any] = {}
        if self.teacher is not None:
            t_x, t_y, t_bytes = self.teacher_batch(batch)
            if t_x.shape[1] > self.teacher.block_size:
                raise ConfigError(
                    f"teacher windows of {t_x.shape[1]} tokens exceed its block_size "
                    f"{self.teacher.block_size}; lower data.window_bytes"
                )
            train_teacher = stage == "train" and self.in_teacher_stage
            with torch.set_grad_enabled(train_teacher):
                t_logits = self.teacher(t_x)
            t_ce = F.cross_entropy(
                t_logits.reshape(-1, t_logits.shape[-1]), t_y.reshape(-1), ignore_index=IGNORE, reduction="sum"
            )
            n_t = (t_y != IGNORE).sum()
            teacher_out = {
                "teacher_bpb": (t_ce.detach() / math.log(2) / t_bytes.sum(), t_bytes.sum()),
                "teacher_loss": (t_ce.detach() / n_t, n_t),
            }
            if train_teacher:
                out = StepOutput(
                    t_ce / n_t.clamp_min(1),
                    n=int(n_t),
                    inputs={**teacher_out, "acc": None, "bpc": None, "bpb": None, "distill": None},
                )
                return out
        s_logits, ce, out = self.lm_loss(batch)
        inputs = dict(out.inputs or {})
        inputs.update(teacher_out)
        loss = ce
        if self.teacher is not None and self.loss_name != "sft":
            s_x, s_y, _ = lm_batch(batch)
            d, n = self.distill_term(s_logits, s_x, s_y, t_logits, t_x, t_y)
            inputs["distill"] = (d.detach(), n)
            loss = ce + self.alpha * d
        return out._replace(loss=loss, inputs=inputs)

    # --- the diagnostic's view ----------------------------------------------------------------------------------
    @torch.no_grad()
    def aligned_chunks(self, batch: Any) -> dict[str, Tensor]:
        """``modules.protocols.AlignedChunks``: chunk lengths between common token starts, boundary masses
        (empty without a teacher)."""
        if self.teacher is None or self.teacher_index < 0:
            return {}  # no teacher (loss=sft): nothing to align
        s_x, s_y, _ = lm_batch(batch)
        t_x, t_y, _ = self.teacher_batch(batch)
        s = self.byte_rows(self(s_x), s_x, s_y, self.tables[0], "next_first_byte")
        t = self.byte_rows(self.teacher(t_x), t_x, t_y, self.tables[1], "next_first_byte")
        i_s, _ = self.aligned(
            {"win": s["token_win"], "start": s["token_start"]},
            {"win": t["token_win"], "start": t["token_start"]},
            ("win", "start"),
        )
        win, start = s["token_win"][i_s], s["token_start"][i_s]
        ends = s["offset"].new_zeros(int(s["win"].max()) + 1 if s["win"].numel() else 0)
        ends = ends.scatter_reduce(0, s["win"], s["offset"] + 1, "amax")  # each window's end offset
        same = torch.cat([win[1:] == win[:-1], win.new_zeros(1, dtype=torch.bool)]) if win.numel() else win.bool()
        nxt = torch.where(same, torch.cat([start[1:], start.new_zeros(1)]) if win.numel() else start, ends[win])
        return {
            "chunk_lengths": (nxt - start).float(),
            "boundary_mass_student": s["boundary"][s["k"] > 0],
            "boundary_mass_teacher": t["boundary"][t["k"] > 0],
        }
