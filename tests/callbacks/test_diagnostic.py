"""The diagnostic base: one Schedule, one emit path, state keyed by arguments, capability checks, presets."""

from __future__ import annotations

import math
from pathlib import Path

import lightning as L
import pytest
import torch
from torch import nn

from callbacks.diagnostic import Diagnostic, Moment, Schedule
from errors import ConfigError
from modules.protocols import PerSampleLoss
from tests.helpers import REPO


def test_schedule_steps_by_hand():
    assert Schedule(every_n_steps=4).steps(12) == [0, 4, 8, 12]
    assert Schedule(at_fit_start=False, every_n_steps=5).steps(11) == [5, 10]
    # log-spaced: the steps round(10^(k/n)), n per decade
    for n in (2, 4, 10):
        expected = sorted({round(10 ** (k / n)) for k in range(3 * n + 1)})
        assert Schedule(at_fit_start=False, log_spaced=n).steps(1000) == expected
    assert Schedule(at_fit_start=False, log_spaced=4).steps(100) == [1, 2, 3, 6, 10, 18, 32, 56, 100]
    assert Schedule(every_n_steps=50, log_spaced=2).steps(100) == [0, 1, 3, 10, 32, 50, 100]
    assert Schedule(every_n_epochs=2).due_epoch(4) and not Schedule(every_n_epochs=2).due_epoch(3)
    with pytest.raises(ConfigError, match="every_n_steps"):
        Schedule(every_n_steps=-1)


class _Norm(Diagnostic):
    """|W|^2 of every Linear layer: a sum over ranks would double it, so its reduction is None."""

    name = "norm"

    def __init__(self, schedule: Schedule = Schedule(every_n_steps=2), scale: float = 1.0,
                 if_unsupported="error", plot=False, max_history=3) -> None:
        super().__init__(schedule, if_unsupported, plot, max_history)
        self.scale = scale

    def measure(self, trainer, pl_module, moment: Moment):
        return {"sq": self.scale * sum(float(m.weight.pow(2).sum()) for m in pl_module.modules()
                                       if isinstance(m, nn.Linear))}


class _Needs(Diagnostic):
    name = "needs"
    requires = (PerSampleLoss,)

    def measure(self, trainer, pl_module, moment):
        return {"x": 1.0}


class _Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(3, 2)

    def training_step(self, batch, i):
        return self.net(batch[0]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(32, 3)), batch_size=4)


class _Capture(L.pytorch.loggers.Logger):
    name, version = "capture", "0"

    def __init__(self) -> None:
        super().__init__()
        self.logged: list[tuple[int, dict]] = []

    def log_metrics(self, metrics, step=None):
        self.logged.append((step, dict(metrics)))

    def log_hyperparams(self, params, *args, **kwargs):
        pass


def _fit(callbacks, steps=6, logger=None):
    model = _Tiny()
    trainer = L.Trainer(max_steps=steps, logger=logger or False, callbacks=callbacks, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model)
    return trainer, model


def test_measures_at_the_schedule_emits_once_and_keeps_a_bounded_history():
    logger = _Capture()
    cb = _Norm()
    trainer, model = _fit([cb], steps=6, logger=logger)
    assert [h["step"] for h in cb.history] == [2, 4, 6]  # fit start (0) dropped: max_history is 3
    logged = [(s, m) for s, m in logger.logged if "diag/norm/sq" in m]
    assert [s for s, _ in logged] == [0, 2, 4, 6]
    assert logged[-1][1]["diag/norm/sq"] == pytest.approx(float(model.net.weight.pow(2).sum()))
    assert trainer.callback_metrics["diag/norm/sq"].item() == pytest.approx(logged[-1][1]["diag/norm/sq"])


def test_state_key_includes_the_arguments_so_two_instances_keep_their_own_state():
    a, b = _Norm(scale=1.0), _Norm(scale=2.0)
    assert a.state_key != b.state_key and a.state_key == _Norm(scale=1.0).state_key
    trainer, _ = _fit([a, b], steps=2)
    states = {cb.state_key: cb.state_dict() for cb in (a, b)}
    fresh_a, fresh_b = _Norm(scale=1.0), _Norm(scale=2.0)
    fresh_b.load_state_dict(states[fresh_b.state_key])
    fresh_a.load_state_dict(states[fresh_a.state_key])
    assert fresh_b.history[-1]["sq"] == pytest.approx(2 * fresh_a.history[-1]["sq"])


def test_missing_capability_is_one_line_or_is_skipped_once(caplog):
    with pytest.raises(ConfigError, match=r"_Needs needs _Tiny.per_sample_loss\(batch\)"):
        _fit([_Needs(Schedule(every_n_steps=1))], steps=1)
    cb = _Needs(Schedule(every_n_steps=1), if_unsupported="skip")
    with caplog.at_level("INFO"):
        _fit([cb], steps=3)
    assert cb.history == [] and not cb.active
    assert sum("is off for this run" in r.getMessage() for r in caplog.records) == 1


def test_a_schedule_that_never_measures_is_refused():
    with pytest.raises(ConfigError, match="never measure"):
        _Norm(Schedule(at_fit_start=False))


def _smoke(method: str) -> list[str]:
    return ["--config", str(REPO / f"tests/conf/{method}.yaml")]


# (preset, experiment, overrides, the diagnostics the preset must add there). Each case runs at its method's
# smoke size where the method has one (tests/conf/<method>.yaml, as in its smoke fit; its own diagnostics keep
# the experiment's settings): the full-size piece count and piece maps of causal pieces, BVPO's evaluation
# batches of 100 prompts and the 1.5M-character corpus of the tiny GPT (max_chars 100k: the 465k characters of the
# pydoc topics, which the corpus always holds whole) were most of these cases' time.
# The default suite keeps one case of each kind: economy on an experiment without diagnostics of its own, so
# that both of its diagnostics run (on the tiny GPT, which configures both, the preset added nothing); full
# where all of its diagnostics apply (the MLP); full where the experiment configures one of the preset's
# diagnostics, which keeps the experiment's settings, and the others say once that they are off (causal
# pieces' spiking net, run in that method's smoke fit: tests/test_cli.py, SMOKE_PRESETS). The slow ones are
# further instances of those kinds.
PRESET_CASES = [
    ("economy", "flip_lipschitz/digits", _smoke("flip_lipschitz"), ("weight_drift", "activations")),
    ("full", "mlp_classifier/yinyang", [], ("weight_drift", "activations", "grad_var")),
    # slow: the same kind as the MLP's case (the whole preset through the CLI) and the two below (a preset's
    # diagnostic the experiment configures keeps the experiment's settings), on a transformer; its fit with
    # figures was a third of weight drift's share of the default suite
    pytest.param("full", "weight_drift/tiny_gpt_text", ["--data.init_args.max_chars", "100000"], ("grad_var",),
                 marks=pytest.mark.slow),
    # a spiking net: each says it is off. The default suite runs this case as causal pieces' smoke fit
    # (tests/test_cli.py, SMOKE_PRESETS), which checks that the experiment's piece counter kept its settings
    pytest.param("full", "causal_pieces/yinyang", _smoke("causal_pieces"), (), marks=pytest.mark.slow),
    # slow: the same kind as causal pieces' case (the experiment configures GradientVariance, the preset's is
    # dropped, by class as CausalPieceCounter is there); a second CLI fit in BVPO's share
    pytest.param("full", "bvpo/bvpo", _smoke("bvpo"), (), marks=pytest.mark.slow),
]


def _case_id(case) -> str:
    preset, config = case.values[:2] if hasattr(case, "values") else case[:2]
    return f"{preset}-{config}"


@pytest.mark.parametrize("preset, config, overrides, added", PRESET_CASES, ids=[_case_id(c) for c in PRESET_CASES])
def test_diagnostics_presets_stack_on_any_experiment(config, preset, overrides, added, paperlab_tmp: Path, capsys):
    from main import cli_main
    from tests.helpers import TINY, client, runs_of

    rc = cli_main(["fit", "--config", str(REPO / f"configs/{config}.yaml"), *overrides, "--config",
                   str(REPO / f"configs/diagnostics/{preset}.yaml"), *TINY, "--trainer.limit_train_batches", "4"])
    assert rc == 0, capsys.readouterr().err[-2000:]
    (run,) = runs_of(config.split("/")[0])
    name = run.info.run_name  # named by the last experiment config and the overrides, not by the preset
    configs = [a for i, a in enumerate(overrides) if i and overrides[i - 1] == "--config"]
    stem = Path(configs[-1]).stem if configs else config.split("/")[1]
    assert name.startswith(stem + " ") and preset not in name
    keys = set(client().get_run(run.info.run_id).data.metrics)
    assert any(k.startswith("diag/") for k in keys), keys
    missing = [d for d in added if not any(k.startswith(f"diag/{d}/") for k in keys)]
    assert not missing, f"the {preset} preset's {missing} logged nothing: {sorted(keys)}"
    assert not math.isnan(sum(v for k, v in run.data.metrics.items() if k.startswith("diag/") and "noise" not in k
                              and math.isfinite(v)))


def test_a_default_schedule_class_attribute_applies_when_none_is_given():
    class _Every7(Diagnostic):
        name = "every7"
        default_schedule = Schedule(every_n_steps=7)

        def measure(self, trainer, pl_module, moment: Moment):
            return {}

    assert _Every7().schedule == Schedule(every_n_steps=7)
    assert _Every7(schedule=Schedule(every_n_epochs=2)).schedule == Schedule(every_n_epochs=2)
    assert _Norm(schedule=None).schedule == Schedule()  # the base's own default


def test_a_default_plot_class_attribute_applies_when_plot_is_none():
    class _Every7(Diagnostic):
        name = "every7"

        def measure(self, trainer, pl_module, moment: Moment):
            return {}

    class _NoFigure(Diagnostic):
        name = "no_figure"
        default_plot = False

        def measure(self, trainer, pl_module, moment: Moment):
            return {}

    assert _NoFigure().plot is False
    assert _NoFigure(plot=True).plot is True
    assert _Every7().plot is True  # the base's own default
