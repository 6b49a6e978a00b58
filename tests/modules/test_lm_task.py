"""``CausalLMTask`` (bits per byte over padded BPE windows and character windows) and ``load_lm``."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from errors import ConfigError
from modules.components.lm_task import IGNORE, CausalLMTask, load_lm
from modules.components.tiny_gpt import TinyGPT


class _LM(CausalLMTask):
    paper_id = "test"
    monitor = "val/bpb"
    monitor_mode = "min"


def _tiny(shape: tuple[int, ...], n: int) -> TinyGPT:
    return TinyGPT(shape, n, n_layer=1, n_head=2, n_embd=16, norm="rmsnorm")


def _bpe_batch(gen: torch.Generator, lengths: list[int], width: int = 12, vocab: int = 40) -> tuple[torch.Tensor, ...]:
    x = torch.zeros(len(lengths), width, dtype=torch.long)
    y = torch.full((len(lengths), width), IGNORE, dtype=torch.long)
    for i, n in enumerate(lengths):
        toks = torch.randint(0, vocab, (n,), generator=gen)
        x[i, :n] = toks
        y[i, : n - 1] = toks[1:]
    n_bytes = torch.randint(5, 30, (len(lengths),), generator=gen)
    return x, y, n_bytes


def test_bpb_is_target_bits_over_bytes() -> None:
    torch.manual_seed(0)
    task = _LM(net=_tiny, input_shape=(12,), num_classes=40)
    gen = torch.Generator().manual_seed(1)
    batches = [_bpe_batch(gen, [7, 12, 3]), _bpe_batch(gen, [5, 9])]
    bits = total_bytes = 0.0
    for x, y, n_bytes in batches:
        task._run_step((x, y, n_bytes), "val")
        with torch.no_grad():
            logp = task.net(x).log_softmax(-1)  # the full padded width: causal, so the cut changes nothing
        for i in range(len(x)):  # a naive loop over the real targets
            for t in range(x.shape[1]):
                if y[i, t] != IGNORE:
                    bits -= float(logp[i, t, y[i, t]]) / math.log(2)
        total_bytes += float(n_bytes.sum())
    values = task.epoch_metrics("val")
    assert values["val/bpb"].item() == pytest.approx(bits / total_bytes, rel=1e-5)
    n_targets = sum(int((b[1] != IGNORE).sum()) for b in batches)
    assert values["val/bpc"].item() == pytest.approx(bits / n_targets, rel=1e-5)  # bits per token


def test_character_batches_count_one_byte_per_target() -> None:
    torch.manual_seed(0)
    task = _LM(net=_tiny, input_shape=(8,), num_classes=128)
    text = b"def f(x): return x  # abcdefghij!"  # ASCII: one byte per character, counted by hand: 32 targets
    ids = torch.tensor(list(text))
    x, y = ids[:32].reshape(4, 8), ids[1:33].reshape(4, 8)
    task._run_step((x, y), "test")
    values = task.epoch_metrics("test")
    with torch.no_grad():
        nll = -task.net(x).log_softmax(-1).gather(2, y[..., None]).sum() / math.log(2)
    assert values["test/bpb"].item() == pytest.approx(float(nll) / 32, rel=1e-5)
    assert values["test/bpb"].item() == pytest.approx(values["test/bpc"].item(), rel=1e-6)


def test_load_lm_rebuilds_the_network(tmp_path: Path) -> None:
    torch.manual_seed(0)
    x = torch.randint(0, 40, (2, 12))
    spec = {
        "class_path": "modules.components.tiny_gpt.TinyGPT",
        "init_args": {"n_layer": 1, "n_head": 2, "n_embd": 16, "norm": "rmsnorm"},
    }
    for net in (_tiny, "modules.components.lm_task.default_lm"):
        task = _LM(net=_tiny, input_shape=(12,), num_classes=40)
        hp = dict(task.hparams)
        hp["net"] = spec if net is _tiny else net
        if net is not _tiny:  # a module-level factory named in the checkpoint
            task = _LM(input_shape=(12,), num_classes=40)
        path = tmp_path / "m.ckpt"
        torch.save({"hyper_parameters": hp, "state_dict": task.state_dict()}, path)
        lm = load_lm(path)
        assert isinstance(lm, TinyGPT) and not lm.training
        with torch.no_grad():
            assert torch.equal(lm(x), task.net.eval()(x))
    with pytest.raises(ConfigError, match="does not exist"):
        load_lm(tmp_path / "missing.ckpt")
    torch.save(
        {"hyper_parameters": {"net": "<lambda>", "input_shape": (12,), "num_classes": 40}, "state_dict": {}}, path
    )
    with pytest.raises(ConfigError, match="cannot rebuild"):
        load_lm(path)


def test_a_scheduler_steps_once_per_optimiser_step() -> None:
    # language models are budgeted in steps (one long epoch): a cosine's T_max must count steps, not epochs
    task = _LM(lambda shape, n: _tiny(shape, n), (8,), 40,
               lr_scheduler=lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=100))
    assert task.configure_optimizers()["lr_scheduler"]["interval"] == "step"
