"""`ninfer compile`: artifact -> frontend -> passes -> codegen -> package directory.

Stages run in order and report their time: bind (read the artifact's text component and
bindings into a typed config and weight plan), export (Relax IR of the entry functions), compile
(passes and code generation for the target), package (library, resources, manifest).
"""

from __future__ import annotations

import importlib
import platform
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import tvm

from ninfer_runtime import targets
from ninfer_runtime.artifact import Artifact
from ninfer_runtime.package import LIBRARY, CacheLayout, write_manifest

from .build import compile_module, export_module
from .codegen import targets as codegen_targets
from .codegen.export import export_library
from .codegen.fatbin import inspect_library
from .codegen.graphs import add_graph_variants, bucket_sizes, graph_name
from .codegen.toolchain import ToolchainError, cuda_build
from .frontend.options import ModelOptions
from .ops.common import kernel_features

# text component architecture -> frontend package (binding.py + model.py)
FRONTENDS = {"Qwen3_5ForCausalLM": "ninfer_compiler.frontend.qwen3_5"}
TEXT_RESOURCES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")


class CompileError(Exception):
    """The artifact cannot be compiled for the requested target (the message says why)."""


@dataclass
class CompileOptions:
    target: str = "cpu"
    max_context: int | None = None  # tokens of one request (prompt + output)
    prefill_chunk: int = 512  # tokens per prefill call
    max_batch: int = 8  # sequences per decode call (the engine's max_active)
    page_size: int = 16
    # Override of the target's activation (and KV) dtype, e.g. "float32" for a package whose GPU
    # kernels are checked against an fp32 reference without bf16 rounding; None = the target's.
    activation_dtype: str | None = None


@dataclass
class CompileReport:
    package: Path
    target: str
    stage_seconds: dict[str, float] = field(default_factory=dict)
    library_bytes: int = 0

    @property
    def seconds(self) -> float:
        return sum(self.stage_seconds.values())


def tvm_target(target: targets.Target) -> tvm.target.Target:
    try:
        return codegen_targets.tvm_target(target)
    except ValueError as exc:
        raise CompileError(str(exc)) from None


def _compile_cuda(mod: tvm.IRModule, target: targets.Target, ttarget: tvm.target.Target,
                  out: Path) -> dict:
    """Compile with AOT device code and a CUDA-graph decode; export; verify the library."""
    mod = add_graph_variants(mod)
    try:
        with cuda_build(ttarget) as stats, tvm.transform.PassContext(config={"relax.backend.use_cuda_graph": True}):
            executable = compile_module(mod, ttarget)
        out.mkdir(parents=True, exist_ok=True)
        export_library(executable, out / LIBRARY, target)
    except ToolchainError as exc:
        raise CompileError(f"target {target.name}: {exc}") from None
    code = inspect_library(out / LIBRARY)
    problems = code.problems(target.cuda_arch)
    want_host = codegen_targets.host_arch(target.host_triple)
    if code.host_machine != want_host:
        problems.append(f"host code is {code.host_machine}, the target needs {want_host}")
    if problems:
        raise CompileError(f"target {target.name}: the library is not ahead-of-time for {target.cuda_arch}: "
                           + "; ".join(problems))
    return {
        "host_machine": code.host_machine,
        "sass": sorted(code.sass_archs),
        "fatbin_entries": len(code.entries),
        "device_compiler": stats.to_json(),
    }


def compile_artifact(
    artifact_path: str | Path,
    out_dir: str | Path,
    options: CompileOptions | None = None,
    stage: Callable[[str], None] | None = None,
) -> CompileReport:
    """Compile the artifact's text component into a package at `out_dir` (must not exist)."""
    options = options or CompileOptions()
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        raise CompileError(f"{out} exists and is not empty; choose a new package directory")
    target = targets.load(options.target)
    report = CompileReport(out, target.name)
    clock = time.perf_counter()

    def done(name: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        report.stage_seconds[name] = now - clock
        clock = now
        if stage:
            stage(name)

    artifact_path = Path(artifact_path).resolve()
    with Artifact(artifact_path) as art:
        text = art.components.get("text")
        if text is None:
            raise CompileError(f"{artifact_path}: no text component")
        arch = (text.config.get("architectures") or [None])[0]
        if arch not in FRONTENDS:
            raise CompileError(f"{artifact_path}: architecture {arch!r} has no compiler frontend yet "
                               f"(available: {', '.join(FRONTENDS)})")
        binding = importlib.import_module(FRONTENDS[arch] + ".binding")
        model_mod = importlib.import_module(FRONTENDS[arch] + ".model")
        try:
            cfg = binding.model_config(art)
            plan = binding.weight_plan(art, target)
        except ValueError as exc:  # ConfigError / BindingError
            raise CompileError(f"{artifact_path}: {exc}") from None
        max_positions = text.config.get("max_position_embeddings", 4096)
        max_context = options.max_context or min(max_positions, 32768)
        if max_context > max_positions:
            raise CompileError(f"--max-context {max_context} exceeds the model's max_position_embeddings {max_positions}")
        act_dtype = options.activation_dtype or target.activation_dtype
        kv_dtype = options.activation_dtype or target.kv_dtype
        try:
            opts = ModelOptions(dtype=act_dtype, weights=plan, page_size=options.page_size)
        except ValueError as exc:
            raise CompileError(str(exc)) from None
        model = model_mod.Qwen35ForCausalLM(cfg, opts)
        ttarget = tvm_target(target)
        done("bind")
        with ttarget:  # the ops pick their kernel variant (CPU or GPU) from the current target
            mod, params = export_module(model, model.upper_bounds(max_prefill_tokens=options.prefill_chunk,
                                                                  max_batch=options.max_batch))
            signatures = _signatures(model)  # (under the target: tuned CUDA packages have more functions)
        try:
            entries = binding.param_entries(art, params)
            binding.check_loadable(art, entries)
        except ValueError as exc:
            raise CompileError(f"{artifact_path}: {exc}") from None
        done("export")
        device_code = None
        if target.is_cuda:
            device_code = _compile_cuda(mod, target, ttarget, out)
        else:
            executable = compile_module(mod, ttarget)
            out.mkdir(parents=True, exist_ok=True)
            executable.export_library(str(out / LIBRARY))
        done("compile")
        (out / "resources").mkdir(exist_ok=True)
        for role in TEXT_RESOURCES:
            if role in text.resources:
                (out / "resources" / role).write_bytes(art.resource("text", role))
        cache = CacheLayout(
            page_size=options.page_size,
            kv_per_page=(2, cfg.num_key_value_heads, options.page_size, cfg.head_dim),
            kv_dtype=kv_dtype,
            attention_layers=len(cfg.attention_layers),
            gdn_state_per_slot=(cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim),
            conv_state_per_slot=(cfg.linear_conv_kernel_dim - 1, cfg.conv_channels),
            gdn_layers=len(cfg.gdn_layers),
            conv_dtype=act_dtype,
        )
        weight_bytes = sum(_nbytes(e.shape, e.dtype) for e in entries)
        write_manifest(out, {
            "model": {"architecture": arch, "name": art.metadata.get("name"), "config": dict(text.config),
                      "vocab_size": cfg.vocab_size},
            "artifact": {"path": str(artifact_path), "artifact_id": art.artifact_id, "components": ["text"]},
            "target": {"name": target.name, "device": target.device, "cuda_arch": target.cuda_arch,
                       "host": codegen_targets.host_arch(target.host_triple) if target.is_cuda else platform.machine()},
            "compile": {"options": vars(options), "versions": _versions(), "stage_seconds": report.stage_seconds,
                        **({"kernel_features": kernel_features()} if target.is_cuda else {})},
            "functions": signatures,
            **({"device_code": device_code,
                "cuda_graphs": {"decode": {"function": graph_name("decode"),
                                           "buckets": bucket_sizes(options.max_batch)}}}
               if device_code else {}),
            "params": [e.to_json() for e in entries],
            "cache": cache.to_json(),
            "limits": {"max_context": max_context, "prefill_chunk": options.prefill_chunk,
                       "max_batch": options.max_batch},
            "memory_plan": {"weight_bytes": weight_bytes, "kv_bytes_per_page": cache.bytes_per_page(),
                            "state_bytes_per_sequence": cache.bytes_per_slot()},
            "library": LIBRARY,
        })
    done("package")
    report.library_bytes = (out / LIBRARY).stat().st_size
    return report


def _nbytes(shape, dtype: str) -> int:
    n = 1
    for d in shape:
        n *= d
    return n * {"float32": 4, "int32": 4, "bfloat16": 2, "float16": 2, "uint8": 1}[dtype]


def _signatures(model) -> dict:
    out = {}
    for name, spec in model.get_export_spec().items():
        args = {}
        for arg, s in spec.items():
            if arg == "$":
                continue
            if not hasattr(s, "shape"):  # an int input
                args[arg] = {"shape": [], "dtype": "int64"}
                continue
            args[arg] = {"shape": [d if isinstance(d, int) else str(d) for d in s.shape], "dtype": s.dtype}
        packed = spec.get("$", {}).get("param_mode", "packed") == "packed"
        out[name] = {"inputs": args, "params": "packed tuple (manifest params order)" if packed else "none"}
        outputs = getattr(model, "OUTPUTS", {}).get(name)
        if outputs is not None:
            out[name]["outputs"] = list(outputs)
    return out


def _versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {"tvm": tvm.__version__}
    try:
        out["ninfer"] = version("ninfer")
    except PackageNotFoundError:
        out["ninfer"] = "unknown"
    return out


def remove_package(path: Path) -> None:
    """Delete a partially written package directory after a failed compile."""
    shutil.rmtree(path, ignore_errors=True)
