"""The paper-scale data path: Hugging Face hub data sets through ``datasets.load_dataset``.

Every default experiment runs on embedded data; this path is for paper-scale runs on a machine with
access to the hub. All downloads are cached under one directory (``PAPERLAB_DATA_DIR``, default
``~/.cache/paperlab/datasets``). Offline, or when the hub refuses, the call fails with one clear line that
names the embedded default to use instead.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from errors import PaperlabError


class HubDataUnavailable(PaperlabError, RuntimeError):
    """The hub data set could not be loaded (offline, unknown id, ...)."""


def data_cache_dir() -> Path:
    return Path(os.environ.get("PAPERLAB_DATA_DIR", Path.home() / ".cache" / "paperlab" / "datasets"))


def load_hub_dataset(
    hub_id: str,
    embedded_default: str,
    config_name: str | None = None,
    split: str | None = None,
    **kwargs: Any,
) -> Any:
    """``datasets.load_dataset(hub_id, config_name, split=split)`` cached under ``data_cache_dir()``.

    Args:
        hub_id: the data set's hub id, for example ``"zalando-datasets/fashion_mnist"``.
        embedded_default: the offline alternative to name in the error, for example
            ``"configs/causal_pieces/digits.yaml (scikit-learn digits)"``.
    """
    import datasets

    cache = data_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    try:
        return datasets.load_dataset(hub_id, config_name, split=split, cache_dir=str(cache), **kwargs)
    except Exception as err:  # noqa: BLE001 - every failure mode of the hub ends in the same advice
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise HubDataUnavailable(
            f"could not load the hub data set {hub_id!r} ({type(err).__name__}: {reason[:200]}); "
            f"this machine may be offline. Use the embedded default instead: {embedded_default}"
        ) from None
