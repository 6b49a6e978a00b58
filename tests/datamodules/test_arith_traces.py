"""The arithmetic-trace task: splits, sequence format, teacher statistics, preference pairs."""

from __future__ import annotations

import pytest
import torch

from datamodules.arith_traces import ArithTracesDataModule
from datamodules.arith_vocab import END_THINK, EOS, PAIRS, THINK, answers, prompt_ids


@pytest.mark.parametrize("op", ["max", "sum_mod10"])
def test_splits_pairs_and_teacher_statistics(op):
    dm = ArithTracesDataModule(seed=3, op=op)
    dm.setup()
    s = dm.splits
    ids = {k: set(prompt_ids(v[0]).tolist()) for k, v in s.items()}
    assert [len(ids[k]) for k in ("train", "val", "test")] == [800, 100, 100]
    assert sum(len(v) for v in ids.values()) == len(set.union(*ids.values()))  # disjoint
    prompts, y, seq, y_neg, rows = s["train"]
    assert prompts.shape == (6400, 3) and seq.shape == (6400, 10)
    assert torch.equal(y, answers(prompts, op)) and (y_neg != y).all() and (y_neg < 10).all()
    assert len(set(torch.cat([v[4] for v in s.values()]).tolist())) == 6600  # row ids unique
    # brute-force reference for the answer
    ref = [max(p) if op == "max" else sum(p) % 10 for p in prompts.tolist()]
    assert y.tolist() == ref
    think = seq[:, 5] != END_THINK
    assert (seq[:, 4] == THINK).all() and abs(think.float().mean().item() - 0.5) < 0.03
    t_seq, t_p = seq[think], prompts[think]
    assert (t_seq[:, 9] == EOS).all() and (seq[~think][:, 7] == EOS).all()
    # s1 is the chosen pair's result with prob. 0.7 (a slip otherwise), y follows from s1 and the third digit
    f = (lambda u, v: torch.maximum(u, v)) if op == "max" else (lambda u, v: (u + v) % 10)
    idx = torch.tensor(PAIRS)[t_seq[:, 5] - 13]
    pick = lambda c: t_p.gather(1, idx[:, c : c + 1]).squeeze(1)  # noqa: E731
    s1_ok = t_seq[:, 6] == f(pick(0), pick(1))
    assert abs(s1_ok.float().mean().item() - 0.7) < 0.03  # 4.5 standard errors of 3200 draws
    assert torch.equal(t_seq[:, 8], f(t_seq[:, 6], pick(2)))
    n_ok = seq[~think][:, 6] == y[~think]
    assert abs(n_ok.float().mean().item() - 0.2) < 0.03


def test_seeded_and_validated():
    a, b = ArithTracesDataModule(seed=1), ArithTracesDataModule(seed=1)
    a.setup(), b.setup()
    assert all(torch.equal(x, z) for x, z in zip(a.splits["train"], b.splits["train"]))
    c = ArithTracesDataModule()
    c.run_seed = 1  # seed None follows the run's seed (the CLI sets it from seed_everything)
    c.setup()
    assert c.seed == 1 and all(torch.equal(x, z) for x, z in zip(a.splits["val"], c.splits["val"]))
    with pytest.raises(ValueError, match="op"):
        ArithTracesDataModule(op="product")
    with pytest.raises(ValueError, match="trace_acc"):
        ArithTracesDataModule(trace_acc=1.5)
