"""ErrorLadder: per-level metrics after every level, the table and figure, unsupported modules."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from lightning.pytorch.loggers import Logger

from callbacks.error_ladder import ErrorLadder
from datamodules.signal_ladder import SignalLadderDataModule
from errors import ConfigError
from modules.compression_error.tasks import CompressionLadder
from modules.mlp_classifier import MLPClassifier
from tracking.tables import table_csv


class ListLogger(Logger):
    """Collects every logged metric dict."""

    def __init__(self) -> None:
        super().__init__()
        self.logged: list[tuple[int, dict]] = []

    @property
    def name(self) -> str:
        return "list"

    @property
    def version(self) -> str:
        return "0"

    def log_hyperparams(self, *args, **kwargs) -> None:
        pass

    def log_metrics(self, metrics, step=None) -> None:
        self.logged.append((step, dict(metrics)))


def test_logs_each_level_and_builds_table_and_figure():
    dm = SignalLadderDataModule(kind="procedural", size=16, n_test=2, n_calib=2, steps_per_epoch=30, seed=0)
    model = CompressionLadder(family="grid", levels=[3, 5, 9], input_shape=(4, 16, 16, 1),
                              optimizer=lambda p: torch.optim.Adam(p, lr=0.05))
    cb = ErrorLadder()
    logger = ListLogger()
    trainer = L.Trainer(max_epochs=3, logger=logger, callbacks=[cb], enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(model, dm)
    diag = [m for _, m in logger.logged if any(k.startswith("diag/error_ladder/") for k in m)]
    assert len(diag) == 3  # one measurement per level
    assert set(diag[0]) == {"diag/error_ladder/true_0"}
    assert {"diag/error_ladder/true_1", "diag/error_ladder/bound_0", "diag/error_ladder/rho_calib",
            "diag/error_ladder/coverage"} <= set(diag[1])
    assert "diag/error_ladder/pred_0" in diag[2]  # three levels: the signal-specific prediction exists
    # the logged true error of the last level is the test signals' mean RMS error
    sig, calib = dm.signals()
    fit = model.fits()[-1]
    ref = (fit - sig).pow(2).flatten(1).mean(1).sqrt()[~calib].mean()
    assert diag[2]["diag/error_ladder/true_2"] == pytest.approx(float(ref), rel=1e-5)
    rows = table_csv(cb.table()).strip().splitlines()
    assert rows[0].startswith("signal,role,level") and len(rows) == 1 + 4 * 3
    assert rows[-1].split(",")[1:3] == ["test", "9"]
    fig = cb.figure()
    assert fig is not None and len(fig.axes) == 5


def test_unsupported_module_fails_with_the_method_to_implement():
    cb = ErrorLadder()
    model = MLPClassifier(input_shape=(4,), num_classes=3)
    with pytest.raises(ConfigError, match=r"error_ladder\(batch\)"):
        cb.setup(L.Trainer(logger=False), model, "fit")
