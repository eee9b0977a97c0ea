"""The tensor-core nvfp4 decode GEMV (`ops/nvfp4_gemv_cuda.cu`) without a GPU.

A bit-level numpy emulator of the kernel's per-lane work (nibble pairs, bf16 scale products, the
mma.m16n8k16 fragments, the K split and its shared-memory sum) is checked against the codec's
dequantization times x, and the source is compiled for every CUDA target arch without spills.
The device numerics and speed: tests/gpu/check_nvfp4_gemv.py.
"""

from __future__ import annotations

import subprocess

import numpy as np
import pytest

from ..codegen.conftest import require_tool
from .test_nvfp4 import _codec_planes

MAG, SIGN = np.uint32(0x01C001C0), np.uint32(0x80008000)
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])


def byte_perm(a: np.ndarray, b: np.ndarray, sel: int) -> np.ndarray:
    """`__byte_perm(a, b, sel)` (default mode, selector nibbles < 8)."""
    src = (b.astype(np.uint64) << np.uint64(32)) | a.astype(np.uint64)
    out = np.zeros_like(a, dtype=np.uint32)
    for i in range(4):
        idx = (sel >> (4 * i)) & 7
        byte = ((src >> np.uint64(8 * idx)) & np.uint64(0xFF)).astype(np.uint32)
        out |= byte << np.uint32(8 * i)
    return out


def bf16_value(bits: np.ndarray) -> np.ndarray:
    """16-bit patterns as float64 (exact, subnormals included)."""
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32).astype(np.float64)


def halves(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return bf16_value(v & np.uint32(0xFFFF)), bf16_value(v >> np.uint32(16))


def bf16_bits(v: np.ndarray) -> np.ndarray:
    """float64 values that must be exact in bf16 -> their 16-bit patterns (asserts exactness)."""
    f = v.astype(np.float32)
    assert np.array_equal(f.astype(np.float64), v)
    bits = f.view(np.uint32)
    assert not np.any(bits & np.uint32(0xFFFF)), "a product is not exact in bf16"
    return bits >> np.uint32(16)


def e4m3(s: np.ndarray) -> np.ndarray:
    """E4M3FN bytes (no NaN) as float64."""
    e, m = (s >> 3) & 0xF, s & 7
    mag = np.where(e == 0, m / 8.0 * 2.0**-6, (1 + m / 8.0) * 2.0 ** (e.astype(np.int64) - 7))
    return np.where(s & 0x80, -mag, mag)


def scaled_pair(w: np.ndarray, s: np.ndarray, i: int) -> np.ndarray:
    """The kernel's `scaled_pair<i>`: magnitudes of nibbles i, i + 4 at bits 6..8, signs into s."""
    w = w.astype(np.uint32)
    mag = ((w << np.uint32(6 - 4 * i)) if i <= 1 else (w >> np.uint32(4 * i - 6))) & MAG
    sgn = w << np.uint32(12 - 4 * i)
    return scale_pair(mag, s ^ (sgn & SIGN))


def scale_pair(a: np.ndarray, s: np.ndarray) -> np.ndarray:
    """`fma.rn.bf16x2(a, s, -0)` where every product is exact."""
    lo_a, hi_a = halves(a)
    lo_s, hi_s = halves(s)
    return bf16_bits(lo_a * lo_s) | (bf16_bits(hi_a * hi_s) << np.uint32(16))


def emulate(packed: np.ndarray, scales: np.ndarray, divisor: float, x: np.ndarray, ks: int) -> np.ndarray:
    """y [b, N] as the kernel computes it (products exact, sums in float64)."""
    n, k = packed.shape[0], packed.shape[1] * 2
    b = x.shape[0]
    lanes = np.arange(32)
    g, c = lanes // 4, lanes % 4
    xb = np.zeros((8, k), np.float32)
    xb[:b] = x
    x_bits = (xb.view(np.uint32) >> np.uint32(16)).astype(np.uint32)  # x is bf16-exact
    x_words = (x_bits[:, 0::2] | (x_bits[:, 1::2] << np.uint32(16))).astype(np.uint32)  # [8, K/2]
    code_words = np.ascontiguousarray(packed).view(np.uint32)  # [N, K/8]
    scale_u16 = scales.view(np.uint16)  # [N, K/32]: the two scales of a thread's 32 k
    chunks = k // 128
    y = np.zeros((b, n))
    for row0 in range(0, n, 16):
        parts = []
        for kp in range(ks):
            acc = np.zeros((32, 4))
            per = -(-chunks // ks)
            for ch in range(min(kp * per, chunks), min(kp * per + per, chunks)):
                ra, rb = row0 + g, row0 + g + 8
                s2a, s2b = scale_u16[ra, ch * 4 + c], scale_u16[rb, ch * 4 + c]
                sa = [e4m3(s2a & 0xFF) * 2.0**119, e4m3(s2a >> 8) * 2.0**119]
                sb = [e4m3(s2b & 0xFF) * 2.0**119, e4m3(s2b >> 8) * 2.0**119]
                for q in range(4):
                    word = ch * 16 + c * 4 + q  # uint32 index of the thread's word q in the row
                    wa, wb = code_words[ra, word], code_words[rb, word]
                    sba, sbb = bf16_bits(sa[q // 2]), bf16_bits(sb[q // 2])
                    s_a, s_b = sba | (sba << np.uint32(16)), sbb | (sbb << np.uint32(16))
                    xw = np.stack([x_words[g, word * 4 + i] for i in range(4)], axis=-1)  # [32, 4]
                    for h in range(2):  # pairs (2h, 2h + 1) with x words (h, h + 2)
                        regs_a = [scaled_pair(wa, s_a, 2 * h), scaled_pair(wb, s_b, 2 * h),
                                  scaled_pair(wa, s_a, 2 * h + 1), scaled_pair(wb, s_b, 2 * h + 1)]
                        xl, xh = xw[:, h], xw[:, h + 2]
                        regs_b = [byte_perm(xl, xh, 0x5410), byte_perm(xl, xh, 0x7632)]
                        acc += mma(regs_a, regs_b)
            parts.append(acc)
        total = sum(parts) * (2.0**7 / float(divisor))
        for i in range(4):
            rows = row0 + g + (i >> 1) * 8
            cols = 2 * c + (i & 1)
            keep = cols < b
            y[cols[keep], rows[keep]] = total[keep, i]
    return y


def mma(a: list[np.ndarray], bregs: list[np.ndarray]) -> np.ndarray:
    """mma.m16n8k16 over per-lane registers -> per-lane D (float64 sums of exact products)."""
    A = np.zeros((16, 16))
    B = np.zeros((16, 8))
    for lane in range(32):
        gg, cc = lane // 4, lane % 4
        for reg, (row, kk) in enumerate([(gg, 2 * cc), (gg + 8, 2 * cc), (gg, 2 * cc + 8), (gg + 8, 2 * cc + 8)]):
            lo, hi = halves(a[reg][lane:lane + 1])
            A[row, kk], A[row, kk + 1] = lo[0], hi[0]
        for reg, kk in enumerate([2 * cc, 2 * cc + 8]):
            lo, hi = halves(bregs[reg][lane:lane + 1])
            B[kk, gg], B[kk + 1, gg] = lo[0], hi[0]
    D = A @ B
    out = np.zeros((32, 4))
    for lane in range(32):
        gg, cc = lane // 4, lane % 4
        out[lane] = [D[gg, 2 * cc], D[gg, 2 * cc + 1], D[gg + 8, 2 * cc], D[gg + 8, 2 * cc + 1]]
    return out


def _bf16(x: np.ndarray) -> np.ndarray:
    return ((x.astype(np.float32).view(np.uint32) >> 16) << 16).view(np.float32)


@pytest.mark.parametrize("b,ks", [(1, 1), (3, 2), (8, 2), (2, 5)])
def test_fragment_mapping_matches_dequant_times_x(b, ks):
    """Exact products, so the emulated kernel equals W @ x up to float64 summation order."""
    rng = np.random.default_rng(7 + b)
    packed, scales, divisor, w = _codec_planes(rng, 128, 256)  # the codec needs N % 128 == 0
    packed, scales, w = packed[:32], scales[:32], w[:32]  # two row tiles are enough here
    k = 256
    x = _bf16(rng.standard_normal((b, k)))
    codes = np.stack([packed & 0xF, packed >> 4], axis=-1).reshape(32, k)
    w64 = E2M1[codes] * np.repeat(e4m3(scales), 16, axis=1) / float(divisor[0])
    np.testing.assert_allclose(w, w64, rtol=2**-23)  # the codec's fp32 decode, to its rounding
    ref = x.astype(np.float64) @ w64.T
    got = emulate(packed, scales, float(divisor[0]), x, ks)
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12 * np.abs(ref).max())


def test_every_code_and_scale_is_exact():
    """All 16 codes against all non-NaN scales: each bf16 product equals e2m1 * e4m3 * 2^-7."""
    codes = np.arange(16, dtype=np.uint32)
    e2m1 = E2M1
    for s in [*range(0x7F), *range(0x80, 0xFF)]:
        sv = e4m3(np.array([s]))[0]
        sb = bf16_bits(np.array([sv * 2.0**119]))[0]
        # nibble i = code in every position: each pair's halves both see `code`
        word = codes * np.uint32(0x11111111)
        for i in range(4):
            pair = scaled_pair(word, np.full_like(word, sb | (sb << 16)), i)
            lo, hi = halves(pair)
            np.testing.assert_array_equal(lo, e2m1 * sv * 2.0**-7)
            np.testing.assert_array_equal(hi, e2m1 * sv * 2.0**-7)


def test_launch_plan():
    """Blocks of ks * slots warps fit 16 warps per SM, cover every tile, and split K evenly enough."""
    from ninfer_compiler.ops.nvfp4 import SMS, WARPS_PER_SM, tc_plan

    for sms in SMS.values():
        for rows, k in [(17408, 5120), (5120, 17408), (6144, 5120), (2048, 5120), (1024, 5120), (5120, 6144),
                        (64, 256), (16, 128)]:
            ks, warps, grid = tc_plan(rows, k, sms)
            assert warps % ks == 0 and warps <= WARPS_PER_SM and ks <= k // 128
            groups = -(-(rows // 16) // (warps // ks))
            assert 1 <= grid <= min(groups, (WARPS_PER_SM // warps) * sms)


@pytest.mark.parametrize("arch", ["sm_90a", "sm_120a", "sm_121a"])
def test_compiles_without_spills(arch, tmp_path):
    require_tool("nvcc", "the CUDA toolkit builds device code")
    from ninfer_compiler.codegen.toolchain import nvcc_path
    from ninfer_compiler.ops.nvfp4 import TC_SOURCE

    proc = subprocess.run(
        [nvcc_path(), "-cubin", "-O3", "-std=c++17", "-Xptxas", "-v",
         f"-gencode=arch={arch.replace('sm_', 'compute_')},code={arch}", str(TC_SOURCE),
         "-o", str(tmp_path / "k.cubin")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    infos = [line for line in proc.stderr.splitlines() if "spill" in line]
    assert len(infos) == 2 and all("0 bytes spill stores, 0 bytes spill loads" in line for line in infos), proc.stderr
    regs = [int(line.split("Used ")[1].split(" registers")[0]) for line in proc.stderr.splitlines() if "Used " in line]
    assert regs and max(regs) <= 128  # 512-thread blocks (ks = 16) must fit the register file


def test_decode_calls_route_to_the_extern_in_an_h200_library(tmp_path):
    """`[b, 1, K]` bf16 calls (N % 16, K % 128) launch the tensor-core GEMV; prefill keeps the GEMM."""
    from ninfer_compiler.build import compile_module, export_module
    from ninfer_compiler.codegen.export import export_library
    from ninfer_compiler.codegen.fatbin import extract_fatbins, inspect_library
    from ninfer_compiler.codegen.targets import tvm_target
    from ninfer_compiler.codegen.toolchain import cuda_build
    from ninfer_compiler.ops import nvfp4
    from ninfer_runtime import targets

    from ..conftest import _op_module

    require_tool("nvcc", "the CUDA toolkit builds device code")
    target = targets.load("h200")
    ttarget = tvm_target(target)
    n, k = 128, 256

    def main(xd, xp, c, s, d):
        return nvfp4.nvfp4_matmul(xd, c, s, d, k), nvfp4.nvfp4_matmul(xp, c, s, d, k)

    inputs = {"xd": (["b", 1, k], "bfloat16"), "xp": ([1, "t", k], "bfloat16")}
    inputs |= {name: (list(shape), dtype) for name, (shape, dtype) in nvfp4.plane_shapes(n, k).items()}
    with ttarget:
        mod, _ = export_module(_op_module(main, inputs), {})
    text = mod.script()
    assert f'"{nvfp4.TC_SYMBOL}"' in text and f'"{nvfp4.GEMM_SYMBOL}"' in text
    assert f'"{nvfp4.GEMV_SYMBOL}"' not in text  # no Triton GEMV, no partial sums
    with cuda_build(ttarget):
        exe = compile_module(mod, ttarget)
    lib = export_library(exe, tmp_path / "model.so", target)
    code = inspect_library(lib)
    assert code.problems("sm_90a") == [] and code.sass_archs == {"sm_90a"}
    assert any(b"ninfer_nvfp4_gemv_ybf16" in fb for fb in extract_fatbins(lib))
    assert nvfp4.TC_SYMBOL.encode() in lib.read_bytes()
