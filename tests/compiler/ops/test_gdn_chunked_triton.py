"""Chunked GDN Triton kernels (`ops/gdn_chunked_triton.py`): AOT images, the op's support check
and a Relax module that calls the op exporting as a library for the h200 target (no GPU here).
Numerics are checked under Triton's interpreter (`test_gdn_chunked_triton_interpreter.py`).
"""

from __future__ import annotations

import pytest

from ..codegen.conftest import require_tool
from ..conftest import _op_module

pytest.importorskip("triton")

HK, HV, DK, DV = 2, 4, 16, 32
GDN_INPUTS = {
    "q": ([1, "t", HK, DK], "float32"),
    "k": ([1, "t", HK, DK], "float32"),
    "v": ([1, "t", HV, DV], "float32"),
    "g": ([1, "t", HV], "float32"),
    "beta": ([1, "t", HV], "float32"),
    "state": ([3, 2, HV, DK, DV], "float32"),
    "slot_ids": ([1], "int32"),
    "seq_lens": ([1], "int32"),
}


@pytest.mark.parametrize("arch", ["sm_90a", "sm_120a", "sm_121a"])
def test_images_carry_sass_for_the_arch(arch):
    from ninfer_compiler.codegen.fatbin import parse_fatbin
    from ninfer_compiler.ops import gdn_chunked_triton as gdn
    from ninfer_compiler.ops.triton_aot import cubin_arch

    require_tool("nvcc", "the CUDA toolkit wraps cubins into fatbins")
    prep, walk = gdn.images(arch, HK, HV, DK, DV, "float32", "float32")
    assert (prep.name, walk.name) == ("prep_kernel", "walk_kernel")
    # the launch shapes fit the arch's shared memory (sm_12x: ~99 KB per block)
    limit = 227 * 1024 if arch == "sm_90a" else 99 * 1024
    assert max(prep.shared, walk.shared) <= limit
    for img in (prep, walk):
        assert cubin_arch(img.cubin) == int(arch[3:-1])
        entries, _ = parse_fatbin(img.fatbin, 0)
        assert [(e.kind, e.arch) for e in entries] == [("elf", arch)]


def test_sm12x_launch_shape_fits_shared_memory_with_27b_heads():
    """sm_12x blocks get ~99 KB of shared memory; the shipped shape at Hk 16, Hv 48, dk = dv = 128
    must fit (the sm_90a shapes ran on the H200 with these heads: tests/gpu/check_gdn_chunked.py)."""
    from ninfer_compiler.ops import gdn_chunked_triton as gdn

    require_tool("nvcc", "the CUDA toolkit wraps cubins into fatbins")
    prep, walk = gdn.images("sm_120a", 16, 48, 128, 128, "float32", "float32")
    assert max(prep.shared, walk.shared) <= 99 * 1024, (prep.shared, walk.shared)
    assert gdn.config_for("sm_90a", "float32").bv == 64 and gdn.config_for("sm_90a", "bfloat16").bv == 32
    with pytest.raises(ValueError, match="sm_80"):
        gdn.config_for("sm_80", "float32")


def test_wants_16bit_inputs_only_where_the_kernels_run():
    from ninfer_compiler.codegen.targets import tvm_target
    from ninfer_compiler.ops.common import reference_kernels
    from ninfer_compiler.ops.gdn_chunked_triton import wants_16bit_inputs
    from ninfer_runtime import targets

    assert not wants_16bit_inputs(16, 48, 128, 128, "bfloat16")  # no target
    with tvm_target(targets.load("h200")):
        assert wants_16bit_inputs(16, 48, 128, 128, "bfloat16")
        assert not wants_16bit_inputs(16, 48, 128, 128, "float32")  # fp32 v: nothing to keep 16-bit
        assert not wants_16bit_inputs(16, 48, 128, 24, "bfloat16")
        with reference_kernels():
            assert not wants_16bit_inputs(16, 48, 128, 128, "bfloat16")


def test_check_shapes_names_the_problem():
    from ninfer_compiler.ops.gdn_chunked_triton import check_shapes

    check_shapes(16, 48, 128, 128, 32)
    with pytest.raises(ValueError, match="multiple of key heads"):
        check_shapes(3, 4, 16, 32, 16)
    with pytest.raises(ValueError, match="dk = 24"):
        check_shapes(2, 4, 24, 32, 16)


def test_supported_needs_a_cuda_target_and_the_layer_dtypes():
    from tvm.relax.frontend import nn

    from ninfer_compiler.codegen.targets import tvm_target
    from ninfer_compiler.ops.gdn_chunked_triton import supported
    from ninfer_runtime import targets

    def t(shape, dtype="float32"):
        return nn.Tensor.placeholder(shape, dtype)

    args = (t([1, 8, HK, DK]), t([1, 8, HK, DK]), t([1, 8, HV, DV]), t([1, 8, HV]), t([1, 8, HV]),
            t([3, 2, HV, DK, DV]))
    assert not supported(*args)  # no target: the CPU kernels
    with tvm_target(targets.load("h200")):
        assert supported(*args)
        assert not supported(*args[:5], t([3, 2, HV, DK, DV], "bfloat16"))
        assert not supported(t([1, 8, HK, 24]), t([1, 8, HK, 24]), *args[2:])
        # 16-bit q/k (read in place by the walk) and bf16 v / o; g, beta stay fp32
        assert supported(t([1, 8, HK, DK], "float16"), t([1, 8, HK, DK], "float16"), t([1, 8, HV, DV], "bfloat16"),
                         *args[3:])
        assert not supported(t([1, 8, HK, DK], "float16"), *args[1:])  # q and k differ
        assert not supported(*args[:3], t([1, 8, HV], "bfloat16"), *args[4:])


def test_workspace_layout_is_16_byte_aligned():
    """Each token's workspace row and its q/k copies start on 16 bytes (vector loads, cp.async)."""
    from ninfer_compiler.ops.gdn_chunked_triton import CHUNK, workspace_width

    for hk, hv, dk in ((16, 48, 128), (2, 4, 16), (1, 3, 16), (4, 20, 64)):
        for f32 in (False, True):
            size = 4 if f32 else 2
            width = workspace_width(hk, hv, dk, not f32, f32)
            assert width * size % 16 == 0
            copies = workspace_width(hk, hv, dk, False, f32)
            assert copies * size % 16 == 0 and copies >= 2 * hv * CHUNK + hv * 4 // size


def test_op_module_exports_and_passes_the_aot_check(tmp_path):
    from ninfer_compiler.build import compile_module, export_module
    from ninfer_compiler.codegen.export import export_library
    from ninfer_compiler.codegen.fatbin import inspect_library
    from ninfer_compiler.codegen.targets import tvm_target
    from ninfer_compiler.codegen.toolchain import cuda_build
    from ninfer_compiler.ops.gdn_chunked_triton import gdn_chunked
    from ninfer_runtime import targets

    require_tool("nvcc", "the CUDA toolkit builds device code")

    def op(q, k, v, g, beta, state, slot_ids, seq_lens):
        o, new_state = gdn_chunked(q, k, v, g, beta, state, slot_ids, seq_lens, 2)
        return o, new_state

    target = targets.load("h200")
    ttarget = tvm_target(target)
    with ttarget:
        mod, _ = export_module(_op_module(op, GDN_INPUTS), {})
    script = mod.script()
    assert "call_inplace_packed" in script and "ninfer_gdn_chunked_prep_hk2_hv4_dk16_dv32_fp32_fp32" in script
    with cuda_build(ttarget):
        exe = compile_module(mod, ttarget)
    lib = export_library(exe, tmp_path / "model.so", target)
    code = inspect_library(lib)
    assert code.problems("sm_90a") == []
    data = lib.read_bytes()
    assert b"ninfer_gdn_chunked_state_hk2_hv4_dk16_dv32_fp32_fp32" in data and b"walk_kernel" in data


INPLACE_SOURCE = r"""
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/container/tuple.h>
#include <tvm/ffi/function.h>
namespace {
// o = x + layer; state[layer] += 1; returns (o, state) as the GDN launcher does.
tvm::ffi::Tuple<tvm::ffi::Tensor, tvm::ffi::Tensor> step(tvm::ffi::TensorView x, int64_t layer,
                                                         tvm::ffi::Tensor o, tvm::ffi::Tensor state) {
  const float* xp = static_cast<const float*>(x.data_ptr());
  float* op = static_cast<float*>(o.data_ptr());
  for (int64_t i = 0; i < x.numel(); ++i) op[i] = xp[i] + static_cast<float>(layer);
  float* sp = static_cast<float*>(state.data_ptr()) + layer * state.size(1);
  for (int64_t i = 0; i < state.size(1); ++i) sp[i] += 1.0f;
  return tvm::ffi::Tuple<tvm::ffi::Tensor, tvm::ffi::Tensor>(o, state);
}
}  // namespace
TVM_FFI_DLL_EXPORT_TYPED_FUNC(ninfer_test_inplace_step, step);
"""


def test_inplace_call_aliases_the_state_on_the_vm():
    """`inplace_call` (how the op updates the state) on the CPU VM with a C++ function."""
    import numpy as np
    import tvm
    from tvm.relax.frontend import nn
    from tvm.relax.frontend.nn import op

    from ninfer_compiler.build import compile_module, load_vm
    from ninfer_compiler.ops.cuda_extern import inplace_call

    def fn(x, state):
        module = nn.SourceModule({"ninfer_test_inplace_step": lambda *a: None}, INPLACE_SOURCE, "cpp",
                                 compile_options=[*nn.SourceModule.get_compile_options("cpp"), "-fPIC"])
        nn.add_extern(module)
        o, new_state = inplace_call("ninfer_test_inplace_step", [x, 1], [op.empty(x.shape, "float32"), state])
        return op.add(o, o), new_state

    model = _op_module(fn, {"x": ([5], "float32"), "state": ([2, 3], "float32")})
    mod, _, externs = model.export_tvm(spec=model.get_export_spec(), allow_extern=True)
    mod = tvm.relax.transform.AttachExternModules(externs)(mod)
    vm = load_vm(compile_module(mod, "llvm"))
    x = np.arange(5, dtype="float32")
    state = tvm.runtime.tensor(np.zeros((2, 3), "float32"))
    out, new_state = vm["main"](tvm.runtime.tensor(x), state)
    np.testing.assert_array_equal(out.numpy(), 2 * (x + 1))
    np.testing.assert_array_equal(state.numpy(), [[0, 0, 0], [1, 1, 1]])  # written where it lives
    np.testing.assert_array_equal(new_state.numpy(), state.numpy())
