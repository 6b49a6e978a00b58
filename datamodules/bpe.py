"""Byte-level BPE tokenizers, trained offline with Hugging Face ``tokenizers`` and cached on disk.

Shared by the data (``datamodules.bpe_text`` encodes windows with them) and by the methods that need each
token's bytes (cross-tokenizer distillation): it lives in a data file without a DataModule, so a method may
import it (``docs/design.md``, floors).

A tokenizer of vocabulary ``V`` is GPT-2's byte-level BPE: the 256 single bytes (ids by the trainer's
order) plus ``V - 256`` merges learnt on the training text, no special tokens, so every id is a byte string
and every text has exactly one encoding. ``token_bytes[i]`` is read from the byte-level alphabet map
(GPT-2's ``bytes_to_unicode``: each byte is stored as one printable character), not from ``decode([i])``,
which would turn an incomplete UTF-8 sequence into U+FFFD.

Cache: ``$PAPERLAB_CACHE_DIR/bpe/`` (default ``~/.cache/paperlab/bpe/``), one JSON file per (vocabulary,
training text, ``tokenizers`` version), written atomically under a file lock, so sweep workers that start
together train it once.
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

from errors import ConfigError

#: bump when the training recipe changes, so cached tokenizers of the old recipe are not reused
RECIPE = 1
N_BYTES = 256


def cache_dir() -> Path:
    return Path(os.environ.get("PAPERLAB_CACHE_DIR", Path.home() / ".cache" / "paperlab")) / "bpe"


@functools.lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's map of the 256 bytes to printable characters (what a byte-level BPE vocabulary is spelt in):
    printable Latin-1 bytes map to themselves, the others to code points from 256 upwards, in byte order."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {b: chr(b) for b in keep}, 0
    for b in range(N_BYTES):
        if b not in chars:
            chars[b] = chr(N_BYTES + extra)
            extra += 1
    return dict(sorted(chars.items()))


class BPETokenizer:
    """A trained byte-level BPE: ``encode(text) -> list[int]``, ``token_bytes`` per id, ``vocab_size``."""

    def __init__(self, tokenizer: object, key: str = "") -> None:
        from tokenizers import Tokenizer

        assert isinstance(tokenizer, Tokenizer)
        self.tokenizer = tokenizer
        self.key = key  # the cache key: what it was trained on, with which recipe
        byte_of = {c: b for b, c in bytes_to_unicode().items()}
        vocab = tokenizer.get_vocab(with_added_tokens=False)
        self.vocab_size = len(vocab)
        if sorted(vocab.values()) != list(range(self.vocab_size)):
            raise ConfigError("the BPE vocabulary's ids are not 0..V-1; delete the cache folder " + str(cache_dir()))
        spelled = [""] * self.vocab_size
        for tok, i in vocab.items():
            spelled[i] = tok
        self.token_bytes: list[bytes] = [bytes(byte_of[c] for c in tok) for tok in spelled]

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self.tokenizer.encode_batch(list(texts))]

    def decode_bytes(self, ids: Sequence[int]) -> bytes:
        return b"".join(self.token_bytes[i] for i in ids)


def _train(vocab_size: int, texts: Sequence[str]) -> object:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        show_progress=False,
        special_tokens=[],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return tok


def train_bpe(vocab_size: int, texts: Sequence[str]) -> BPETokenizer:
    """The byte-level BPE of ``vocab_size`` ids trained on ``texts`` (from the cache when it is there)."""
    import tokenizers
    from filelock import FileLock
    from tokenizers import Tokenizer

    if vocab_size <= N_BYTES:
        raise ConfigError(f"a byte-level BPE vocabulary needs more than {N_BYTES} ids (the bytes), got {vocab_size}")
    digest = hashlib.sha256()
    for t in texts:
        digest.update(t.encode("utf-8"))
        digest.update(b"\0")
    key = f"v{vocab_size}-r{RECIPE}-tk{tokenizers.__version__}-{digest.hexdigest()[:20]}"
    folder = cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{key}.json"
    with FileLock(str(path) + ".lock"):
        if not path.is_file():
            tok = _train(vocab_size, texts)
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            tok.save(str(tmp))  # type: ignore[attr-defined]
            os.replace(tmp, path)
    out = BPETokenizer(Tokenizer.from_file(str(path)), key)
    if out.vocab_size != vocab_size:
        raise ConfigError(
            f"the training text supports only {out.vocab_size} BPE ids, not {vocab_size}; lower the vocabulary"
        )
    return out
