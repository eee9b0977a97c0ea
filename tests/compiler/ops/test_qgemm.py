"""The prefill GEMM over grouped-int planes (`ops/qgemm.py`, `ops/qgemm_triton.py`).

Numerics in Triton's interpreter against numpy float64 (per format, both operand orders, ragged
M and N); AOT images for the three CUDA archs with the entry names the launcher asks for; the
dispatch rule; and an h200 library that carries the extern (SASS only). Speed and numerics on
the H200: tests/gpu/check_qgemm.py.
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


def _planes(fmt: str, n: int, k: int, seed: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    rng = np.random.default_rng(seed)
    planes = encode_row_split(rng.standard_normal((n, k)).astype(np.float32), fmt)
    return planes, decode_row_split(planes, fmt, k)


@pytest.mark.parametrize("trans", [True, False])
@pytest.mark.parametrize("fmt", FORMATS)
def test_interpreter_matches_float64(fmt, trans):
    from ninfer_compiler.ops.qgemm_triton import grid_size, qgemm_kernel
    from ninfer_compiler.ops.triton_aot import interpreted

    m, n, k, bm, bn = 37, 48, 256, 32, 32  # ragged M and N, 4 K steps
    planes, w = _planes(fmt, n, k, seed=len(fmt) + trans)
    x = torch.tensor(np.random.default_rng(1).standard_normal((m, k)), dtype=torch.bfloat16)
    y = torch.full((m, n), float("nan"), dtype=torch.bfloat16)
    t = {name: torch.from_numpy(np.ascontiguousarray(p)) for name, p in planes.items()}
    interpreted(qgemm_kernel)[(grid_size(m, n, bm, bn),)](
        x, t["base"], t.get("high", t["base"]), t["scales"], y, m,
        N=n, K=k, BITS=int(fmt[1]), BLOCK_M=bm, BLOCK_N=bn, GROUP_M=2, TRANS=trans)
    got = y.double().numpy()
    xd = x.double().numpy()
    # what the kernel computes: weights `scale * code` rounded once to bf16, fp32 sums, bf16 out
    folded = torch.from_numpy(w).bfloat16().double().numpy()
    np.testing.assert_allclose(got, xd @ folded.T, rtol=2.0**-8, atol=1e-3)
    exact = xd @ w.astype(np.float64).T
    assert np.abs(got - exact).max() / np.abs(exact).max() < 5e-3


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


def test_supported_only_for_prefill_on_cuda():
    import tvm
    from tvm.relax.frontend import nn

    from ninfer_compiler.codegen.targets import tvm_target
    from ninfer_compiler.ops import qgemm
    from ninfer_runtime import targets

    def tensor(shape, dtype="bfloat16"):
        return nn.Tensor.placeholder(shape, dtype)

    s = tvm.tirx.Var("s", "int64")
    with tvm_target(targets.load("h200")):
        assert qgemm.supported(tensor([1, s, 512]), 96, 512)
        assert qgemm.supported(tensor([2, 9, 512]), 100, 512)
        assert not qgemm.supported(tensor([4, 8, 512]), 96, 512)  # decode-shaped
        assert not qgemm.supported(tensor([1, s, 320]), 96, 320)  # K % 128
        assert not qgemm.supported(tensor([1, s, 512], "float32"), 96, 512)
        assert not qgemm.supported(tensor([s, 512]), 96, 512)
    with tvm.target.Target("llvm"):
        assert not qgemm.supported(tensor([1, s, 512]), 96, 512)


def test_launcher_source_is_complete():
    from ninfer_compiler.ops import qgemm

    narrow, wide = qgemm.configs("sm_90a", 4)
    src = qgemm.launcher_source("ninfer_qgemm_q4_64x256", 4, 64, 256, narrow, wide)
    assert not re.search(r"@[A-Z_]+@", src)
    assert qgemm.kernel_name(4, 64, 256, narrow) in src and qgemm.kernel_name(4, 64, 256, wide) in src
    one = qgemm.launcher_source("ninfer_qgemm_q4_64x256", 4, 64, 256, *qgemm.configs("sm_120a", 4))
    assert "kWideBM = 0" in one


def test_h200_library_carries_the_extern(tmp_path):
    from ninfer_compiler.build import compile_module, export_module
    from ninfer_compiler.codegen.export import export_library
    from ninfer_compiler.codegen.fatbin import inspect_library
    from ninfer_compiler.codegen.targets import tvm_target
    from ninfer_compiler.codegen.toolchain import cuda_build
    from ninfer_compiler.ops import qgemm
    from ninfer_compiler.ops.row_split import plane_shapes
    from ninfer_runtime import targets

    require_tool("nvcc", "the CUDA toolkit builds device code")
    target = targets.load("h200")
    ttarget = tvm_target(target)
    k = 256
    a, b = plane_shapes("q4_g64_fp16", 64, k), plane_shapes("q5_g64_fp16", 96, k)
    inputs = {"x": ([1, "s", k], "bfloat16")}
    inputs.update({f"a_{p}": (list(s), d) for p, (s, d) in a.items()})
    inputs.update({f"b_{p}": (list(s), d) for p, (s, d) in b.items()})

    def main(x, a_base, a_scales, b_base, b_high, b_scales):
        assert qgemm.supported(x, 64, k) and qgemm.supported(x, 96, k)
        first = qgemm.qgemm(x, a_base, None, a_scales, "q4_g64_fp16")
        again = qgemm.qgemm(x, a_base, None, a_scales, "q4_g64_fp16")  # same shape: same extern
        return first + again, qgemm.qgemm(x, b_base, b_high, b_scales, "q5_g64_fp16")

    with ttarget:
        mod, _ = export_module(_op_module(main, inputs), {})
    with cuda_build(ttarget):
        exe = compile_module(mod, ttarget)
    lib = export_library(exe, tmp_path / "model.so", target)
    code = inspect_library(lib)
    assert code.problems("sm_90a") == [] and code.sass_archs == {"sm_90a"} and not code.ptx_archs
    data = lib.read_bytes()
    for name in (b"ninfer_qgemm_q4_64x256", b"ninfer_qgemm_q5_96x256", b"ninfer_qgemm_q4_n64_k256_t256x128g8",
                 b"ninfer_qgemm_q5_n96_k256_t128x128g8"):
        assert name in data
