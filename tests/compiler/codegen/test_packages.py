"""`ninfer compile --target h200|rtx5090|dgx-spark` on this CPU machine: AOT packages, checked structurally.

Each package of the tiny Qwen3.5 Dense model is built with a cold kernel cache (15-19 s each on the
2-core CI machine, printed with `-s` and recorded in docs/gpu-checks.md; under the 30 s that would
make them `slow`), then its library is read back: SASS for the
target's arch and no other, no PTX, no CUDA source, host code for the target's CPU (`file` agrees
for the DGX Spark's AArch64 library), and the manifest describes the device code and the decode
graphs. Numerics are checked on the H200 (tests/gpu/check_h200_tiny.py) and, for the GPU kernels'
arithmetic, on the CPU (test_gpu_kernels.py, test_emulated_package.py).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time

import pytest
from click.testing import CliRunner

from ninfer_cli.main import cli
from ninfer_compiler.codegen.fatbin import inspect_library
from ninfer_compiler.compile import CompileOptions, compile_artifact

from .conftest import require_tool

TARGETS = {"h200": ("sm_90a", "x86_64"), "rtx5090": ("sm_120a", "x86_64"), "dgx-spark": ("sm_121a", "aarch64")}
OPTIONS = {"max_context": 1024, "prefill_chunk": 128, "max_batch": 8}


@pytest.fixture(scope="module")
def packages(tiny_artifact, tmp_path_factory) -> dict:
    require_tool("nvcc", "the CUDA toolkit builds device code")
    require_tool("aarch64-linux-gnu-g++", "links the DGX Spark's host code; scripts/setup.sh installs "
                 "g++-aarch64-linux-gnu when run as root")
    root = tmp_path_factory.mktemp("gpu-packages")
    mp = pytest.MonkeyPatch()
    mp.setenv("NINFER_KERNEL_CACHE_DIR", str(root / "kernel-cache"))  # cold: nothing compiled before
    out = {}
    try:
        for name in TARGETS:
            start = time.perf_counter()
            compile_artifact(tiny_artifact, root / name, CompileOptions(target=name, **OPTIONS))
            out[name] = (root / name, time.perf_counter() - start)
            print(f"cold build {name}: {out[name][1]:.1f} s")
    finally:
        mp.undo()
    return out


@pytest.mark.parametrize("name", list(TARGETS))
def test_library_is_aot_for_its_target(packages, name):
    arch, host = TARGETS[name]
    path, _ = packages[name]
    code = inspect_library(path / "model.so")
    assert code.problems(arch) == []
    assert code.sass_archs == {arch} and not code.ptx_archs and not code.has_cuda_source
    assert code.host_machine == host
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["target"] == {"name": name, "device": "cuda", "cuda_arch": arch, "host": host}
    assert manifest["device_code"]["sass"] == [arch]
    assert manifest["device_code"]["device_compiler"]["cache_hits"] == 0
    assert manifest["cuda_graphs"] == {"decode": {"function": "decode_graph", "buckets": [1, 2, 4, 8]}}
    assert manifest["cache"]["kv_dtype"] == "bfloat16"
    # the draw of sampling requests on the device (ops/device_sampling.py)
    assert manifest["functions"]["sample"]["outputs"] == ["sample_token", "sample_logprob"]
    assert manifest["functions"]["sample"]["inputs"]["params"] == {"shape": ["b", 5], "dtype": "float64"}
    assert manifest["functions"]["sample"]["inputs"]["selections"] == {"shape": [], "dtype": "int64"}
    assert manifest["functions"]["sample"]["params"] == "none"
    assert b"ninfer_sample_choice" in (path / "model.so").read_bytes()


@pytest.mark.parametrize("name", list(TARGETS))
def test_bf16_package_has_no_qgemv(packages, name):
    """A bf16 package has no grouped-int weight, so it must not carry our GEMV (test_qgemv_package.py
    checks the groupwise-int packages that do)."""
    assert b"ninfer_qgemv" not in (packages[name][0] / "model.so").read_bytes()


def test_dgx_spark_library_is_aarch64(packages):
    if shutil.which("file") is None:
        pytest.skip("`file` is not installed (the ELF header check above covers the same)")
    out = subprocess.run(["file", str(packages["dgx-spark"][0] / "model.so")], capture_output=True, text=True).stdout
    assert "ARM aarch64" in out and "shared object" in out


def test_cold_builds_fit_the_ci_budget(packages):
    assert all(seconds < 120 for _, seconds in packages.values()), {k: v[1] for k, v in packages.items()}


def test_cli_compiles_for_a_gpu_target_with_the_kernel_cache(packages, tiny_artifact, tmp_path, monkeypatch):
    """The CLI path; the same kernels as the cold build come from the cache (no nvcc run)."""
    monkeypatch.setenv("NINFER_KERNEL_CACHE_DIR", str(packages["h200"][0].parent / "kernel-cache"))
    out = tmp_path / "pkg"
    result = CliRunner().invoke(cli, ["compile", str(tiny_artifact), "--target", "h200", "-o", str(out),
                                      "--max-context", "1024", "--prefill-chunk", "128"])
    assert result.exit_code == 0, result.output
    compiler = json.loads((out / "manifest.json").read_text())["device_code"]["device_compiler"]
    assert compiler["cache_hits"] == compiler["modules"] == 1 and compiler["nvcc_seconds"] == 0
    assert inspect_library(out / "model.so").problems("sm_90a") == []
