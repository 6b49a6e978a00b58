"""The language of the arithmetic-traces task (paper 000-14, BVPO): its vocabulary, prompts, answers and the
two sequence formats. Shared by the DataModule that draws the teacher's data (``datamodules.arith_traces``)
and the method that scores sequences in it (``modules.bvpo``); holds no DataModule.

Vocabulary (18 tokens): digits 0-9, BOS, THINK, END_THINK, three pair tokens P_ab, P_ac, P_bc, EOS, PAD.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from errors import ConfigError

N_DIGITS = 10
BOS, THINK, END_THINK, P_AB, P_AC, P_BC, EOS, PAD = range(10, 18)
VOCAB_SIZE = 18
SEQ_LEN = 10
#: operand pairs (i, j) of each pair token and the remaining operand k
PAIRS = ((0, 1, 2), (0, 2, 1), (1, 2, 0))
N_TRACES = 3 * N_DIGITS


def all_prompts() -> Tensor:
    """The 1000 prompts (a, b, c), prompt id = 100 a + 10 b + c."""
    ids = torch.arange(1000)
    return torch.stack([ids // 100, (ids // 10) % 10, ids % 10], 1)


def prompt_ids(prompts: Tensor) -> Tensor:
    return prompts[:, 0] * 100 + prompts[:, 1] * 10 + prompts[:, 2]


OPS = {"max": torch.maximum, "sum_mod10": lambda u, v: (u + v) % N_DIGITS}


def operation(op: str) -> Callable[[Tensor, Tensor], Tensor]:
    if op not in OPS:
        raise ConfigError(f"op must be one of {sorted(OPS)}, got {op!r}")
    return OPS[op]


def answers(prompts: Tensor, op: str = "max") -> Tensor:
    """y* = a o b o c."""
    f = operation(op)
    return f(f(prompts[:, 0], prompts[:, 1]), prompts[:, 2])


def thinking_seqs(prompts: Tensor, pair: Tensor, s1: Tensor, y: Tensor) -> Tensor:
    """``(N, 10)`` thinking sequences for pair index ``pair`` in 0..2, partial sum ``s1``, answer ``y``."""
    n = prompts.shape[0]
    col = lambda v: torch.full((n, 1), v, dtype=torch.long, device=prompts.device)  # noqa: E731
    return torch.cat([col(BOS), prompts, col(THINK), (P_AB + pair)[:, None], s1[:, None], col(END_THINK),
                      y[:, None], col(EOS)], 1)


def nothink_seqs(prompts: Tensor, y: Tensor) -> Tensor:
    """``(N, 10)`` no-thinking sequences (padded with PAD after EOS)."""
    n = prompts.shape[0]
    col = lambda v: torch.full((n, 1), v, dtype=torch.long, device=prompts.device)  # noqa: E731
    tail = [col(THINK), col(END_THINK), y[:, None], col(EOS), col(PAD), col(PAD)]
    return torch.cat([col(BOS), prompts, *tail], 1)
