"""The end-of-run timing table assigns tests to methods by file name and by config folder."""

from __future__ import annotations

from tests.timing_report import method_of

METHODS = sorted(["bvpo", "craft", "residual_can", "mlp_classifier", "m_sync_sgd"], key=len, reverse=True)


def test_tests_are_assigned_to_their_method() -> None:
    assert method_of("tests/modules/test_bvpo.py::test_x", METHODS) == "bvpo"
    assert method_of("tests/modules/test_residual_can_claims.py::test_y", METHODS) == "residual_can"
    assert method_of("tests/test_cli.py::test_config_builds[craft/digits_craft]", METHODS) == "craft"
    assert method_of("tests/test_cli.py::test_smoke_fit[m_sync_sgd/quadratic_exp]", METHODS) == "m_sync_sgd"
    preset = "tests/callbacks/test_diagnostic.py::test_diagnostics_presets_stack_on_any_experiment"
    assert method_of(f"{preset}[full-craft/digits_craft]", METHODS) == "craft"
    assert method_of("tests/callbacks/test_weight_drift.py::test_z", METHODS) is None
    assert method_of("tests/test_layers.py::test_the_tree_keeps_its_floors", METHODS) is None
