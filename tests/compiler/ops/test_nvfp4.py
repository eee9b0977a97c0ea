"""The nvfp4 matmul op (`ops/nvfp4.py`): the CPU TE op against the artifact codec's decoder, and an
h200 library that carries the Triton kernels (SASS only)."""

from __future__ import annotations

import numpy as np
import pytest

from ninfer_runtime.artifact.codecs import (
    NvFp4Planes,
    dequantize,
    memory_reader,
    pack_planes,
    unpack_planes,
)
from ninfer_runtime.artifact.formats import BLOCK_SCALE

from ..codegen.conftest import require_tool
from ..conftest import _op_module


def random_planes(rng: np.random.Generator, n: int, k: int):
    """Random valid planes: every code word, scales over the whole E4M3FN range, a divisor."""
    codes = rng.integers(0, 16, size=(n, k), dtype=np.uint8)
    scales = rng.integers(0, 0x7F, size=(n, k // 16), dtype=np.uint8)  # 0x00..0x7E: no NaN, no sign
    divisor = np.float32(rng.uniform(0.5, 3.0))
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    return codes, packed, scales, divisor


def _codec_planes(rng: np.random.Generator, n: int, k: int):
    """Random planes through the codec's packer: `(packed codes, natural scales, divisor [1], W fp32)`."""
    codes, packed, scales, divisor = random_planes(rng, n, k)
    data = pack_planes(BLOCK_SCALE, "nvfp4", (n, k), NvFp4Planes(codes, scales, np.array(divisor, np.float32)))
    w = dequantize(unpack_planes(BLOCK_SCALE, "nvfp4", (n, k), memory_reader(data)))
    return packed, scales, np.array([divisor], np.float32), w


def test_plane_shapes():
    from ninfer_compiler.ops.nvfp4 import plane_shapes

    assert plane_shapes(384, 320) == {"codes": ((384, 160), "uint8"), "block_scales": ((384, 20), "uint8"),
                                      "divisor": ((1,), "float32")}
    with pytest.raises(ValueError, match="K % 64"):
        plane_shapes(128, 96)


@pytest.mark.parametrize("n,k", [(128, 64), (256, 320)])
def test_te_op_is_the_codec_decode(op_compiler, n, k):
    """An identity x reads W^T back bit for bit; random x matches float64 to fp32 rounding."""
    from ninfer_compiler.ops.nvfp4 import nvfp4_matmul, plane_shapes

    rng = np.random.default_rng(n + k)
    packed, scales, divisor, w = _codec_planes(rng, n, k)
    inputs = {"x": (["b", "t", k], "float32")}
    inputs |= {name: (list(shape), dtype) for name, (shape, dtype) in plane_shapes(n, k).items()}
    run = op_compiler(lambda x, c, s, d: nvfp4_matmul(x, c, s, d, k), inputs)
    (y,), _ = run(np.eye(k, dtype=np.float32)[None], packed, scales, divisor)
    np.testing.assert_array_equal(y[0], w.T)
    for b, t in ((1, 1), (3, 5)):
        x = rng.standard_normal((b, t, k)).astype(np.float32)
        (y,), _ = run(x, packed, scales, divisor)
        ref = x.astype(np.float64) @ w.T.astype(np.float64)
        assert float(np.abs(y - ref).max() / np.abs(ref).max()) < 1e-5


def test_h200_library_carries_the_kernels(tmp_path):
    from ninfer_compiler.build import compile_module, export_module
    from ninfer_compiler.codegen.export import export_library
    from ninfer_compiler.codegen.fatbin import inspect_library
    from ninfer_compiler.codegen.targets import tvm_target
    from ninfer_compiler.codegen.toolchain import cuda_build
    from ninfer_compiler.ops import nvfp4
    from ninfer_runtime import targets

    require_tool("nvcc", "the CUDA toolkit builds device code")
    target = targets.load("h200")
    ttarget = tvm_target(target)
    n, k = 256, 128

    def main(xd, xp, c, s, d):
        assert nvfp4.cuda_supported(xd, k)
        return nvfp4.nvfp4_matmul(xd, c, s, d, k), nvfp4.nvfp4_matmul(xp, c, s, d, k)

    inputs = {"xd": (["b", 1, k], "bfloat16"), "xp": ([1, "t", k], "bfloat16")}
    inputs |= {name: (list(shape), dtype) for name, (shape, dtype) in nvfp4.plane_shapes(n, k).items()}
    with ttarget:
        mod, _ = export_module(_op_module(main, inputs), {})
    text = mod.script()
    assert nvfp4.TC_SYMBOL in text and nvfp4.GEMM_SYMBOL in text  # decode (K % 128 == 0), prefill
    with cuda_build(ttarget):
        exe = compile_module(mod, ttarget)
    lib = export_library(exe, tmp_path / "model.so", target)
    code = inspect_library(lib)
    assert code.problems("sm_90a") == [] and code.sass_archs == {"sm_90a"}
    data = lib.read_bytes()
    assert b"ninfer_nvfp4_gemm" in data and nvfp4.TC_SYMBOL.encode() in data
