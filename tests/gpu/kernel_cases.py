"""Our custom GPU kernels one by one, for the H200 check: built here, run there against the CPU kernels.

`build(stage)` compiles each case twice: the CPU kernel (LLVM), which gives the expected outputs
on the case's inputs, and the GPU kernel for sm_90a, exported as `kernels/<case>.so`; inputs and
expected outputs (including in-place updated caches) go to `kernels/<case>.npz`. `run(stage)`
needs only TVM's runtime: it runs each library on the GPU and returns the max relative errors.
Dimensions are the real Qwen3.5 ones where they change the kernels' thread layout (head_dim 256,
GDN head dims 128).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

RNG = np.random.default_rng(7)


def _attention_case():
    from ninfer_compiler.ops.paged_attention import kv_append, paged_attention

    hq, hkv, d, ps = 8, 2, 256, 16

    def fn(q, k, v, pool, pages, lens):
        pool = kv_append(pool, k, v, pages, lens, layer=1, page_size=ps)
        return paged_attention(q, pool, pages, lens, layer=1, page_size=ps), pool

    spec = {"q": (["b", "n", hq, d], "float32"), "k": (["b", "n", hkv, d], "float32"),
            "v": (["b", "n", hkv, d], "float32"), "pool": ([2, "pages", 2, hkv, ps, d], "float32"),
            "pages": (["b", "p"], "int32"), "lens": (["b"], "int32")}
    lens = np.array([20, 130, 0], np.int32)
    new = 5
    pages = np.array([[7, 2, 9, 0, 0, 0, 0, 0, 0, 0], [3, 11, 5, 1, 4, 6, 8, 10, 12, 13],
                      [14, 0, 0, 0, 0, 0, 0, 0, 0, 0]], np.int32)
    pool = RNG.standard_normal((2, 15, 2, hkv, ps, d)).astype(np.float32)
    arrays = [RNG.standard_normal((3, new, hq, d)).astype(np.float32),
              RNG.standard_normal((3, new, hkv, d)).astype(np.float32),
              RNG.standard_normal((3, new, hkv, d)).astype(np.float32), pool, pages, lens]
    return fn, spec, arrays


def _gdn_case(chunked: bool, n: int):
    from ninfer_compiler.ops.gated_delta_rule import gated_delta_rule

    hk, hv, dk, dv = 2, 4, 128, 128

    def fn(q, k, v, g, beta, state, slots, lens):
        return gated_delta_rule(q, k, v, g, beta, state, slots, lens, layer=1, chunked=chunked)

    spec = {"q": (["b", "n", hk, dk], "float32"), "k": (["b", "n", hk, dk], "float32"),
            "v": (["b", "n", hv, dv], "float32"), "g": (["b", "n", hv], "float32"),
            "beta": (["b", "n", hv], "float32"), "state": ([2, "s", hv, dk, dv], "float32"),
            "slots": (["b"], "int32"), "lens": (["b"], "int32")}

    def l2(x):
        return x / np.sqrt((x * x).sum(-1, keepdims=True) + 1e-6)

    b = 2
    arrays = [(l2(RNG.standard_normal((b, n, hk, dk))) / np.sqrt(dk)).astype(np.float32),
              l2(RNG.standard_normal((b, n, hk, dk))).astype(np.float32),
              RNG.standard_normal((b, n, hv, dv)).astype(np.float32),
              (-np.exp(RNG.standard_normal((b, n, hv)) * 0.5) * 0.3).astype(np.float32),
              (1 / (1 + np.exp(-RNG.standard_normal((b, n, hv))))).astype(np.float32),
              (RNG.standard_normal((2, 4, hv, dk, dv)) * 0.1).astype(np.float32),
              np.array([2, 0], np.int32), np.array([0, 40], np.int32)]
    return fn, spec, arrays


def _conv_case():
    from ninfer_compiler.ops.conv1d import causal_conv1d_with_state

    c, k = 320, 4
    spec = {"x": (["b", "n", c], "float32"), "w": ([k, c], "float32"), "state": ([2, "s", k - 1, c], "float32"),
            "slots": (["b"], "int32"), "lens": (["b"], "int32")}
    arrays = [RNG.standard_normal((2, 9, c)).astype(np.float32), RNG.standard_normal((k, c)).astype(np.float32),
              RNG.standard_normal((2, 4, k - 1, c)).astype(np.float32), np.array([3, 1], np.int32),
              np.array([0, 12], np.int32)]
    return (lambda x, w, state, slots, lens: causal_conv1d_with_state(x, w, state, slots, lens, 1)), spec, arrays


CASES = {
    "attention": _attention_case,
    "gdn_chunked": lambda: _gdn_case(True, 150),
    "gdn_recurrent": lambda: _gdn_case(False, 3),
    "conv1d": _conv_case,
}


def build(stage: Path) -> dict:
    """Build every case (CPU reference outputs + sm_90a library); returns build notes."""
    import tvm

    from ninfer_compiler.build import compile_module, load_vm
    from ninfer_compiler.codegen.targets import tvm_target
    from ninfer_compiler.codegen.toolchain import cuda_build
    from ninfer_runtime import targets
    from tests.compiler.conftest import _op_module

    out = stage / "kernels"
    out.mkdir(parents=True, exist_ok=True)
    gpu = tvm_target(targets.load("h200"))
    notes = {}
    for name, make in CASES.items():
        fn, spec, arrays = make()
        model = _op_module(fn, spec)
        mod, _ = model.export_tvm(spec=model.get_export_spec())
        vm = load_vm(compile_module(mod, "llvm"))
        tensors = [tvm.runtime.tensor(a) for a in arrays]
        res = vm["main"](*tensors)
        outs = list(res) if isinstance(res, tvm.ir.Array | tuple | list) else [res]
        expected = {f"out{i}": o.numpy() for i, o in enumerate(outs)}
        expected.update({f"after{i}": t.numpy() for i, t in enumerate(tensors)})
        with gpu:  # (the CUDA targets' extern kernels: host launchers linked in, as export_module does)
            mod, _, ext_mods = model.export_tvm(spec=model.get_export_spec(), allow_extern=True)
            if ext_mods:
                from ninfer_compiler.codegen.toolchain import host_objects

                mod = tvm.relax.transform.AttachExternModules(host_objects(ext_mods))(mod)
        with cuda_build(gpu):
            compile_module(mod, gpu).export_library(str(out / f"{name}.so"))
        np.savez(out / f"{name}.npz", **{f"in{i}": a for i, a in enumerate(arrays)}, **expected)
        notes[name] = sorted(f.name_hint for f in mod.functions if "gpu" in f.name_hint)
    return notes


def run(stage: Path) -> dict:
    """Run every case on the GPU (TVM runtime only); max relative error per output."""
    import tvm
    from tvm.runtime import vm as tvm_vm

    dev = tvm.cuda(0)
    results = {}
    for name in CASES:
        try:
            data = np.load(stage / "kernels" / f"{name}.npz")
            vm = tvm_vm.VirtualMachine(tvm.runtime.load_module(str(stage / "kernels" / f"{name}.so")), dev)
            n_in = sum(1 for k in data.files if k.startswith("in"))
            tensors = [tvm.runtime.tensor(data[f"in{i}"], dev) for i in range(n_in)]
            res = vm["main"](*tensors)
            outs = [res] if hasattr(res, "numpy") else list(res)
            errs = {f"out{i}": _rel(o.numpy(), data[f"out{i}"]) for i, o in enumerate(outs)}
            errs.update({f"after{i}": _rel(t.numpy(), data[f"after{i}"]) for i, t in enumerate(tensors)})
            results[name] = {"max_rel": max(errs.values()), "errors": errs}
        except Exception as exc:  # noqa: BLE001 - report and go on with the other kernels
            results[name] = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
    return results


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    scale = float(np.abs(b).max()) or 1.0
    return float(np.abs(a.astype(np.float64) - b).max() / scale)
