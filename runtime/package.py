"""Compiled packages: the manifest schema, and loading a package with only TVM's runtime.

A package is a directory:

    manifest.json       what was compiled, from which artifact, for which target, with which
                        function signatures, parameters and memory plan (versioned)
    model.so            the compiled library (host code + device code for the target)
    resources/          the text component's tokenizer, template and generation config

Weights are not copied: they are read from the artifact recorded in the manifest (whose
artifact_id must match), in the format the kernels consume.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .artifact import Artifact
from .weights import ParamEntry, load_param

MANIFEST = "manifest.json"
PACKAGE_FORMAT = "ninfer-package"
PACKAGE_VERSION = 1
LIBRARY = "model.so"


class PackageError(Exception):
    """A package directory is missing, malformed, or does not match its artifact or device."""


@dataclass(frozen=True)
class CacheLayout:
    """Shapes of the runtime-owned caches (symbolic dims `num_pages` / `num_slots` left out)."""

    page_size: int
    kv_per_page: tuple[int, ...]  # kv_pool = [layers, num_pages, *kv_per_page[1:]] with layers first
    kv_dtype: str
    attention_layers: int
    gdn_state_per_slot: tuple[int, ...]
    conv_state_per_slot: tuple[int, ...]
    gdn_layers: int
    conv_dtype: str

    @classmethod
    def from_json(cls, raw: dict) -> CacheLayout:
        return cls(
            page_size=raw["page_size"], kv_per_page=tuple(raw["kv_per_page"]), kv_dtype=raw["kv_dtype"],
            attention_layers=raw["attention_layers"], gdn_state_per_slot=tuple(raw["gdn_state_per_slot"]),
            conv_state_per_slot=tuple(raw["conv_state_per_slot"]), gdn_layers=raw["gdn_layers"], conv_dtype=raw["conv_dtype"],
        )

    def to_json(self) -> dict:
        return {
            "page_size": self.page_size, "kv_per_page": list(self.kv_per_page), "kv_dtype": self.kv_dtype,
            "attention_layers": self.attention_layers, "gdn_state_per_slot": list(self.gdn_state_per_slot),
            "conv_state_per_slot": list(self.conv_state_per_slot), "gdn_layers": self.gdn_layers,
            "conv_dtype": self.conv_dtype,
        }

    def bytes_per_page(self) -> int:
        """KV bytes one page holds across all attention layers."""
        return self.attention_layers * _elements(self.kv_per_page) * _itemsize(self.kv_dtype)

    def bytes_per_slot(self) -> int:
        """Recurrent + conv state bytes of one sequence across all GDN layers."""
        return self.gdn_layers * (_elements(self.gdn_state_per_slot) * 4 + _elements(self.conv_state_per_slot) * _itemsize(self.conv_dtype))


def _elements(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _itemsize(dtype: str) -> int:
    return {"float32": 4, "bfloat16": 2, "float16": 2, "int8": 1, "float8_e4m3fn": 1}[dtype]


@dataclass
class Manifest:
    raw: dict

    @property
    def architecture(self) -> str:
        return self.raw["model"]["architecture"]

    @property
    def target(self) -> dict:
        return self.raw["target"]

    @property
    def params(self) -> list[ParamEntry]:
        return [ParamEntry.from_json(p) for p in self.raw["params"]]

    @property
    def cache(self) -> CacheLayout:
        return CacheLayout.from_json(self.raw["cache"])

    @property
    def limits(self) -> dict:
        return self.raw["limits"]

    @property
    def artifact_id(self) -> str:
        return self.raw["artifact"]["artifact_id"]

    @property
    def text_config(self) -> dict:
        return self.raw["model"]["config"]


REQUIRED = ("format", "version", "model", "artifact", "target", "compile", "functions", "params", "cache", "limits", "library")


def read_manifest(package: Path) -> Manifest:
    path = package / MANIFEST
    if not path.exists():
        raise PackageError(f"{package}: not a ninfer package (no {MANIFEST}); build one with `ninfer compile`")
    try:
        raw = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise PackageError(f"{path}: unreadable manifest ({exc})") from None
    if not isinstance(raw, dict) or raw.get("format") != PACKAGE_FORMAT:
        raise PackageError(f"{path}: not a ninfer package manifest")
    if raw.get("version") != PACKAGE_VERSION:
        raise PackageError(f"{path}: package version {raw.get('version')} is not supported (this runtime reads "
                           f"version {PACKAGE_VERSION}); recompile with `ninfer compile`")
    missing = [k for k in REQUIRED if k not in raw]
    if missing:
        raise PackageError(f"{path}: manifest lacks {', '.join(missing)}")
    return Manifest(raw)


def write_manifest(package: Path, raw: dict[str, Any]) -> None:
    raw = {"format": PACKAGE_FORMAT, "version": PACKAGE_VERSION, **raw}
    tmp = package / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(raw, indent=2, ensure_ascii=False) + "\n")
    os.replace(tmp, package / MANIFEST)


def open_package_artifact(package: Path, manifest: Manifest, artifact: str | os.PathLike | None = None) -> Artifact:
    """Open the artifact the package was compiled from (or `artifact`), checking its identity."""
    path = Path(artifact) if artifact is not None else Path(manifest.raw["artifact"]["path"])
    if not path.is_absolute():
        path = (package / path).resolve()
    if not path.exists():
        raise PackageError(
            f"{package}: the artifact {path} this package was compiled from is missing; pass its new location "
            "with --artifact"
        )
    art = Artifact(path)
    if art.artifact_id != manifest.artifact_id:
        art.close()
        raise PackageError(
            f"{path} has artifact_id {art.artifact_id}, but {package} was compiled from artifact_id "
            f"{manifest.artifact_id}; recompile the package for this artifact"
        )
    return art


def load_params_numpy(art: Artifact, manifest: Manifest) -> list:
    return [load_param(art, entry) for entry in manifest.params]


def resource(package: str | os.PathLike, role: str) -> bytes:
    path = Path(package) / "resources" / role
    if not path.exists():
        raise PackageError(f"{package}: missing resource {role}")
    return path.read_bytes()


def load_tokenizer(package: str | os.PathLike, chat_template: bytes | str | None = None):
    """The package's tokenizer (with its generation config's stop ids and chat template, or
    `chat_template` instead)."""
    from .text import Tokenizer

    template = chat_template if chat_template is not None else resource(package, "chat_template.jinja")
    return Tokenizer.from_bytes(resource(package, "tokenizer.json"), resource(package, "tokenizer_config.json"),
                                resource(package, "generation_config.json"), template)
