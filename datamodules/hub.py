"""The paper-scale data path: Hugging Face hub data sets through ``datasets.load_dataset``.

Every default experiment runs on embedded data; this path is for paper-scale runs on a machine with
access to the hub. All downloads are cached under one directory (``PAPERLAB_DATA_DIR``, default
``~/.cache/paperlab/datasets``). Offline, or when the hub refuses, the call fails with one clear line that
names the embedded default to use instead.

Failing fast: offline without saying so (no ``HF_HUB_OFFLINE``), ``datasets`` would retry the hub five
times with back-off, about 30 s, before failing. So the hub is probed first with one request of at most
``PAPERLAB_HUB_TIMEOUT_S`` seconds (default 2): no answer and no cached copy of the data set is the one-line
error at once; a cached copy is loaded as ``datasets`` does offline (slowly, after its retries: set
``HF_HUB_OFFLINE=1`` to skip them).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from errors import ConfigError, PaperlabError


class HubDataUnavailable(PaperlabError, RuntimeError):
    """The hub data set could not be loaded (offline, unknown id, ...)."""


def data_cache_dir() -> Path:
    return Path(os.environ.get("PAPERLAB_DATA_DIR", Path.home() / ".cache" / "paperlab" / "datasets"))


def hub_timeout_s() -> float:
    """How long the hub has to answer the probe (``PAPERLAB_HUB_TIMEOUT_S``, default 2 s)."""
    value = os.environ.get("PAPERLAB_HUB_TIMEOUT_S", "2")
    try:
        return float(value)
    except ValueError:
        raise ConfigError(f"PAPERLAB_HUB_TIMEOUT_S must be a number of seconds, got {value!r}") from None


def hub_answers(endpoint: str, timeout_s: float) -> str | None:
    """None if ``endpoint`` answers an HTTP request within ``timeout_s`` (any status: it is reachable), else why
    not. The request goes through ``huggingface_hub``'s own HTTP client, so its proxies and settings count;
    it runs in a thread, since name resolution honours no time-out."""
    from huggingface_hub import get_session

    outcome: list[str | None] = []

    def probe() -> None:
        try:
            get_session().head(endpoint, timeout=timeout_s, follow_redirects=False)
            outcome.append(None)
        except Exception as err:  # noqa: BLE001 - any failure to reach the hub means the same here
            outcome.append(f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}")

    thread = threading.Thread(target=probe, name="paperlab-hub-probe", daemon=True)
    thread.start()
    thread.join(timeout_s + 0.5)
    return outcome[0] if outcome else f"no answer within {timeout_s:g} s"


def is_cached(hub_id: str, cache: Path) -> bool:
    """Whether ``datasets`` holds a prepared copy of ``hub_id`` under ``cache`` (what it falls back to when the
    hub cannot be reached: ``<namespace>___<name>/<config>/<version>/<hash>/``)."""
    from datasets.naming import camelcase_to_snakecase

    *namespace, name = hub_id.split("/")
    folder = cache / "___".join([*namespace, camelcase_to_snakecase(name)])
    return any(p.is_dir() for p in folder.glob("*/*/*"))


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
    # offline declared: datasets fails (or reads its cache) at once; else probe before its retries
    if not datasets.config.HF_HUB_OFFLINE and not is_cached(hub_id, cache):
        why = hub_answers(datasets.config.HF_ENDPOINT, hub_timeout_s())
        if why is not None:
            raise HubDataUnavailable(
                f"could not load the hub data set {hub_id!r}: the hub ({datasets.config.HF_ENDPOINT}) does not "
                f"answer ({why[:160]}); this machine may be offline. Use the embedded default instead: "
                f"{embedded_default}"
            )
    try:
        return datasets.load_dataset(hub_id, config_name, split=split, cache_dir=str(cache), **kwargs)
    except Exception as err:  # noqa: BLE001 - every failure mode of the hub ends in the same advice
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise HubDataUnavailable(
            f"could not load the hub data set {hub_id!r} ({type(err).__name__}: {reason[:200]}); "
            f"this machine may be offline. Use the embedded default instead: {embedded_default}"
        ) from None
