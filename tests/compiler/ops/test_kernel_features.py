"""Opt-in tuned kernels (`ops.common.kernel_feature`): defaults, NINFER_KERNELS overrides, errors."""

from __future__ import annotations

import pytest


@pytest.fixture
def features(monkeypatch):
    from ninfer_compiler.ops import common

    monkeypatch.setattr(common, "KERNEL_FEATURES", {"new_gemv": False, "new_norm": True})
    monkeypatch.delenv("NINFER_KERNELS", raising=False)
    return common


def test_defaults_apply_on_cuda_only(features):
    import tvm

    with tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}):
        assert not features.kernel_feature("new_gemv") and features.kernel_feature("new_norm")
        with features.reference_kernels():
            assert not features.kernel_feature("new_norm")
    assert not features.kernel_feature("new_norm")  # no CUDA target: no tuned kernel at all


def test_environment_overrides(features, monkeypatch):
    import tvm

    monkeypatch.setenv("NINFER_KERNELS", "+new_gemv, -new_norm")
    assert features.kernel_features() == {"new_gemv": True, "new_norm": False}
    with tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}):
        assert features.kernel_feature("new_gemv") and not features.kernel_feature("new_norm")
    monkeypatch.setenv("NINFER_KERNELS", "+all")
    assert features.kernel_features() == {"new_gemv": True, "new_norm": True}
    monkeypatch.setenv("NINFER_KERNELS", "-all,+new_norm")
    assert features.kernel_features() == {"new_gemv": False, "new_norm": True}


@pytest.mark.parametrize("value", ["new_gemv", "+nope", "~new_gemv"])
def test_bad_values_name_the_problem(features, monkeypatch, value):
    monkeypatch.setenv("NINFER_KERNELS", value)
    with pytest.raises(ValueError, match="NINFER_KERNELS"):
        features.kernel_features()
    with pytest.raises(KeyError, match="unknown kernel feature"):
        features.kernel_feature("missing")
