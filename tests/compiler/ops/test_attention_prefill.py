"""Prefill attention Triton kernel (`ops/attention_prefill.py`), without a GPU.

Numerics are in `test_attention_prefill_interpreter.py`. Here: the kernel compiles ahead of time
for every CUDA arch we target,
and a Relax module calling the op exports for the h200 target as one library that passes the AOT
check and carries the launcher.
"""

from __future__ import annotations

import pytest

from ..codegen.conftest import require_tool
from ..conftest import _op_module

pytest.importorskip("triton")

from ninfer_compiler.ops import attention_prefill as ap  # noqa: E402


def test_qk_scale_folds_log2e():
    assert ap.qk_scale(256, None) == pytest.approx(ap.LOG2E / 16)
    assert ap.qk_scale(256, 0.5) == pytest.approx(0.5 * ap.LOG2E)


def test_shape_checks():
    with pytest.raises(ValueError, match="multiple"):
        ap.check_shapes(6, 4, 256, 16)
    with pytest.raises(ValueError, match="head_dim"):
        ap.check_shapes(24, 4, 96, 16)
    ap.check_shapes(24, 4, 256, 16)


@pytest.mark.parametrize("arch", ["sm_90a", "sm_120a", "sm_121a"])
def test_aot_image_for_each_arch(arch):
    from ninfer_compiler.codegen.fatbin import parse_fatbin
    from ninfer_compiler.ops.triton_aot import cubin_arch

    require_tool("nvcc", "the CUDA toolkit wraps cubins into fatbins")
    (img,) = ap.images(arch, 24, 4, 256, 16)
    block_m, block_n, num_warps, _ = ap.config(arch, 256)
    assert img.threads == num_warps * 32
    assert cubin_arch(img.cubin) == int(arch[3:-1])
    assert [(e.kind, e.arch) for e in parse_fatbin(img.fatbin, 0)[0]] == [("elf", arch)]
    limit = 227 * 1024 if arch == "sm_90a" else 99 * 1024
    assert 0 < img.shared <= limit, f"{img.shared} bytes of shared memory for {block_m}x{block_n}"


def test_tiny_model_head_dim_builds_for_h200():
    """The tiny test model (head dim 64, 4 query / 2 KV heads) takes this kernel on CUDA targets too."""
    require_tool("nvcc", "the CUDA toolkit wraps cubins into fatbins")
    (img,) = ap.images("sm_90a", 4, 2, 64, 16)
    assert 0 < img.shared <= 227 * 1024


def test_host_source_fills_every_placeholder():
    src = ap.host_source("prefill_kernel", "sm_90a", 24, 4, 256, 16, ap.qk_scale(256, None))
    assert "@" not in src
    assert "TVM_FFI_DLL_EXPORT_TYPED_FUNC(ninfer_attention_prefill, attention_prefill)" in src
    assert "(t + 128 - 1) / 128" in src and '"prefill_kernel", 24u' in src


def test_supported_only_on_cuda_with_prefill_shapes():
    pytest.importorskip("tvm")
    from tvm.relax.frontend import nn

    from ninfer_compiler.codegen.targets import tvm_target
    from ninfer_runtime import targets

    q = nn.Tensor.placeholder(["b", "n", 24, 256], "bfloat16")
    one = nn.Tensor.placeholder(["b", 1, 24, 256], "bfloat16")
    pool = nn.Tensor.placeholder([16, "pages", 2, 4, 16, 256], "bfloat16")
    assert not ap.supported(q, pool, 16)  # no target: CPU
    with tvm_target(targets.load("h200")):
        assert ap.supported(q, pool, 16)
        assert not ap.supported(one, pool, 16)
        assert not ap.supported(nn.Tensor.placeholder(["b", "n", 24, 256], "float32"), pool, 16)


def test_op_exports_for_h200(tmp_path):
    pytest.importorskip("tvm")
    from ninfer_compiler.build import compile_module, export_module
    from ninfer_compiler.codegen.export import export_library
    from ninfer_compiler.codegen.fatbin import inspect_library
    from ninfer_compiler.codegen.targets import tvm_target
    from ninfer_compiler.codegen.toolchain import cuda_build
    from ninfer_runtime import targets

    require_tool("nvcc", "the CUDA toolkit builds device code")

    def fn(q, pool, pages, lens):
        return ap.paged_attention_prefill(q, pool, pages, lens, layer=1, page_size=16)

    inputs = {
        "q": ([1, "n", 24, 256], "bfloat16"),
        "pool": ([2, "pages", 2, 4, 16, 256], "bfloat16"),
        "pages": ([1, "p"], "int32"),
        "lens": ([1], "int32"),
    }
    target = targets.load("h200")
    ttarget = tvm_target(target)
    with ttarget:
        mod, _ = export_module(_op_module(fn, inputs), {})
    assert ap.SYMBOL in mod.script()
    with cuda_build(ttarget):
        exe = compile_module(mod, ttarget)
    lib = export_library(exe, tmp_path / "model.so", target)
    code = inspect_library(lib)
    assert code.problems("sm_90a") == []
    assert code.sass_archs == {"sm_90a"} and not code.ptx_archs
    assert ap.SYMBOL.encode() in lib.read_bytes() and b"prefill_kernel" in lib.read_bytes()
