"""The prefill GEMM over grouped-int planes (`ops/qgemm.py`, `ops/qgemm_triton.py`).

Numerics in Triton's interpreter against numpy float64 (per format and epilogue: plain, residual
add, SwiGLU; ragged M and N), the dequantization bit-exact (an identity `x` returns the folded
weights), AOT images for the three CUDA archs with the entry names the launcher asks for, the
dispatch rules, and an h200 library that carries the externs (SASS only). The inline-PTX byte
conversion the images use has no interpreter form; the interpreter runs its shift-and-subtract
twin (`ASM=False`). Speed and numerics on the H200: tests/gpu/check_qgemm.py.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from ninfer_compiler.ops.row_split import decode_row_split, encode_row_split

from ..codegen.conftest import require_tool
from ..conftest import _op_module

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

FORMATS = ["q4_g64_fp16", "q5_g64_fp16", "q6_g64_fp16", "q8_g32_fp16"]


def _planes(fmt: str, n: int, k: int, seed: int) -> tuple[dict[str, torch.Tensor], np.ndarray]:
    rng = np.random.default_rng(seed)
    planes = encode_row_split(rng.standard_normal((n, k)).astype(np.float32), fmt)
    return ({name: torch.from_numpy(np.ascontiguousarray(p)) for name, p in planes.items()},
            decode_row_split(planes, fmt, k))


def _folded(w: np.ndarray) -> np.ndarray:
    """What the kernel multiplies by: every `scale * code` rounded once to bf16."""
    return torch.from_numpy(w).bfloat16().double().numpy()


def _run(fmt, x, first, second, residual, m, n, k, bm, bn, epilogue):
    from ninfer_compiler.ops.qgemm_triton import grid_size, qgemm_kernel
    from ninfer_compiler.ops.triton_aot import interpreted

    y = torch.full((m, n), float("nan"), dtype=torch.bfloat16)
    planes = [first["base"], first.get("high", first["base"]), first["scales"]]
    planes2 = [second["base"], second.get("high", second["base"]), second["scales"]]
    interpreted(qgemm_kernel)[(grid_size(m, n, bm, bn, epilogue),)](
        x, *planes, *planes2, residual, y, m,
        N=n, K=k, BITS=int(fmt[1]), BLOCK_M=bm, BLOCK_N=bn, GROUP_M=2, EPILOGUE=epilogue, ASM=False)
    return y.double().numpy()


@pytest.mark.parametrize("epilogue", [0, 1, 2], ids=["plain", "add", "swiglu"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_interpreter_matches_float64(fmt, epilogue):
    m, n, k, bm, bn = 37, 44, 256, 32, 32  # ragged M and N (SwiGLU: 16 features a program), 4 K steps
    first, w = _planes(fmt, n, k, seed=len(fmt) + epilogue)
    second, w2 = _planes(fmt, n, k, seed=7)
    rng = np.random.default_rng(1)
    x = torch.tensor(rng.standard_normal((m, k)), dtype=torch.bfloat16)
    residual = torch.tensor(rng.standard_normal((m, n)) * 4, dtype=torch.bfloat16)
    got = _run(fmt, x, first, second, residual, m, n, k, bm, bn, epilogue)
    xd = x.double().numpy()
    # what the kernel computes: folded bf16 weights, fp32 sums, the epilogue in fp32, bf16 out
    a, exact = xd @ _folded(w).T, xd @ w.astype(np.float64).T
    if epilogue == 1:
        a, exact = a + residual.double().numpy(), exact + residual.double().numpy()
    elif epilogue == 2:
        b, b_exact = xd @ _folded(w2).T, xd @ w2.astype(np.float64).T
        a, exact = a / (1 + np.exp(-a)) * b, exact / (1 + np.exp(-exact)) * b_exact
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, a, rtol=2.0**-8, atol=1e-3 * np.abs(a).max())
    assert np.abs(got - exact).max() / np.abs(exact).max() < 5e-3


@pytest.mark.parametrize("fmt", FORMATS)
def test_dequantization_is_bit_exact(fmt):
    """`x = I` returns each weight `bf16(scale * code)` exactly (one product per fp32 sum)."""
    k, n = 128, 40
    planes, w = _planes(fmt, n, k, seed=3)
    x = torch.eye(k, dtype=torch.bfloat16)
    got = _run(fmt, x, planes, planes, x, k, n, k, 64, 32, 0)
    np.testing.assert_array_equal(got, _folded(w).T)


@pytest.mark.parametrize("arch", ["sm_90a", "sm_120a", "sm_121a"])
def test_images_for_each_arch(arch):
    from ninfer_compiler.ops import qgemm
    from ninfer_compiler.ops.triton_aot import cubin_arch

    require_tool("nvcc", "the CUDA toolkit wraps cubins into fatbins")
    narrow, wide = qgemm.configs(arch, 5)
    assert (wide is not None) == (arch == "sm_90a")
    for cfg in [narrow] + ([wide] if wide else []):
        img = qgemm.image(arch, 5, 1000, 256, cfg)
        assert img.name == f"ninfer_qgemm_q5_n1000_k256_t{cfg.block_m}x{cfg.block_n}g8"
        assert cubin_arch(img.cubin) == int(arch[3:-1]) and img.threads == 32 * cfg.num_warps
        assert img.shared <= (227 if arch == "sm_90a" else 99) * 1024
    for epilogue, suffix in ((qgemm.ADD, "_add"), (qgemm.SWIGLU, "_swiglu")):
        cfg = qgemm.configs(arch, 4, epilogue)[0]
        img = qgemm.image(arch, 4, 96, 256, cfg, epilogue)
        assert img.name == f"ninfer_qgemm_q4_n96_k256_t{cfg.block_m}x{cfg.block_n}g8{suffix}"
        assert img.shared <= (227 if arch == "sm_90a" else 99) * 1024


def _tensor(shape, dtype="bfloat16"):
    from tvm.relax.frontend import nn

    return nn.Tensor.placeholder(shape, dtype)


def test_supported_only_for_prefill_on_cuda():
    import tvm

    from ninfer_compiler.codegen.targets import tvm_target
    from ninfer_compiler.ops import qgemm
    from ninfer_runtime import targets

    s = tvm.tirx.Var("s", "int64")
    with tvm_target(targets.load("h200")):
        assert qgemm.supported(_tensor([1, s, 512]), 96, 512)
        assert qgemm.supported(_tensor([2, 9, 512]), 100, 512)
        assert not qgemm.supported(_tensor([4, 8, 512]), 96, 512)  # decode-shaped
        assert not qgemm.supported(_tensor([1, s, 320]), 96, 320)  # K % 128
        assert not qgemm.supported(_tensor([1, s, 512], "float32"), 96, 512)
        assert not qgemm.supported(_tensor([s, 512]), 96, 512)
    with tvm.target.Target("llvm"):
        assert not qgemm.supported(_tensor([1, s, 512]), 96, 512)


def test_fused_supported():
    import tvm

    from ninfer_compiler.codegen.targets import tvm_target
    from ninfer_compiler.ops import qgemm
    from ninfer_compiler.ops.linear_weight import LinearWeight
    from ninfer_runtime import targets

    s = tvm.tirx.Var("s", "int64")
    x = _tensor([1, s, 512])

    def weight(fmt="q4_g64_fp16", rows=96, cols=512):
        return LinearWeight(fmt, rows, cols, _tensor([rows, cols // 2], "uint8"), None,
                            _tensor([rows, cols // 64], "float16"))

    with tvm_target(targets.load("h200")):
        assert qgemm.fused_supported(x, [weight()])
        assert qgemm.fused_supported(x, [weight(), weight()])
        assert qgemm.fused_supported(x, [weight("q5_g64_fp16"), weight("q5_g64_fp16")])
        assert not qgemm.fused_supported(x, [weight(), weight("q5_g64_fp16")])  # formats differ
        assert not qgemm.fused_supported(x, [weight(), weight(rows=128)])  # shapes differ
        assert not qgemm.fused_supported(x, [weight()] * 3)
        assert not qgemm.fused_supported(x, [LinearWeight("bfloat16", 96, 512, _tensor([96, 512]))])
        assert not qgemm.fused_supported(x, [weight(cols=256)])  # x is wider than the weight
        assert not qgemm.fused_supported(_tensor([4, 1, 512]), [weight()])  # decode-shaped
    with tvm.target.Target("llvm"):
        assert not qgemm.fused_supported(x, [weight()])


@pytest.mark.parametrize("epilogue", [0, 1, 2])
def test_launcher_source_is_complete(epilogue):
    from ninfer_compiler.ops import qgemm

    narrow, wide = qgemm.configs("sm_90a", 4, epilogue)
    src = qgemm.launcher_source("ninfer_qgemm_q4_64x256", 4, 64, 256, narrow, wide, epilogue)
    assert not re.search(r"@[A-Z_]+@", src)
    for cfg in (narrow, wide):
        assert qgemm.kernel_name(4, 64, 256, cfg, epilogue) in src
    out_n = narrow.block_n // 2 if epilogue == qgemm.SWIGLU else narrow.block_n
    assert f"kOutN = {out_n};" in src
    one = qgemm.launcher_source("ninfer_qgemm_q4_64x256", 4, 64, 256, *qgemm.configs("sm_120a", 4, epilogue),
                                epilogue)
    assert "kWideBM = 0" in one


def test_h200_library_carries_the_externs(tmp_path):
    from ninfer_compiler.build import compile_module, export_module
    from ninfer_compiler.codegen.export import export_library
    from ninfer_compiler.codegen.fatbin import inspect_library
    from ninfer_compiler.codegen.targets import tvm_target
    from ninfer_compiler.codegen.toolchain import cuda_build
    from ninfer_compiler.ops import qgemm
    from ninfer_compiler.ops.linear_weight import LinearWeight
    from ninfer_compiler.ops.row_split import plane_shapes
    from ninfer_runtime import targets

    require_tool("nvcc", "the CUDA toolkit builds device code")
    target = targets.load("h200")
    ttarget = tvm_target(target)
    k = 256
    a, b = plane_shapes("q4_g64_fp16", 64, k), plane_shapes("q5_g64_fp16", 96, k)
    inputs = {"x": ([1, "s", k], "bfloat16"), "r": ([1, "s", 96], "bfloat16")}
    inputs.update({f"a_{p}": (list(s), d) for p, (s, d) in a.items()})
    inputs.update({f"b_{p}": (list(s), d) for p, (s, d) in b.items()})
    inputs.update({f"c_{p}": (list(s), d) for p, (s, d) in a.items()})

    def main(x, r, a_base, a_scales, b_base, b_high, b_scales, c_base, c_scales):
        assert qgemm.supported(x, 64, k) and qgemm.supported(x, 96, k)
        first = qgemm.qgemm(x, a_base, None, a_scales, "q4_g64_fp16")
        again = qgemm.qgemm(x, a_base, None, a_scales, "q4_g64_fp16")  # same shape: same extern
        gate = LinearWeight("q4_g64_fp16", 64, k, a_base, None, a_scales)
        up = LinearWeight("q4_g64_fp16", 64, k, c_base, None, c_scales)
        down = LinearWeight("q5_g64_fp16", 96, k, b_base, b_high, b_scales)
        assert qgemm.fused_supported(x, [gate, up]) and qgemm.fused_supported(x, [down])
        return (first + again, qgemm.qgemm(x, b_base, b_high, b_scales, "q5_g64_fp16"),
                qgemm.qgemm_swiglu(x, gate, up), qgemm.qgemm_add(x, down, r))

    with ttarget:
        mod, _ = export_module(_op_module(main, inputs), {})
    with cuda_build(ttarget):
        exe = compile_module(mod, ttarget)
    lib = export_library(exe, tmp_path / "model.so", target)
    code = inspect_library(lib)
    assert code.problems("sm_90a") == [] and code.sass_archs == {"sm_90a"} and not code.ptx_archs
    data = lib.read_bytes()
    for name in (b"ninfer_qgemm_q4_64x256", b"ninfer_qgemm_q5_96x256", b"ninfer_qgemm_q4_n64_k256_t256x128g8",
                 b"ninfer_qgemm_q5_n96_k256_t128x128g8", b"ninfer_qgemm_q4_64x256_swiglu",
                 b"ninfer_qgemm_q4_n64_k256_t128x128g8_swiglu", b"ninfer_qgemm_q5_96x256_add",
                 b"ninfer_qgemm_q5_n96_k256_t256x128g8_add", b"ninfer_qgemm_q4_n64_k256_t256x128g8_swiglu"):
        assert name in data, name
