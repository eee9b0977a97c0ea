"""Ahead-of-time CUDA compilation with TVM 0.27 on any machine, GPU or not.

Three things must hold for `tvm.compile` to put SASS (not CUDA source) into the library:

1. TVM's CUDA sidecar `libtvm_runtime_cuda.so` is loaded (it creates CUDA modules from binary
   code). It links `libcuda.so.1`, so on a machine without the NVIDIA driver we build a stub
   library exporting the driver symbols it imports (each returns an error; nothing calls them
   at build time) and load it first, under the driver's soname.
2. Device code goes to nvcc, never NVRTC, for exactly the target arch: our
   `tvm_callback_cuda_compile` replaces TVM's for the duration of a build and compiles with
   `-gencode arch=compute_XX,code=sm_XX` (SASS only, no PTX) through TVM's nvcc driver.
3. The build runs under `with target:` (the callback reads the arch from the current target).

`cuda_build()` sets all three up and restores the previous callback afterwards. Compiled
device code is cached by (provider version, nvcc version, arch, flags, source digest) under
`kernel_cache_dir()`, so rebuilding a package with unchanged kernels skips nvcc. The host
launchers of our extern kernels (`nn.SourceModule`s, C++ against TVM's headers, several seconds of
g++ each) are cached there too (`host_objects`), keyed by compiler, flags, TVM version and source.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import tvm
import tvm_ffi

# Bump when the way we invoke nvcc changes, so stale cache entries are not reused.
PROVIDER_VERSION = "ninfer-nvcc-1"
# Bump when the way host launchers are compiled or keyed changes.
HOST_PROVIDER_VERSION = "ninfer-host-1"
CALLBACK = "tvm_callback_cuda_compile"
CUDA_MODULE_FACTORY = "ffi.Module.create.cuda"
# Driver symbols libtvm_runtime_cuda.so 0.27 imports; more are added if loading reports them.
DRIVER_SYMBOLS = (
    "cuDeviceGetName", "cuFuncSetAttribute", "cuGetErrorName", "cuGetErrorString", "cuLaunchKernelEx",
    "cuModuleGetFunction", "cuModuleLoadData", "cuModuleUnload", "cuTensorMapEncodeTiled",
)  # fmt: skip
REPO_ROOT = Path(__file__).resolve().parents[2]


class ToolchainError(RuntimeError):
    """A tool needed for CUDA code generation is missing or failed (the message says which)."""


def cache_root() -> Path:
    """`$NINFER_CACHE_DIR`, else `<repo>/.cache/ninfer` (git-ignored)."""
    base = os.environ.get("NINFER_CACHE_DIR")
    return Path(base) if base else REPO_ROOT / ".cache" / "ninfer"


def kernel_cache_dir() -> Path:
    """`$NINFER_KERNEL_CACHE_DIR`, else `<cache root>/kernels` (set the variable to time cold builds)."""
    override = os.environ.get("NINFER_KERNEL_CACHE_DIR")
    return Path(override) if override else cache_root() / "kernels"


def tvm_lib_dir() -> Path:
    return Path(tvm.__file__).resolve().parent / "lib"


def nvcc_path() -> str:
    path = shutil.which("nvcc")
    if path is None:
        raise ToolchainError("nvcc is not on PATH: CUDA targets need the CUDA toolkit (nvcc) on the build machine")
    return path


def nvcc_version() -> str:
    out = subprocess.run([nvcc_path(), "--version"], capture_output=True, text=True, check=True).stdout
    match = re.search(r"release [0-9.]+, V[0-9.]+", out)
    return match.group(0) if match else out.strip().splitlines()[-1]


def write_atomic(path: Path, data: bytes) -> None:
    """Write a cache file so that a concurrent reader (another build, a parallel test process)
    sees either no file or the whole of it, never a partly written one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


# ---- TVM's CUDA sidecar on a driverless machine ---------------------------------------------


def _build_stub(symbols: tuple[str, ...]) -> Path:
    digest = hashlib.sha256("\n".join(symbols).encode()).hexdigest()[:12]
    out = cache_root() / "stub-libcuda" / digest / "libcuda.so.1"
    if out.exists():
        return out
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        raise ToolchainError("no C compiler (gcc) to build the stub libcuda.so.1 this driverless machine needs")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        src = Path(tmp) / "stub.c"
        # CUDA_ERROR_NOT_INITIALIZED (3) from every entry point: nothing may call them at build time.
        src.write_text("".join(f"int {s}(void) {{ return 3; }}\n" for s in symbols))
        lib = Path(tmp) / "libcuda.so.1"
        subprocess.run([cc, "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(lib), str(src)],
                       check=True, capture_output=True)
        os.replace(lib, out)
    return out


def _load_sidecar() -> None:
    from tvm_ffi import libinfo

    libinfo.load_lib_ctypes(package="tvm", target_name="tvm_runtime_cuda", extra_lib_paths=[tvm_lib_dir()],
                            mode="RTLD_GLOBAL")


def cuda_codegen_available() -> bool:
    return tvm_ffi.get_global_func(CUDA_MODULE_FACTORY, allow_missing=True) is not None


def ensure_cuda_codegen() -> None:
    """Make TVM able to create CUDA modules from binaries (see the module docstring, point 1)."""
    if cuda_codegen_available():
        return
    symbols = DRIVER_SYMBOLS
    for _ in range(8):
        try:
            _load_sidecar()
            break
        except OSError as exc:
            missing = re.search(r"undefined symbol: (cu\w+)", str(exc))
            if missing:
                symbols = (*symbols, missing.group(1))
            elif "libcuda.so.1" not in str(exc):
                raise ToolchainError(f"cannot load TVM's CUDA runtime library: {exc}") from None
            ctypes.CDLL(str(_build_stub(symbols)), mode=ctypes.RTLD_GLOBAL)
    if not cuda_codegen_available():
        raise ToolchainError("TVM's CUDA runtime library did not register its module factory; "
                             "a package built now would carry CUDA source instead of SASS")


# ---- nvcc with a kernel cache -----------------------------------------------------------------


@dataclass
class BuildStats:
    """What the device compiler did during one build (recorded in the package manifest)."""

    arch: str
    nvcc: str = ""
    modules: int = 0
    cache_hits: int = 0
    nvcc_seconds: float = 0.0
    keys: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"arch": self.arch, "nvcc": self.nvcc, "provider": PROVIDER_VERSION, "modules": self.modules,
                "cache_hits": self.cache_hits, "nvcc_seconds": round(self.nvcc_seconds, 2), "cache_keys": self.keys}


def _flags_fingerprint() -> str:
    knobs = ("TVM_CUDA_PTXAS_REG_LEVEL", "TVM_CUDA_PTXAS_EXTRA_OPTS", "TVM_CUDA_NVCC_NO_FAST_MATH")
    return ";".join(f"{k}={os.environ.get(k, '')}" for k in knobs)


def _compiler(stats: BuildStats):
    from tvm.support import nvcc as tvm_nvcc

    def compile_cuda(code: str) -> bytes:
        target = tvm.target.Target.current(allow_none=True)
        arch = str(target.arch) if target is not None else ""
        if arch != stats.arch:
            raise ToolchainError(f"device code compiled for {arch or 'no target'} inside a build for {stats.arch}")
        key = hashlib.sha256(
            "\0".join([PROVIDER_VERSION, tvm.__version__, stats.nvcc, arch, _flags_fingerprint(), str(code)]).encode()
        ).hexdigest()
        stats.modules += 1
        stats.keys.append(key[:16])
        path = kernel_cache_dir() / arch / f"{key}.fatbin"
        if path.exists():
            stats.cache_hits += 1
            return bytearray(path.read_bytes())
        start = time.perf_counter()
        binary = bytes(tvm_nvcc.compile_cuda(str(code), target_format="fatbin", compiler="nvcc"))
        stats.nvcc_seconds += time.perf_counter() - start
        write_atomic(path, binary)
        return bytearray(binary)

    return compile_cuda


@contextlib.contextmanager
def cuda_build(target: tvm.target.Target) -> Iterator[BuildStats]:
    """Everything inside compiles device code ahead of time for `target`'s arch, through nvcc."""
    if target.kind.name != "cuda":
        raise ValueError(f"cuda_build needs a CUDA target, got {target.kind.name}")
    ensure_cuda_codegen()
    stats = BuildStats(arch=str(target.arch), nvcc=nvcc_version())
    previous = tvm_ffi.get_global_func(CALLBACK, allow_missing=True)
    tvm_ffi.register_global_func(CALLBACK, _compiler(stats), override=True)
    try:
        with target:
            yield stats
    finally:
        if previous is not None:
            tvm_ffi.register_global_func(CALLBACK, previous, override=True)


def nvcc_fatbin(source: Path, arch: str, defines: tuple[str, ...] = (), tag: str | None = None) -> bytes:
    """nvcc's fatbin of one CUDA source for `arch`: SASS only (no PTX), `-O3`, C++17.

    Cached in the kernel cache by source bytes, flags and nvcc version, so rebuilding a package
    with unchanged kernels skips nvcc. `defines` are `-D` switches; `tag` names the cache file.
    """
    flags = ["-O3", "-std=c++17", f"-gencode=arch={arch.replace('sm_', 'compute_')},code={arch}",
             *(f"-D{d}" for d in defines)]
    text = source.read_bytes()
    key = hashlib.sha256(b"\0".join([text, nvcc_version().encode(), " ".join(flags).encode()])).hexdigest()[:24]
    path = kernel_cache_dir() / arch / f"{tag or source.stem}-{key}.fatbin"
    if path.exists():
        return path.read_bytes()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "kernel.fatbin"
        proc = subprocess.run([nvcc_path(), "-fatbin", *flags, str(source), "-o", str(out)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise ToolchainError(f"nvcc failed on {source.name}:\n{proc.stderr[-4000:]}")
        data = out.read_bytes()
    write_atomic(path, data)
    return data


# ---- host launchers with an object cache -----------------------------------------------------


@cache
def _compiler_identity(cc: str) -> str:
    """The resolved compiler binary and its `--version` banner (part of every host object's key)."""
    path = shutil.which(cc)
    if path is None:
        raise ToolchainError(f"the host C++ compiler {cc} is not on PATH")
    proc = subprocess.run([path, "--version"], capture_output=True, text=True)
    return f"{os.path.realpath(path)}\0{proc.stdout.strip()}"


def _host_object_key(module) -> str:  # noqa: ANN001 (nn.SourceModule)
    from tvm.support import cc as tvm_cc

    cc = module.compiler or tvm_cc.get_cc()
    if cc is None:
        raise ToolchainError("no host C++ compiler (g++) to build the kernel launchers")
    parts = [HOST_PROVIDER_VERSION, tvm.__version__, getattr(tvm_ffi, "__version__", ""), _compiler_identity(cc),
             *module.compile_options, module.source_suffix, module.source_code]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def _host_object(module) -> Path:  # noqa: ANN001 (nn.SourceModule)
    """`module` compiled to an object file in the kernel cache (compiled now if not there)."""
    path = kernel_cache_dir() / "host" / f"{_host_object_key(module)}{module.output_suffix}"
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.stem}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        module.compile(tmp)
        os.replace(tmp, path)  # atomic: a concurrent build sees no object or a whole one
    finally:
        tmp.unlink(missing_ok=True)
    return path


def host_objects(modules: Sequence) -> list:
    """`modules` (the extern modules of an export) with each `nn.SourceModule` replaced by an
    `nn.ObjectModule` over its cached object; the objects not cached yet compile in parallel.

    The cache key holds everything the object depends on but the contents of the headers the
    flags name (TVM's, versioned by TVM's version, and the compiler's own)."""
    from tvm.relax.frontend import nn

    sources = [m for m in modules if isinstance(m, nn.SourceModule)]
    workers = min(len(sources), os.cpu_count() or 1)
    if workers > 1:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            objects = dict(zip(map(id, sources), pool.map(_host_object, sources), strict=True))
    else:
        objects = {id(m): _host_object(m) for m in sources}
    return [nn.ObjectModule(m._symbols, objects[id(m)]) if id(m) in objects else m  # noqa: SLF001
            for m in modules]
