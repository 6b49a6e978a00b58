"""The hub path on a machine that cannot reach the hub, without HF_HUB_OFFLINE: one line, at once."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from datamodules.hub import is_cached
from tests.helpers import REPO

CONFIG = REPO / "configs/causal_pieces/fashion_mnist.yaml"

# In a fresh interpreter, so that the hub libraries read HF_ENDPOINT when imported. Timed: the config's
# DataModule setting up (the hub path itself; the libraries' import is not timed), then the user's whole `fit`
# of the config (after a first parse, so that imports are not timed either).
TIMED = """
import importlib, sys, time
import datasets, yaml
from datamodules.hub import HubDataUnavailable
from main import cli_main

data = yaml.safe_load(open(sys.argv[1]))["data"]
module, _, name = data["class_path"].rpartition(".")
dm = getattr(importlib.import_module(module), name)(**data.get("init_args", {}))
start = time.perf_counter()
try:
    dm.setup("fit")
except HubDataUnavailable:
    pass
print(f"SETUP {time.perf_counter() - start:.3f}", file=sys.stderr)
assert cli_main(["fit", "--config", sys.argv[1], "--print_config"]) == 0
start = time.perf_counter()
rc = cli_main(["fit", "--config", sys.argv[1]])
print(f"FIT {time.perf_counter() - start:.3f} RC {rc}", file=sys.stderr)
"""


def test_unreachable_hub_fails_at_once_naming_the_embedded_default(paperlab_tmp: Path) -> None:
    """Without the probe, ``datasets`` retries the hub five times with back-off first: 23 s of sleeps alone
    (about 30 s in all). The data path now fails in < 3 s; the whole command (mostly parsing the config, a
    second or two on an idle machine) in < 15 s even on a loaded one."""
    with socket.socket() as s:  # a port nobody listens on: connection refused, as on a machine offline
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.update(HF_ENDPOINT=f"http://127.0.0.1:{port}", PAPERLAB_DATA_DIR=str(paperlab_tmp / "data"), CI="1",
               PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-c", TIMED, str(CONFIG)], cwd=paperlab_tmp, env=env,
                          capture_output=True, text=True, timeout=300)
    lines = proc.stderr.splitlines()
    timed = {ln.split()[0]: ln.split() for ln in lines if ln.startswith(("SETUP ", "FIT "))}
    assert set(timed) == {"SETUP", "FIT"}, proc.stderr[-3000:]
    assert float(timed["SETUP"][1]) < 3.0, proc.stderr[-3000:]
    assert float(timed["FIT"][1]) < 15.0, proc.stderr[-3000:]
    errors = [ln for ln in lines if ln.startswith("error: ")]
    assert timed["FIT"][3] == "1" and len(errors) == 1, proc.stderr[-3000:]
    assert f"the hub (http://127.0.0.1:{port}) does not answer" in errors[0]
    assert errors[0].endswith("Use the embedded default instead: configs/causal_pieces/digits.yaml (scikit-learn digits, "
                              "offline)"), errors[0]
    assert "Traceback" not in proc.stderr and "Retrying" not in proc.stderr


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
