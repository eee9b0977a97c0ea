"""CUDA devices for compiled packages, with only TVM's runtime installed.

A runtime-only TVM (`TVM_USE_RUNTIME_LIB=1`, or no compiler library) does not load its CUDA
sidecar `libtvm_runtime_cuda.so` by itself; without it there is no CUDA device API and no
loader for the device code inside a package. `load_cuda_runtime()` loads it from TVM's `lib/`
folder.

Nothing here compiles code. TVM's loader compiles a CUDA module that carries source instead of
machine code through the Python callback `tvm_callback_cuda_compile` (nvcc or NVRTC), which even
the runtime-only `import tvm` registers; we replace it with one that refuses, so a package that
is not ahead-of-time fails loudly instead of compiling on the serving machine.
"""

from __future__ import annotations

from pathlib import Path

import tvm
import tvm_ffi

from .package import Manifest, PackageError

CUDA_DEVICE_API = "device_api.cuda"
JIT_CALLBACK = "tvm_callback_cuda_compile"
jit_requests: list[int] = []  # sizes of the sources TVM asked to compile (a check reads this)


def _refuse_jit(code: str) -> bytes:
    jit_requests.append(len(str(code)))
    raise PackageError("the package's library carries CUDA source, which would be compiled at load time; "
                       "ninfer packages must carry machine code for the GPU (recompile with `ninfer compile`)")


def refuse_jit() -> None:
    """Make TVM's compile-at-load path raise instead of running nvcc or NVRTC."""
    tvm_ffi.register_global_func(JIT_CALLBACK, _refuse_jit, override=True)


def load_cuda_runtime() -> None:
    """Register TVM's CUDA device API and module loader (idempotent)."""
    refuse_jit()
    if tvm_ffi.get_global_func(CUDA_DEVICE_API, allow_missing=True) is not None:
        return
    from tvm_ffi import libinfo

    lib_dir = Path(tvm.__file__).resolve().parent / "lib"
    try:
        libinfo.load_lib_ctypes(package="tvm", target_name="tvm_runtime_cuda", extra_lib_paths=[lib_dir],
                                mode="RTLD_LOCAL")
    except OSError as first:
        # libcudart may live in a pip package (nvidia-cuda-runtime) that is not on the loader's path.
        if not _preload_cudart():
            raise PackageError(f"cannot load TVM's CUDA runtime (libtvm_runtime_cuda.so): {first}; "
                               "a CUDA package needs the NVIDIA driver and the CUDA runtime library") from None
        try:
            libinfo.load_lib_ctypes(package="tvm", target_name="tvm_runtime_cuda", extra_lib_paths=[lib_dir],
                                    mode="RTLD_LOCAL")
        except OSError as exc:
            raise PackageError(f"cannot load TVM's CUDA runtime (libtvm_runtime_cuda.so): {exc}; "
                               "a CUDA package needs the NVIDIA driver") from None
    if tvm_ffi.get_global_func(CUDA_DEVICE_API, allow_missing=True) is None:
        raise PackageError("TVM's CUDA runtime loaded but registered no CUDA device API")


def _preload_cudart() -> bool:
    """Load `libcudart.so.13` globally from a CUDA install or the nvidia pip packages, if found."""
    import ctypes
    import site
    import sys

    roots = [Path(p) for p in (*site.getsitepackages(), *sys.path) if p]
    candidates = [Path("/usr/local/cuda/lib64/libcudart.so.13")]
    for root in roots:
        candidates.extend(sorted((root / "nvidia").glob("**/lib/libcudart.so.13")) if (root / "nvidia").is_dir() else [])
    for path in candidates:
        if path.is_file():
            try:
                ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
                return True
            except OSError:
                continue
    return False


def arch_runs_on(arch: str, compute_version: str) -> bool:
    """Whether SASS for `arch` (`sm_90a`, `sm_120f`, `sm_121a`) runs on a GPU of `compute_version`.

    Arch-specific code (`a`) runs only on its exact compute capability; family code (`f`) on
    the same major version with an equal or higher minor; plain code on equal or newer GPUs
    of the same major version.
    """
    digits = arch.removeprefix("sm_").rstrip("af")
    major, minor = int(digits[:-1]), int(digits[-1])
    have_major, have_minor = (int(x) for x in compute_version.split(".")[:2])
    if arch.endswith("a"):
        return (have_major, have_minor) == (major, minor)
    return have_major == major and have_minor >= minor


def cuda_device(manifest: Manifest, device_id: int = 0) -> tvm.runtime.Device:
    """The CUDA device a package runs on, checked against the package's target arch."""
    load_cuda_runtime()
    dev = tvm.cuda(device_id)
    if not dev.exist:
        raise PackageError(f"target {manifest.target['name']}: no CUDA device {device_id} on this machine")
    tvm.runtime.empty((1,), "int8", dev)  # initialises the CUDA context (driver queries need it)
    arch = manifest.target.get("cuda_arch") or ""
    version = dev.compute_version
    if arch and not arch_runs_on(arch, version):
        raise PackageError(f"package for {manifest.target['name']} ({arch}) cannot run on {dev.device_name} "
                           f"(compute capability {version}); compile it for this GPU's target")
    return dev
