"""Character-level language-modelling text: an offline corpus from CPython itself, or a hub corpus.

The embedded corpus is text every Python install ships: the help topics of ``pydoc_data.topics`` and the
docstrings of the standard library's top-level modules (read from the sources, never imported).
Documents are sorted by name, so the corpus and its splits are the same on every machine with the same
CPython version. Characters are bytes 0..127 (ASCII); anything else maps to ``?``.

Pipeline (``datasets``): ``Dataset.from_dict`` of documents -> ``.map`` to byte ids -> concatenate per
split ->
non-overlapping windows of ``block_size + 1`` characters -> inputs ``x = w[:-1]``, targets ``y = w[1:]``.
The windows are then served by the core's batched tensor loader (one gather per batch, DDP-sharded).
"""

from __future__ import annotations

import inspect
import re
import sysconfig
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from datamodules.base import Split, TensorDataModule
from datamodules.hub import load_hub_dataset
from errors import ConfigError

VOCAB_SIZE = 128
_UNKNOWN = ord("?")
_TRIPLE_QUOTED = re.compile(r'"""(.*?)"""', re.S)


def stdlib_documents(max_chars: int = 1_500_000) -> list[tuple[str, str]]:
    """``(name, text)`` documents: all pydoc topics, then stdlib module docstrings, up to ``max_chars``."""
    import pydoc_data.topics

    docs = [(f"topic:{k}", v) for k, v in sorted(pydoc_data.topics.topics.items())]
    total = sum(len(t) for _, t in docs)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(stdlib.glob("*.py")):
        if total >= max_chars:
            break
        # Triple-quoted strings are, in the standard library, almost all docstrings; a regex reads them
        # about 50x faster than ast.parse over the whole library.
        src = path.read_text(encoding="utf-8", errors="replace")
        parts = [inspect.cleandoc(m) for m in _TRIPLE_QUOTED.findall(src) if len(m.strip()) > 20]
        text = "\n\n".join(dict.fromkeys(parts))  # de-duplicated, in source order
        if text:
            docs.append((f"module:{path.stem}", text))
            total += len(text)
    return docs


def encode(text: str) -> np.ndarray:
    """Bytes 0..127 per character (uint8); non-ASCII characters become ``?``."""
    return np.frombuffer(text.encode("ascii", errors="replace"), dtype=np.uint8)


def decode(ids: torch.Tensor | list[int]) -> str:
    return "".join(chr(int(i)) for i in ids)


class CharTextDataModule(TensorDataModule):
    """Character-level next-token prediction: batches ``(x (B, T) long, y (B, T) long)``, y = x shifted by 1.

    Args:
        block_size: context length T.
        max_chars: character budget of the embedded corpus.
        val_fraction, test_fraction: share of the characters held out, in whole documents (deterministic).
        hub_id: a hub text corpus (for example ``"karpathy/tiny_shakespeare"``) instead of the embedded one.
        hub_config, text_column: the hub data set's config name and text column.
        batch_size, eval_batch_size, seed: see ``TensorDataModule``.
        train_chars: U, train on only the first U characters of the train stream (None: all of it); val and
            test are untouched. More than the train split holds is a ``ConfigError`` that prints its size.
    """

    dataset_name = "stdlib_text"
    splits_follow_run_seed = False  # the corpus and its document split are fixed

    def __init__(
        self,
        block_size: int = 64,
        max_chars: int = 1_500_000,
        val_fraction: float = 0.1,
        test_fraction: float = 0.1,
        hub_id: str | None = None,
        hub_config: str | None = None,
        text_column: str = "text",
        batch_size: int = 64,
        eval_batch_size: int | None = None,
        seed: int | None = 0,
        train_chars: int | None = None,
    ) -> None:
        super().__init__(batch_size=batch_size, eval_batch_size=eval_batch_size, seed=seed)
        if block_size <= 0 or max_chars <= 0:
            raise ConfigError(f"block_size and max_chars must be positive, got {block_size}, {max_chars}")
        if train_chars is not None and train_chars <= 0:
            raise ConfigError(f"train_chars must be positive (or null for the whole train split), got {train_chars}")
        if not (0 < val_fraction < 1 and 0 < test_fraction < 1 and val_fraction + test_fraction < 1):
            raise ConfigError(
                f"val_fraction={val_fraction}, test_fraction={test_fraction} must be in (0, 1), sum < 1"
            )
        self.block_size = block_size
        self.max_chars = max_chars
        self.val_fraction = val_fraction
        self.test_fraction = test_fraction
        self.hub_id = hub_id
        self.hub_config = hub_config
        self.text_column = text_column
        self.train_chars = train_chars
        if hub_id is not None:
            self.dataset_name = hub_id

    def documents(self) -> list[str]:
        if self.hub_id is None:
            return [t for _, t in stdlib_documents(self.max_chars)]
        ds = load_hub_dataset(
            self.hub_id,
            "the embedded CPython corpus (leave data.hub_id unset)",
            self.hub_config,
            split="train",
        )
        if self.text_column not in ds.column_names:
            raise ConfigError(
                f"{self.hub_id} has no column {self.text_column!r}; "
                f"set text_column to one of {ds.column_names}"
            )
        docs, total = [], 0
        for t in ds[self.text_column]:
            docs.append(t)
            total += len(t)
            if total >= self.max_chars:
                break
        if len(docs) < 3:  # one long document (tiny_shakespeare): cut it into pieces so it can be split
            text = "".join(docs)[: self.max_chars]
            step = max(1, len(text) // 100)
            docs = [text[i : i + step] for i in range(0, len(text), step)]
        return docs

    def split_documents(self) -> dict[str, list[str]]:
        """The documents of each split, ``{"train": [...], "val": [...], "test": [...]}``."""
        docs = self.documents()
        # Whole documents go to one split (no text leaks across); each next document goes to the split
        # furthest below its share of characters, so the character fractions come out close to the
        # requested ones.
        target = {
            "train": 1 - self.val_fraction - self.test_fraction,
            "val": self.val_fraction,
            "test": self.test_fraction,
        }
        chars = dict.fromkeys(target, 0)
        split_of = []
        for i, doc in enumerate(docs):
            total = sum(chars.values()) + len(doc)
            name = min(target, key=lambda k: (chars[k] + len(doc)) / total - target[k]) if i else "train"
            chars[name] += len(doc)
            split_of.append(name)
        return {name: [d for d, s in zip(docs, split_of) if s == name] for name in target}

    def streams(self) -> dict[str, Tensor]:
        """Each split's character stream (documents joined, each followed by a newline), int64 ids; the train
        stream cut to its first ``train_chars`` characters."""
        import datasets

        per_split = self.split_documents()
        docs = [d for name in ("train", "val", "test") for d in per_split[name]]
        split_of = [name for name in ("train", "val", "test") for _ in per_split[name]]
        ds = datasets.Dataset.from_dict({"text": docs, "split": split_of})
        bars = datasets.is_progress_bar_enabled()
        datasets.disable_progress_bars()
        try:
            ds = ds.map(
                lambda b: {"ids": [encode(t) for t in b["text"]]}, batched=True, remove_columns=["text"]
            )
            ds = ds.with_format("numpy")
            ids, splits = ds["ids"], ds["split"]
        finally:
            if bars:
                datasets.enable_progress_bars()
        out: dict[str, Tensor] = {}
        newline = np.array([ord("\n")], dtype=np.uint8)
        for name in ("train", "val", "test"):
            rows = [np.concatenate([r, newline]) for r, s in zip(ids, splits) if s == name]
            out[name] = torch.from_numpy(np.concatenate(rows).astype(np.int64))
        if self.train_chars is not None:
            size = out["train"].numel()
            if self.train_chars > size:
                raise ConfigError(
                    f"train_chars={self.train_chars} exceeds the train split's {size} characters; "
                    f"set data.train_chars <= {size} (or raise max_chars)"
                )
            out["train"] = out["train"][: self.train_chars]
        return out

    def build_splits(self) -> dict[str, Split]:
        out: dict[str, Split] = {}
        w = self.block_size + 1
        for name, stream in self.streams().items():
            n_win = (stream.numel() - 1) // self.block_size
            if n_win == 0:
                raise ConfigError(f"the {name} split has fewer than {w} characters; lower block_size")
            idx = torch.arange(n_win)[:, None] * self.block_size + torch.arange(w)[None, :]
            windows = stream[idx]
            out[name] = (windows[:, :-1].contiguous(), windows[:, 1:].contiguous())
        return out

    @property
    def input_shape(self) -> tuple[int, ...]:
        return (self.block_size,)

    @property
    def num_classes(self) -> int:
        """Next-character targets: one class per vocabulary entry."""
        return VOCAB_SIZE

    @property
    def vocab_size(self) -> int:
        return VOCAB_SIZE
