"""CharTextDataModule: the offline CPython corpus, deterministic splits, shifted targets, offline hub path."""

from __future__ import annotations

import pytest
import torch

from datamodules.hub import HubDataUnavailable
from datamodules.text import VOCAB_SIZE, CharTextDataModule, decode, encode, stdlib_documents


def test_encode_decode():
    ids = encode("ab\n\u00e9z")
    assert ids.tolist() == [97, 98, 10, ord("?"), 122]
    assert decode(ids) == "ab\n?z"


def test_corpus_is_real_cpython_text():
    docs = stdlib_documents(max_chars=600_000)
    names = [n for n, _ in docs]
    topics = [n for n in names if n.startswith("topic:")]
    modules = [n for n in names if n.startswith("module:")]
    assert len(topics) > 50 and modules and names == sorted(topics) + sorted(modules)
    assert 600_000 <= sum(len(t) for _, t in docs) < 700_000  # stops soon after the budget
    text = "".join(t for _, t in docs)
    assert "def" in text and "the" in text


def test_splits_shift_and_determinism():
    dm = CharTextDataModule(block_size=32, max_chars=300_000)
    dm.setup()
    for name in ("train", "val", "test"):
        x, y = dm.splits[name]
        assert x.shape == y.shape and x.shape[1] == 32 and x.dtype == torch.long
        assert torch.equal(x[:, 1:], y[:, :-1])  # y is x shifted by one character
        assert torch.equal(x[1:, 0], y[:-1, -1])  # consecutive windows continue the stream
        assert 0 <= x.min() and x.max() < VOCAB_SIZE
    n_train, n_val = len(dm.splits["train"][0]), len(dm.splits["val"][0])
    assert n_train > 5 * n_val > 0
    again = CharTextDataModule(block_size=32, max_chars=300_000)
    again.setup()
    assert torch.equal(again.splits["val"][0], dm.splits["val"][0])
    assert dm.num_classes == VOCAB_SIZE


def test_val_documents_are_not_in_train():
    dm = CharTextDataModule(block_size=64, max_chars=300_000)
    dm.setup()
    train_text = "".join(decode(r) for r in dm.splits["train"][0][:, :1].flatten().split(1))  # cheap probe
    train_windows = {decode(r) for r in dm.splits["train"][0][:2000]}
    val_windows = {decode(r) for r in dm.splits["val"][0][:500]}
    assert (
        train_text and len(train_windows & val_windows) <= 5
    )  # boilerplate lines may repeat, documents don't


def test_hub_path_offline_names_the_embedded_default(hub_offline):
    dm = CharTextDataModule(hub_id="karpathy/tiny_shakespeare")
    with pytest.raises(HubDataUnavailable, match="embedded CPython corpus"):
        dm.setup()


def test_bad_arguments():
    with pytest.raises(ValueError, match="block_size"):
        CharTextDataModule(block_size=0)
    with pytest.raises(ValueError, match="val_fraction"):
        CharTextDataModule(val_fraction=0.6, test_fraction=0.5)


def test_a_null_seed_shuffles_with_the_run_seed():
    from datamodules.base import run_seed_context

    def first_batch(seed: int | None, run_seed: int) -> torch.Tensor:
        with run_seed_context(run_seed):
            dm = CharTextDataModule(block_size=32, max_chars=100_000, batch_size=4, seed=seed)
        dm.setup()
        return next(iter(dm.loader("train", shuffle=True)))[0]

    assert torch.equal(first_batch(None, 3), first_batch(3, 0))  # null: the run's seed
    assert not torch.equal(first_batch(None, 3), first_batch(None, 4))
    assert torch.equal(first_batch(0, 3), first_batch(0, 4))  # a fixed seed ignores the run's
