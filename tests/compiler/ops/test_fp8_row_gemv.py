"""The tensor-core fp8-row decode GEMV (`ops/fp8_row_gemv_cuda.cu`) without a GPU.

A bit-level numpy emulator of the kernel's per-lane work (byte pairs placed at bf16 bits 4..10, the
bf16 products by 2^120, the mma.m16n8k16 fragments, the K split and its shared-memory sum, the row
scale on the fp32 sum) is checked against float64 `x @ W^T`; every valid code word decodes exactly;
the source compiles for every CUDA target arch without spills. Device numerics and speed:
tests/gpu/check_fp8_row.py.
"""

from __future__ import annotations

import re
import subprocess

import numpy as np
import pytest

from ..codegen.conftest import require_tool
from .test_fp8_row import VALID, e4m3fn64, random_planes, reference
from .test_nvfp4_gemv import bf16_bits, byte_perm, halves, mma

MAG, SIGN, TWO120 = np.uint32(0x07F007F0), np.uint32(0x80008000), np.uint32(0x7B807B80)


def scale_pair(a: np.ndarray, s: np.ndarray) -> np.ndarray:
    """`fma.rn.bf16x2(a, s, -0)` where every product must be exact (asserted)."""
    lo_a, hi_a = halves(a)
    lo_s, hi_s = halves(s)
    return bf16_bits(lo_a * lo_s) | (bf16_bits(hi_a * hi_s) << np.uint32(16))


def pair02(w: np.ndarray) -> np.ndarray:
    """The kernel's `pair02`: bytes 0 and 2 of w as bf16x2 code values."""
    w = w.astype(np.uint32)
    return scale_pair((w << np.uint32(4)) & MAG, ((w << np.uint32(8)) & SIGN) | TWO120)


def pair13(w: np.ndarray) -> np.ndarray:
    """The kernel's `pair13`: bytes 1 and 3 of w as bf16x2 code values."""
    w = w.astype(np.uint32)
    return scale_pair((w >> np.uint32(4)) & MAG, (w & SIGN) | TWO120)


def emulate(codes: np.ndarray, words: np.ndarray, x: np.ndarray, ks: int) -> np.ndarray:
    """y [b, N] as the kernel computes it (products exact, sums in float64, then the row scale)."""
    n, k = codes.shape
    b = x.shape[0]
    lanes = np.arange(32)
    g, c = lanes // 4, lanes % 4
    xb = np.zeros((8, k), np.float32)
    xb[:b] = x
    x_bits = (xb.view(np.uint32) >> np.uint32(16)).astype(np.uint32)  # x is bf16-exact
    x_words = (x_bits[:, 0::2] | (x_bits[:, 1::2] << np.uint32(16))).astype(np.uint32)  # [8, K/2]
    code_words = np.ascontiguousarray(codes).view(np.uint32)  # [N, K/4], byte 0 = lowest k
    scale = (words.astype(np.uint32) << np.uint32(16)).view(np.float32).astype(np.float64)
    chunks = k // 128
    y = np.zeros((b, n))
    for row0 in range(0, n, 16):
        parts = []
        per = -(-chunks // ks)
        for kp in range(ks):
            acc = np.zeros((32, 4))
            for ch in range(min(kp * per, chunks), min(kp * per + per, chunks)):
                ra, rb = row0 + g, row0 + g + 8
                for q in range(8):  # the thread's 8 code words of the chunk (bytes 32c .. 32c + 31)
                    word = ch * 32 + c * 8 + q
                    wa, wb = code_words[ra, word], code_words[rb, word]
                    xk = ch * 128 + c * 32 + 4 * q  # the word's first k
                    x01, x23 = x_words[g, xk // 2], x_words[g, xk // 2 + 1]
                    regs_a = [pair02(wa), pair02(wb), pair13(wa), pair13(wb)]
                    regs_b = [byte_perm(x01, x23, 0x5410), byte_perm(x01, x23, 0x7632)]
                    acc += mma(regs_a, regs_b)
            parts.append(acc)
        total = sum(parts)
        for i in range(4):
            rows = row0 + g + (i >> 1) * 8
            cols = 2 * c + (i & 1)
            keep = cols < b
            y[cols[keep], rows[keep]] = total[keep, i] * scale[rows[keep]]
    return y


def _bf16(x: np.ndarray) -> np.ndarray:
    return ((x.astype(np.float32).view(np.uint32) >> 16) << 16).view(np.float32)


@pytest.mark.parametrize("b,ks", [(1, 1), (3, 2), (8, 2), (5, 1)])
def test_fragment_mapping_matches_float64(b, ks):
    """Exact products, so the emulated kernel equals s * (x @ codes^T) up to float64 summation order."""
    rng = np.random.default_rng(11 + b)
    n, k = 32, 256
    codes, words = random_planes(rng, n, k)
    x = _bf16(rng.standard_normal((b, k)))
    ref = reference(x, codes, words)
    got = emulate(codes, words, x, ks)
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12 * np.abs(ref).max())


def test_every_code_word_is_exact():
    """Each valid word in every byte position of a code word decodes to its E4M3FN value."""
    w = VALID.astype(np.uint32) * np.uint32(0x01010101)
    for pair in (pair02(w), pair13(w)):
        lo, hi = halves(pair)
        np.testing.assert_array_equal(lo, e4m3fn64(VALID))
        np.testing.assert_array_equal(hi, e4m3fn64(VALID))
    # distinct bytes: the pairs take (0, 2) and (1, 3)
    rng = np.random.default_rng(0)
    quads = rng.choice(VALID, size=(1000, 4))
    w = quads.astype(np.uint32) @ (np.uint32(1) << np.arange(0, 32, 8, dtype=np.uint32))
    lo, hi = halves(pair02(w))
    np.testing.assert_array_equal(np.stack([lo, hi], 1), e4m3fn64(quads[:, [0, 2]]))
    lo, hi = halves(pair13(w))
    np.testing.assert_array_equal(np.stack([lo, hi], 1), e4m3fn64(quads[:, [1, 3]]))


def test_launch_plan_is_the_nvfp4_one():
    """The launcher's plan loop is the nvfp4 GEMV's (`nvfp4.tc_plan` mirrors it; tested there)."""
    from ninfer_compiler.ops import fp8_row, nvfp4
    from ninfer_compiler.ops.cuda_extern import fill_launcher

    def plan(text: str) -> str:
        body = text[text.index("static const int kChoices"):text.index("const char* key")]
        return re.sub(r"\s+", " ", body)

    ours = fill_launcher(fp8_row.TC_LAUNCHER, {"WARPS_PER_SM": nvfp4.WARPS_PER_SM, "SMS": 132})
    theirs = nvfp4.TC_LAUNCHER.replace("WARPS_PER_SM", str(nvfp4.WARPS_PER_SM)).replace("SMS", "132")
    assert plan(ours) == plan(theirs)


@pytest.mark.parametrize("arch", ["sm_90a", "sm_120a", "sm_121a"])
def test_compiles_without_spills(arch, tmp_path):
    require_tool("nvcc", "the CUDA toolkit builds device code")
    from ninfer_compiler.codegen.toolchain import nvcc_path
    from ninfer_compiler.ops.fp8_row import TC_SOURCE

    proc = subprocess.run(
        [nvcc_path(), "-cubin", "-O3", "-std=c++17", "-Xptxas", "-v",
         f"-gencode=arch={arch.replace('sm_', 'compute_')},code={arch}", str(TC_SOURCE),
         "-o", str(tmp_path / "k.cubin")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    infos = [line for line in proc.stderr.splitlines() if "spill" in line]
    assert len(infos) == 2 and all("0 bytes spill stores, 0 bytes spill loads" in line for line in infos), proc.stderr
    regs = [int(line.split("Used ")[1].split(" registers")[0]) for line in proc.stderr.splitlines() if "Used " in line]
    assert regs and max(regs) <= 128  # 512-thread blocks (ks = 16) must fit the register file
