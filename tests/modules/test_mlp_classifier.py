"""The reference method: the shared SupervisedTask trains, predicts probabilities and fails clearly."""

from __future__ import annotations

import lightning as L
import pytest
import torch
import torch.nn.functional as F

from datamodules.yinyang import YinYangDataModule
from modules.mlp_classifier import MLPClassifier
from tests.helpers import mlp_net


def test_forward_predict_and_training_reduces_the_loss() -> None:
    L.seed_everything(0)
    dm = YinYangDataModule(train_size=600, val_size=100, test_size=100, batch_size=50)
    model = MLPClassifier(net=mlp_net([32], init="default"), input_shape=(4,), num_classes=3,
                          optimizer=lambda p: torch.optim.AdamW(p, lr=0.02))
    x, y = dm._split("train")
    before = F.cross_entropy(model(x), y).item()
    trainer = L.Trainer(max_epochs=5, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(model, dm)
    assert F.cross_entropy(model(x), y).item() < 0.8 * before
    probs = model.predict_step((x[:7],), 0)
    assert probs.shape == (7, 3) and torch.allclose(probs.sum(-1), torch.ones(7))
    with torch.no_grad():
        xv, yv = dm._split("val")
        acc = (model(xv).argmax(-1) == yv).float().mean().item()
    assert trainer.callback_metrics["val/acc"].item() == pytest.approx(acc)


def test_data_of_another_size_names_the_fix() -> None:
    model = MLPClassifier(input_shape=(4,), num_classes=3)
    with pytest.raises(ValueError, match="expects 4 input features per sample, got 64"):
        model.step((torch.zeros(2, 64), torch.zeros(2, dtype=torch.long)), "train")
    with pytest.raises(ValueError, match="loss must be one of"):
        MLPClassifier(loss="hinge")


@pytest.mark.slow
def test_default_configs_reach_95_percent(paperlab_tmp) -> None:
    """The README's claim: >= 95 % test accuracy on Yin-Yang and digits from the default configs."""
    from main import cli_main
    from tests.helpers import REPO, runs_of

    for name in ("yinyang", "digits"):
        config = REPO / f"configs/mlp_classifier/{name}.yaml"
        assert cli_main(["fit", "--config", str(config)]) == 0
        assert cli_main(["test", "--config", str(config), "--ckpt_path", "best"]) == 0
    accs = {r.info.run_name: r.data.metrics["test/acc"] for r in runs_of("mlp_classifier")}
    assert accs["yinyang"] >= 0.95 and accs["digits"] >= 0.95, accs
