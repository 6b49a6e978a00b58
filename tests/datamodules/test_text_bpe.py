"""Byte-level BPE (``datamodules.bpe``), ``BPETextDataModule`` and ``CharTextDataModule(train_chars=...)``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from datamodules.bpe import N_BYTES, bytes_to_unicode, train_bpe
from datamodules.bpe_text import IGNORE, BPETextDataModule
from datamodules.text import CharTextDataModule
from errors import ConfigError

CORPUS = [
    "def f(x):\n    return x + 1\n",
    "The quick brown fox jumps over the lazy dog. " * 20,
    "for i in range(10):\n    print(i, i * i)\n" * 10,
    "naïve café — Größe, 日本語のテキスト, emoji 🙂 ok " * 5,
]


@pytest.fixture
def bpe_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PAPERLAB_CACHE_DIR", str(tmp_path))
    return tmp_path / "bpe"


def test_alphabet_map_is_a_bijection_of_the_256_bytes() -> None:
    m = bytes_to_unicode()
    assert sorted(m) == list(range(N_BYTES)) and len(set(m.values())) == N_BYTES
    assert m[ord("a")] == "a" and m[ord(" ")] == "Ġ"  # GPT-2's spelling of a space


def test_token_bytes_concatenate_to_the_utf8_bytes(bpe_cache: Path) -> None:
    tok = train_bpe(300, CORPUS)
    assert tok.vocab_size == 300 and len(tok.token_bytes) == 300
    assert {b for b in tok.token_bytes if len(b) == 1} == {bytes([i]) for i in range(N_BYTES)}
    assert max(len(b) for b in tok.token_bytes) > 3  # merges were learnt
    for text in [*CORPUS, "unseen: Ωmega ∑ x² \t\n", "é" * 7, "🙂🙂"]:
        ids = tok.encode(text)
        assert b"".join(tok.token_bytes[i] for i in ids) == text.encode("utf-8")
    # a multi-byte character may be split across tokens: token_bytes keeps the raw bytes (decode would not)
    assert any(len(b) < 4 and b and b[0] >= 0x80 for b in tok.token_bytes)


def test_tokenizer_is_cached(bpe_cache: Path) -> None:
    first = train_bpe(280, CORPUS)
    files = list(bpe_cache.glob("*.json"))
    assert len(files) == 1
    again = train_bpe(280, CORPUS)
    assert again.token_bytes == first.token_bytes and list(bpe_cache.glob("*.json")) == files
    with pytest.raises(ConfigError, match="more than 256"):
        train_bpe(256, CORPUS)


def _small(**kw: object) -> BPETextDataModule:
    args = {"max_chars": 60_000, "window_bytes": 64, "tokenizer_vocabs": [300, 400]}
    return BPETextDataModule(**{**args, **kw})  # type: ignore[arg-type]


def test_bpe_windows_are_the_same_bytes_for_every_tokenizer(bpe_cache: Path) -> None:
    dm = _small()
    dm.setup()
    chars = CharTextDataModule(max_chars=60_000).streams()
    lengths = dm.token_lengths
    assert dm.input_shape == (lengths[0],) and dm.block_size == lengths[0]
    assert dm.num_classes == dm.vocab_size == 300
    for name, split in dm.splits.items():
        stream = chars[name]
        assert len(split) == 6 and split[0].shape[0] == stream.numel() // 64
        for k, tok in enumerate(dm.tokenizers):
            x, y, n_bytes = split[3 * k : 3 * k + 3]
            assert x.shape == y.shape == (len(n_bytes), lengths[k])
            for i in (0, 1, len(x) - 1):
                n = int((y[i] != IGNORE).sum()) + 1  # tokens in the window
                window = bytes(stream[i * 64 : (i + 1) * 64].tolist())
                assert tok.decode_bytes(x[i, :n].tolist()) == window
                assert torch.equal(y[i, : n - 1], x[i, 1:n]) and (y[i, n - 1 :] == IGNORE).all()
                assert int(n_bytes[i]) == len(tok.decode_bytes(y[i, : n - 1].tolist()))
                assert int(n_bytes[i]) == 64 - len(tok.token_bytes[int(x[i, 0])])
    alone = _small(tokenizer_vocabs=[400])
    alone.setup()
    assert torch.equal(alone.splits["val"][0], dm.splits["val"][3]) and alone.token_lengths == lengths[1:]


def test_train_chars_cuts_only_the_train_stream() -> None:
    full = CharTextDataModule(max_chars=60_000).streams()
    cut = CharTextDataModule(max_chars=60_000, train_chars=10_000).streams()
    assert cut["train"].numel() == 10_000 and torch.equal(cut["train"], full["train"][:10_000])
    assert torch.equal(cut["val"], full["val"]) and torch.equal(cut["test"], full["test"])
    dm = CharTextDataModule(max_chars=60_000, block_size=32, train_chars=10_000)
    dm.setup()
    assert dm.splits["train"][0].shape[0] == (10_000 - 1) // 32
    size = full["train"].numel()
    with pytest.raises(ConfigError, match=f"train split's {size} characters"):
        CharTextDataModule(max_chars=60_000, train_chars=size + 1).setup()
    with pytest.raises(ConfigError, match="train_chars must be positive"):
        CharTextDataModule(train_chars=0)
