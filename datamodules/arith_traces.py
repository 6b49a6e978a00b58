"""Procedural reasoning task for BVPO (paper 000-14): three digits in, one digit out, with traces.

Prompt x = (a, b, c), digits; answer y* = a o b o c for a binary operation o: ``op="max"`` (default) or
``op="sum_mod10"`` (the spec's (a + b + c) mod 10). Why max by default: from scratch, the tiny GPT sits on
the chance plateau of modular addition for thousands of steps (grokking), while it learns max in about
100 steps, and the estimator problem BVPO is about does not depend on the operation. All 1000 prompts,
split 800 / 100 / 100
(train / val / test, seeded). Vocabulary (18 tokens): digits 0-9, BOS, THINK, END_THINK, three pair
tokens P_ab, P_ac, P_bc, EOS, PAD. Sequences:
  thinking     BOS a b c THINK P s1 END_THINK y EOS       (trace r = (P, s1): 3 x 10 = 30 traces)
  no thinking  BOS a b c THINK END_THINK y EOS            (empty trace, as chat templates do with
                                                           thinking disabled)
Teacher (the SFT data, one fresh draw per training row): with prob. ``p_think`` a thinking sequence with
P uniform, s1 = a_i o a_j for the chosen pair with prob. ``trace_acc`` else a uniformly wrong digit (a
slip), y = s1 o (remaining digit) (a slip can give a wrong answer); otherwise a no-thinking sequence
whose y is correct with prob. ``nothink_acc`` else uniformly wrong. Traces are genuinely random and
reasoning genuinely helps: by default the teacher's partial result is right w.p. 0.7 and its answer
without thinking w.p. 0.2, so the SFT policy is a reasoning model whose no-thinking mode is poor (as when a
reasoning model's thinking is switched off) and whose empty-trace branch starts far from the thinking
marginal. (With 0.8 / 0.6, the earlier default, the two modes end up nearly interchangeable after a few
DPO steps, so the empty branch is almost the marginal gradient and there is little left to trade off.)

Each row is ``(prompt (3,), y_star, teacher_seq (10,), y_minus, row_id)``: DPO pairs are (x, y+ = y*,
y- = a uniformly wrong digit drawn per row); ``row_id`` keys the model's trace sampling so that it is a
pure function of (step, row). Training rows repeat every train prompt ``copies`` times with fresh
teacher draws and fresh y-.
"""

from __future__ import annotations

import torch
from torch import Tensor

from datamodules.arith_vocab import (
    N_DIGITS,
    PAIRS,
    all_prompts,
    answers,
    nothink_seqs,
    operation,
    thinking_seqs,
)
from datamodules.base import TensorDataModule, seeded_split
from errors import ConfigError


def wrong_digit(y: Tensor, gen: torch.Generator) -> Tensor:
    """A uniformly drawn digit different from ``y``."""
    return (y + torch.randint(1, N_DIGITS, y.shape, generator=gen)) % N_DIGITS


def teacher_sequences(prompts: Tensor, gen: torch.Generator, p_think: float = 0.5, trace_acc: float = 0.8,
                      nothink_acc: float = 0.6, op: str = "max") -> Tensor:
    """One teacher draw per prompt (see the module docstring)."""
    f = operation(op)
    n = prompts.shape[0]
    pair = torch.randint(0, 3, (n,), generator=gen)
    idx = torch.tensor(PAIRS)[pair]  # (n, 3): i, j, k
    pick = lambda col: prompts.gather(1, idx[:, col : col + 1]).squeeze(1)  # noqa: E731
    s1_true = f(pick(0), pick(1))
    slip = torch.rand(n, generator=gen) >= trace_acc
    s1 = torch.where(slip, wrong_digit(s1_true, gen), s1_true)
    think = thinking_seqs(prompts, pair, s1, f(s1, pick(2)))
    y_star = answers(prompts, op)
    miss = torch.rand(n, generator=gen) >= nothink_acc
    plain = nothink_seqs(prompts, torch.where(miss, wrong_digit(y_star, gen), y_star))
    use_think = torch.rand(n, generator=gen) < p_think
    return torch.where(use_think[:, None], think, plain)


class ArithTracesDataModule(TensorDataModule):
    """Prompts, answers, teacher reasoning traces and preference pairs (see the module docstring).

    Args:
        batch_size: global training batch size (rows = prompt + teacher sequence + preference pair).
        eval_batch_size: batch size of validation and test (held-out prompts).
        seed: seed of the split, the teacher draws, the rejected answers and the shuffling; None: the run's
            seed (``seed_everything``), so that a seed study varies the data as well as the initialisation.
        copies: training rows per train prompt (fresh teacher draw and y- each).
        p_think: teacher's probability of a thinking sequence.
        trace_acc: probability that the teacher's partial sum s1 is right (a slip makes y wrong).
        nothink_acc: probability that the teacher's no-thinking answer is right.
        op: the operation o, "max" or "sum_mod10".
    """

    dataset_name = "arith_traces"

    def __init__(
        self,
        batch_size: int = 64,
        eval_batch_size: int | None = 100,
        seed: int | None = None,
        copies: int = 8,
        p_think: float = 0.5,
        trace_acc: float = 0.7,
        nothink_acc: float = 0.2,
        op: str = "max",
    ) -> None:
        super().__init__(batch_size, eval_batch_size, seed)
        if copies < 1:
            raise ConfigError(f"copies must be >= 1, got {copies}")
        for name, p in (("p_think", p_think), ("trace_acc", trace_acc), ("nothink_acc", nothink_acc)):
            if not 0.0 <= p <= 1.0:
                raise ConfigError(f"{name} is a probability in [0, 1], got {p}")
        operation(op)
        self.op = op
        self.copies = copies
        self.p_think, self.trace_acc, self.nothink_acc = p_think, trace_acc, nothink_acc

    def build_splits(self) -> dict[str, tuple[Tensor, ...]]:
        gen = torch.Generator().manual_seed(self.seed)
        train_idx, val_idx, test_idx = seeded_split(1000, [800, 100, 100], self.seed)
        prompts = all_prompts()
        out, offset = {}, 0
        parts = (("train", train_idx, self.copies), ("val", val_idx, 1), ("test", test_idx, 1))
        for name, idx, reps in parts:
            p = prompts[idx.sort().values].repeat(reps, 1)
            y = answers(p, self.op)
            seq = teacher_sequences(p, gen, self.p_think, self.trace_acc, self.nothink_acc, self.op)
            rows = torch.arange(offset, offset + p.shape[0])
            offset += p.shape[0]
            out[name] = (p, y, seq, wrong_digit(y, gen), rows)
        return out

    @property
    def num_classes(self) -> int:
        return N_DIGITS
