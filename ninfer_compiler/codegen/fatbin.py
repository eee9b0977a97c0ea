"""Read the CUDA device code embedded in a compiled library, with nothing but the bytes.

nvcc's fatbin container starts with the magic `0xBA55ED50` (bytes `50 ED 55 BA`), a 16-byte
header (`magic u32, version u16, header_size u16, payload_size u64`), then entries, each with
its own header (`kind u16` 1 = PTX, 2 = ELF/SASS; `header_size u32` at 4; `payload_size u64` at
8; `arch u32` at 28; `flags u64` at 40, whose bits 20-21 hold the arch variant: 1 = `a`,
2 = `f`). This is what `cuobjdump --list-elf/--list-ptx` reports; reading it ourselves lets CI
(no CUDA binary utilities) and the GPU machine (no TVM) run the same check.

A library that would compile at load time instead carries CUDA C++ source, recognisable by
`__global__`; an AOT library has none.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

MAGIC = b"\x50\xed\x55\xba"
KINDS = {1: "ptx", 2: "elf"}
VARIANTS = {0: "", 1: "a", 2: "f"}
ELF_MACHINES = {62: "x86_64", 183: "aarch64"}


@dataclass(frozen=True)
class FatbinEntry:
    kind: str  # "elf" (SASS) or "ptx"
    arch: str  # "sm_90a", "sm_120f", ... ("compute_90a" for PTX)
    size: int


@dataclass(frozen=True)
class DeviceCode:
    """What one library holds: fatbin entries, host machine, and whether CUDA source is in it."""

    host_machine: str
    entries: tuple[FatbinEntry, ...]
    has_cuda_source: bool

    @property
    def sass_archs(self) -> set[str]:
        return {e.arch for e in self.entries if e.kind == "elf"}

    @property
    def ptx_archs(self) -> set[str]:
        return {e.arch for e in self.entries if e.kind == "ptx"}

    def problems(self, arch: str) -> list[str]:
        """Why this is not an AOT library for exactly `arch` (empty when it is).

        The family form counts for the arch-specific one: `sm_120f` SASS runs on the GPUs
        `sm_120a` names, so either satisfies a `sm_120a` target.
        """
        out = []
        accepted = {arch, arch.rstrip("af") + "f"} if arch.endswith("a") else {arch}
        if not self.entries:
            out.append("no fatbin (device code) in the library")
        if self.sass_archs - accepted:
            out.append(f"SASS for other architectures: {sorted(self.sass_archs - accepted)}")
        if self.entries and not self.sass_archs & accepted:
            out.append(f"no SASS for {arch}")
        if self.ptx_archs:
            out.append(f"PTX (JIT-compiled by the driver at load) for {sorted(self.ptx_archs)}")
        if self.has_cuda_source:
            out.append("CUDA source in the library (it would be compiled when loaded)")
        return out


def parse_fatbin(data: bytes, offset: int) -> tuple[list[FatbinEntry], int]:
    """Entries of the fatbin container at `offset`, and the offset just past it."""
    magic, _version, header_size, size = struct.unpack_from("<4sHHQ", data, offset)
    if magic != MAGIC:
        raise ValueError(f"no fatbin at offset {offset}")
    pos, end = offset + header_size, offset + header_size + size
    entries = []
    while pos < end:
        kind, _flags, ehsize, psize = struct.unpack_from("<HHIQ", data, pos)
        arch_num = struct.unpack_from("<I", data, pos + 28)[0]
        flags = struct.unpack_from("<Q", data, pos + 40)[0]
        variant = VARIANTS.get((flags >> 20) & 0x3, "?")
        name = KINDS.get(kind, f"kind{kind}")
        prefix = "compute" if name == "ptx" else "sm"
        entries.append(FatbinEntry(name, f"{prefix}_{arch_num}{variant}", psize))
        if ehsize == 0:
            break
        pos += ehsize + psize
    return entries, end


def elf_machine(data: bytes) -> str:
    if data[:4] != b"\x7fELF":
        return "not ELF"
    machine = struct.unpack_from("<H", data, 18)[0]
    return ELF_MACHINES.get(machine, f"e_machine {machine}")


def inspect_library(path: str | Path) -> DeviceCode:
    """The device code of a compiled library (`model.so`)."""
    data = Path(path).read_bytes()
    entries: list[FatbinEntry] = []
    pos = data.find(MAGIC)
    while pos >= 0:
        try:
            found, end = parse_fatbin(data, pos)
        except (ValueError, struct.error):
            found, end = [], pos + 4
        entries.extend(found)
        pos = data.find(MAGIC, max(end, pos + 4))
    return DeviceCode(elf_machine(data), tuple(entries), b"__global__" in data)


def extract_fatbins(path: str | Path) -> list[bytes]:
    """The fatbin containers inside a library, as standalone files for `cuobjdump` (which does not
    look inside TVM's serialized module blob)."""
    data = Path(path).read_bytes()
    out, pos = [], data.find(MAGIC)
    while pos >= 0:
        try:
            _, end = parse_fatbin(data, pos)
            out.append(data[pos:end])
        except (ValueError, struct.error):
            end = pos + 4
        pos = data.find(MAGIC, max(end, pos + 4))
    return out
