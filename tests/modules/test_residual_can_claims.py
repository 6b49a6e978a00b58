"""The claims of paper 000-02 as docs/papers/residual_can.md checks them, re-run from the stage-2 sweep files (slow).

Claims 1-2 did not reproduce at the claim budget: their slow test checks that the paper's statement fails and
that what the docs report instead holds. The slow tests of claims 3-4 check the issue's statements; at the claim
budget both fail (claim 3: the positive control escapes, no paper arm does; claim 4: CauchyAct beats SiLU under DSM
too), as the docs report.

Each test runs one evaluation sweep (seeds 1, 2, 3; the lr of every arm was picked by its ``*_lr_sweep.yaml`` at
seed 0) in process into this test's fresh MLflow store, groups the runs as ``python main.py compare`` does, and
checks the statement of the issue: the functions ``check_*`` are the claims, written once, applied to the
grouped means (mean, sample std, n over seeds). They are independent of any number obtained from a run.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from main import cli_main
from sweeps.compare import compare
from tests.helpers import REPO, client

SWEEPS = REPO / "configs/residual_can"
Stat = tuple[float, float, int]  # (mean, sample std, n) over seeds


def group_means(sweep: str, metric: str, by: list[str]) -> dict[tuple[str, ...], Stat]:
    """``{keys: (mean, std, n)}`` of ``metric`` over the FINISHED runs of ``sweep`` in this test's store."""
    result = compare(client(), "residual_can", metric, by=by, sweep=sweep, mode="min")
    # compare also splits by what else differs between the arms (their width, their tuned lr): one group per arm
    out = {tuple(g.keys[: len(by)]): (g.mean, g.std, g.n) for g in result.groups}
    assert len(out) == len(result.groups), [g.keys for g in result.groups]
    return out


def run_sweep(name: str) -> None:
    assert cli_main(["sweep", "--config", str(SWEEPS / f"{name}_sweep.yaml"), "--in-process"]) == 0


def welch_t(a: Stat, b: Stat) -> float:
    """Welch's t of mean(a) - mean(b)."""
    return (a[0] - b[0]) / math.sqrt(a[1] ** 2 / a[2] + b[1] ** 2 / b[2])


# --- claims 1-2: ResidualCAN vs the SiLU MLP, and the ablation --------------------------------------------------
ABL_BY = ["model.net.class_path", "model.net.activation", "model.net.basis"]
_RCAN_NET, _MLP_NET = "modules.components.local_basis.ResidualCAN", "modules.components.mlp.MLP"
RCAN, SILU = (_RCAN_NET, "cauchy", "cauchy"), (_MLP_NET, "silu", "None")  # an MLP has no basis: "None"
CAUCHY_MLP, GAUSS = (_MLP_NET, "cauchy", "None"), (_RCAN_NET, "cauchy", "gaussian")


def ablation_gains(means: dict[tuple[str, ...], Stat]) -> dict[str, float]:
    """``mean rel-L2 of the SiLU MLP / mean rel-L2 of the arm`` for ResidualCAN and its two ablations."""
    silu = means[SILU][0]
    return {"residual_can": silu / means[RCAN][0], "cauchy_mlp": silu / means[CAUCHY_MLP][0],
            "gaussian_bumps": silu / means[GAUSS][0]}


def check_ablation(gain: dict[str, float]) -> None:
    """ResidualCAN >= 100x below the SiLU MLP; without the residual most of the gain (on a log scale) goes;
    Gaussian bumps instead of Cauchy nodes recover most of it."""
    assert gain["residual_can"] >= 100, gain
    log_gain = math.log(gain["residual_can"])
    assert math.log(max(gain["cauchy_mlp"], 1e-300)) < 0.5 * log_gain, gain
    assert math.log(max(gain["gaussian_bumps"], 1e-300)) >= 0.5 * log_gain, gain


def test_check_ablation_accepts_the_claim_and_refuses_its_negations():
    check_ablation({"residual_can": 1520.0, "cauchy_mlp": 3.0, "gaussian_bumps": 800.0})
    for bad in ({"residual_can": 50.0, "cauchy_mlp": 3.0, "gaussian_bumps": 40.0},     # < 100x
                {"residual_can": 1520.0, "cauchy_mlp": 100.0, "gaussian_bumps": 800.0},  # activation keeps most
                {"residual_can": 1520.0, "cauchy_mlp": 3.0, "gaussian_bumps": 5.0}):     # bumps do not recover
        with pytest.raises(AssertionError):
            check_ablation(bad)


def check_ablation_as_found(gain: dict[str, float]) -> None:
    """What docs/papers/residual_can.md reports at the claim budget (500 steps): ResidualCAN is below the SiLU
    MLP but by less than 100x, the CauchyAct MLP without the residual keeps more than half of that gain on a log
    scale, and Gaussian bumps do not improve on the CauchyAct MLP."""
    assert 1 < gain["residual_can"] < 100, gain
    assert math.log(gain["cauchy_mlp"]) >= 0.5 * math.log(gain["residual_can"]), gain
    assert gain["gaussian_bumps"] <= gain["cauchy_mlp"], gain




def check_ablation_long_as_found(gain: dict[str, float]) -> None:
    """What docs/papers/residual_can.md reports at the longer budget (2,500 steps x 2,048 points, float64):
    ResidualCAN is below the SiLU MLP by more than at 500 steps but still by less than 100x, and the CauchyAct
    MLP without the residual keeps more than half of that gain on a log scale (the activation, not the
    residual, carries most of it); Gaussian bumps then keep at least as much as the CauchyAct MLP alone."""
    assert 12 < gain["residual_can"] < 100, gain
    assert math.log(gain["cauchy_mlp"]) >= 0.5 * math.log(gain["residual_can"]), gain
    assert gain["gaussian_bumps"] >= gain["cauchy_mlp"], gain


@pytest.mark.slow  # "ablation": 12 runs of 10-20 s; "ablation_long": 12 runs of 2,500 steps in float64, ~25 CPU min
@pytest.mark.parametrize(("sweep", "check_as_found"), [("ablation", check_ablation_as_found),
                                                        ("ablation_long", check_ablation_long_as_found)])
def test_claims_1_2_ablation(paperlab_tmp: Path, sweep: str, check_as_found) -> None:
    """The paper's statement does not hold at either budget; what the docs report instead does."""
    run_sweep(sweep)
    means = group_means(sweep, "test/rel_l2", ABL_BY)
    assert {RCAN, SILU, CAUCHY_MLP, GAUSS} <= set(means) and all(m[2] == 3 for m in means.values()), means
    gain = ablation_gains(means)
    with pytest.raises(AssertionError):
        check_ablation(gain)
    check_as_found(gain)


# --- claim 3: the loss-activation factorial in the Allen-Cahn trap, with a positive control -----------------------
TRAP_BY = ["arm"]  # the run tag each point of trap_control_sweep.yaml / trap_factorial_sweep.yaml sets
ALSO_ESCAPE = ("cauchy_l1", "cauchy_huber", "relu_cauchy")


def _mean(means: dict[tuple[str, ...], Stat], arm: str) -> float:
    return means[(arm,)][0]


def check_control(means: dict[tuple[str, ...], Stat]) -> None:
    """The positive control (CauchyAct + L2 with the layer's centre pinned and eps continuation) escapes: mean
    rel-L2 < 0.1, so this budget, metric and number of seeds can show an escape."""
    assert _mean(means, "control") < 0.1, means


def check_trap_claim(means: dict[tuple[str, ...], Stat]) -> None:
    """The paper: CauchyAct + L2 is trapped (mean rel-L2 > 0.5), CauchyAct + Cauchy escapes (< 0.1), and so does
    at least one of CauchyAct + L1, CauchyAct + Huber, ReLU + Cauchy."""
    assert _mean(means, "cauchy_l2") > 0.5, means
    assert _mean(means, "cauchy_cauchy") < 0.1, means
    assert min(_mean(means, a) for a in ALSO_ESCAPE) < 0.1, means


PAPER_ARMS = ("cauchy_l2", "cauchy_cauchy") + ALSO_ESCAPE


def check_trap_measured(means: dict[tuple[str, ...], Stat], control_max: float = 0.01,
                        arm_min: float = 0.3) -> None:
    """What the trap sweeps show (docs/papers/residual_can.md, claim 3): the control escapes far below the
    escape threshold (measured mean rel-L2 0.0030 at eps = 0.1, 0.0044 at eps = 0.02) and no paper arm comes near
    it (smallest arm mean 0.4642 at eps = 0.1, 0.442 at eps = 0.02)."""
    assert _mean(means, "control") < control_max, means
    assert min(_mean(means, a) for a in PAPER_ARMS) > arm_min, means


def test_check_trap_claim_and_control_accept_the_statements_and_refuse_their_negations():
    ok = {("cauchy_l2",): (0.8, 0.1, 3), ("cauchy_cauchy",): (0.05, 0.01, 3), ("cauchy_l1",): (0.6, 0.1, 3),
          ("cauchy_huber",): (0.04, 0.01, 3), ("relu_cauchy",): (0.7, 0.1, 3), ("control",): (0.003, 0.001, 3)}
    check_trap_claim(ok)
    check_control(ok)
    for key, value in ((("cauchy_l2",), (0.3, 0.1, 3)), (("cauchy_cauchy",), (0.2, 0.1, 3)),
                       (("cauchy_huber",), (0.2, 0.1, 3))):
        with pytest.raises(AssertionError):
            check_trap_claim({**ok, key: value})
    with pytest.raises(AssertionError):
        check_control({**ok, ("control",): (0.3, 0.1, 3)})


def test_check_trap_measured_accepts_the_runs_and_refuses_an_escape_or_a_failed_control():
    measured = {("cauchy_l2",): (0.9166, 0.27, 3), ("cauchy_cauchy",): (0.7018, 0.27, 3),
                ("cauchy_l1",): (0.7967, 0.29, 3), ("cauchy_huber",): (0.8026, 0.29, 3),
                ("relu_cauchy",): (0.4642, 0.02, 3), ("control",): (0.002965, 0.0018, 3)}
    check_trap_measured(measured)
    for arm in PAPER_ARMS:
        with pytest.raises(AssertionError):
            check_trap_measured({**measured, (arm,): (0.05, 0.01, 3)})
    with pytest.raises(AssertionError):
        check_trap_measured({**measured, ("control",): (0.05, 0.01, 3)})


@pytest.mark.slow  # 18 runs of 1,000 steps each (about 30 CPU s a run)
@pytest.mark.parametrize("sweep", ["trap_control", "trap_factorial"])
def test_claim_3_trap_positive_control(paperlab_tmp: Path, sweep: str):
    """Re-runs a trap sweep: the control escapes, no paper arm does (not reproduced, docs/papers/residual_can.md)."""
    run_sweep(sweep)
    means = group_means(sweep, "test/rel_l2", TRAP_BY)
    assert len(means) == 6 and all(m[2] == 3 for m in means.values()), means
    check_control(means)
    check_trap_measured(means)
    with pytest.raises(AssertionError):  # the paper's statement fails on the same runs
        check_trap_claim(means)


# --- claim 4: Cauchy beats SiLU under the FP-PDE loss, not under DSM ------------------------------------------
SCORE_BY = ["model.loss", "model.net.activation"]


def check_score(means: dict[tuple[str, ...], Stat], t_crit: float = 4.303) -> None:
    """Under ``fp_pde`` CauchyAct's Fisher divergence is below SiLU's beyond seed noise (Welch t below
    -t(0.975, 2) = -4.303, the two-sided 5 % point with n = 3 each); under ``dsm`` the difference is within it."""
    t_fp = welch_t(means[("fp_pde", "cauchy")], means[("fp_pde", "silu")])
    t_dsm = welch_t(means[("dsm", "cauchy")], means[("dsm", "silu")])
    assert t_fp < -t_crit, (t_fp, means)
    assert abs(t_dsm) <= t_crit, (t_dsm, means)


def test_check_score_accepts_the_claim_and_refuses_its_negations():
    ok = {("fp_pde", "cauchy"): (0.01, 0.001, 3), ("fp_pde", "silu"): (0.05, 0.002, 3),
          ("dsm", "cauchy"): (0.02, 0.005, 3), ("dsm", "silu"): (0.021, 0.005, 3)}
    check_score(ok)
    for key, value in ((("fp_pde", "cauchy"), (0.049, 0.002, 3)), (("dsm", "cauchy"), (0.001, 0.0001, 3))):
        with pytest.raises(AssertionError):
            check_score({**ok, key: value})


@pytest.mark.slow
@pytest.mark.xfail(strict=True, raises=AssertionError, reason="half reproduced: CauchyAct beats SiLU under the Fokker-Planck loss as claimed, "
                   "but also under DSM, where the paper finds no difference (docs/papers/residual_can.md)")
def test_claim_4_score(paperlab_tmp: Path):
    run_sweep("score")
    means = group_means("score", "test/fisher", SCORE_BY)
    assert len(means) == 4 and all(m[2] == 3 for m in means.values()), means
    check_score(means)
