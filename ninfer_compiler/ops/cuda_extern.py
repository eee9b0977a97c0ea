"""Host launchers for ahead-of-time compiled kernel images, linked into the exported package.

An extern is C++ source (exported with `TVM_FFI_DLL_EXPORT_TYPED_FUNC`, destination-passing:
inputs, then scalars, then the output) plus the kernel images it launches. We prepend
`cuda_driver.h` and the images as byte arrays, and register the result once per export as an
`nn.SourceModule`, compiled by the host's C++ compiler (the cross compiler for AArch64 hosts).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

import tvm
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn.exporter import Exporter

HEADER = Path(__file__).resolve().parent / "cuda_driver.h"
LAUNCH_HEADER = Path(__file__).resolve().parent / "cuda_launch.h"  # cuLaunchKernelEx's structs
INCLUDE_LINE = '#include "ninfer_cuda.h"'


class Image(Protocol):
    """What an embedded image needs (`triton_aot.KernelImage` is one)."""

    name: str
    shared: int

    @property
    def threads(self) -> int: ...

    @property
    def fatbin(self) -> bytes: ...


def _keyed(images: Sequence[Image] | dict[str, Image]) -> list[tuple[str, Image]]:
    if isinstance(images, dict):
        return list(images.items())
    return [(img.name, img) for img in images]


def image_table(images: Sequence[Image] | dict[str, Image]) -> str:
    """C++ for the images as byte arrays and `ninfer_cuda::images()` over them.

    A list is looked up by each image's entry name; a dict by its keys (one kernel compiled in
    several variants has one entry name, so its variants need keys of their own).
    """
    keyed = _keyed(images)
    keys = [k for k, _ in keyed]
    if len(set(keys)) != len(keys):
        raise ValueError(f"duplicate kernel names in one extern: {keys}")
    parts = ["namespace {"]
    array_of: dict[bytes, int] = {}  # one array per distinct image (variants may share a fatbin)
    for _, img in keyed:
        if img.fatbin not in array_of:
            i = array_of[img.fatbin] = len(array_of)
            body = ",".join(str(b) for b in img.fatbin)
            parts.append(f"alignas(64) const unsigned char kImage{i}[{len(img.fatbin)}] = {{{body}}};")
    rows = ",\n".join(
        f'    {{"{key}", "{img.name}", kImage{array_of[img.fatbin]}, {int(img.shared)}u, {int(img.threads)}u}}'
        for key, img in keyed
    )
    parts.append("namespace ninfer_cuda {")
    parts.append(f"const Image kImages[] = {{\n{rows}\n}};" if keyed else "const Image* kImages = nullptr;")
    parts.append(
        f"const Image* images(int* count) {{ *count = {len(keyed)}; return kImages; }}"
    )
    parts.append("}  // namespace ninfer_cuda")
    parts.append("}  // namespace")
    return "\n".join(parts) + "\n"


PLACEHOLDER = re.compile(r"@([A-Z][A-Z0-9_]*)@")


def fill_launcher(template: str, values: dict[str, object]) -> str:
    """`template` with every `@NAME@` replaced by `values["NAME"]` (keys may keep their `@`s).

    Launchers are C++ text with per-shape constants; a placeholder left unfilled or a value with
    no placeholder is a build error naming it, not a C++ compile error later.
    """
    given = {k.strip("@"): str(v) for k, v in values.items()}
    wanted = set(PLACEHOLDER.findall(template))
    missing, unused = sorted(wanted - given.keys()), sorted(given.keys() - wanted)
    if missing or unused:
        raise ValueError(f"launcher template: no value for {missing}, no placeholder for {unused}")
    return PLACEHOLDER.sub(lambda m: given[m.group(1)], template)


def host_source(launcher: str, images: Sequence[Image] | dict[str, Image]) -> str:
    """The whole translation unit: driver header, image table, the extern's launcher."""
    return (LAUNCH_HEADER.read_text() + "\n" + HEADER.read_text() + "\n" + image_table(images) + "\n"
            + launcher.replace(INCLUDE_LINE, "// (ninfer_cuda.h is prepended by the build)"))


def extern(
    key: str,
    functions: dict[str, Callable[..., nn.Tensor]],
    launcher: str,
    images: Sequence[Image] | dict[str, Image],
) -> nn.SourceModule:
    """The extern module `key` of the current export, built and registered on first use.

    `functions` maps each exported symbol to its output-shape inference (called with the op's
    arguments, returns `nn.Tensor.placeholder(...)`). Call the result as `module[symbol](...)`.
    `images` is a list (launched by entry name) or a dict (launched by key).
    """
    exporter = Exporter.current()
    registered: dict[str, nn.SourceModule] = getattr(exporter, "_ninfer_externs", None) or {}
    module = registered.get(key)
    if module is not None:
        return module
    target = tvm.target.Target.current()
    mtriple = str(target.host.attrs.get("mtriple", "")) if target.host is not None else ""
    module = nn.SourceModule(
        functions,
        source_code=host_source(launcher, images),
        source_format="cpp",
        compile_options=[*nn.SourceModule.get_compile_options("cpp"), "-fPIC"],
        compiler=f"{mtriple}-g++" if mtriple else None,
    )
    nn.add_extern(module)
    registered[key] = module
    exporter._ninfer_externs = registered  # noqa: SLF001 (per-export registry)
    return module


def current_arch() -> str:
    """The CUDA arch of the current target (`sm_90a`), for choosing which images to build."""
    target = tvm.target.Target.current()
    if target is None or target.kind.name != "cuda":
        raise ValueError("a CUDA target must be current")
    return str(target.arch)


def inplace_call(symbol: str, args: list, mutated: list):  # noqa: ANN201 (nn.Tensor or a tuple of them)
    """Call the packed function `symbol(*args, *mutated)`, which writes `mutated` and returns them.

    Why not `module[symbol](...)`: that is destination-passing (a fresh output), while the state
    must be updated where it lives. `call_inplace_packed` tells Relax that the results alias
    the mutated arguments; the function returns them (a `tvm::ffi::Tuple` for several).
    """
    from tvm import relax
    from tvm.relax.frontend.nn import op

    exprs = [relax.prim_value(a) if isinstance(a, (int, float)) else a._expr  # noqa: SLF001
             for a in [*args, *mutated]]
    types = [t._expr.ty for t in mutated]  # noqa: SLF001 (nn.Tensor's expr)
    call = relax.op.call_inplace_packed(
        symbol, *exprs, inplace_indices=list(range(len(args), len(args) + len(mutated))),
        ty_args=[relax.TupleType(types) if len(types) > 1 else types[0]],
    )
    return op.wrap_nested(call, name=symbol)


def dps_call(symbol: str, args: list, outputs: list):  # noqa: ANN201 (a tuple of nn.Tensor)
    """Call the packed function `symbol(*args, *outputs)` that writes several fresh outputs.

    `outputs` are placeholders (`nn.Tensor.placeholder(shape, dtype)`) giving each result's type;
    the extern's module must already be registered (`extern`). Why not `module[symbol](...)`:
    its output inference takes one tensor type only.
    """
    from tvm import relax
    from tvm.relax.frontend.nn import op

    # numbers and the function's int inputs (TIR variables) go as prim values
    exprs = [a._expr if isinstance(a, nn.Tensor) else relax.prim_value(a) for a in args]  # noqa: SLF001
    types = [t._expr.ty for t in outputs]  # noqa: SLF001 (nn.Tensor's expr)
    call = relax.op.call_dps_packed(symbol, relax.Tuple(exprs), types)
    return op.wrap_nested(call, name=symbol)
