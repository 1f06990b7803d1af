"""Stores written before an option existed resume when the option is at its old-behaviour default.

Oracle: ``first_difference`` of two resolved configs; the default's claim (old behaviour, bitwise)
is tested where the option lives (``tests/test_distributional_heads.py``, ``test_conformal_callback``).
"""

from ripieno.framework.runner.fingerprints import ADDED_OPTION_DEFAULTS, first_difference


def test_an_added_option_at_its_default_is_no_change_and_any_other_value_is():
    old = {"model": {"init_args": {"k": 8}}, "data": {"init_args": {"val_size": 0.2}}}
    new = {"model": {"init_args": {"k": 8, "regression_head": "point", "quantile_levels": [0.05, 0.5, 0.95],
                                   "beta_nll": 0.0}},
           "data": {"init_args": {"val_size": 0.2, "calibration_size": 0.0}}}
    assert first_difference(old, new) is None
    new["data"]["init_args"]["calibration_size"] = 0.1
    assert first_difference(old, new) == "data.init_args.calibration_size: absent then, 0.1 now"
    new["data"]["init_args"]["calibration_size"] = 0.0
    new["model"]["init_args"]["regression_head"] = "gaussian"
    assert first_difference(old, new) == "model.init_args.regression_head: absent then, 'gaussian' now"
    assert first_difference({"k": 8}, {"k": 8, "unknown_option": 0}) == "unknown_option: absent then, 0 now"
    assert set(ADDED_OPTION_DEFAULTS) == {"calibration_size", "regression_head", "quantile_levels",
                                          "beta_nll"}
