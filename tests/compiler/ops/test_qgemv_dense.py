"""Routing of bf16-weight decode projections to our dense GEMV (`ops/qgemv.py`, `dense_nt`).

Structural (numerics and speed: `tests/gpu/check_qgemv.py cupy` on the H200): on a CUDA target a
decode-shaped `[b, 1, K]` bf16 x bf16 call with a small N goes to the `ninfer_dense_gemv` extern,
whose fatbin holds only the dense kernels; prefill shapes go to the tensor-core GEMM
(`ops/dense_triton.py`); large-N decode, fp32 and CPU keep the TE op.
"""

from __future__ import annotations

import pytest

from ninfer_compiler.ops import qgemv
from ninfer_compiler.ops.matmul import dense_nt

from ..codegen.conftest import require_tool
from ..conftest import _op_module


def _export(x_shape: list, n: int, k: int, dtype: str = "bfloat16", target: str | None = "h200"):
    from ninfer_compiler.codegen.targets import tvm_target
    from ninfer_runtime import targets

    spec = {"x": (x_shape, dtype), "w": ([n, k], dtype)}
    model = _op_module(dense_nt, spec)
    if target is None:
        return model.export_tvm(spec=model.get_export_spec(), allow_extern=True)
    with tvm_target(targets.load(target)):
        return model.export_tvm(spec=model.get_export_spec(), allow_extern=True)


@pytest.mark.parametrize(
    ("x_shape", "n", "dtype", "target", "routed"),
    [
        (["b", 1, 512], 48, "bfloat16", "h200", True),
        ([3, 1, 512], 256, "bfloat16", "rtx5090", True),
        (["b", 7, 512], 48, "bfloat16", "h200", False),  # prefill chunk
        (["b", 1, 512], 4096, "bfloat16", "h200", False),  # large N: cuBLAS-class kernels do better
        (["b", 1, 512], 48, "float32", "h200", False),
        (["b", 1, 512], 48, "bfloat16", None, False),  # no target: CPU build
    ],
)
def test_dense_routing(x_shape, n, dtype, target, routed):
    require_tool("nvcc", "the CUDA toolkit builds device code")
    mod, _, ext = _export(x_shape, n, 512, dtype, target)
    text = mod.script()
    assert (qgemv.DENSE_SYMBOL in text) is routed
    prefill = target is not None and dtype == "bfloat16" and x_shape[1] != 1
    assert ("ninfer_dense_nt" in text) is prefill
    assert bool(ext) is (routed or prefill)


def test_dense_fatbin_has_only_dense_kernels():
    require_tool("nvcc", "the CUDA toolkit builds device code")
    dense = qgemv.fatbin("sm_90a", dense=True)
    assert b"ninfer_dense_bf16_b8" in dense and b"ninfer_qgemv" not in dense
    source = qgemv.host_source("sm_90a", dense=True)
    assert source.startswith("#define NINFER_GEMV_DENSE_ONLY")
