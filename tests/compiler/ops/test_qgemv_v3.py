"""Decode GEMV v3 (`ops/qgemv_cuda.cu`, tensor cores): its lane mapping, checked without a GPU.

`emulate_v3` redoes, bit for bit in numpy, what each thread of a warp packs into its `mma.m16n8k16`
fragments (the shifts, masks, PRMT selectors and bf16 constants of `code_pair`, `high_word` and the
activation pairing) and applies the PTX fragment layout of A, B and D. If the mapping of physical
lanes to the MMA's k were wrong in A or B, or the code/sign arithmetic were off, the emulated
result would not equal `decode_row_split(planes) @ x`. The kernels themselves are compiled for the
three CUDA archs and checked for register spills (numerics and speed on the H200:
`tests/gpu/check_qgemv.py cupy`).
"""

from __future__ import annotations

import re
import subprocess

import numpy as np
import pytest

from ninfer_compiler.ops import qgemv
from ninfer_compiler.ops.row_split import decode_row_split, plane_shapes

from ..codegen.conftest import require_tool
from .test_qgemv5_emulation import halves, mul, q4_pair, q5_pair, q6_pair

FORMATS = {"q4_g64_fp16": 4, "q5_g64_fp16": 5, "q6_g64_fp16": 6}
M32 = np.uint64(0xFFFFFFFF)


def byte_perm(a: np.ndarray, b: np.ndarray, sel: int) -> np.ndarray:
    """CUDA `__byte_perm(a, b, sel)` (selector nibbles 0..7 pick bytes of b:a)."""
    pool = (b.astype(np.uint64) << np.uint64(32)) | a.astype(np.uint64)
    out = np.zeros_like(pool)
    for i in range(4):
        pick = np.uint64((sel >> (4 * i)) & 7)
        out |= ((pool >> (np.uint64(8) * pick)) & np.uint64(0xFF)) << np.uint64(8 * i)
    return out & M32


def bf16_halves(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A bf16x2 register as (low, high) float64 values."""
    v = v.astype(np.uint32)
    lo = (v << np.uint32(16)).view(np.float32).astype(np.float64)
    hi = (v & np.uint32(0xFFFF0000)).view(np.float32).astype(np.float64)
    return lo, hi


def high_word(h: np.ndarray, bits: int, half: int) -> tuple[np.ndarray | None, np.ndarray | None]:
    """The kernel's `high_word`: q5 (x, x3) = h8 * (0x10010, 0x8008); q6 (F, -) by one PRMT."""
    if bits == 5:
        h8 = (h >> np.uint64(8)) if half else (h & np.uint64(0xFF))
        return mul(h8, 0x10010), mul(h8, 0x8008)
    if bits == 6:
        return byte_perm(h, np.zeros_like(h), 0x4342 if half else 0x4140), None
    return None, None


def v3_pair(w: np.ndarray, f: tuple, bits: int, m: int, half: int) -> tuple[np.ndarray, np.ndarray]:
    """Signed codes of lanes (m, m + 4) of w, as the kernel's `code_pair` computes them (the same
    construction as v5's, emulated in test_qgemv5_emulation.py, exactness of every bf16x2 FMA
    asserted)."""
    x, x3 = f
    v = q4_pair(w, m) if bits == 4 else q5_pair(w, x, x3, m) if bits == 5 else q6_pair(w, x, m)
    return halves(v)


def emulate_v3(planes: dict[str, np.ndarray], bits: int, x_bits: np.ndarray) -> np.ndarray:
    """`y [b, N]` from the fragments that v3 builds; `x_bits` is bf16 as uint16 `[b, K]`, b <= 8."""
    base = planes["base"]
    n, groups = base.shape[0], base.shape[1] // 32
    hb = {5: 8, 6: 16}.get(bits, 0)
    b = x_bits.shape[0]
    xb = np.zeros((8, x_bits.shape[1]), dtype=np.uint16)
    xb[:b] = x_bits  # batch columns >= b are zeros in B
    y = np.zeros((n, 8))
    for gi in range(groups):
        words = base[:, gi * 32 : gi * 32 + 32].copy().view("<u4").astype(np.uint64)  # [N, 8]
        if hb:
            hplane = planes["high"][:, gi * hb : (gi + 1) * hb]
            hwords = hplane.copy().view("<u2" if bits == 5 else "<u4").astype(np.uint64)  # [N, 4]
        xw = xb[:, gi * 64 : gi * 64 + 64].copy().view("<u4").astype(np.uint64)  # [8, 32]
        t = np.zeros((n, 8))
        for m in range(4):
            a = np.zeros((n, 16))  # A[row, logical k]
            bm = np.zeros((16, 8))  # B[logical k, batch column]
            for c in range(4):
                h = hwords[:, c] if hb else np.zeros(n, dtype=np.uint64)
                for half, kk in ((0, 2 * c), (1, 2 * c + 8)):  # a0/a1 (w0) and a2/a3 (w1)
                    w = words[:, 2 * c + half]
                    a[:, kk], a[:, kk + 1] = v3_pair(w, high_word(h, bits, half), bits, m, half)
                    # thread c's activations: words X0..X7 = lanes 16c + 2i, 16c + 2i + 1
                    xs = xw[:, 8 * c + 4 * half : 8 * c + 4 * half + 4]
                    lo_w, hi_w = (xs[:, 0], xs[:, 2]) if m < 2 else (xs[:, 1], xs[:, 3])
                    pair = byte_perm(lo_w, hi_w, 0x7632 if m & 1 else 0x5410)
                    bm[kk], bm[kk + 1] = bf16_halves(pair)
            t += a @ bm
        y += t * planes["scales"][:, gi : gi + 1].astype(np.float64)
    return y[:, :b].T


def _random_planes(fmt: str, n: int, k: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    out = {}
    for p, (shape, dtype) in plane_shapes(fmt, n, k).items():
        if dtype == "uint8":
            out[p] = rng.integers(0, 256, size=shape, dtype=np.uint8)
        else:
            out[p] = (rng.uniform(0.5, 1.5, size=shape) * rng.choice([-1, 1], size=shape) / 64).astype(np.float16)
    return out


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("b", [1, 3, 8])
def test_v3_fragment_mapping_matches_reference(fmt, b):
    rng = np.random.default_rng(FORMATS[fmt] * 10 + b)
    n, k = 16, 256
    planes = _random_planes(fmt, n, k, rng)
    x = rng.standard_normal((b, k)).astype(np.float32)
    x_bits = (x.view(np.uint32) >> 16).astype(np.uint16)  # bf16 by truncation: exact inputs
    x_exact = (x_bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    ref = x_exact @ decode_row_split(planes, fmt, k).astype(np.float64).T
    got = emulate_v3(planes, FORMATS[fmt], x_bits)
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-12 * np.abs(ref).max())


def test_v3_sees_every_code():
    """Extreme codes (all-zero and all-one bytes) decode to the format's min / -1 exactly."""
    for fmt, bits in FORMATS.items():
        for fill in (0x00, 0xFF):
            planes = {p: np.full(s, fill, dtype=np.uint8) for p, (s, d) in plane_shapes(fmt, 16, 128).items() if d == "uint8"}
            planes["scales"] = np.ones((16, 2), dtype=np.float16)
            x_bits = np.full((1, 128), 0x3F80, dtype=np.uint16)  # x = 1
            expected = 0 if fill == 0 else -1.0
            assert (emulate_v3(planes, bits, x_bits) == expected * 128).all(), (fmt, fill)


@pytest.mark.parametrize("arch", ["sm_90a", "sm_120a", "sm_121a"])
def test_v3_and_dense_compile_without_spills(arch, tmp_path):
    require_tool("nvcc", "the CUDA toolkit builds device code")
    from ninfer_compiler.codegen.toolchain import nvcc_path

    proc = subprocess.run(
        [nvcc_path(), "-cubin", "-O3", "-std=c++17", "-DNINFER_GEMV_SKIP_V2", "-Xptxas", "-v",
         f"-gencode=arch={arch.replace('sm_', 'compute_')},code={arch}", str(qgemv.DEVICE_SOURCE),
         "-o", str(tmp_path / "k.cubin")],
        capture_output=True, text=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    kernels = re.findall(r"Function properties for (\w+)\n\s+(\d+) bytes stack frame, (\d+) bytes spill stores", proc.stderr)
    names = {name for name, _, _ in kernels}
    assert {f"ninfer_qgemv3_q{b}_ybf16" for b in (4, 5, 6)} <= names
    assert {f"ninfer_dense_bf16_b{b}" for b in (1, 2, 4, 8)} <= names
    assert not any(name.startswith("ninfer_qgemv_q") for name in names)
    # (the v4 entries run under a register cap and are checked loop by loop in test_qgemv_v4.py)
    spills = {name: int(s) for name, _, s in kernels if int(s) and not name.startswith("ninfer_qgemv4")}
    assert spills == {}, f"register spills: {spills}"
    regs = [int(r) for r in re.findall(r"Used (\d+) registers", proc.stderr)]
    assert max(regs) <= 128
