"""The reconstruction claims of paper 004-01 as docs/papers/attn_hyper_inr.md checks them (slow: re-runs the sweep).

The slow test runs ``configs/attn_hyper_inr/compare_sweep.yaml`` (AttnOptHyperINR vs TransINRBaseline at
trainable counts within 10 %, 3 seeds) in process into this test's fresh MLflow store, groups the runs as
``python main.py compare`` does, and applies the claims, written once as the ``check_*`` functions below and
tested on made-up numbers in the default suite. Nothing here is a number obtained from a run. At the claim
budget both claims fail, as the docs report: the test is a strict xfail, which fails the day they hold.
"""

from __future__ import annotations

import pytest

from main import cli_main
from modules.attn_hyper_inr import AttnOptHyperINR, TransINRBaseline, count_parameters
from sweeps.compare import compare
from tests.helpers import REPO, client

SWEEP = REPO / "configs/attn_hyper_inr/compare_sweep.yaml"
SWEEP16 = REPO / "configs/attn_hyper_inr/compare16_sweep.yaml"  # the same arms on 16 x 16 images, 500 steps
# how the runs record model.net.class_path: jsonargparse writes a class's shortest import path, the package's
# re-export, whatever path the sweep file gives
OURS, BASE = "modules.attn_hyper_inr.AttnOptHyperINR", "modules.attn_hyper_inr.TransINRBaseline"
IMAGE = (3, 32, 32)  # shapes2d's images (the sweep's data), linked into the nets by the CLI
Stat = tuple[float, float, int]  # (mean, sample std, n) over seeds


def check_psnr_margin(ours: Stat, base: Stat, margin_db: float = 1.0) -> None:
    """Claim 2: mean test PSNR of AttnOptHyperINR >= Trans-INR's + 1 dB, over >= 3 seeds each."""
    assert ours[2] >= 3 and base[2] >= 3, (ours, base)
    assert ours[0] >= base[0] + margin_db, f"AttnOptHyperINR {ours[0]:.2f} dB vs Trans-INR {base[0]:.2f} dB"


def check_non_decreasing(per_step: list[float]) -> None:
    """Claim 3: the mean test PSNR after rollout step k does not decrease over k = 1..K."""
    assert len(per_step) >= 2, per_step
    assert all(b >= a for a, b in zip(per_step, per_step[1:])), per_step


def test_checks_accept_the_claims_and_refuse_their_negations() -> None:
    check_psnr_margin((20.5, 0.3, 3), (19.4, 0.2, 3))
    for ours, base in (((20.0, 0.3, 3), (19.5, 0.2, 3)), ((20.5, 0.3, 2), (19.4, 0.2, 3))):
        with pytest.raises(AssertionError):
            check_psnr_margin(ours, base)
    check_non_decreasing([15.0, 15.0, 16.2])
    with pytest.raises(AssertionError):
        check_non_decreasing([15.0, 16.0, 15.9])


@pytest.mark.parametrize("sweep", [SWEEP, SWEEP16], ids=lambda p: p.stem)
def test_the_sweep_compares_sizes_matched_within_ten_percent(sweep) -> None:
    """The arms of each claim sweep, as configured there, on its images (the sizes are a property of the
    configs)."""
    import yaml

    spec = yaml.safe_load(sweep.read_text())
    side = spec.get("overrides", {}).get("data.init_args.size", IMAGE[1])
    image = (IMAGE[0], side, side)
    nets = {p["model.init_args.net"]["class_path"].rsplit(".", 1)[1]: p["model.init_args.net"]["init_args"]
            for p in spec["points"]}
    ours = count_parameters(AttnOptHyperINR(image, image[0], **nets["AttnOptHyperINR"]))
    base = count_parameters(TransINRBaseline(image, image[0], **nets["TransINRBaseline"]))
    assert abs(base - ours) <= 0.10 * ours, (ours, base)


def _stat(metric: str) -> dict[str, Stat]:
    result = compare(client(), "attn_hyper_inr", metric, by=["model.net.class_path"], sweep="compare", mode="max")
    out = {g.keys[0]: (g.mean, g.std, g.n) for g in result.groups}
    assert len(out) == len(result.groups), [g.keys for g in result.groups]
    return out


@pytest.mark.slow
@pytest.mark.xfail(strict=True, raises=AssertionError, reason=(
    "not reproduced at 250 steps (docs/papers/attn_hyper_inr.md): test PSNR 16.28 +- 0.53 vs Trans-INR "
    "15.93 +- 0.26 (+0.35 dB, 3 seeds each, claim +1 dB), and the mean PSNR after step 3 (16.28) is below "
    "step 2 (16.30)"))
def test_reconstruction_claims(paperlab_tmp) -> None:
    assert cli_main(["sweep", "--config", str(SWEEP), "--in-process"]) == 0
    psnr = _stat("test/psnr")
    steps = [_stat(f"test/psnr_step{k}")[OURS][0] for k in (1, 2, 3)]
    check_non_decreasing(steps)
    check_psnr_margin(psnr[OURS], psnr[BASE])
