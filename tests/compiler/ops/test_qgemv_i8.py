"""The int8 q4 / q5 decode path (`qgemv_cuda.cu`: `norm_xq8` writes the activations, for the norm
and for the SwiGLU's output, `v4_stage_i8` reads them with the weights as `mma.m16n8k32.s8`
fragments), replayed in numpy from the kernels' index formulas: every byte the norm writes and every
fragment register the GEMV builds, against float64.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from ninfer_compiler.ops import qgemv

K = 512  # two stages of 256 k
ROWS = 32  # two warp tiles


def _bf16(a: np.ndarray) -> np.ndarray:
    """Round to bf16 (nearest even), as float64."""
    u = a.astype(np.float32).view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16 << 16).astype(np.uint32)
    return u.view(np.float32).astype(np.float64)


def _norm_xq(xn: np.ndarray) -> np.ndarray:
    """`norm_xq8` for every vector v of every row r < 4: the xq bytes (and scales after K * 8)."""
    b, k = xn.shape
    xq = np.zeros(k * 8 + k // 256 * 64, dtype=np.uint8)
    scales = np.zeros(k // 256 * 16, dtype=np.float32)
    for r in range(b):
        for v in range(k // 8):
            f = xn[r, 8 * v:8 * v + 8].astype(np.float32)
            m = np.float32(np.abs(xn[r, (v >> 3) * 64:(v >> 3) * 64 + 64]).max())  # the group's 8 lanes
            sh = np.float32(m / np.float32(127)) if m > 0 else np.float32(1)
            inv = np.float32(1) / sh
            hi = np.clip(np.rint(f * inv), -127, 127).astype(np.float32)
            lo = np.clip(np.rint((f - hi * sh) * (np.float32(254) * inv)), -127, 127)
            grp, m8 = v >> 3, v & 7
            chunk = (grp * 32 + (m8 >> 1) * 8 + 2 * r) * 16 + (m8 & 1) * 8
            for e in range(8):
                pos = chunk + 4 * (e & 1) + (e >> 1)
                xq[pos] = np.int8(hi[e]).view(np.uint8)
                xq[pos + 16] = np.int8(lo[e]).view(np.uint8)
            if m8 == 0:
                scales[(grp >> 2) * 16 + r * 4 + (grp & 3)] = sh / np.float32(254 * 16)
    xq[k * 8:] = scales.view(np.uint8)
    return xq


def _cluster_buffers(b: int, n: int, outs: int) -> dict[int, np.ndarray]:
    """`v4_xq_out_cluster`'s leader buffers for a SwiGLU of blocks with `outs` output tiles (16
    outputs each): per cluster (64 / (16 outs) blocks, rank = block % that), the output index each
    of the leader's [row 4][64] slots receives from the epilogue's stores (-1: none), as written at
    `col * 64 + rank * outs * 16 + s * 16 + r`; a slot written twice fails."""
    per = 64 // (outs * 16)
    buffers = {}
    for first in range(0, n // (outs * 16), per):
        buf = np.full((4, 64), -1)
        for rank in range(per):
            for s_ in range(outs):
                for r in range(16):
                    for col in range(b):
                        at = col * 64 + rank * outs * 16 + s_ * 16 + r
                        assert buf.flat[at] == -1
                        buf.flat[at] = (first + rank) * outs * 16 + s_ * 16 + r
        buffers[first * outs * 16] = buf  # keyed by the leader's first output (its out0)
    return buffers


@pytest.mark.parametrize("outs", [1, 2])
@pytest.mark.parametrize("b", [1, 3, 4])
def test_swiglu_cluster_handover_gathers_each_group(b: int, outs: int) -> None:
    """The SwiGLU's handover inside a cluster (NINFER_V4_XQ_CLUSTER=1): the leader's buffer holds, for
    every batch row, exactly the 64 outputs of its group in order, so that its first warp (lane: row
    lane / 8, vector lane % 8, vector index out0 / 8 + lane % 8) quantizes them with `norm_xq8` as the
    count-in handover's last block does from y."""
    n = 256
    buffers = _cluster_buffers(b, n, outs)
    assert sorted(buffers) == list(range(0, n, 64))
    for out0, buf in buffers.items():
        assert (buf[:b] == out0 + np.arange(64)).all()  # vector j of lane (r, j) is outputs out0 + 8 j ..
        assert (buf[b:] == -1).all()


def _word(row_bytes: np.ndarray, at: int) -> int:
    return int(row_bytes[at:at + 4].view("<u4")[0])


def _s8(word: int) -> np.ndarray:
    return np.frombuffer(np.uint32(word).tobytes(), dtype=np.int8).astype(np.int64)


def _q5_even(w: int, h8: int) -> int:
    """`q5_s8_even`: lanes 0, 2, 4, 6 of the word as bytes 8 x code (uint32 arithmetic)."""
    return (((w << 3) & 0x78787878) | ((((h8 & 0x55) * 0x02082080) & 0xFFFFFFFF) & 0x80808080)) & 0xFFFFFFFF


def _q5_odd(w: int, h8: int) -> int:
    """`q5_s8_odd`: lanes 1, 3, 5, 7."""
    return (((w >> 1) & 0x78787878) | ((((h8 & 0xAA) * 0x01041040) & 0xFFFFFFFF) & 0x80808080)) & 0xFFFFFFFF


def test_q5_bytes_are_8_x_code() -> None:
    """Every 8-lane word and high byte: each byte of the two registers is 8 x its lane's 5-bit code."""
    rng = np.random.default_rng(0)
    for w in [0, 0xFFFFFFFF, *rng.integers(0, 2**32, size=200).tolist()]:
        for h8 in range(256):
            codes = [((w >> 4 * j) & 15) | (((h8 >> j) & 1) << 4) for j in range(8)]
            codes = [c - 32 if c >= 16 else c for c in codes]
            assert _s8(_q5_even(w, h8)).tolist() == [8 * c for c in codes[0::2]]
            assert _s8(_q5_odd(w, h8)).tolist() == [8 * c for c in codes[1::2]]


def _gemv_i8(base: np.ndarray, scales: np.ndarray, xq: np.ndarray, b: int, staged: bool,
             high: np.ndarray | None = None) -> np.ndarray:
    """`v4_stage_i8` over every stage of every 16-row tile, K unsplit (fp32 accumulation in
    float64 here: the check is on the integer and index parts), then the lane remap. `high`: the
    q5 high plane (8 bytes per group of 64, bit j = lane j), else q4."""
    n, k = base.shape[0], base.shape[1] * 2
    code = 2.0 if high is not None else 1.0  # q5 bytes are 8 x code, q4 16 x code
    xsc = xq[k * 8:].view(np.float32)
    y = np.zeros((b, n))
    for t in range(n // 16):
        acc = np.zeros((8, 4, 2))  # [g][c][row g / g + 8] for batch c
        for u in range(k // 256):
            unit = xq[u * 2048:(u + 1) * 2048]
            if staged:  # lane's copy: chunk (group lane / 8, c = (lane / 2) % 4, column lane % 2)
                slot = np.concatenate([unit[(ln >> 3) * 512 + (((ln >> 1) & 3) * 8 + (ln & 1)) * 16:][:16]
                                       for ln in range(32)])
            for q in range(4):
                a = np.zeros((16, 32), dtype=np.int64)
                bm = np.zeros((32, 8, 2), dtype=np.int64)  # [L][column][MMA j]
                for g in range(8):
                    for c in range(4):
                        if staged:
                            xv = slot[(q * 8 + c * 2 + (g & 1)) * 16:][:16]
                            if g < 2:
                                assert (xv == unit[q * 512 + (c * 8 + g) * 16:][:16]).all()
                        else:
                            xv = unit[q * 512 + (c * 8 + g) * 16:][:16]
                        for j in range(2):
                            bm[4 * c:4 * c + 4, g, j] = xv[8 * j:8 * j + 4].view(np.int8)
                            bm[16 + 4 * c:20 + 4 * c, g, j] = xv[8 * j + 4:8 * j + 8].view(np.int8)
                d = np.zeros((16, 8), dtype=np.int64)
                for j in range(2):
                    for g in range(8):
                        for c in range(4):
                            for row in (g, g + 8):
                                wb = base[t * 16 + row, u * 128 + q * 32 + c * 8:][:8]
                                w = _word(wb, 4 * j)
                                if high is None:
                                    a[row, 4 * c:4 * c + 4] = _s8((w << 4) & 0xF0F0F0F0)
                                    a[row, 16 + 4 * c:20 + 4 * c] = _s8(w & 0xF0F0F0F0)
                                else:  # the thread's high bytes 2c + j of the group
                                    h8 = int(high[t * 16 + row, (u * 4 + q) * 8 + 2 * c + j])
                                    a[row, 4 * c:4 * c + 4] = _s8(_q5_even(w, h8))
                                    a[row, 16 + 4 * c:20 + 4 * c] = _s8(_q5_odd(w, h8))
                    d += a @ bm[:, :, j]
                assert np.abs(d).max() < 2**31 // 254
                for g in range(8):
                    for c in range(4):
                        sx = code * float(xsc[u * 16 + c * 4 + q]) if c < b else 0.0
                        for half, row in ((0, g), (1, g + 8)):
                            v = float(np.float32(d[row, 2 * c] * 254 + d[row, 2 * c + 1]))
                            acc[g, c, half] += v * float(scales[t * 16 + row, u * 4 + q]) * sx
        for g in range(8):
            for c in range(b):
                y[c, t * 16 + g], y[c, t * 16 + g + 8] = acc[g, c]
    return y


@pytest.mark.parametrize("bits", [4, 5])
@pytest.mark.parametrize(("b", "staged"), [(1, True), (1, False), (3, False), (4, False)])
def test_int8_path_matches_float64(b: int, staged: bool, bits: int) -> None:
    rng = np.random.default_rng(b)
    base = rng.integers(0, 256, size=(ROWS, K // 2), dtype=np.uint8)
    high = rng.integers(0, 256, size=(ROWS, K // 64 * 8), dtype=np.uint8) if bits == 5 else None
    scales = (rng.uniform(0.5, 1.5, size=(ROWS, K // 64)) / 64).astype(np.float16).astype(np.float64)
    # a norm output with one large outlier per row: the per-group scales keep the rest exact enough
    xn = _bf16(rng.standard_normal((b, K)))
    xn[:, 5] *= 40
    codes = np.empty((ROWS, K), dtype=np.int64)
    codes[:, 0::2], codes[:, 1::2] = base & 0xF, base >> 4
    if high is not None:  # bit j of a group's 8 high bytes is lane j's bit 4
        codes += 16 * np.unpackbits(high, axis=1, bitorder="little").astype(np.int64)
        w = np.where(codes >= 16, codes - 32, codes) * np.repeat(scales, 64, axis=1)
    else:
        w = np.where(codes >= 8, codes - 16, codes) * np.repeat(scales, 64, axis=1)
    got = _gemv_i8(base, scales, _norm_xq(xn), b, staged, high)
    ref = xn @ w.T
    # a wrong byte or scale index is an O(1) error; the split's own is ~2^-15 of a group's largest
    # |x| per element (here ~3e-4 of max |y|), below the bf16 rounding of the kernel's output (4e-3)
    assert np.abs(got - ref).max() / np.abs(ref).max() < 1e-3


def test_sources_agree_on_the_layout() -> None:
    """The formulas above are the kernels' (a change there must change this test)."""
    cu = qgemv.DEVICE_SOURCE.read_text()
    cc = qgemv.HOST_SOURCE.read_text()
    assert "(grp * 32u + (m8 >> 1) * 8u + 2u * r) * 16u + (m8 & 1u) * 8u" in cu
    assert "[(grp >> 2) * 16u + r * 4u + (grp & 3u)] = sh / (254.f * 16.f)" in cu
    assert "ld_dep16(xq + q * 512 + (c * 8u + g) * 16u)" in cu
    assert "(xslot + (q * 8u + c * 2u + (g & 1u)) * 16u)" in cu
    assert "(((lane >> 1) & 3u) * 8u + (lane & 1u)) * 16u" in cu
    assert "e.x_scales + (ubeg + i) * 16u" in cu and "ld_dep16(xsc + c * 4u)" in cu
    assert ("a[0][0] = (wa.x << 4) & 0xF0F0F0F0u, a[0][1] = (wb.x << 4) & 0xF0F0F0F0u, a[0][2] = wa.x & 0xF0F0F0F0u,"
            in cu)
    assert "((w << 3) & 0x78787878u) | (((h8 & 0x55u) * 0x02082080u) & 0x80808080u)" in cu
    assert "((w >> 1) & 0x78787878u) | (((h8 & 0xAAu) * 0x01041040u) & 0x80808080u)" in cu
    assert "a[0][0] = q5_s8_even(wa.x, ha[0]), a[0][1] = q5_s8_even(wb.x, hb[0]), a[0][2] = q5_s8_odd(wa.x, ha[0])," in cu
    assert "a[1][0] = q5_s8_even(wa.y, ha[1])" in cu
    assert "constexpr float CODE = BITS == 5 ? 2.f : 1.f;" in cu
    # the SwiGLU's int8 output: lane = batch row r and vector of a group, as the norm's (`_norm_xq`)
    assert "const uint32_t r = lane >> 3, v = (grp0 + gi) * 8u + (lane & 7u);" in cu
    assert "norm_xq8(o, v, r, n_rows, valid, e.xq_out);" in cu
    # ... and within a cluster (`_xq_out_cluster`)
    assert "xq_y = reinterpret_cast<__nv_bfloat16*>(v4_smem + dynamic_smem_bytes() - V4_XQC_BYTES) + cluster_rank() * outs * 16u;" in cu
    assert "cluster_store_leader(xq_y + col * 64u + s * 16u + r, __float2bfloat16_rn(out));" in cu
    assert "const uint32_t r = threadIdx.x >> 3, j = threadIdx.x & 7u;" in cu
    assert "q = *reinterpret_cast<const uint4*>(xq_y + r * 64u + j * 8u);" in cu
    assert "norm_xq8(o, (out0 >> 3) + j, r, n_rows, valid, e.xq_out);" in cu
    assert "v4_xq_out_cluster(e, n_rows, b_rows, (tile0 + blk * outs - cluster_rank() * outs) * 16u);" in cu
    assert ("const uint32_t cluster = NINFER_V4_XQ_CLUSTER && i8 && !xqn && swiglu && xq_out != nullptr && outs16 < 64 ? "
            "64 / outs16 : 1;") in cc
    # the norm in the prologue (XQN) writes its slots as the self-quantizing entry does, from the same bytes
    assert "v4_xq_slot(o4, unit, lane);" in cu and "norm_scale8(ld_dep16(xr + u * 32u + lane), inv, wv, o);" in cu
    assert "v4_stage_i8<BITS, true>(ring + use, nullptr, reinterpret_cast<const float*>(xqn + (ubeg + i) * V4_XQN_UNIT + 512u)," in cu
    assert "t[0] * 254 + t[1]" in cu
    assert re.search(r"int64_t xq_bytes\(int64_t k\) \{ return k \* 8 \+ k / 256 \* 64; \}", cc)
    assert qgemv.xq_bytes(5120) == 5120 * 8 + 5120 // 256 * 64
