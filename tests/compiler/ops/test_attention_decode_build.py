"""Split-KV decode attention as an extern of an exported module (no GPU: structure only).

The kernels' images compile for the three CUDA archs; a Relax module calling the op for the 27B
attention shape builds for the h200 target into one library that passes the AOT check and
carries both launchers and both kernels. Numerics: test_attention_decode.py (interpreter) and
tests/gpu/check_attention_decode.py (H200).
"""

from __future__ import annotations

import pytest

pytest.importorskip("tvm")
pytest.importorskip("triton")

from ..codegen.conftest import require_tool  # noqa: E402
from ..conftest import _op_module  # noqa: E402

HQ, HKV, D, PS = 24, 4, 256, 16
SPEC = {
    "q": (["b", 1, HQ, D], "bfloat16"),
    "pool": ([2, "pages", 2, HKV, PS, D], "bfloat16"),
    "pages": (["b", "p"], "int32"),
    "lens": (["b"], "int32"),
}


@pytest.mark.parametrize("arch", ["sm_90a", "sm_120a", "sm_121a"])
def test_images_compile_for_each_arch(arch):
    from ninfer_compiler.ops import attention_decode as ad
    from ninfer_compiler.ops.triton_aot import cubin_arch

    require_tool("nvcc", "the CUDA toolkit wraps cubins into fatbins")
    split, combine = ad.images(arch, HQ, HKV, D, PS)
    assert {split.name, combine.name} == {"_split_kernel", "_combine_kernel"}
    assert cubin_arch(split.cubin) == cubin_arch(combine.cubin) == int(arch[3:-1])
    assert split.threads == ad.NUM_WARPS * 32 and split.shared <= 48 * 1024


def test_supported_only_for_decode_on_cuda():
    from tvm.relax.frontend import nn

    from ninfer_compiler.codegen.targets import tvm_target
    from ninfer_compiler.ops.attention_decode import supported
    from ninfer_runtime import targets

    pool = nn.Tensor.placeholder([2, "pages", 2, HKV, PS, D], "bfloat16")
    decode = nn.Tensor.placeholder(["b", 1, HQ, D], "bfloat16")
    assert not supported(decode, pool, PS)  # no target
    with tvm_target(targets.load("h200")):
        assert supported(decode, pool, PS)
        assert not supported(nn.Tensor.placeholder(["b", "n", HQ, D], "bfloat16"), pool, PS)
        assert not supported(nn.Tensor.placeholder([1, 4, HQ, D], "bfloat16"), pool, PS)
        assert not supported(nn.Tensor.placeholder(["b", 1, HQ, D], "float32"), pool, PS)
        assert not supported(decode, pool, 64)  # pages larger than a key block
    with tvm_target(targets.load("cpu")):
        assert not supported(decode, pool, PS)


def test_h200_library_carries_the_kernels(tmp_path):
    from ninfer_compiler.build import compile_module, export_module
    from ninfer_compiler.codegen.export import export_library
    from ninfer_compiler.codegen.fatbin import extract_fatbins, inspect_library
    from ninfer_compiler.codegen.targets import tvm_target
    from ninfer_compiler.codegen.toolchain import cuda_build
    from ninfer_compiler.ops.attention_decode import (
        COMBINE_SYMBOL,
        SPLIT_SYMBOL,
        paged_attention_decode,
    )
    from ninfer_runtime import targets

    require_tool("nvcc", "the CUDA toolkit builds device code")

    def fn(q, pool, pages, lens):
        return paged_attention_decode(q, pool, pages, lens, 1, PS)

    target = targets.load("h200")
    ttarget = tvm_target(target)
    with ttarget:
        mod, _ = export_module(_op_module(fn, SPEC), {})
    script = mod.script()
    assert SPLIT_SYMBOL in script and COMBINE_SYMBOL in script
    with cuda_build(ttarget):
        exe = compile_module(mod, ttarget)
    lib = export_library(exe, tmp_path / "model.so", target)
    code = inspect_library(lib)
    assert code.problems("sm_90a") == []
    assert code.sass_archs == {"sm_90a"} and not code.ptx_archs and not code.has_cuda_source
    data = lib.read_bytes()
    assert SPLIT_SYMBOL.encode() in data and COMBINE_SYMBOL.encode() in data
    assert any(b"_split_kernel" in fb for fb in extract_fatbins(lib))


def test_h200_library_with_the_int8_output(tmp_path):
    """The gated combine that also writes int8 activations (`with_xq`): a DPS call with two outputs,
    its launcher and images linked into an h200 library."""
    from ninfer_compiler.ops.attention_decode import COMBINE_SYMBOL, paged_attention_decode

    from ..conftest import h200_library

    def fn(q, pool, pages, lens, gate):
        o, xq = paged_attention_decode(q, pool, pages, lens, 1, PS, gate=gate, with_xq=True)
        return o, xq

    text, lib = h200_library(fn, {**SPEC, "gate": (["b", 1, HQ * D], "bfloat16")}, tmp_path / "model.so")
    symbol = next(s for s in text.split('"') if s.startswith(COMBINE_SYMBOL))
    assert symbol.endswith("_gated_xq") and f"R.Tensor(({HQ * D * 8 + HQ * D // 256 * 64},), dtype=\"uint8\")" in text
    assert symbol.encode() in lib.read_bytes()


def test_h200_library_with_the_early_split(tmp_path, monkeypatch):
    """`attention_split_early`: the split kernel's EARLY image (under PDL, loads before the wait, no store
    before it: tests/compiler/ops/test_pdl_kernels.py) in an h200 library, its symbols tagged `_early`."""
    from ninfer_compiler.ops.attention_decode import SPLIT_SYMBOL, paged_attention_decode

    from ..conftest import h200_library

    monkeypatch.setenv("NINFER_KERNELS", "+attention_split_early")

    def fn(q, pool, pages, lens, gate):
        o, xq = paged_attention_decode(q, pool, pages, lens, 1, PS, gate=gate, with_xq=True)
        return o, xq

    text, lib = h200_library(fn, {**SPEC, "gate": (["b", 1, HQ * D], "bfloat16")}, tmp_path / "model.so")
    symbol = next(s for s in text.split('"') if s.startswith(SPLIT_SYMBOL))
    assert symbol.endswith("_gated_xq_early") and symbol.encode() in lib.read_bytes()
