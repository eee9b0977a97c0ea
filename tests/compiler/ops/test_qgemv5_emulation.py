"""Decode GEMV v5 (`ops/qgemv5_cuda.cu`): its code construction and data layouts, checked without a GPU.

`q4_pair` / `q5_pair` / `q6_pair` are replayed instruction by instruction in numpy (shifts, the two
LOP3 forms, the IMAD spreads of the high plane, and the bf16x2 FMA with its per-pair scale 2^-p and
offset), exhaustively over every code and high-bit value, against the spec's decode (artifact-v3
4.3). Then one kstep of a warp item goes through the kernel's index maps end to end: `issue_q` /
`issue_bf16` copy the planes into a ring slot, the producer threads permute the activations into
the staged B-fragment layout, every thread reads back its words at the offsets of `q_tile_group` /
`bf16_kstep` / `load_b`, and the emulated `mma.m16n8k16` fragments (PTX layout of A, B and D) must
give `decode(planes) @ x` for the item's rows; every slot byte must be written exactly once and the
fragment loads must be free of shared-memory bank conflicts.
"""

from __future__ import annotations

import numpy as np
import pytest

from ninfer_compiler.ops.row_split import decode_row_split, plane_shapes

M32 = 0xFFFFFFFF
FORMATS = {4: "q4_g64_fp16", 5: "q5_g64_fp16", 6: "q6_g64_fp16"}
HR = {4: 0, 5: 16, 6: 32}  # high bytes per row per kstep


# ---- instructions ----------------------------------------------------------------------------
def u32(v) -> np.ndarray:
    return np.asarray(v, dtype=np.uint64) & np.uint64(M32)


def shr(a, n: int) -> np.ndarray:
    return u32(a) >> np.uint64(n)


def mul(a, b: int) -> np.ndarray:  # IMAD / IMAD.SHL: low 32 bits
    return u32(u32(a) * np.uint64(b))


def and_xor(a, m: int, c: int) -> np.ndarray:  # lop3 0x6A
    return (u32(a) & np.uint64(m)) ^ np.uint64(c)


def and_or(a, m: int, h) -> np.ndarray:  # lop3 0xEA
    return (u32(a) & np.uint64(m)) | u32(h)


def byte_perm(a, b, sel: int) -> np.ndarray:
    pool = (u32(b) << np.uint64(32)) | u32(a)
    out = np.zeros_like(pool)
    for i in range(4):
        pick = np.uint64((sel >> (4 * i)) & 7)
        out |= ((pool >> (np.uint64(8) * pick)) & np.uint64(0xFF)) << np.uint64(8 * i)
    return out


def bf16_value(h) -> np.ndarray:
    return ((np.asarray(h, dtype=np.uint64) & np.uint64(0xFFFF)).astype(np.uint32) << np.uint32(16)).view(np.float32).astype(np.float64)


def halves(v) -> tuple[np.ndarray, np.ndarray]:
    v = np.atleast_1d(u32(v))
    return bf16_value(v), bf16_value(v >> np.uint64(16))


def to_bf16_bits(f: np.ndarray) -> np.ndarray:
    """float64 -> bf16 bits, round to nearest even (through fp32, exact for these values)."""
    b = np.asarray(f, dtype=np.float32).view(np.uint32).astype(np.uint64)
    b = (b + np.uint64(0x7FFF) + ((b >> np.uint64(16)) & np.uint64(1))) >> np.uint64(16)
    return b & np.uint64(0xFFFF)


def hfma2(a, s: int, c: int) -> np.ndarray:
    """fma.rn.bf16x2; also asserts the result is exact (the kernel's construction relies on it)."""
    (alo, ahi), (slo, shi), (clo, chi) = halves(a), halves(s), halves(c)
    lo, hi = alo * slo + clo, ahi * shi + chi
    rlo, rhi = to_bf16_bits(lo), to_bf16_bits(hi)
    assert (bf16_value(rlo) == lo).all() and (bf16_value(rhi) == hi).all(), "inexact bf16x2 FMA"
    return rlo | (rhi << np.uint64(16))


# ---- the kernel's pair construction (qgemv5_cuda.cu) -------------------------------------------
def q4_pair(w, m: int) -> np.ndarray:
    t = w if m == 0 else shr(w, 4 * m)
    return hfma2(and_xor(t, 0x000F000F, 0x43084308), 0x3F803F80, 0xC308C308)


def q5_pair(w, x, x3, m: int) -> np.ndarray:
    if m == 0:
        return hfma2(and_or(w, 0x000F000F, and_xor(x, 0x00100010, 0x43104310)), 0x3F803F80, 0xC310C310)
    if m == 1:
        return hfma2(and_or(shr(w, 3), 0x001E001E, and_xor(x, 0x00200020, 0x43204320)), 0x3F003F00, 0xC2A0C2A0)
    h = and_xor(x if m == 2 else x3, 0x00400040, 0x43404340)
    return hfma2(and_or(shr(w, 6 if m == 2 else 10), 0x003C003C, h), 0x3E803E80, 0xC240C240)


def q6_pair(w, f, m: int) -> np.ndarray:
    if m == 0:
        return hfma2(and_or(w, 0x000F000F, and_xor(mul(f, 16), 0x00300030, 0x43204320)), 0x3F803F80, 0xC320C320)
    if m == 1:
        return hfma2(and_or(shr(w, 3), 0x001E001E, and_xor(mul(f, 8), 0x00600060, 0x43404340)), 0x3F003F00, 0xC2C0C2C0)
    if m == 2:
        return hfma2(and_or(shr(w, 8), 0x000F000F, and_xor(f, 0x00300030, 0x43204320)), 0x3F803F80, 0xC320C320)
    return hfma2(and_or(shr(w, 11), 0x001E001E, and_xor(shr(f, 1), 0x00600060, 0x43404340)), 0x3F003F00, 0xC2C0C2C0)


def word_pairs(bits: int, w, hbytes) -> list[tuple[np.ndarray, np.ndarray]]:
    """The 4 A pairs (m = 0..3) of word w, with the word's high-plane bytes as the kernel loads them
    (q5: one byte; q6: (lo, hi) bytes), as (lane m, lane m + 4) float values."""
    out = []
    if bits == 5:
        x, x3 = mul(hbytes, 0x10010), mul(hbytes, 0x8008)
    if bits == 6:
        f = u32(u32(hbytes[1]) * np.uint64(65536) + u32(hbytes[0]))  # spread16
    for m in range(4):
        v = q4_pair(w, m) if bits == 4 else q5_pair(w, x, x3, m) if bits == 5 else q6_pair(w, f, m)
        out.append(halves(v))
    return out


def spec_codes(bits: int, nibbles: np.ndarray, high: np.ndarray) -> np.ndarray:
    """Signed codes from the 4 low bits and the (bits - 4) high bits (spec 4.3.4 decode)."""
    u = nibbles.astype(np.int64) | (high.astype(np.int64) << 4)
    half = 1 << (bits - 1)
    return np.where(u >= half, u - (1 << bits), u)


@pytest.mark.parametrize("bits", [4, 5, 6])
def test_pairs_decode_every_code(bits):
    """Every (low nibble, high bits) value in every lane of a word, each m: the pair equals the
    spec's signed codes of lanes (m, m + 4)."""
    rng = np.random.default_rng(bits)
    hb = bits - 4
    combos = 16 << hb
    n = 4096
    values = rng.integers(0, combos, size=(n, 8))
    values[:combos] = np.arange(combos)[:, None]  # every value in every lane
    values[combos : 2 * combos] = np.arange(combos)[::-1, None] ^ np.arange(8)[None, :] % combos
    nib, high = values & 15, values >> 4
    w = sum(nib[:, j].astype(np.uint64) << np.uint64(4 * j) for j in range(8))
    if bits == 5:
        hbytes = sum(high[:, j].astype(np.uint64) << np.uint64(j) for j in range(8))
    elif bits == 6:
        hbytes = (sum(high[:, j].astype(np.uint64) << np.uint64(2 * j) for j in range(4)),
                  sum(high[:, 4 + j].astype(np.uint64) << np.uint64(2 * j) for j in range(4)))
    else:
        hbytes = None
    codes = spec_codes(bits, nib, high)
    for m, (lo_v, hi_v) in enumerate(word_pairs(bits, w, hbytes)):
        np.testing.assert_array_equal(lo_v, codes[:, m], err_msg=f"q{bits} m={m} low half")
        np.testing.assert_array_equal(hi_v, codes[:, m + 4], err_msg=f"q{bits} m={m} high half")


def test_high_spreads_have_no_carries():
    """The IMAD spreads of q5 place each lane's bit without carries for every high byte."""
    h = np.arange(256, dtype=np.uint64)
    x, x3 = mul(h, 0x10010), mul(h, 0x8008)
    for j in range(8):
        bit = (h >> np.uint64(j)) & np.uint64(1)
        for spread, shifts in ((x, (4, 16)), (x3, (3, 15))):
            for s in shifts:
                assert ((spread >> np.uint64(j + s)) & np.uint64(1) == bit).all()


# ---- one kstep of an item through the kernel's index maps ---------------------------------------
def base_offset(r: int, p: int) -> int:
    return r * 64 + ((p ^ (((r >> 1) & 1) << 1)) << 4)


def high_offset(bits: int, r: int, q: int) -> int:
    return 2048 + (r * 16 if bits == 5 else r * 32 + ((q ^ ((r >> 2) & 1)) << 4))


def scale_offset(bits: int, r: int) -> int:
    return 2048 + 32 * HR[bits] + r * 4


def bf16_offset(r: int, piece: int) -> int:
    return r * 256 + ((piece ^ (r & 1)) << 4)


def x_piece_offset(n: int, piece: int) -> int:
    return n * 256 + ((piece ^ (n & 1)) << 4)


class Slot:
    """A ring slot (or staged-activation slot) that records which bytes were written."""

    def __init__(self, size: int) -> None:
        self.data = np.full(size, -1, dtype=np.int32)

    def put(self, dst: int, src: np.ndarray) -> None:
        src = np.asarray(src, dtype=np.uint8)
        assert (self.data[dst : dst + src.size] == -1).all(), "a slot byte is written twice"
        self.data[dst : dst + src.size] = src

    def get(self, off: int, n: int) -> np.ndarray:
        out = self.data[off : off + n]
        assert (out >= 0).all(), "read of a slot byte never written"
        return out.astype(np.uint8)

    def word(self, off: int) -> int:
        return int(self.get(off, 4).view("<u4")[0])


def issue_q(bits: int, tiles: list[dict[str, np.ndarray]], ks: int) -> Slot:
    """`issue_q<bits>`: tiles[t] = planes of the tile's 16 rows (full K)."""
    slot = Slot(32 * (68 if bits == 4 else 84 if bits == 5 else 100))
    two = len(tiles) == 2
    for lane in range(32):
        for j in range(4):
            i = j * 32 + lane
            r, pc, t = i >> 2, i & 3, (i >> 2) >> 4
            if t == 1 and not two:
                continue
            slot.put(base_offset(r, pc), tiles[t]["base"][r & 15, ks * 64 + pc * 16 :][:16])
        r, t = lane, lane >> 4
        if bits == 5 and (t == 0 or two):
            slot.put(high_offset(5, r, 0), tiles[t]["high"][r & 15, ks * 16 :][:16])
        if bits == 6:
            for j in range(2):
                i = j * 32 + lane
                rr, q, tt = i >> 1, i & 1, (i >> 1) >> 4
                if tt == 1 and not two:
                    continue
                slot.put(high_offset(6, rr, q), tiles[tt]["high"][rr & 15, ks * 32 + q * 16 :][:16])
        if t == 0 or two:
            slot.put(scale_offset(bits, r), tiles[t]["scales"].view(np.uint8)[r & 15, ks * 4 :][:4])
    return slot


def issue_bf16(w_bits: np.ndarray, ks: int) -> Slot:
    """`issue_bf16`: w_bits = the item's 8 rows as bf16 bits [8, K]."""
    slot = Slot(8 * 256)
    rows = w_bits.view(np.uint8)
    for lane in range(32):
        for j in range(4):
            i = j * 32 + lane
            r, piece = i >> 4, i & 15
            slot.put(bf16_offset(r, piece), rows[r, ks * 256 + piece * 16 :][:16])
    return slot


def stage_x(x_bits: np.ndarray, ks: int) -> Slot:
    """The producer threads (`load_x` / `store_x`) for one kstep: x_bits bf16 bits [batch, K]."""
    slot = Slot(2048)
    batch = x_bits.shape[0]
    for tid in range(16 * batch):
        n, jj, h = tid >> 4, (tid >> 1) & 7, tid & 1
        r = x_bits[n, ks * 128 + jj * 16 + h * 8 :][:8].copy().view("<u4").astype(np.uint64)
        d0, d1 = x_piece_offset(n, 2 * jj) + 4 * h, x_piece_offset(n, 2 * jj + 1) + 4 * h
        for off, a, b, sel in ((d0, 0, 2, 0x5410), (d0 + 8, 0, 2, 0x7632), (d1, 1, 3, 0x5410), (d1 + 8, 1, 3, 0x7632)):
            slot.put(off, np.array([int(byte_perm(r[a], r[b], sel))], dtype="<u4").view(np.uint8))
    return slot


def load_b(xs: Slot, g: int, c: int, q: int, batch: int) -> list[int]:
    if g >= batch:
        return [0] * 8
    lo = xs.get(x_piece_offset(g, 8 * q + 2 * c), 16).view("<u4")
    hi = xs.get(x_piece_offset(g, 8 * q + 2 * c + 1), 16).view("<u4")
    return [int(v) for v in (*lo, *hi)]


def mma(d: np.ndarray, a: dict, b: dict) -> None:
    """mma.m16n8k16 over the warp: a[(g, c)] = 4 regs, b[(g, c)] = 2 regs; d [16 rows, 8 cols] += A @ B."""
    am, bm = np.zeros((16, 16)), np.zeros((16, 8))
    for (g, c), regs in a.items():
        for reg, (row, k0) in zip(regs, ((g, 2 * c), (g + 8, 2 * c), (g, 2 * c + 8), (g + 8, 2 * c + 8)), strict=True):
            am[row, k0], am[row, k0 + 1] = (float(v[0]) for v in halves(reg))
    for (g, c), regs in b.items():
        for reg, k0 in zip(regs, (2 * c, 2 * c + 8), strict=True):
            bm[k0, g], bm[k0 + 1, g] = (float(v[0]) for v in halves(reg))
    d += am @ bm


def emulate_q_item(bits: int, slot: Slot, xs: Slot, batch: int, two: bool) -> np.ndarray:
    """`q_kstep<bits>`: the item's [32 rows, 8 columns] sums for one kstep."""
    out = np.zeros((32, 8))
    for t in range(2 if two else 1):
        for q in range(2):
            a_regs: dict = {}
            b_regs: dict = {}
            scales: dict = {}
            for g in range(8):
                for c in range(4):
                    ra, rb = 16 * t + g, 16 * t + g + 8
                    boff = (((2 * q + (c >> 1)) ^ (((g >> 1) & 1) << 1)) << 4) + (c & 1) * 8
                    wa = slot.get(ra * 64 + boff, 8).view("<u4").astype(np.uint64)
                    wb = slot.get(rb * 64 + boff, 8).view("<u4").astype(np.uint64)
                    words = [wa[0], wb[0], wa[1], wb[1]]
                    if bits == 5:
                        ha = slot.get(high_offset(5, ra, 0) + 8 * q + 2 * c, 2)
                        hbp = slot.get(high_offset(5, rb, 0) + 8 * q + 2 * c, 2)
                        hb = [np.uint64(ha[0]), np.uint64(hbp[0]), np.uint64(ha[1]), np.uint64(hbp[1])]
                    elif bits == 6:
                        ha = slot.get(high_offset(6, ra, q) + 4 * c, 4)
                        hbp = slot.get(high_offset(6, rb, q) + 4 * c, 4)
                        hb = [(ha[0], ha[1]), (hbp[0], hbp[1]), (ha[2], ha[3]), (hbp[2], hbp[3])]
                    else:
                        hb = [None] * 4
                    pairs = [word_pairs(bits, np.array([wd], dtype=np.uint64), h) for wd, h in zip(words, hb, strict=True)]
                    for m in range(4):
                        regs = []
                        for i in range(4):  # a0..a3 = pairs of wa.x, wb.x, wa.y, wb.y
                            lo_v, hi_v = pairs[i][m]
                            regs.append(int(to_bf16_bits(lo_v)[0]) | (int(to_bf16_bits(hi_v)[0]) << 16))
                        a_regs.setdefault(m, {})[(g, c)] = regs
                    b = load_b(xs, g, c, q, batch)
                    for m in range(4):
                        b_regs.setdefault(m, {})[(g, c)] = [b[2 * m], b[2 * m + 1]]
                    sa = slot.get(scale_offset(bits, ra), 4).view(np.float16)
                    sb = slot.get(scale_offset(bits, rb), 4).view(np.float16)
                    scales[(g, c)] = (float(sa[q]), float(sb[q]))
            d = np.zeros((16, 8))
            for m in range(4):
                mma(d, a_regs[m], b_regs[m])
            for (g, c), (s_a, s_b) in scales.items():
                for i in range(4):
                    row, col = g + 8 * (i >> 1), 2 * c + (i & 1)
                    out[16 * t + row, col] += d[row, col] * (s_a if i < 2 else s_b)
    return out


def emulate_bf16_item(slot: Slot, xs: Slot, batch: int) -> np.ndarray:
    """`bf16_kstep`: the item's [8 rows, 8 columns] sums for one kstep."""
    d = np.zeros((16, 8))
    for q in range(2):
        a_regs: dict = {}
        b_regs: dict = {}
        for g in range(8):
            for c in range(4):
                lo = slot.get(bf16_offset(g, 8 * q + 2 * c), 16).view("<u4").astype(np.uint64)
                hi = slot.get(bf16_offset(g, 8 * q + 2 * c + 1), 16).view("<u4").astype(np.uint64)
                v = [*lo, *hi]
                b = load_b(xs, g, c, q, batch)
                for m in range(4):
                    sel = 0x7632 if m & 1 else 0x5410
                    a0 = int(byte_perm(v[m >> 1], v[(m >> 1) + 2], sel))
                    a2 = int(byte_perm(v[4 + (m >> 1)], v[6 + (m >> 1)], sel))
                    a_regs.setdefault(m, {})[(g, c)] = [a0, 0, a2, 0]
                    b_regs.setdefault(m, {})[(g, c)] = [b[2 * m], b[2 * m + 1]]
        for m in range(4):
            mma(d, a_regs[m], b_regs[m])
    assert (d[8:] == 0).all()
    return d[:8]


def _planes(bits: int, rows: int, k: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    out = {}
    for p, (shape, dtype) in plane_shapes(FORMATS[bits], rows, k).items():
        if dtype == "uint8":
            out[p] = rng.integers(0, 256, size=shape, dtype=np.uint8)
        else:
            out[p] = (rng.uniform(0.5, 1.5, size=shape) * rng.choice([-1, 1], size=shape) / 64).astype(np.float16)
    return out


def _x_bits(batch: int, k: int, rng: np.random.Generator) -> np.ndarray:
    return (rng.standard_normal((batch, k)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


def _x_exact(x_bits: np.ndarray) -> np.ndarray:
    return (x_bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


@pytest.mark.parametrize("bits", [4, 5, 6])
@pytest.mark.parametrize(("batch", "two"), [(1, True), (3, False), (8, True)])
def test_q_item_kstep_matches_reference(bits, batch, two):
    rng = np.random.default_rng(100 * bits + 10 * batch + two)
    k, ks = 256, 1
    rows = 32 if two else 16
    planes = _planes(bits, rows, k, rng)
    tiles = [{p: a[16 * t : 16 * t + 16] for p, a in planes.items()} for t in range(rows // 16)]
    x_bits = _x_bits(batch, k, rng)
    got = emulate_q_item(bits, issue_q(bits, tiles, ks), stage_x(x_bits, ks), batch, two)
    lanes = slice(ks * 128, ks * 128 + 128)
    ref = decode_row_split(planes, FORMATS[bits], k).astype(np.float64)[:, lanes] @ _x_exact(x_bits)[:, lanes].T
    np.testing.assert_allclose(got[:rows, :batch], ref, rtol=0, atol=1e-12 * np.abs(ref).max())
    assert (got[:, batch:] == 0).all()  # columns past the batch come from zero B fragments


@pytest.mark.parametrize("batch", [1, 5, 8])
def test_bf16_item_kstep_matches_reference(batch):
    rng = np.random.default_rng(batch)
    k, ks = 256, 1
    w_bits = _x_bits(8, k, rng)
    x_bits = _x_bits(batch, k, rng)
    got = emulate_bf16_item(issue_bf16(w_bits, ks), stage_x(x_bits, ks), batch)
    lanes = slice(ks * 128, ks * 128 + 128)
    ref = _x_exact(w_bits)[:, lanes] @ _x_exact(x_bits)[:, lanes].T
    np.testing.assert_allclose(got[:, :batch], ref, rtol=0, atol=1e-12 * np.abs(ref).max())


def test_slots_are_fully_written():
    """Every byte of a full item's slot and of a full batch's activation slot is written once."""
    rng = np.random.default_rng(0)
    for bits in (4, 5, 6):
        planes = _planes(bits, 32, 256, rng)
        tiles = [{p: a[16 * t : 16 * t + 16] for p, a in planes.items()} for t in range(2)]
        assert (issue_q(bits, tiles, 0).data >= 0).all(), bits
    assert (issue_bf16(_x_bits(8, 256, rng), 1).data >= 0).all()
    assert (stage_x(_x_bits(8, 256, rng), 1).data >= 0).all()


def _conflict_free(addresses: list[tuple[int, int]]) -> bool:
    """One phase of a shared-memory access: each 4-byte bank serves one word address (or broadcasts)."""
    words: dict[int, set[int]] = {}
    for off, size in addresses:
        for w in range(off // 4, (off + size - 1) // 4 + 1):
            words.setdefault(w % 32, set()).add(w)
    return all(len(v) == 1 for v in words.values())


def _phases(size: int) -> list[range]:
    """Threads served together: 8-byte accesses per half-warp, 16-byte per quarter-warp."""
    per = {1: 32, 2: 32, 4: 32, 8: 16, 16: 8}[size]
    return [range(i, i + per) for i in range(0, 32, per)]


@pytest.mark.parametrize("bits", [4, 5, 6])
def test_fragment_loads_have_no_bank_conflicts(bits):
    for t in range(2):
        for q in range(2):
            loads = {
                "wa": lambda g, c, t=t, q=q: ((16 * t + g) * 64 + ((((2 * q + (c >> 1)) ^ (((g >> 1) & 1) << 1)) << 4) + (c & 1) * 8), 8),
                "wb": lambda g, c, t=t, q=q: ((16 * t + g + 8) * 64 + ((((2 * q + (c >> 1)) ^ (((g >> 1) & 1) << 1)) << 4) + (c & 1) * 8), 8),
                "sa": lambda g, c, t=t: (scale_offset(bits, 16 * t + g), 4),
                "xlo": lambda g, c, q=q: (x_piece_offset(g, 8 * q + 2 * c), 16),
                "xhi": lambda g, c, q=q: (x_piece_offset(g, 8 * q + 2 * c + 1), 16),
            }
            for e in range(2 if bits == 5 else 4 if bits == 6 else 0):
                if bits == 5:
                    loads[f"h{e}"] = lambda g, c, t=t, q=q, e=e: (high_offset(5, 16 * t + g, 0) + 8 * q + 2 * c + e, 1)
                else:
                    loads[f"h{e}"] = lambda g, c, t=t, q=q, e=e: (high_offset(6, 16 * t + g, q) + 4 * c + e, 1)
            for name, fn in loads.items():
                size = fn(0, 0)[1]
                for phase in _phases(size):
                    assert _conflict_free([fn(lane >> 2, lane & 3) for lane in phase]), (bits, t, q, name)


def test_bf16_and_producer_accesses_have_no_bank_conflicts():
    for q in range(2):
        for e in range(2):
            for phase in _phases(16):
                assert _conflict_free([(bf16_offset(lane >> 2, 8 * q + 2 * (lane & 3) + e), 16) for lane in phase])
    # producer stores (4 bytes each, one warp = columns 2w, 2w + 1): at most 2-way (jj and jj + 4 share banks)
    for warp in range(4):
        for d in range(4):
            words: dict[int, set[int]] = {}
            for lane in range(32):
                tid = 32 * warp + lane
                n, jj, h = tid >> 4, (tid >> 1) & 7, tid & 1
                off = x_piece_offset(n, 2 * jj + (d >> 1)) + 8 * (d & 1) + 4 * h
                words.setdefault((off // 4) % 32, set()).add(off // 4)
            assert max(len(v) for v in words.values()) <= 2
