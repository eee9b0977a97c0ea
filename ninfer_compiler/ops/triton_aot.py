"""Triton kernels compiled ahead of time to a cubin for one CUDA arch (no GPU needed).

Why: Triton gives tensor-core tiles (mma.sync, wgmma on sm_90a) with little code, and its
compiler runs without a device. We compile at package build time, embed the cubin in the
package's host library (`ops/cuda_extern.py`) and launch it through the driver API, so a
package never needs Triton, NVRTC or PTX JIT where it runs. Results are cached on disk by the
kernel's source, signature, constants, options, arch and Triton version.
"""

from __future__ import annotations

import atexit
import hashlib
import inspect
import json
import os
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..codegen.toolchain import ToolchainError, kernel_cache_dir, nvcc_path, write_atomic

POINTER_ALIGN = 16  # every pointer argument is compiled assuming this alignment (checked at launch)


@dataclass(frozen=True)
class KernelImage:
    """A compiled kernel: entry symbol, its SASS (cubin, and that cubin in a fatbin) and launch shape.

    The fatbin is what a package embeds: the library checks (`codegen/fatbin.py`) then see its
    SASS arch like that of every other kernel, and the driver loads either form.
    """

    name: str
    cubin: bytes
    fatbin: bytes
    shared: int  # dynamic shared memory bytes to launch with
    num_warps: int

    @property
    def threads(self) -> int:
        return self.num_warps * 32


def _arch_capability(arch: str) -> int:
    """`sm_90a` -> 90 (Triton emits the `a` variant for 90, 100, 120 and 121 itself)."""
    digits = arch.removeprefix("sm_").rstrip("af")
    if not digits.isdigit():
        raise ToolchainError(f"not a CUDA arch: {arch!r}")
    return int(digits)


def _source_key(fn: Any) -> str:
    """Identity of a kernel's code (its own source and the Triton version)."""
    import triton

    src = inspect.getsource(fn.fn)
    # `triton.jit(repr=...)` names the entry symbol (interpreter objects keep it in `kwargs`)
    naming = getattr(fn, "_repr", None) or getattr(fn, "kwargs", {}).get("repr")
    if callable(naming):
        try:
            src += "\0" + inspect.getsource(naming)
        except (OSError, TypeError):
            src += "\0" + repr(naming)
    return hashlib.sha256(f"{triton.__version__}\0{fn.fn.__name__}\0{src}".encode()).hexdigest()


def _interpreter_mode(fn: Any) -> bool:
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(fn, InterpretedFunction)


# One child process compiles every kernel asked for from interpreter mode (the test suite): each
# fresh interpreter would pay ~4 s of imports (TVM, torch) before a compile of a few seconds.
_WORKER_LOOP = r"""
import importlib, json, os, sys, traceback
out = os.fdopen(int(sys.argv[1]), "w")  # replies on their own pipe: libraries may print to stdout
from ninfer_compiler.ops.triton_aot import compile_kernel
for line in sys.stdin:
    req = json.loads(line)
    for var, value in req["env"].items():
        if value is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = value
    try:
        compile_kernel(getattr(importlib.import_module(req["module"]), req["name"]), **req["kwargs"])
        reply = {"ok": True}
    except BaseException:
        reply = {"ok": False, "error": traceback.format_exc()[-3000:]}
    out.write(json.dumps(reply) + "\n")
    out.flush()
"""
_WORKER_ENV = ("NINFER_KERNEL_CACHE_DIR", "NINFER_CACHE_DIR")  # read per request (tests change them)
_worker: subprocess.Popen | None = None
_worker_replies: Any = None
_worker_lock = threading.Lock()


def _start_worker() -> tuple[subprocess.Popen, Any]:
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = Path(__file__).resolve().parents[2]
    env["PYTHONPATH"] = os.pathsep.join([str(root), os.getcwd(), env.get("PYTHONPATH", "")])
    read_fd, write_fd = os.pipe()
    # its stderr goes to a file: a pipe nobody reads while it works could fill and stall it
    log = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen([sys.executable, "-c", _WORKER_LOOP, str(write_fd)], stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, stderr=log, text=True, env=env, pass_fds=(write_fd,))
    os.close(write_fd)
    proc.log = log  # type: ignore[attr-defined]
    atexit.register(_stop_worker)
    return proc, os.fdopen(read_fd)


def _worker_log(proc: subprocess.Popen) -> str:
    log = proc.log  # type: ignore[attr-defined]
    log.seek(0)
    return log.read()[-3000:]


def _stop_worker() -> None:
    global _worker
    if _worker is not None and _worker.poll() is None:
        _worker.stdin.close()
        _worker.wait(timeout=30)
    _worker = None


def _compile_in_subprocess(fn: Any, **kwargs: Any) -> None:
    """Compile (into the cache) in a child process with Triton's interpreter mode off.

    Under `TRITON_INTERPRET=1` (the test suite) every jit function, Triton's own included, is an
    interpreter object that the code generator cannot compile; a child without the flag imports
    the kernel's module and compiles it. The child stays up for the next kernel.
    """
    global _worker, _worker_replies
    module, name = fn.fn.__module__, fn.fn.__name__
    request = json.dumps({"module": module, "name": name, "kwargs": kwargs,
                          "env": {v: os.environ.get(v) for v in _WORKER_ENV}})
    with _worker_lock:
        for attempt in range(2):
            if _worker is None or _worker.poll() is not None:
                _worker, _worker_replies = _start_worker()
            try:
                _worker.stdin.write(request + "\n")
                _worker.stdin.flush()
                line = _worker_replies.readline()
            except (BrokenPipeError, OSError):
                line = ""
            if line:
                break
            _worker.wait(timeout=30)
            stderr = _worker_log(_worker)
            _worker = None  # the child died: start another once, then give up
            if attempt:
                raise ToolchainError(f"compiling {name} outside the interpreter failed:\n{stderr}")
    reply = json.loads(line)
    if not reply["ok"]:
        raise ToolchainError(f"compiling {name} outside the interpreter failed:\n{reply['error']}")


def compile_kernel(
    fn: Any,
    *,
    signature: dict[str, str],
    constants: dict[str, Any],
    arch: str,
    num_warps: int = 4,
    num_stages: int = 3,
) -> KernelImage:
    """Compile `fn` (a `@triton.jit` function) for `arch` with every argument typed or fixed.

    `signature` maps each runtime argument to its Triton type (`"*bf16"`, `"i32"`, ...);
    `constants` gives every `tl.constexpr` argument. Pointers are assumed 16-byte aligned.
    """
    import triton
    from triton.backends.compiler import GPUTarget

    names = list(inspect.signature(fn.fn).parameters)
    missing = [n for n in names if n not in signature and n not in constants]
    extra = [n for n in [*signature, *constants] if n not in names]
    if missing or extra:
        raise ToolchainError(
            f"{fn.fn.__name__}: arguments without a type or constant {missing}, unknown names {extra}"
        )
    capability = _arch_capability(arch)
    key_data = json.dumps(
        [_source_key(fn), signature, {k: repr(v) for k, v in constants.items()}, arch, num_warps,
         num_stages], sort_keys=True,
    )
    key = hashlib.sha256(key_data.encode()).hexdigest()[:24]
    cache = kernel_cache_dir() / arch / f"triton-{fn.fn.__name__}-{key}"
    meta_path, cubin_path = cache.with_suffix(".json"), cache.with_suffix(".cubin")
    fatbin_path = cache.with_suffix(".fatbin")
    if meta_path.exists() and cubin_path.exists() and fatbin_path.exists():
        meta = json.loads(meta_path.read_text())
        return KernelImage(meta["name"], cubin_path.read_bytes(), fatbin_path.read_bytes(),
                           meta["shared"], meta["num_warps"])

    if _interpreter_mode(fn):
        _compile_in_subprocess(fn, signature=signature, constants=constants, arch=arch,
                               num_warps=num_warps, num_stages=num_stages)
        meta = json.loads(meta_path.read_text())
        return KernelImage(meta["name"], cubin_path.read_bytes(), fatbin_path.read_bytes(),
                           meta["shared"], meta["num_warps"])

    full_sig = {n: ("constexpr" if n in constants else signature[n]) for n in names}
    attrs = {
        (i,): [["tt.divisibility", POINTER_ALIGN]]
        for i, n in enumerate(names)
        if n in signature and signature[n].startswith("*")
    }
    src = triton.compiler.ASTSource(fn=fn, signature=full_sig, constexprs=dict(constants), attrs=attrs)
    target = GPUTarget("cuda", capability, 32)
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    try:
        compiled = triton.compile(src, target=target,
                                  options={"num_warps": num_warps, "num_stages": num_stages})
    except Exception as err:  # Triton raises many kinds; name the kernel and the arch
        raise ToolchainError(f"Triton failed to compile {fn.fn.__name__} for {arch}: {err}") from err
    meta = compiled.metadata
    if getattr(meta, "global_scratch_size", 0) or getattr(meta, "profile_scratch_size", 0):
        raise ToolchainError(f"{fn.fn.__name__}: kernels that need Triton's global scratch are not supported")
    if tuple(getattr(meta, "cluster_dims", (1, 1, 1)) or (1, 1, 1)) not in ((1, 1, 1), (1,), ()):
        raise ToolchainError(f"{fn.fn.__name__}: thread-block clusters are not supported")
    cubin = bytes(compiled.asm["cubin"])
    image = KernelImage(meta.name, cubin, wrap_fatbin(cubin, arch), int(meta.shared), int(meta.num_warps))
    # each file whole or not at all, the metadata last: a concurrent build that sees all three
    # reads complete files
    write_atomic(cubin_path, image.cubin)
    write_atomic(fatbin_path, image.fatbin)
    write_atomic(meta_path, json.dumps({"name": image.name, "shared": image.shared,
                                        "num_warps": image.num_warps}).encode())
    return image


def fatbinary_path() -> str:
    """The toolkit's `fatbinary` (beside nvcc, else on PATH)."""
    beside = Path(nvcc_path()).with_name("fatbinary")
    path = str(beside) if beside.exists() else shutil.which("fatbinary")
    if path is None:
        raise ToolchainError("fatbinary is not found: CUDA targets need the CUDA toolkit's fatbinary")
    return path


def wrap_fatbin(cubin: bytes, arch: str) -> bytes:
    """`cubin` as a one-image fatbin tagged with `arch` (e.g. `sm_90a`)."""
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "k.cubin", Path(tmp) / "k.fatbin"
        src.write_bytes(cubin)
        sm = arch.removeprefix("sm_")
        proc = subprocess.run([fatbinary_path(), "-64", f"--create={out}",
                               f"--image3=kind=elf,sm={sm},file={src}"], capture_output=True, text=True)
        if proc.returncode != 0:
            raise ToolchainError(f"fatbinary failed for {arch}: {proc.stderr[-2000:]}")
        return out.read_bytes()


def cubin_arch(cubin: bytes) -> int:
    """The SM number an ELF cubin is built for (e_flags' arch field), for checks in tests."""
    if cubin[:4] != b"\x7fELF":
        raise ValueError("not an ELF cubin")
    flags = int.from_bytes(cubin[48:52], "little")
    # CUDA >= 12.x cubins (ELF ABI v8) keep the SM number in bits 8..15 of e_flags
    return (flags >> 8) & 0xFF


def cache_root() -> Path:
    """Where compiled Triton images live (inside the kernel cache)."""
    return kernel_cache_dir()


def interpreted(fn: Any) -> Any:
    """The same `@triton.jit` kernel run by Triton's CPU interpreter (torch CPU tensors).

    How the kernels are unit-tested on machines without a GPU: launch it as `k[grid](...)`.
    The test suite sets `TRITON_INTERPRET=1` before Triton is imported (tests/conftest.py), so
    kernels are interpreter functions there already; otherwise one is made from the source
    (enough for kernels that call only Triton builtins). The interpreter rounds toward zero
    when it stores bf16: compare bf16 outputs loosely, or give the kernel an fp32 output.
    """
    from triton.runtime.interpreter import InterpretedFunction

    return fn if isinstance(fn, InterpretedFunction) else InterpretedFunction(fn.fn)
