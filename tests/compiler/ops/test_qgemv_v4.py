"""Decode GEMV v4 (`ops/qgemv_cuda.cu`, cp.async ring): its shared-memory layout, checked without a GPU.

v4 computes exactly what v3 computes (same fragments, `v3_pair` etc., emulated bit for bit in
`test_qgemv_v3.py`); only the way the bytes reach a thread changes: `v4_issue` copies 16-byte pieces
of a stage into a swizzled ring slot and `v4_stage` reads each thread's words back from it. Here
both index formulas are replayed in numpy: every thread must read back exactly the bytes v3 loads
from global memory for the same (row, group, lane), every byte of a slot must be written once, and
the fragment loads of a warp must be free of shared-memory bank conflicts. Also: the kernels compile
for the three CUDA archs without spills, and the launcher's stage counts match the kernel's.
"""

from __future__ import annotations

import re
import subprocess

import numpy as np
import pytest

from ninfer_compiler.ops import qgemv

from ..codegen.conftest import require_tool

HB = {4: 0, 5: 8, 6: 16}


def stage_bytes(bits: int, xs: int = 0) -> tuple[int, int, int]:
    """(base, high, total) bytes of one stage (16 rows x 4 groups, `xs` activation rows), as `V4<BITS>`."""
    base, high = 16 * 128, 16 * 4 * HB[bits]
    return base, high, base + high + 16 * 8 + 512 * xs


def issue(bits: int, base: np.ndarray, high: np.ndarray, scales: np.ndarray, row0: int, u: int,
          x: np.ndarray | None = None) -> np.ndarray:
    """One ring slot as `v4_issue` fills it (byte copies of the planes at the kernel's offsets);
    `x` (bf16 bits `[xs, K]`): the staged activation rows."""
    xs = 0 if x is None else x.shape[0]
    nb, nh, total = stage_bytes(bits, xs)
    slot = np.full(total, -1, dtype=np.int32)  # -1: never written
    sbytes = scales.view(np.uint8)
    groups = scales.shape[1]

    def put(dst: int, src: np.ndarray) -> None:
        assert (slot[dst : dst + src.size] == -1).all(), "a slot byte is written twice"
        slot[dst : dst + src.size] = src

    gi0 = 4 * u
    for lane in range(32):
        for j in range(4):
            i = j * 32 + lane
            r, p = i >> 3, i & 7
            put(r * 128 + ((p ^ ((r & 3) << 1)) << 4), base[row0 + r, gi0 * 32 + p * 16 :][:16])
        if bits == 5:
            r, p = lane >> 1, lane & 1
            put(nb + r * 32 + ((p ^ ((r >> 2) & 1)) << 4), high[row0 + r, gi0 * 8 + p * 16 :][:16])
        if bits == 6:
            for j in range(2):
                i = j * 32 + lane
                r, p = i >> 2, i & 3
                put(nb + r * 64 + ((p ^ ((r >> 1) & 3)) << 4), high[row0 + r, gi0 * 16 + p * 16 :][:16])
        r, p = lane >> 1, lane & 1
        put(nb + nh + r * 8 + p * 4, sbytes[row0 + r, (gi0 + 2 * p) * 2 :][:4])
        for j in range(xs):
            put(nb + nh + 128 + j * 512 + lane * 16, x[j].view(np.uint8)[(gi0 * 64 + lane * 8) * 2 :][:16])
    assert groups >= gi0 + 4
    assert (slot >= 0).all(), "a slot byte is never written"
    return slot


def reads(bits: int, g: int, c: int, q: int, xs: int = 0) -> dict[str, tuple[int, int]]:
    """Shared-memory (offset, size) of what thread (g, c) reads for group q of a stage (`v4_stage`)."""
    nb, nh, _ = stage_bytes(bits, xs)
    boff = (((2 * q + (c >> 1)) ^ ((g & 3) << 1)) << 4) + (c & 1) * 8
    out = {"wa": (g * 128 + boff, 8), "wb": ((g + 8) * 128 + boff, 8)}
    if bits == 5:
        hoff = nb + (((q >> 1) ^ ((g >> 2) & 1)) << 4) + (q & 1) * 8 + c * 2
        out |= {"ha": (hoff + g * 32, 2), "hb": (hoff + (g + 8) * 32, 2)}
    if bits == 6:
        hoff = nb + ((q ^ ((g >> 1) & 3)) << 4) + c * 4
        out |= {"ha": (hoff + g * 64, 4), "hb": (hoff + (g + 8) * 64, 4)}
    # one half2 per two groups: q // 2 (and the kernel picks the half by q % 2)
    out |= {"sa": (nb + nh + g * 8 + (q >> 1) * 4, 4), "sb": (nb + nh + (g + 8) * 8 + (q >> 1) * 4, 4)}
    # a staged activation row g (when g < xs): 16 bf16 at lanes 16c.. of the group, two 16-byte loads
    out["x"] = (nb + nh + 128 + g * 512 + q * 128 + c * 32, 32)
    return out


def v3_global(bits: int, base, high, scales, row0: int, g: int, c: int, gi: int, x=None) -> dict[str, np.ndarray]:
    """The same words as v3 loads them from global memory (`v3_body`)."""
    ra, rb = row0 + g, row0 + g + 8
    hb = HB[bits]
    out = {"wa": base[ra, gi * 32 + c * 8 :][:8], "wb": base[rb, gi * 32 + c * 8 :][:8]}
    if hb:
        n = 2 if bits == 5 else 4
        out |= {"ha": high[ra, gi * hb + c * (hb // 4) :][:n], "hb": high[rb, gi * hb + c * (hb // 4) :][:n]}
    s = scales.view(np.uint8)
    ch = gi // 2
    out |= {"sa": s[ra, 4 * ch :][:4], "sb": s[rb, 4 * ch :][:4]}
    if x is not None and g < x.shape[0]:  # v3: x + g * k + c * 16 + gi * 64, two uint4
        out["x"] = x[g].view(np.uint8)[(gi * 64 + c * 16) * 2 :][:32]
    return out


@pytest.mark.parametrize("bits", [4, 5, 6])
@pytest.mark.parametrize("xs", [0, 2])
def test_v4_ring_reads_back_v3_words(bits, xs):
    rng = np.random.default_rng(bits)
    n, k = 32, 512
    groups = k // 64
    base = rng.integers(0, 256, size=(n, k // 2), dtype=np.uint8)
    high = rng.integers(0, 256, size=(n, groups * HB[bits]), dtype=np.uint8) if HB[bits] else base
    scales = rng.standard_normal((n, groups)).astype(np.float16)
    x = rng.integers(0, 1 << 16, size=(xs, k), dtype=np.uint16) if xs else None
    for row0 in (0, 16):
        for u in range(k // 256):
            slot = issue(bits, base, high, scales, row0, u, x)
            for g in range(8):
                for c in range(4):
                    for q in range(4):
                        want = v3_global(bits, base, high, scales, row0, g, c, 4 * u + q, x)
                        for name, (off, size) in reads(bits, g, c, q, xs).items():
                            if name == "x" and not (x is not None and g < xs):
                                continue
                            got = slot[off : off + size]
                            assert (got == want[name]).all(), (bits, row0, u, g, c, q, name)


@pytest.mark.parametrize("bits", [4, 5, 6])
def test_v4_fragment_loads_have_no_bank_conflicts(bits):
    """Per load instruction: lanes of one phase (a half-warp for 8-byte loads, the warp otherwise)
    touch each 4-byte bank at one word address only (same word: broadcast)."""
    for q in range(4):
        for name in reads(bits, 0, 0, q):
            if name == "x":  # activation rows: only lanes of rows g < b read them (checked apart)
                continue
            size = reads(bits, 0, 0, q)[name][1]
            phases = [range(0, 16), range(16, 32)] if size == 8 else [range(32)]
            for phase in phases:
                words: dict[int, set[int]] = {}
                for lane in phase:
                    off, sz = reads(bits, lane >> 2, lane & 3, q)[name]
                    for w in range(off // 4, (off + sz - 1) // 4 + 1):
                        words.setdefault(w % 32, set()).add(w)
                assert all(len(v) == 1 for v in words.values()), (bits, q, name, words)


def test_v4_stage_counts_match_launcher():
    """The launcher sizes dynamic shared memory from its own copy of the stage counts."""
    cu = qgemv.DEVICE_SOURCE.read_text()
    cc = qgemv.HOST_SOURCE.read_text()
    for name in ("XSTAGE", *(f"STAGES_Q{b}" for b in (4, 5, 6))):
        dev = re.search(rf"#define NINFER_V4_{name} (\d+)", cu)
        host = re.search(rf"#define NINFER_V4_{name} (\d+)", cc)
        assert dev and host and dev.group(1) == host.group(1), name
    for bits in (4, 5, 6):
        dev = re.search(rf"#define NINFER_V4_STAGES_Q{bits} (\d+)", cu)
        host = re.search(rf"#define NINFER_V4_STAGES_Q{bits} (\d+)", cc)
        assert dev and host and dev.group(1) == host.group(1), bits
        assert int(dev.group(1)) == qgemv.V4_STAGES[bits]
        # 8 warps of a block must fit the smallest opt-in maximum of the three archs (99 KB)
        assert 8 * qgemv.V4_STAGES[bits] * stage_bytes(bits)[2] <= 101376


@pytest.mark.parametrize("arch", ["sm_90a", "sm_120a", "sm_121a"])
def test_v4_compiles_without_spills(arch, tmp_path):
    require_tool("nvcc", "the CUDA toolkit builds device code")
    from ninfer_compiler.codegen.toolchain import nvcc_path

    proc = subprocess.run(
        [nvcc_path(), "-cubin", "-O3", "-std=c++17", "-DNINFER_GEMV_SKIP_V2", "-Xptxas", "-v",
         f"-gencode=arch={arch.replace('sm_', 'compute_')},code={arch}", str(qgemv.DEVICE_SOURCE),
         "-o", str(tmp_path / "k.cubin")],
        capture_output=True, text=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    kernels = dict(re.findall(r"Function properties for (\w+)\n\s+\d+ bytes stack frame, (\d+) bytes spill stores",
                              proc.stderr))
    v4 = {f"ninfer_qgemv4_q{b}_y{t}" for b in (4, 5, 6) for t in ("bf16", "f32")}
    v4 |= {f"ninfer_qgemv4e_q{b}_{m}" for b in (4, 5, 6) for m in ("plain", "add", "swiglu", "multi")}
    v4 |= {"ninfer_rms_norm_wf32", "ninfer_rms_norm_wbf16"}
    assert v4 <= set(kernels)
    assert {name: s for name, s in kernels.items() if name in v4 and int(s)} == {}


def test_launcher_kernel_names_exist():
    """Every kernel the launcher looks up by name (`kernel_name` in qgemv_host.cc) is defined by
    qgemv_cuda.cu's entry macros, and the launcher's V4Epi mirrors the kernel's field by field."""
    cu = qgemv.DEVICE_SOURCE.read_text()
    cc = qgemv.HOST_SOURCE.read_text()
    assert re.search(r"constexpr int kKernels = 32 \+ 3 \+ 12;", cc) and re.search(r"constexpr int kKernels = 4 \+ 2;", cc)
    names = [f"ninfer_qgemv_q{b}_b{n}_{t}" for t in ("bf16", "f32") for b in (4, 5, 6, 8) for n in (1, 2, 4, 8)]
    names += [f"ninfer_qgemv3_q{b}_ybf16" for b in (4, 5, 6)]
    names += [f"ninfer_qgemv4e_q{b}_{m}" for b in (4, 5, 6) for m in ("plain", "add", "swiglu", "multi")]
    assert "ninfer_rms_norm_wf32" in cu and "ninfer_rms_norm_wbf16" in cu
    for name in names:
        stem, _, tail = name.rpartition("_")
        if name.startswith("ninfer_qgemv4e_"):
            assert re.search(r"NINFER_QGEMV4E\(BITS, V4_\w+, " + tail, cu), name
        elif name.startswith("ninfer_qgemv3_"):
            assert "ninfer_qgemv3_q##BITS##_y##TAG" in cu
        else:
            assert "ninfer_qgemv_q##BITS##_b##B##_##TAG" in cu
    fields = lambda src: re.findall(r"^\s+(?:const )?\w+\*? (\w+);", re.search(r"struct V4Epi \{(.*?)\};", src, re.S).group(1), re.M)  # noqa: E731
    assert fields(cu) == fields(cc) == ["up_base", "up_high", "up_scales", "residual", "y_stride"]
    arrays = lambda src: re.findall(r"^\s+(?:const )?\w+\*? (\w+)\[V4_SEGS\];", re.search(r"struct V4Epi \{(.*?)\};", src, re.S).group(1), re.M)  # noqa: E731
    assert arrays(cu) == arrays(cc) == ["seg_end", "seg_stride", "seg_base", "seg_high", "seg_scales", "seg_y"]
    # the modes' numbering is the launcher's index arithmetic (35 + 4 * (bits - 4) + mode)
    for mode, value in (("V4_PLAIN", 0), ("V4_ADD", 1), ("V4_SWIGLU", 2), ("V4_MULTI", 3)):
        assert re.search(rf"{mode} = {value}\b", cu) and re.search(rf"{mode} = {value}\b", cc)

