"""``build_server``: the simulated server of each method of paper 004-18 (``METHODS``)."""

from __future__ import annotations

import math
from typing import Literal, get_args

import torch

from errors import ConfigError
from modules.inkheart_sgd.marina import InkheartServer, M4Server, MarinaPServer
from modules.inkheart_sgd.servers import RennalaCycle, Server, SGDServer, SyncServer, worker_times

Method = Literal["sgd", "sync_sgd", "rennala", "randk_sync", "marina_p", "m4_inferred", "inkheart_inferred"]
METHODS: tuple[str, ...] = get_args(Method)


def build_server(
    method: Method,
    n_workers: int,
    dim: int,
    h: float = 1.0,
    kappa: float = 0.1,
    uplink_cost: bool = True,
    h_power: float = 0.0,
    k: int | None = None,
    p: float | None = None,
    downlink: Literal["permk", "randk"] = "permk",
    momentum: float = 1.0,
    m: int | None = None,
    batch: int | None = None,
    round_time: float | None = None,
    sigma2_over_eps: float = 0.0,
    generator: torch.Generator | None = None,
) -> Server:
    """The simulated server of ``method`` (``METHODS``); each one is described in the package docstring
    (``modules.inkheart_sgd``)."""
    if method not in METHODS:
        raise ConfigError(f"unknown method {method!r}: choose one of {', '.join(METHODS)}")
    if n_workers < 1:
        raise ConfigError(f"n_workers must be >= 1, got {n_workers}")
    if k is not None and not 1 <= k <= dim:
        raise ConfigError(f"k must be in [1, d] = [1, {dim}], got {k}")
    taus = worker_times(n_workers, h, h_power)
    common = dict(kappa=kappa, uplink_cost=uplink_cost, generator=generator)
    k_default = k if k is not None else math.ceil(dim / n_workers)
    if method == "sgd":
        return SGDServer(n_workers, dim, taus, **common)
    if method == "sync_sgd":
        return SyncServer(n_workers, dim, taus, **common)
    if method == "randk_sync":
        return SyncServer(n_workers, dim, taus, k=k_default, **common)
    if method == "rennala":
        b = batch if batch is not None else n_workers
        return RennalaCycle(n_workers, dim, taus, kappa, uplink_cost, b, generator)
    down = dict(p=p, downlink=downlink, down_k=k)
    if method == "marina_p":
        return MarinaPServer(n_workers, dim, taus, **down, **common)
    if method == "m4_inferred":
        return M4Server(n_workers, dim, taus, momentum=momentum, sigma2_over_eps=sigma2_over_eps, m=m, **down,
                        **common)
    return InkheartServer(n_workers, dim, taus, sigma2_over_eps=sigma2_over_eps, round_time=round_time, **down,
                          **common)

