"""FiniteLossGuard's check on its own: which losses stop training, with which error, naming which step."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from callbacks.guards import DivergedLossError, FiniteLossGuard, NonFiniteLossError


def _feed(guard: FiniteLossGuard, losses: list, outputs_as_dict: bool = False) -> None:
    """Hand ``losses`` to the guard as Lightning would, step s's loss at global step s, then end the epoch."""
    trainer = SimpleNamespace(global_step=0, current_epoch=0, callbacks=[])
    for step, loss in enumerate(losses):
        trainer.global_step = step
        guard.on_train_batch_start(trainer, None, None, step)
        value = torch.as_tensor(loss, dtype=torch.float32)
        guard.on_train_batch_end(trainer, None, {"loss": value} if outputs_as_dict else value, None, step)
    guard.on_train_epoch_end(trainer, None)


inf, nan = float("inf"), float("nan")


@pytest.mark.parametrize(("kwargs", "losses", "error", "step"), [
    ({}, [1.0, 2.0, inf, 1.0], NonFiniteLossError, 2),               # with the relative bound set
    ({}, [1.0, -inf], NonFiniteLossError, 1),
    ({}, [1.0, 1.0, 1.0, nan, 2e4], NonFiniteLossError, 3),          # the first bad step is named
    ({}, [2.0] * 12 + [-2e4 - 1], DivergedLossError, 12),            # past 1e4 x |first|, negative too
    ({"divergence_factor": None}, [1.0, 1e30, inf], NonFiniteLossError, 2),   # no bound: only NaN/inf
    ({"max_loss": inf}, [1.0, inf], NonFiniteLossError, 1),          # an infinite bound still stops inf
    ({"max_loss": 3.0}, [[1.0, 9.0], [4.0, 0.0]], DivergedLossError, 1),     # a vector loss: its first element
])
def test_the_guard_stops_at_the_first_bad_loss_with_the_right_error(kwargs, losses, error, step) -> None:
    for as_dict in (False, True):
        with pytest.raises(error, match=f"at step {step} "):
            _feed(FiniteLossGuard(check_every_n_steps=5, **kwargs), losses, outputs_as_dict=as_dict)


@pytest.mark.parametrize(("kwargs", "losses"), [
    ({}, [2.0] * 12 + [2e4 - 1]),
    ({"divergence_factor": None}, [1.0, 1e30, -1e30]),
    ({"max_loss": 3.0}, [[1.0, 9.0], [3.0, 9.0]]),
])
def test_the_guard_lets_finite_losses_within_the_bound_through(kwargs, losses) -> None:
    _feed(FiniteLossGuard(check_every_n_steps=5, **kwargs), losses)
