"""Decode GEMV v5: the kernels build for every CUDA arch, the launcher builds against TVM, and the
fused externs sit inside an exported h200 decode function's CUDA-graph capture region.

Numerics and speed on the H200: `tests/gpu/check_qgemv5.py`.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from ninfer_compiler.ops import qgemv

from ..codegen.conftest import require_tool
from ..conftest import build_launcher


@pytest.mark.parametrize("arch", ["sm_90a", "sm_120a", "sm_121a"])
def test_v5_compiles_without_spills(arch, tmp_path):
    require_tool("nvcc", "the CUDA toolkit builds device code")
    from ninfer_compiler.codegen.toolchain import nvcc_path

    proc = subprocess.run(
        [nvcc_path(), "-cubin", "-O3", "-std=c++17", "-Xptxas", "-v",
         f"-gencode=arch={arch.replace('sm_', 'compute_')},code={arch}", str(qgemv.V5_DEVICE_SOURCE),
         "-o", str(tmp_path / "k.cubin")],
        capture_output=True, text=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    kernels = re.findall(r"Function properties for (\w+)\n\s+(\d+) bytes stack frame, (\d+) bytes spill stores", proc.stderr)
    assert {name for name, _, _ in kernels} == {"ninfer_qgemv5_ybf16", "ninfer_qgemv5_yf32"}
    assert all(stack == "0" and spills == "0" for _, stack, spills in kernels), kernels
    regs = [int(r) for r in re.findall(r"Used (\d+) registers", proc.stderr)]
    assert regs and max(regs) <= 128  # two 256-thread blocks per SM (__launch_bounds__(256, 2))


def test_v5_fatbin_is_sass_only():
    require_tool("nvcc", "the CUDA toolkit builds device code")
    from ninfer_compiler.codegen.fatbin import parse_fatbin

    data = qgemv.fatbin_v5("sm_90a")
    assert b"ninfer_qgemv5_ybf16" in data
    entries, _ = parse_fatbin(data, 0)
    assert entries and all(e.kind == "elf" and e.arch == "sm_90a" for e in entries)


def test_v5_launcher_builds_against_tvm(tmp_path):
    """The launcher as the package links it (plan header and fatbin inlined, TVM FFI exports)."""
    require_tool("nvcc", "the CUDA toolkit builds device code")
    from ninfer_compiler.ops import cuda_extern

    symbols = build_launcher(cuda_extern.host_source(qgemv.host_source_v5("sm_90a"), []), tmp_path)
    for name in (qgemv.V5_MULTI, qgemv.V5_SWIGLU, qgemv.V5_ADD):
        assert re.search(rf"\bT __tvm_ffi_{name}\b", symbols), name


def _decode_module(k: int, inner: int, dense_output: bool = True):
    """A parameterised `decode(x, residual)` chaining one fused call of each kind (GDN- and MLP-shaped);
    its results go through elementwise ops, as in a model, so the fused calls' outputs are internal."""
    from tvm.relax.frontend import nn
    from tvm.relax.frontend.nn import op, spec

    from ninfer_compiler.frontend.layers.quantized_linear import QuantizedLinear
    from ninfer_compiler.ops.linear_weight import LinearWeight, linear_weight

    class Decode(nn.Module):
        def __init__(self) -> None:
            self.q = QuantizedLinear(k, k // 2, "q4_g64_fp16")
            self.v = QuantizedLinear(k, k // 2, "q5_g64_fp16")
            self.z = QuantizedLinear(k, k, "q5_g64_fp16")
            self.a = nn.Parameter((16, k), "bfloat16")
            self.out = QuantizedLinear(k, k, "q6_g64_fp16")
            self.gate = QuantizedLinear(k, inner, "q4_g64_fp16")
            self.up = QuantizedLinear(k, inner, "q4_g64_fp16")
            self.down = QuantizedLinear(inner, k, "q5_g64_fp16")

        def decode(self, x: nn.Tensor, residual: nn.Tensor):
            groups = [[linear_weight(self.q), linear_weight(self.v)], [linear_weight(self.z)]]
            if dense_output:  # v5 also takes dense bf16 weights in a multi call
                groups.append([LinearWeight("bfloat16", 16, k, self.a)])
            qv, z, *rest = qgemv.gemv_multi(x, groups)
            a = rest[0] if rest else z
            h = qgemv.gemv_add(qv, linear_weight(self.out), op.add(z, residual))
            m = qgemv.gemv_swiglu(h, linear_weight(self.gate), linear_weight(self.up))
            y = qgemv.gemv_add(m, linear_weight(self.down), h)
            return op.add(y, y), op.multiply(a, a)

        def get_export_spec(self) -> dict:
            return {"decode": {"x": spec.Tensor(["b", 1, k], "bfloat16"),
                               "residual": spec.Tensor(["b", 1, k], "bfloat16"),
                               "$": {"param_mode": "packed", "effect_mode": "none"}}}

    return Decode()


@pytest.mark.parametrize("family", ["v5", "v4"])
def test_decode_graph_captures_fused_gemvs(family, monkeypatch):
    """The fused externs (v5's with the opt-in feature, else the v4 launcher's) are called by decode
    and sit inside the decode graph's capture region."""
    require_tool("nvcc", "the CUDA toolkit builds device code")
    if family == "v5":
        monkeypatch.setenv("NINFER_KERNELS", "+gemv5")
        names = {"multi": qgemv.V5_MULTI, "add": qgemv.V5_ADD, "swiglu": qgemv.V5_SWIGLU}
    else:
        names = {"multi": qgemv.MULTI_SYMBOL, "add": qgemv.ADD_SYMBOL, "swiglu": qgemv.SWIGLU_SYMBOL}
    import tvm

    from ninfer_compiler.build import export_module
    from ninfer_compiler.codegen.graphs import add_graph_variants
    from ninfer_compiler.codegen.targets import tvm_target
    from ninfer_compiler.codegen.toolchain import cuda_build
    from ninfer_compiler.passes.pipeline import relax_pipeline
    from ninfer_runtime import targets

    ttarget = tvm_target(targets.load("h200"))
    model = _decode_module(256, 128 if family == "v5" else 256, dense_output=family == "v5")  # v4: K % 256
    with ttarget:
        mod, _ = export_module(model, {"decode": {"b": 8}})
    assert set(names.values()) <= set(re.findall(r"ninfer_qgemv\w+", mod["decode"].script()))
    mod = add_graph_variants(mod)
    with cuda_build(ttarget), tvm.transform.PassContext(config={"relax.backend.use_cuda_graph": True}):
        mod = relax_pipeline(ttarget)(mod)
    captured = "".join(mod[gv].script() for gv in mod.get_global_vars() if "decode_graph_cuda_graph_capture" in gv.name_hint)
    calls = re.findall(r'R\.call_packed\("(ninfer_qgemv\w*)"', captured)
    assert sorted(calls) == sorted([names["multi"], names["add"], names["swiglu"], names["add"]])
    assert 'R.call_packed("ninfer_qgemv' not in mod["decode_graph"].script()  # only graph launches outside
    assert 'R.call_packed("ninfer_qgemv' in mod["decode"].script()  # the eager variant calls them directly


def test_fused_supported_rules(monkeypatch):
    """What the dispatcher may send (traced shapes; the current target decides CUDA or not), and the
    opt-in kernel feature "gemv5" in front of it."""
    import tvm
    from tvm.relax.frontend import nn

    from ninfer_compiler.codegen.targets import tvm_target
    from ninfer_compiler.ops.linear_weight import LinearWeight
    from ninfer_runtime import targets

    def q(fmt: str, rows: int, k: int) -> LinearWeight:
        high = nn.Parameter((rows, k // 64 * (8 if fmt[1] == "5" else 16)), "uint8") if fmt[1] in "56" else None
        return LinearWeight(fmt, rows, k, nn.Parameter((rows, k // 2), "uint8"), high, nn.Parameter((rows, k // 64), "float16"))

    x = nn.Tensor.placeholder(["b", 1, 256], "bfloat16")
    dense = LinearWeight("bfloat16", 48, 256, nn.Parameter((48, 256), "bfloat16"))
    ok = [q("q4_g64_fp16", 32, 256), q("q5_g64_fp16", 48, 256), q("q6_g64_fp16", 16, 256), dense]
    monkeypatch.setenv("NINFER_KERNELS", "+gemv5")
    assert not qgemv.fused_supported(x, ok)  # no CUDA target
    with tvm_target(targets.load("h200")):
        assert qgemv.fused_supported(x, ok)
        monkeypatch.setenv("NINFER_KERNELS", "-gemv5")
        assert not qgemv.fused_supported(x, ok) and qgemv.fused_accepts(x, ok)
        monkeypatch.setenv("NINFER_KERNELS", "+gemv5")
        assert not qgemv.fused_supported(nn.Tensor.placeholder(["b", 1, 192], "bfloat16"),
                                         [q("q4_g64_fp16", 32, 192)])
        assert not qgemv.fused_supported(nn.Tensor.placeholder(["b", 2, 256], "bfloat16"), ok[:1])
        assert not qgemv.fused_supported(nn.Tensor.placeholder(["b", 1, 256], "float32"), ok[:1])
        assert not qgemv.fused_supported(x, [q("q4_g64_fp16", 40, 256)])
        q8 = LinearWeight("q8_g32_fp16", 32, 256, nn.Parameter((32, 256), "uint8"), None,
                          nn.Parameter((32, 8), "float16"))
        assert not qgemv.fused_supported(x, [q8])
        assert not qgemv.fused_supported(x, ok[:1] * 9)
        assert qgemv.fused_supported(x, ok[:1] * 2, op="swiglu")
        assert not qgemv.fused_supported(x, ok[:2], op="swiglu")
        assert not qgemv.fused_supported(x, [dense, dense], op="swiglu")
        assert qgemv.fused_supported(x, [dense], op="add") and not qgemv.fused_supported(x, ok[:2], op="add")
    assert tvm.target.Target.current(allow_none=True) is None


def test_launcher_reads_the_argument_layout_of_the_externs(tmp_path):
    """The TVM exports parse the argument lists `gemv_multi` / `gemv_swiglu` / `gemv_add` emit (CPU
    tensors: every argument is read and checked, then the launch refuses the device)."""
    require_tool("nvcc", "the CUDA toolkit builds device code")
    cxx = shutil.which("g++")
    if cxx is None:
        pytest.skip("g++ is not on PATH")
    import numpy as np
    import tvm
    from tvm.relax.frontend import nn

    from ninfer_compiler.ops import cuda_extern

    src, lib = tmp_path / "launcher.cc", tmp_path / "launcher.so"
    src.write_text(cuda_extern.host_source(qgemv.host_source_v5("sm_90a"), []))
    flags = [f for f in nn.SourceModule.get_compile_options("cpp") if f != "-c"]
    subprocess.run([cxx, *flags, "-shared", "-fPIC", str(src), "-o", str(lib), "-ldl"], check=True)
    mod = tvm.runtime.load_module(str(lib))
    k, b = 256, 3

    def t(shape, dtype):
        return tvm.runtime.tensor(np.zeros(shape, dtype=dtype))

    bf = "bfloat16"
    x = tvm.runtime.empty((b, 1, k), bf)
    q4 = [4, t((32, k // 2), "uint8"), t((32, k // 2), "uint8"), t((32, k // 64), "float16")]
    q5 = [5, t((16, k // 2), "uint8"), t((16, k // 8), "uint8"), t((16, k // 64), "float16")]
    dense = tvm.runtime.empty((8, k), bf)
    ys = [tvm.runtime.empty((b, 1, 48), bf), tvm.runtime.empty((b, 1, 8), bf)]

    def outcome(name, *args):
        try:
            mod[name](*args)
        except Exception as exc:  # noqa: BLE001 - the message says which check stopped it
            return str(exc)
        return "ran"

    device = "x must be on a CUDA device"
    assert device in outcome(qgemv.V5_MULTI, x, 2, 2, 1, *q4, *q5, 16, dense, dense, dense, *ys)
    assert device in outcome(qgemv.V5_SWIGLU, x, *q4, *q4[1:], tvm.runtime.empty((b, 1, 32), bf))
    assert device in outcome(qgemv.V5_ADD, x, *q5, tvm.runtime.empty((b, 1, 16), bf), tvm.runtime.empty((b, 1, 16), bf))
    assert "arguments" in outcome(qgemv.V5_MULTI, x, 2, 2, 1, *q4, *q5, 16, dense, dense, dense, ys[0])
    assert "base plane" in outcome(qgemv.V5_ADD, x, 5, q5[2], q5[2], q5[3], ys[1], ys[1])
