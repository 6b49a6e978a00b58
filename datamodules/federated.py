"""A labelled data set split among federated clients: Dirichlet label skew, local train/val/test per client.

A stratified share of every class (``test_pool_fraction``, 30 % by default) is held out first as the *test
pool*; the rest is partitioned among ``n_clients`` by ``datamodules.partition.dirichlet_partition``, and
``val_fraction`` of each client's samples is held out as its local validation set. Client ``i``'s test set
is ``client_test_size`` draws (50 by default) from the pool, each an independent draw from the client's own
label distribution ``pi_i`` (the label shares of its local samples): a class ``c ~ pi_i``, then a pool sample
of class ``c`` uniformly, i.e. with replacement. The test pool is disjoint from every client's training and
validation data; clients with overlapping labels may share pool samples.

Why not the CRAFT authors' local 80/20 split: with Dirichlet(0.1) sizes it gives test sets of 2-80 samples
(median ~12) on digits, whose binomial noise alone explains the measured spread of client accuracies. Why
with replacement: the count of correct answers is then exactly ``Binomial(n, p_i)`` given the model, with
``p_i`` the accuracy on the client's label mixture over the pool, which is what the noise correction of
``ClientAccuracy`` assumes; without replacement from a class pool barely larger than ``n`` it would be
hypergeometric, with much less variance, and the correction would over-subtract. What it does not remove:
the pool's own finite size (about 54 digits per class) is an error shared by every client that weights a
class alike. The global test set is the union of the clients' test sets (every client counted equally).

Batches:

- train: one *federation* per step, ``(x, y, offsets)`` with the clients' training samples sorted by
  client (client ``i`` holds rows ``offsets[i]:offsets[i + 1]``), yielded ``rounds_per_epoch`` times per
  epoch and given whole to every process (a federated method splits the clients, not the samples);
- val / test / predict: ``(x, y, client)`` batches of the union of the local sets, sharded across
  processes like every paperlab loader.

Sources: ``digits`` (scikit-learn's 1797 8x8 digits, offline, the default) or, at paper scale, CIFAR-10 /
CIFAR-100 from the hub (``uoft-cs/cifar10``, ``uoft-cs/cifar100``; train and test splits pooled before
partitioning, channel-normalised), which fail offline with one line naming the embedded default.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from datamodules.base import BatchedTensorLoader, EpochSetter, PaperlabDataModule
from datamodules.digits import load_digits_tensors
from datamodules.hub import load_hub_dataset
from datamodules.partition import dirichlet_partition
from errors import ConfigError

EMBEDDED_DEFAULT = "configs/craft/digits_craft.yaml (scikit-learn digits, 20 clients)"
HUB = {"cifar10": ("uoft-cs/cifar10", "label", 10), "cifar100": ("uoft-cs/cifar100", "fine_label", 100)}
CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2470, 0.2435, 0.2616)


class FederationLoader:
    """Yields the whole federation ``(x, y, offsets)`` ``rounds`` times: one federated round per step."""

    def __init__(self, federation: tuple[Tensor, Tensor, Tensor], rounds: int) -> None:
        self.federation = federation
        self.rounds = rounds
        self.epoch = 0
        self.sampler = EpochSetter(self)  # Lightning's set_epoch hook; the rounds are seeded by the module
        self.batch_sampler = None

    def __len__(self) -> int:
        return self.rounds

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor, Tensor]]:
        for _ in range(self.rounds):
            yield self.federation


class FederatedDataModule(PaperlabDataModule):
    """Clients with Dirichlet(alpha) label skew, each with local train / val / test data.

    Args:
        source: ``digits`` (embedded), ``cifar10`` or ``cifar100`` (hub, paper scale).
        n_clients: number of clients.
        alpha: Dirichlet concentration of the label skew (0.1: strongly non-IID).
        min_size: every client holds at least this many samples (the partition is redrawn until it does).
        test_pool_fraction: share of every class held out (stratified, before partitioning) as the pool the
            clients' test sets are drawn from.
        client_test_size: test samples per client, drawn with replacement from the pool with the client's
            label distribution (at least 2, for the noise-corrected spread).
        val_fraction: share of each client's samples held out as local validation; 0 validates on the
            clients' test sets (the authors' practice; checkpoint selection then sees the test data).
        partition_seed: seed of the partition and the local splits (None: the run's ``seed_everything``, so
            that seeds replicate over partitions too).
        rounds_per_epoch: federated rounds per training epoch (validation runs after each epoch).
        eval_batch_size: batch size of validation and test.
        image_shape: digits as ``(1, 8, 8)`` images for convolutional networks (CIFAR is always images).
    """

    dataset_name = "federated"

    def __init__(
        self,
        source: Literal["digits", "cifar10", "cifar100"] = "digits",
        n_clients: int = 20,
        alpha: float = 0.1,
        min_size: int = 10,
        test_pool_fraction: float = 0.3,
        client_test_size: int = 50,
        val_fraction: float = 0.1,
        partition_seed: int | None = None,
        rounds_per_epoch: int = 10,
        eval_batch_size: int = 512,
        image_shape: bool = False,
    ) -> None:
        super().__init__()
        if source not in ("digits", *HUB):
            raise ConfigError(f"source must be one of ['digits', 'cifar10', 'cifar100'], got {source!r}")
        if n_clients < 1:
            raise ConfigError(f"n_clients must be at least 1, got {n_clients}")
        if not alpha > 0:
            raise ConfigError(f"alpha must be positive (the Dirichlet concentration), got {alpha}")
        if not 0 < test_pool_fraction < 1 or not 0 <= val_fraction < 1:
            raise ConfigError(
                f"test_pool_fraction must lie in (0, 1) and val_fraction in [0, 1), got {test_pool_fraction}, {val_fraction}"
            )
        if client_test_size < 2:
            raise ConfigError(f"client_test_size must be at least 2 (the noise correction needs it), got {client_test_size}")
        needed = 2 if val_fraction > 0 else 1
        if min_size < needed:
            raise ConfigError(
                f"min_size={min_size}: every client needs at least {needed} samples (local train"
                f"{', val' if val_fraction > 0 else ''}); raise min_size"
            )
        if rounds_per_epoch < 1 or eval_batch_size < 1:
            raise ConfigError(f"rounds_per_epoch and eval_batch_size must be positive, got {rounds_per_epoch}, {eval_batch_size}")
        self.source = source
        self.n_clients = n_clients
        self.alpha = alpha
        self.min_size = min_size
        self.test_pool_fraction = test_pool_fraction
        self.client_test_size = client_test_size
        self.val_fraction = val_fraction
        self.fixed_partition_seed = partition_seed
        self.rounds_per_epoch = rounds_per_epoch
        self.eval_batch_size = eval_batch_size
        self.image_shape = image_shape
        self.dataset_name = source
        self.splits: dict[str, tuple[Tensor, ...]] | None = None
        self.client_sizes: Tensor | None = None
        self.pool_indices: Tensor | None = None
        self.indices: dict[str, Tensor] = {}  # every split's rows of the source (test rows repeat: with replacement)

    # --- data ---------------------------------------------------------------------------------------------

    @property
    def partition_seed(self) -> int:
        """The seed of the partition and the local splits: ``partition_seed``, else the run's seed."""
        return self.seed_or_run(self.fixed_partition_seed)
    def load_source(self) -> tuple[Tensor, Tensor]:
        """All samples of the source: ``(x (N, ...), y (N,))``."""
        if self.source == "digits":
            x, y = load_digits_tensors()
            return (x.view(-1, 1, 8, 8) if self.image_shape else x), y
        hub_id, label_key, _ = HUB[self.source]
        parts = [load_hub_dataset(hub_id, EMBEDDED_DEFAULT, split=s) for s in ("train", "test")]
        xs, ys = [], []
        for ds in parts:
            images = np.stack([np.asarray(im.convert("RGB")) for im in ds["img"]])
            xs.append(torch.from_numpy(images).permute(0, 3, 1, 2).float() / 255.0)
            ys.append(torch.as_tensor(ds[label_key]).long())
        x = torch.cat(xs)
        mean, std = torch.tensor(CIFAR_MEAN).view(1, 3, 1, 1), torch.tensor(CIFAR_STD).view(1, 3, 1, 1)
        return (x - mean) / std, torch.cat(ys)

    def local_splits(self, indices: Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """One client's ``(train, val)`` index sets from its samples (a seeded shuffle, then a cut)."""
        idx = indices[torch.randperm(len(indices), generator=generator)]
        n_val = max(1, round(self.val_fraction * len(idx))) if self.val_fraction > 0 else 0
        if len(idx) - n_val < 1:
            raise ConfigError(f"a client with {len(idx)} samples has none left to train on; raise min_size")
        return idx[n_val:], idx[:n_val]

    def test_pool(self, y: Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """``(pool, rest)``: a stratified ``test_pool_fraction`` of every class, and the other indices."""
        pool, rest = [], []
        for c in torch.unique(y).tolist():
            idx = torch.nonzero(y == c).flatten()
            idx = idx[torch.randperm(len(idx), generator=generator)]
            k = round(self.test_pool_fraction * len(idx))
            if not 0 < k < len(idx):
                raise ConfigError(
                    f"test_pool_fraction={self.test_pool_fraction} leaves class {c} ({len(idx)} samples) with an "
                    "empty test pool or no training data; choose a fraction nearer 0.3"
                )
            pool.append(idx[:k])
            rest.append(idx[k:])
        return torch.cat(pool).sort().values, torch.cat(rest).sort().values

    def client_test(self, labels: Tensor, pool_labels: Tensor, generator: torch.Generator) -> Tensor:
        """``client_test_size`` positions in the pool, each drawn independently from the label distribution
        of ``labels`` (the client's samples): probability ``pi(c) / |pool of class c|`` per pool sample."""
        classes = int(max(int(labels.max()), int(pool_labels.max()))) + 1
        share = torch.bincount(labels, minlength=classes).double() / len(labels)
        per_class = torch.bincount(pool_labels, minlength=classes).double()
        prob = share[pool_labels] / per_class[pool_labels]
        return torch.multinomial(prob, self.client_test_size, replacement=True, generator=generator)

    def setup(self, stage: str | None = None) -> None:
        if self.splits is not None:
            return
        x, y = self.load_source()
        gen = torch.Generator().manual_seed(self.partition_seed)
        pool, rest = self.test_pool(y, gen)
        parts = dirichlet_partition(y[rest], self.n_clients, self.alpha, self.min_size, generator=gen)
        train, val, test = [], [], []
        for client, local in enumerate(parts):
            indices = rest[local]
            tr, va = self.local_splits(indices, gen)
            te = pool[self.client_test(y[indices], y[pool], gen)]
            train.append(tr)
            val.append((va, torch.full((len(va),), client)))
            test.append((te, torch.full((len(te),), client)))
        sizes = torch.tensor([len(t) for t in train])
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), sizes.cumsum(0)])
        tr_idx = torch.cat(train)

        def labelled(pieces: list[tuple[Tensor, Tensor]]) -> tuple[Tensor, Tensor, Tensor]:
            idx = torch.cat([p[0] for p in pieces])
            return x[idx], y[idx], torch.cat([p[1] for p in pieces]).long()

        self.client_sizes = sizes
        self.pool_indices = pool
        self.indices = {"train": tr_idx, "val": torch.cat([p[0] for p in val]), "test": torch.cat([p[0] for p in test])}
        self.splits = {"train": (x[tr_idx], y[tr_idx], offsets), "test": labelled(test)}
        self.splits["val"] = labelled(val) if self.val_fraction > 0 else self.splits["test"]

    # --- loaders ------------------------------------------------------------------------------------------
    def _world(self) -> tuple[int, int]:
        trainer = self.trainer
        return (0, 1) if trainer is None else (trainer.global_rank, trainer.world_size)

    def _split(self, name: str) -> tuple[Tensor, ...]:
        self.setup()
        assert self.splits is not None
        return self.splits["test" if name == "predict" else name]

    def train_dataloader(self) -> FederationLoader:
        return FederationLoader(self._split("train"), self.rounds_per_epoch)  # type: ignore[arg-type]

    def _eval_loader(self, name: str) -> BatchedTensorLoader:
        rank, world = self._world()
        return BatchedTensorLoader(self._split(name), self.eval_batch_size, rank=rank, world_size=world)

    def val_dataloader(self) -> BatchedTensorLoader:
        return self._eval_loader("val")

    def test_dataloader(self) -> BatchedTensorLoader:
        return self._eval_loader("test")

    def predict_dataloader(self) -> BatchedTensorLoader:
        return self._eval_loader("predict")

    # --- sizes linked into the model ----------------------------------------------------------------------
    @property
    def input_shape(self) -> tuple[int, ...]:
        if self.source != "digits":
            return (3, 32, 32)
        return (1, 8, 8) if self.image_shape else (64,)

    @property
    def num_features(self) -> int:
        return int(torch.Size(self.input_shape).numel())

    @property
    def num_classes(self) -> int:
        return 10 if self.source == "digits" else HUB[self.source][2]
