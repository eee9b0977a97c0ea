"""The fatbin reader: synthetic containers, a real nvcc output, and the AOT verdict."""

from __future__ import annotations

import struct
import subprocess

import pytest

from ninfer_compiler.codegen.fatbin import (
    MAGIC,
    DeviceCode,
    FatbinEntry,
    extract_fatbins,
    inspect_library,
    parse_fatbin,
)


def _entry(kind: int, arch: int, variant: int, payload: bytes) -> bytes:
    header = bytearray(64)
    struct.pack_into("<HHIQ", header, 0, kind, 0x101, 64, len(payload))
    struct.pack_into("<I", header, 28, arch)
    struct.pack_into("<Q", header, 40, 0x11 | (variant << 20))
    return bytes(header) + payload


def _fatbin(*entries: bytes) -> bytes:
    body = b"".join(entries)
    return MAGIC + struct.pack("<HHQ", 1, 16, len(body)) + body


def test_parses_kinds_archs_and_variants():
    blob = _fatbin(_entry(2, 90, 1, b"\x7fELF" + bytes(60)), _entry(2, 120, 2, bytes(8)), _entry(1, 121, 1, b".ptx"))
    entries, end = parse_fatbin(b"xx" + blob, 2)
    assert end == len(blob) + 2
    assert entries == [FatbinEntry("elf", "sm_90a", 64), FatbinEntry("elf", "sm_120f", 8),
                       FatbinEntry("ptx", "compute_121a", 4)]


def test_library_scan_finds_every_container(tmp_path):
    lib = tmp_path / "lib.so"
    lib.write_bytes(b"\x7fELF" + bytes(14) + struct.pack("<H", 183) + bytes(100)
                    + _fatbin(_entry(2, 121, 1, bytes(16))) + bytes(7) + _fatbin(_entry(2, 121, 1, bytes(4))))
    code = inspect_library(lib)
    assert code.host_machine == "aarch64"
    assert [e.arch for e in code.entries] == ["sm_121a", "sm_121a"]
    assert len(extract_fatbins(lib)) == 2
    assert code.problems("sm_121a") == []


@pytest.mark.parametrize(("entries", "source", "arch", "expect"), [
    ([FatbinEntry("elf", "sm_90a", 1)], False, "sm_90a", []),
    ([FatbinEntry("elf", "sm_120f", 1)], False, "sm_120a", []),  # the family form counts for sm_120a
    ([FatbinEntry("elf", "sm_120a", 1)], False, "sm_121a", ["SASS for other", "no SASS for sm_121a"]),
    ([FatbinEntry("elf", "sm_90a", 1), FatbinEntry("elf", "sm_80", 1)], False, "sm_90a", ["SASS for other"]),
    ([FatbinEntry("elf", "sm_90a", 1), FatbinEntry("ptx", "compute_90a", 1)], False, "sm_90a", ["PTX"]),
    ([], True, "sm_90a", ["no fatbin", "CUDA source"]),
])  # fmt: skip
def test_aot_verdict(entries, source, arch, expect):
    problems = DeviceCode("x86_64", tuple(entries), source).problems(arch)
    assert len(problems) == len(expect)
    for problem, start in zip(problems, expect, strict=True):
        assert problem.startswith(start) or start in problem


@pytest.mark.parametrize(("gencode", "arch"), [
    ("arch=compute_90a,code=sm_90a", "sm_90a"),
    ("arch=compute_120f,code=sm_120f", "sm_120f"),
    ("arch=compute_121a,code=sm_121a", "sm_121a"),
])  # fmt: skip
def test_reads_what_nvcc_writes(tmp_path, nvcc, gencode, arch):
    src = tmp_path / "k.cu"
    src.write_text('extern "C" __global__ void k(float* x) { x[threadIdx.x] *= 2.0f; }\n')
    out = tmp_path / "k.fatbin"
    subprocess.run(["nvcc", "--fatbin", "-gencode", gencode, "-o", str(out), str(src)], check=True)
    entries, _ = parse_fatbin(out.read_bytes(), 0)
    assert entries[0].kind == "elf" and entries[0].arch == arch
