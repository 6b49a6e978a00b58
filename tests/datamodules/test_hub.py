"""The hub path on a machine that cannot reach the hub, without HF_HUB_OFFLINE: one line, at once."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest

from datamodules.hub import is_cached
from tests.helpers import REPO, forked

CONFIG = REPO / "configs/causal_pieces/fashion_mnist.yaml"


def _timed_fit(config: str, cwd: str, env: dict[str, str], out: str, err: str) -> None:
    """In a process forked from the session's fork server (tests.helpers.forked: torch, Lightning and MLflow
    imported, the hub libraries not), with the environment of a machine that cannot reach the hub: the hub
    libraries read HF_ENDPOINT when they are imported, so they are imported here, after it is set. Timed: the
    config's DataModule setting up (the hub path itself; the libraries' import is not timed), then the user's
    whole ``fit`` of the config (after a first parse, so that imports are not timed either)."""
    import importlib
    import time

    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    for fd, path in ((1, out), (2, err)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(target, fd)
        os.close(target)
    early = sorted(m for m in ("datasets", "huggingface_hub") if m in sys.modules)
    assert not early, f"the fork server imported {early} before HF_ENDPOINT was set: this test needs run_main"
    import datasets  # noqa: F401
    import yaml

    from datamodules.hub import HubDataUnavailable
    from main import cli_main

    data = yaml.safe_load(open(config))["data"]
    module, _, name = data["class_path"].rpartition(".")
    dm = getattr(importlib.import_module(module), name)(**data.get("init_args", {}))
    start = time.perf_counter()
    try:
        dm.setup("fit")
    except HubDataUnavailable:
        pass
    print(f"SETUP {time.perf_counter() - start:.3f}", file=sys.stderr)
    assert cli_main(["fit", "--config", config, "--print_config"]) == 0
    start = time.perf_counter()
    rc = cli_main(["fit", "--config", config])
    print(f"FIT {time.perf_counter() - start:.3f} RC {rc}", file=sys.stderr, flush=True)


def test_unreachable_hub_fails_at_once_naming_the_embedded_default(paperlab_tmp: Path, fork_server: None) -> None:
    """Without the probe, ``datasets`` retries the hub five times with back-off first: 23 s of sleeps alone
    (about 30 s in all). The data path now fails in < 3 s; the whole command (mostly parsing the config, a
    second or two on an idle machine) in < 15 s even on a loaded one."""
    with socket.socket() as s:  # a port nobody listens on: connection refused, as on a machine offline
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.update(HF_ENDPOINT=f"http://127.0.0.1:{port}", PAPERLAB_DATA_DIR=str(paperlab_tmp / "data"), CI="1",
               PYTHONPATH=str(REPO))
    out, err = paperlab_tmp / "stdout", paperlab_tmp / "stderr"
    proc = forked(_timed_fit, str(CONFIG), str(paperlab_tmp), env, str(out), str(err))
    proc.join(300)
    stderr = err.read_text()
    assert proc.exitcode == 0, stderr[-3000:]
    lines = stderr.splitlines()
    timed = {ln.split()[0]: ln.split() for ln in lines if ln.startswith(("SETUP ", "FIT "))}
    assert set(timed) == {"SETUP", "FIT"}, stderr[-3000:]
    assert float(timed["SETUP"][1]) < 3.0, stderr[-3000:]
    assert float(timed["FIT"][1]) < 15.0, stderr[-3000:]
    errors = [ln for ln in lines if ln.startswith("error: ")]
    assert timed["FIT"][3] == "1" and len(errors) == 1, stderr[-3000:]
    assert f"the hub (http://127.0.0.1:{port}) does not answer" in errors[0]
    assert errors[0].endswith("Use the embedded default instead: configs/causal_pieces/digits.yaml (scikit-learn digits, "
                              "offline)"), errors[0]
    assert "Traceback" not in stderr and "Retrying" not in stderr


@pytest.mark.parametrize("hub_id", ["zalando-datasets/fashion_mnist", "nielsr/CelebA-faces", "tiny_shakespeare"])
def test_a_cached_copy_is_recognised_as_datasets_recognises_it(hub_id: str, tmp_path: Path) -> None:
    """A cached copy skips the probe (datasets falls back to it when the hub does not answer): ``is_cached``
    agrees with datasets' own fallback, ``CachedDatasetModuleFactory``, before and after a copy exists."""
    from datasets.load import CachedDatasetModuleFactory
    from datasets.naming import camelcase_to_snakecase

    def datasets_finds_it() -> bool:
        try:
            CachedDatasetModuleFactory(hub_id, cache_dir=str(tmp_path)).get_module()
        except FileNotFoundError:
            return False
        return True

    assert not is_cached(hub_id, tmp_path) and not datasets_finds_it()
    *namespace, name = hub_id.split("/")
    (tmp_path / "___".join([*namespace, camelcase_to_snakecase(name)]) / "default" / "0.0.0" / "0123abcd").mkdir(parents=True)
    assert is_cached(hub_id, tmp_path) and datasets_finds_it()
