"""BPE language-modelling text: the character corpus of ``datamodules.text`` cut into byte windows and
tokenized by one or several byte-level BPEs (``datamodules.bpe``), the same windows for every tokenizer.

The byte stream is ``CharTextDataModule``'s (ASCII; a non-ASCII character is ``?``), so bits per byte of a
BPE model and bits per character of a character model measure the same stream. Each split's stream is cut
into non-overlapping windows of ``window_bytes`` bytes (the remainder dropped); every window is encoded
alone, so its first byte starts a token for every tokenizer. For tokenizer ``k`` a window of ``n`` tokens
``t_0 .. t_{n-1}`` becomes ``x = (t_0 .. t_{n-1})`` and ``y = (t_1 .. t_{n-1}, -100)``, both padded to
``L_k`` (the longest window of any split) with 0 in ``x`` and -100 in ``y``; ``n_bytes`` is the number of
bytes the targets cover (the window minus its first token). The logits at the last real position follow
the whole window, which a cross-tokenizer loss needs (the next token's first byte).

A batch is the flat tuple ``(x_0, y_0, n_bytes_0, x_1, y_1, n_bytes_1, ...)`` in the order of
``tokenizer_vocabs``. The tokenizers are trained on the whole train split (before ``train_chars`` cuts it),
so a tokenizer does not change with the training budget. Encoded windows are cached beside the tokenizers
(``$PAPERLAB_CACHE_DIR/bpe/windows/``), keyed on the text, the tokenizers and the window width.
"""

from __future__ import annotations

import hashlib
import os

import torch

from datamodules.base import Split
from datamodules.bpe import BPETokenizer, cache_dir, train_bpe
from datamodules.text import CharTextDataModule, encode
from errors import ConfigError

IGNORE = -100


class BPETextDataModule(CharTextDataModule):
    """Byte windows tokenized by each of ``tokenizer_vocabs``' BPEs (see the module docstring).

    Args:
        tokenizer_vocabs: the vocabulary sizes of the byte-level BPEs (each > 256); the first one's sizes are
            the linked ``vocab_size``/``num_classes`` and ``block_size``/``input_shape`` (its ``L_0``).
        window_bytes: W, bytes per window.
        max_chars, val_fraction, test_fraction, hub_id, hub_config, text_column, batch_size,
            eval_batch_size, seed, train_chars: see ``CharTextDataModule`` (``train_chars`` cuts the train
            byte stream before windowing).
    """

    dataset_name = "stdlib_text_bpe"

    def __init__(
        self,
        tokenizer_vocabs: list[int] = [512],  # noqa: B006 - jsonargparse reads the default; never mutated
        window_bytes: int = 256,
        max_chars: int = 1_500_000,
        val_fraction: float = 0.1,
        test_fraction: float = 0.1,
        hub_id: str | None = None,
        hub_config: str | None = None,
        text_column: str = "text",
        batch_size: int = 32,
        eval_batch_size: int | None = None,
        seed: int | None = 0,
        train_chars: int | None = None,
    ) -> None:
        super().__init__(
            block_size=max(window_bytes, 1),
            max_chars=max_chars,
            val_fraction=val_fraction,
            test_fraction=test_fraction,
            hub_id=hub_id,
            hub_config=hub_config,
            text_column=text_column,
            batch_size=batch_size,
            eval_batch_size=eval_batch_size,
            seed=seed,
            train_chars=train_chars,
        )
        if not tokenizer_vocabs:
            raise ConfigError("tokenizer_vocabs needs at least one vocabulary size, e.g. [512]")
        if window_bytes < 2:
            raise ConfigError(f"window_bytes must be at least 2, got {window_bytes}")
        self.tokenizer_vocabs = [int(v) for v in tokenizer_vocabs]
        self.window_bytes = window_bytes
        self._tokenizers: list[BPETokenizer] | None = None
        self._documents: dict[str, list[str]] | None = None
        self._lengths: list[int] | None = None
        if hub_id is not None:
            self.dataset_name = f"{hub_id} (bpe)"

    def split_documents(self) -> dict[str, list[str]]:
        """The parent's split documents, read once (the tokenizers and the streams both need them)."""
        if self._documents is None:
            self._documents = super().split_documents()
        return self._documents

    @property
    def tokenizers(self) -> list[BPETokenizer]:
        """The trained tokenizers, in the order of ``tokenizer_vocabs`` (trained or read from the cache once)."""
        if self._tokenizers is None:
            train_docs = [encode(d).tobytes().decode("ascii") for d in self.split_documents()["train"]]
            self._tokenizers = [train_bpe(v, train_docs) for v in self.tokenizer_vocabs]
        return self._tokenizers

    def build_splits(self) -> dict[str, Split]:
        w = self.window_bytes
        texts: dict[str, list[str]] = {}
        for name, stream in self.streams().items():
            n_win = stream.numel() // w
            if n_win == 0:
                raise ConfigError(f"the {name} split has fewer than {w} bytes; lower window_bytes")
            raw = stream[: n_win * w].to(torch.uint8).numpy().tobytes().decode("ascii")
            texts[name] = [raw[i * w : (i + 1) * w] for i in range(n_win)]
        digest = hashlib.sha256(f"{w}|{'|'.join(t.key for t in self.tokenizers)}".encode())
        for name in ("train", "val", "test"):
            digest.update("".join(texts[name]).encode("ascii") + b"\0")
        path = cache_dir() / "windows" / f"{digest.hexdigest()[:24]}.pt"
        if path.is_file():  # the windows of this text, these tokenizers and this width, encoded before
            cached = torch.load(path, weights_only=True)
            self._lengths = cached["lengths"]
            return {name: tuple(cached[name]) for name in ("train", "val", "test")}
        encoded = {name: [tok.encode_batch(t) for tok in self.tokenizers] for name, t in texts.items()}
        self._lengths = [
            max(len(ids) for name in encoded for ids in encoded[name][k]) for k in range(len(self.tokenizers))
        ]
        out: dict[str, Split] = {}
        for name, per_tok in encoded.items():
            tensors: list[torch.Tensor] = []
            for k, rows in enumerate(per_tok):
                length, spelled = self._lengths[k], self.tokenizers[k].token_bytes
                x = torch.zeros(len(rows), length, dtype=torch.long)
                y = torch.full((len(rows), length), IGNORE, dtype=torch.long)
                n_bytes = torch.empty(len(rows), dtype=torch.long)
                for i, ids in enumerate(rows):
                    t = torch.tensor(ids, dtype=torch.long)
                    x[i, : len(ids)] = t
                    y[i, : len(ids) - 1] = t[1:]
                    n_bytes[i] = w - len(spelled[ids[0]])
                tensors += [x, y, n_bytes]
            out[name] = tuple(tensors)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        torch.save({"lengths": self._lengths, **{name: list(t) for name, t in out.items()}}, tmp)
        os.replace(tmp, path)
        return out

    def token_bytes(self) -> list[list[bytes]]:
        """``modules.protocols.ProvidesTokenBytes``: each tokenizer's byte string per id."""
        return [tok.token_bytes for tok in self.tokenizers]

    @property
    def token_lengths(self) -> list[int]:
        """``L_k``: the padded length of each tokenizer's windows."""
        self.setup()
        assert self._lengths is not None
        return list(self._lengths)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return (self.token_lengths[0],)

    @property
    def block_size(self) -> int:  # type: ignore[override]
        return self.token_lengths[0]

    @block_size.setter
    def block_size(self, value: int) -> None:
        """Ignored: the parent's constructor sets its character window; here the windows are bytes."""

    @property
    def num_classes(self) -> int:
        return self.tokenizer_vocabs[0]

    @property
    def vocab_size(self) -> int:
        return self.tokenizer_vocabs[0]
