"""Byte-exact codec tests against the computed examples of artifact spec sections 3 and 4."""

from __future__ import annotations

import struct

import ml_dtypes
import numpy as np
import pytest

from ninfer_runtime.artifact import formats
from ninfer_runtime.artifact.codecs import (
    Fp8RowPlanes,
    GroupedPlanes,
    NvFp4Planes,
    decode_direct_words,
    decode_tensor,
    dequantize,
    encode_direct,
    encode_tensor,
    memory_reader,
    pack_planes,
    unpack_planes,
)
from ninfer_runtime.artifact.errors import ArtifactError

CONTIG = "contiguous_le_v1"
ROW_SPLIT = "row_split_k128_v1"
BLOCK = "block_scale_k16_m128x4_v1"
ROW_SCALE = "row_scale_v1"
GROUPED = ["q4_g64_fp16", "q5_g64_fp16", "q6_g64_fp16", "q8_g32_fp16"]
FP8 = "fp8_e4m3fn_row_bf16"


class CountingReader:
    """ReadFn over bytes that records every (offset, length) request."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.calls: list[tuple[int, int]] = []

    def __call__(self, offset: int, length: int) -> bytes:
        self.calls.append((offset, length))
        return self.data[offset : offset + length]

    @property
    def total(self) -> int:
        return sum(n for _, n in self.calls)


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def random_grouped(fmt: str, shape: tuple[int, int], seed: int = 0) -> GroupedPlanes:
    """Valid random planes: legal codes, finite positive scales, some +0 groups, zero padding."""
    info = formats.FORMATS[fmt]
    geo = formats.geometry(ROW_SPLIT, fmt, shape)
    g = rng(seed)
    n, k = shape
    codes = g.integers(info.qmin, info.qmax + 1, size=shape).astype(np.int8)
    scales = g.integers(1, 0x7C00, size=(n, geo.groups_per_row)).astype(np.uint16)
    zero = g.random((n, geo.groups_per_row)) < 0.1
    scales[zero] = 0
    zero_lanes = np.repeat(zero, info.group, axis=1)[:, :k]
    codes[zero_lanes] = 0
    scales[:, -(-k // info.group) :] = 0
    return GroupedPlanes(fmt, codes, scales)


def random_nvfp4(shape: tuple[int, int], seed: int = 0) -> NvFp4Planes:
    g = rng(seed)
    n, k = shape
    codes = g.integers(0, 16, size=shape).astype(np.uint8)
    scales = g.integers(0, 0x7F, size=(n, k // 16)).astype(np.uint8)
    divisor = np.array(np.float32(g.uniform(0.1, 1000)), dtype=np.float32).view(np.uint32)
    return NvFp4Planes(codes, scales, divisor)


def random_fp8(shape: tuple[int, int], seed: int = 0) -> Fp8RowPlanes:
    g = rng(seed)
    n, _ = shape
    codes = g.integers(0, 256, size=shape).astype(np.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0x7E
    scales = g.integers(0, 0x7F80, size=n).astype(np.uint16)
    zero_rows = g.random(n) < 0.2
    scales[zero_rows] = 0
    codes[zero_rows] = g.choice(np.array([0x00, 0x80], dtype=np.uint8), size=codes[zero_rows].shape)
    return Fp8RowPlanes(codes, scales)


def assert_planes_equal(a, b) -> None:
    assert type(a) is type(b)
    for name in ("fmt", "codes", "scales", "divisor"):
        if hasattr(a, name):
            assert np.array_equal(getattr(a, name), getattr(b, name)), name
            if isinstance(getattr(a, name), np.ndarray):
                assert getattr(a, name).dtype == getattr(b, name).dtype, name


# ------------------------------------------------------------------------------------------
# Encoded sizes (4.2, 4.3.8, 4.4, 4.5)
# ------------------------------------------------------------------------------------------

CONTIG_SIZES = [
    ("bf16", [], 2),
    ("bf16", [128], 256),
    ("bf16", [248320, 128], 63_569_920),
    ("fp32", [], 4),
    ("int32", [131072], 524_288),
]


@pytest.mark.parametrize("fmt,shape,size", CONTIG_SIZES)
def test_contiguous_sizes(fmt, shape, size):
    assert formats.encoded_size(CONTIG, fmt, shape) == size
    if formats.elements(shape) <= 1 << 17:
        dtype = {"bf16": np.uint16, "fp32": np.float32, "int32": np.int32}[fmt]
        assert len(encode_tensor(fmt, CONTIG, shape, np.zeros(shape, dtype=dtype))) == size


# fmt, shape, K_pad, groups/row, base, high, high_off, scale_off, scale, encoded_size
ROW_SPLIT_TABLE = [
    ("q4", [7168, 5120], 5120, 80, 18_350_080, 0, 18_350_080, 18_350_080, 1_146_880, 19_496_960),
    ("q4", [256, 128], 128, 2, 16_384, 0, 16_384, 16_384, 1_024, 17_408),
    ("q4", [3, 100], 128, 2, 192, 0, 256, 256, 12, 268),
    ("q4", [1, 1], 128, 2, 64, 0, 256, 256, 4, 260),
    (
        "q5",
        [7168, 5120],
        5120,
        80,
        18_350_080,
        4_587_520,
        18_350_080,
        22_937_600,
        1_146_880,
        24_084_480,
    ),
    ("q5", [256, 128], 128, 2, 16_384, 4_096, 16_384, 20_480, 1_024, 21_504),
    ("q5", [2, 130], 256, 4, 256, 64, 256, 512, 16, 528),
    ("q5", [5, 200], 256, 4, 640, 160, 768, 1_024, 40, 1_064),
    ("q6", [1, 64], 128, 2, 64, 32, 256, 512, 4, 516),
    ("q6", [3, 300], 384, 6, 576, 288, 768, 1_280, 36, 1_316),
    (
        "q6",
        [248320, 5120],
        5120,
        80,
        635_699_200,
        317_849_600,
        635_699_200,
        953_548_800,
        39_731_200,
        993_280_000,
    ),
    ("q8", [1, 1], 128, 4, 128, 0, 256, 256, 8, 264),
    ("q8", [3, 100], 128, 4, 384, 0, 512, 512, 24, 536),
    ("q8", [7, 129], 256, 8, 1_792, 0, 1_792, 1_792, 112, 1_904),
    ("q8", [6144, 5120], 5120, 160, 31_457_280, 0, 31_457_280, 31_457_280, 1_966_080, 33_423_360),
]
SHORT = {"q4": "q4_g64_fp16", "q5": "q5_g64_fp16", "q6": "q6_g64_fp16", "q8": "q8_g32_fp16"}


@pytest.mark.parametrize("row", ROW_SPLIT_TABLE, ids=lambda r: f"{r[0]}{r[1]}")
def test_row_split_size_table(row):
    short, shape, k_pad, gpr, base, high, high_off, scale_off, scale, size = row
    fmt = SHORT[short]
    geo = formats.geometry(ROW_SPLIT, fmt, shape)
    got = (geo.k_pad, geo.groups_per_row, geo.base_bytes, geo.high_bytes)
    assert got == (k_pad, gpr, base, high)
    assert (geo.high_offset, geo.scale_offset, geo.scale_bytes) == (high_off, scale_off, scale)
    assert formats.encoded_size(ROW_SPLIT, fmt, shape) == size
    if shape[0] * shape[1] <= 1 << 16:
        assert len(pack_planes(ROW_SPLIT, fmt, shape, random_grouped(fmt, tuple(shape)))) == size


# shape, code, scale_off, scale, divisor_off, encoded_size
NVFP4_TABLE = [
    ([128, 64], 4_096, 4_096, 512, 4_608, 4_612),
    ([256, 128], 16_384, 16_384, 2_048, 18_432, 18_436),
    ([384, 192], 36_864, 36_864, 4_608, 41_472, 41_476),
    ([128, 320], 20_480, 20_480, 2_560, 23_040, 23_044),
    ([14336, 5120], 36_700_160, 36_700_160, 4_587_520, 41_287_680, 41_287_684),
]


@pytest.mark.parametrize("row", NVFP4_TABLE, ids=lambda r: str(r[0]))
def test_nvfp4_size_table(row):
    shape, code, scale_off, scale, div_off, size = row
    geo = formats.geometry(BLOCK, "nvfp4", shape)
    assert (geo.code_bytes, geo.scale_offset, geo.scale_bytes) == (code, scale_off, scale)
    assert (geo.divisor_offset, geo.encoded_size) == (div_off, size)
    assert formats.encoded_size(BLOCK, "nvfp4", shape) == size
    if shape[0] * shape[1] <= 1 << 17:
        assert len(pack_planes(BLOCK, "nvfp4", shape, random_nvfp4(tuple(shape)))) == size


FP8_TABLE = [
    ([1, 1], 1, 256, 258),
    ([3, 100], 300, 512, 518),
    ([7, 37], 259, 512, 526),
    ([14336, 5120], 73_400_320, 73_400_320, 73_428_992),
    ([248320, 5120], 1_271_398_400, 1_271_398_400, 1_271_895_040),
]


@pytest.mark.parametrize("row", FP8_TABLE, ids=lambda r: str(r[0]))
def test_fp8_size_table(row):
    shape, code, scale_off, size = row
    geo = formats.geometry(ROW_SCALE, FP8, shape)
    assert (geo.code_bytes, geo.scale_offset, geo.encoded_size) == (code, scale_off, size)
    assert formats.encoded_size(ROW_SCALE, FP8, shape) == size
    if shape[0] * shape[1] <= 1 << 16:
        assert len(pack_planes(ROW_SCALE, FP8, shape, random_fp8(tuple(shape)))) == size


# ------------------------------------------------------------------------------------------
# Byte-level examples (4.3.6, 4.4)
# ------------------------------------------------------------------------------------------


def test_row_split_byte_example_436():
    planes = GroupedPlanes(
        "q4_g64_fp16", np.array([[-3]], np.int8), np.array([[0x3C00, 0]], np.uint16)
    )
    data = pack_planes(ROW_SPLIT, "q4_g64_fp16", [1, 1], planes)
    assert len(data) == 260
    assert data[0] == 0x0D
    assert data[1:256] == bytes(255)
    assert data[256:260] == bytes([0x00, 0x3C, 0x00, 0x00])
    back = unpack_planes(ROW_SPLIT, "q4_g64_fp16", [1, 1], memory_reader(data))
    assert_planes_equal(back, planes)
    assert dequantize(back).tolist() == [[-3.0]]


def _lanes(fmt: str, lanes: list[int]) -> tuple[bytes, formats.RowSplitGeometry]:
    k = len(lanes)
    geo = formats.geometry(ROW_SPLIT, fmt, [1, k])
    scales = np.zeros((1, geo.groups_per_row), np.uint16)
    scales[0, 0] = 0x3C00
    planes = GroupedPlanes(fmt, np.array([lanes], np.int8), scales)
    data = pack_planes(ROW_SPLIT, fmt, [1, k], planes)
    back = unpack_planes(ROW_SPLIT, fmt, [1, k], memory_reader(data))
    assert back.codes.tolist() == [lanes]
    return data, geo


def test_q4_packing_example():
    data, _ = _lanes("q4_g64_fp16", [-8, 7, -3, 1])
    assert data[:2] == bytes([0x78, 0x1D])


def test_q5_packing_example():
    data, geo = _lanes("q5_g64_fp16", [-16, 15, -1, 0, 1, 2, 3, 4])
    assert data[:4] == bytes([0xF0, 0x0F, 0x21, 0x43])
    assert data[geo.high_offset] == 0x05


def test_q6_packing_example():
    data, geo = _lanes("q6_g64_fp16", [-32, 31, -1, 5])
    assert data[:2] == bytes([0xF0, 0x5F])
    assert data[geo.high_offset] == 0x36


def test_q5_q6_high_bits_every_lane():
    """Spec 4.3.4 per lane: q5 byte j bit t = lane 8j+t; q6 lane i at byte i>>2, shift 2(i&3)."""
    for fmt, per_byte in (("q5_g64_fp16", 8), ("q6_g64_fp16", 4)):
        bits = 5 if fmt.startswith("q5") else 6
        for lane in range(64):
            for hi in range(1, 1 << (bits - 4)):
                u = hi << 4
                codes = [0] * 64
                codes[lane] = u - (1 << bits) if u >= 1 << (bits - 1) else u
                data, geo = _lanes(fmt, codes)
                high = data[geo.high_offset : geo.high_offset + geo.high_row_bytes]
                expected = bytearray(len(high))
                expected[lane // per_byte] = hi << ((bits - 4) * (lane % per_byte))
                assert high == bytes(expected), (fmt, lane, hi)
                assert data[lane // 2] == 0  # the low nibble of hi<<4 is zero


def test_q8_lanes_are_bytes():
    lanes = [-127, 127, -1, 0, 5]
    data, _ = _lanes("q8_g32_fp16", lanes)
    assert data[:5] == bytes([0x81, 0x7F, 0xFF, 0x00, 0x05])


SWIZZLE = [
    (0, 0, 64, 0),
    (1, 0, 64, 16),
    (32, 0, 64, 4),
    (0, 3, 64, 3),
    (127, 3, 64, 511),
    (0, 4, 128, 512),
    (130, 5, 128, 1569),
    (255, 7, 128, 2047),
]


@pytest.mark.parametrize("n,g,k,offset", SWIZZLE)
def test_nvfp4_swizzle_offsets(n, g, k, offset):
    shape = (256, k)
    scales = np.zeros((256, k // 16), np.uint8)
    scales[n, g] = 0x55
    planes = NvFp4Planes(np.zeros(shape, np.uint8), scales, np.array(0x3F800000, np.uint32))
    data = pack_planes(BLOCK, "nvfp4", shape, planes)
    geo = formats.geometry(BLOCK, "nvfp4", shape)
    plane = np.frombuffer(data[geo.scale_offset : geo.divisor_offset], np.uint8)
    assert np.flatnonzero(plane).tolist() == [offset]


def test_nvfp4_swizzle_formula_everywhere():
    shape = (384, 192)
    planes = random_nvfp4(shape, seed=3)
    data = pack_planes(BLOCK, "nvfp4", shape, planes)
    geo = formats.geometry(BLOCK, "nvfp4", shape)
    plane = data[geo.scale_offset : geo.divisor_offset]
    k_tiles = shape[1] // 64
    for n in range(shape[0]):
        for g in range(shape[1] // 16):
            m = n % 128
            off = (n // 128 * k_tiles + g // 4) * 512 + (m % 32) * 16 + (m // 32) * 4 + g % 4
            assert plane[off] == planes.scales[n, g]


def test_nvfp4_code_nibbles_and_divisor():
    shape = (128, 64)
    codes = np.zeros(shape, np.uint8)
    codes[0, :4] = [0x1, 0xF, 0x8, 0x7]
    codes[1, 0] = 0x3
    planes = NvFp4Planes(codes, np.zeros((128, 4), np.uint8), np.array(0x40400000, np.uint32))
    data = pack_planes(BLOCK, "nvfp4", shape, planes)
    assert data[:2] == bytes([0xF1, 0x78])
    assert data[32] == 0x03
    assert data[-4:] == struct.pack("<f", 3.0)


# ------------------------------------------------------------------------------------------
# Direct formats
# ------------------------------------------------------------------------------------------

BF16_SPECIALS = [0x0000, 0x8000, 0x0001, 0x807F, 0x7F80, 0xFF80, 0x7FC0, 0x7F81, 0xFFFF, 0x3F80]


def test_bf16_all_words_bit_exact():
    words = np.arange(1 << 16, dtype=np.uint16)
    for shape in [(1 << 16,), (256, 256), (4, 16, 1024)]:
        data = encode_tensor("bf16", CONTIG, shape, words.reshape(shape))
        assert data == words.astype("<u2").tobytes()
        read = memory_reader(data)
        assert np.array_equal(decode_direct_words("bf16", shape, read), words.reshape(shape))
        as_bf16 = decode_tensor("bf16", CONTIG, shape, read, dtype="bfloat16")
        assert as_bf16.dtype == ml_dtypes.bfloat16
        assert np.array_equal(as_bf16.view(np.uint16), words.reshape(shape))
        f32 = decode_tensor("bf16", CONTIG, shape, read)
        assert f32.dtype == np.float32
        assert np.array_equal(f32.view(np.uint32), words.reshape(shape).astype(np.uint32) << 16)


def test_bf16_from_ml_dtypes_and_specials():
    words = np.array(BF16_SPECIALS, np.uint16)
    data = encode_direct("bf16", words.view(ml_dtypes.bfloat16))
    assert data == encode_direct("bf16", words) == words.astype("<u2").tobytes()
    vals = decode_tensor("bf16", CONTIG, [len(words)], memory_reader(data))
    assert vals[0] == 0 and not np.signbit(vals[0]) and np.signbit(vals[1])
    assert vals[2] == 2.0**-133 and vals[3] == -(127 * 2.0**-133)
    assert vals[4] == np.inf and vals[5] == -np.inf and np.isnan(vals[6:9]).all()


@pytest.mark.parametrize(
    "f32_word,bf16_word",
    [
        (0x3F800000, 0x3F80),  # 1.0
        (0x3F808000, 0x3F80),  # 1 + 2^-8: tie, even stays
        (0x3F818000, 0x3F82),  # 1 + 3*2^-8: tie, rounds up to even
        (0x3F808001, 0x3F81),  # just above the tie
        (0x7F7FFFFF, 0x7F80),  # largest finite rounds to +inf
        (0x00008000, 0x0000),  # subnormal tie to even zero
        (0x80018000, 0x8002),
        (0x7F800000, 0x7F80),
        (0xFF800000, 0xFF80),
        (0x7F800001, 0x7FC0),  # NaN whose payload is only in the low half stays NaN
        (0xFFC12345, 0xFFC1),
        (0x80000000, 0x8000),
    ],
)
def test_bf16_from_float32_rne(f32_word, bf16_word):
    x = np.array([f32_word], np.uint32).view(np.float32)
    assert encode_direct("bf16", x) == struct.pack("<H", bf16_word)


def test_bf16_from_float32_matches_ml_dtypes():
    x = (rng(1).standard_normal(50_000) * 10.0 ** rng(2).integers(-40, 38, 50_000)).astype(
        np.float32
    )
    ours = np.frombuffer(encode_direct("bf16", x), "<u2")
    assert np.array_equal(ours, x.astype(ml_dtypes.bfloat16).view(np.uint16))


@pytest.mark.parametrize("shape", [(), (1,), (1, 1), (3, 4, 5), (2, 1, 1, 3)])
def test_fp32_int32_round_trip(shape):
    g = rng(4)
    words = g.integers(0, 1 << 32, size=shape, dtype=np.uint64).astype(np.uint32)
    words.reshape(-1)[:1] = 0x7F800001  # signalling NaN payload
    data = encode_tensor("fp32", CONTIG, shape, words.view(np.float32))
    assert data == encode_direct("fp32", words) == words.astype("<u4").tobytes()
    got = decode_tensor("fp32", CONTIG, shape, memory_reader(data))
    assert got.dtype == np.float32 and got.shape == shape
    assert np.array_equal(got.view(np.uint32), words)
    ints = words.view(np.int32)
    data = encode_tensor("int32", CONTIG, shape, ints)
    got = decode_tensor("int32", CONTIG, shape, memory_reader(data))
    assert got.dtype == np.int32 and np.array_equal(got, ints)


def test_int32_extremes_little_endian():
    data = encode_direct("int32", np.array([-(2**31), 2**31 - 1, -1, 1], np.int32))
    assert data == bytes.fromhex("00000080ffffff7fffffffff01000000")


def test_contiguous_rows_read_only_their_span():
    shape = (10, 3, 7)
    x = rng(5).standard_normal(shape).astype(np.float32)
    data = encode_tensor("fp32", CONTIG, shape, x)
    read = CountingReader(data)
    got = decode_tensor("fp32", CONTIG, shape, read, rows=(4, 6))
    assert np.array_equal(got, x[4:6])
    assert read.calls == [(4 * 21 * 4, 2 * 21 * 4)]
    words = decode_direct_words("fp32", shape, memory_reader(data), rows=(9, 10))
    assert words.shape == (1, 3, 7) and np.array_equal(words.view(np.float32), x[9:])


def test_contiguous_rank0_and_errors():
    data = encode_tensor("bf16", CONTIG, [], np.array(0x3F80, np.uint16))
    assert decode_tensor("bf16", CONTIG, [], memory_reader(data)).tolist() == 1.0
    with pytest.raises(ArtifactError) as e:
        decode_tensor("bf16", CONTIG, [], memory_reader(data), rows=(0, 1))
    assert e.value.rule == "row_range"
    with pytest.raises(ArtifactError) as e:
        encode_tensor("fp32", CONTIG, [2], np.zeros(3, np.float32))
    assert e.value.rule == "data_shape"
    with pytest.raises(ArtifactError) as e:
        encode_direct("fp32", np.zeros(3, np.float64))
    assert e.value.rule == "data_dtype"


# ------------------------------------------------------------------------------------------
# Quantized planes round trips and row slices
# ------------------------------------------------------------------------------------------

GROUPED_SHAPES = [
    (1, 1),
    (1, 64),
    (3, 100),
    (2, 130),
    (4, 128),
    (5, 200),
    (7, 129),
    (2, 300),
    (1, 5),
]


@pytest.mark.parametrize("fmt", GROUPED)
@pytest.mark.parametrize("shape", GROUPED_SHAPES)
def test_grouped_planes_round_trip(fmt, shape):
    planes = random_grouped(fmt, shape, seed=sum(shape))
    data = pack_planes(ROW_SPLIT, fmt, shape, planes)
    assert len(data) == formats.encoded_size(ROW_SPLIT, fmt, shape)
    back = unpack_planes(ROW_SPLIT, fmt, shape, memory_reader(data), obj="w")
    assert_planes_equal(back, planes)
    assert pack_planes(ROW_SPLIT, fmt, shape, back) == data
    assert encode_tensor(fmt, ROW_SPLIT, shape, back) == data
    expected = (
        planes.codes.astype(np.float32)
        * np.repeat(
            planes.scales.view(np.float16).astype(np.float32), formats.FORMATS[fmt].group, axis=1
        )[:, : shape[1]]
    )
    assert np.array_equal(dequantize(back), expected)
    assert np.array_equal(decode_tensor(fmt, ROW_SPLIT, shape, memory_reader(data)), expected)


@pytest.mark.parametrize("shape", [(128, 64), (256, 128), (128, 320), (384, 192)])
def test_nvfp4_planes_round_trip(shape):
    planes = random_nvfp4(shape, seed=shape[1])
    data = pack_planes(BLOCK, "nvfp4", shape, planes)
    back = unpack_planes(BLOCK, "nvfp4", shape, memory_reader(data))
    assert_planes_equal(back, planes)
    assert back.divisor.shape == ()
    assert pack_planes(BLOCK, "nvfp4", shape, back) == data
    e2m1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6] * 2, np.float32)
    e2m1 *= np.repeat(np.float32([1, -1]), 8)
    scale = planes.scales.astype(np.float32)
    for w in range(256):  # independent E4M3FN decode
        e, m = (w >> 3) & 15, w & 7
        value = m * 2.0**-9 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
        scale[planes.scales == w] = value
    divisor = planes.divisor.view(np.float32)
    expected = (e2m1[planes.codes] * np.repeat(scale, 16, axis=1)) / divisor
    assert np.array_equal(dequantize(back), expected)


@pytest.mark.parametrize("shape", [(1, 1), (3, 100), (7, 37), (1, 300), (40, 1)])
def test_fp8_planes_round_trip(shape):
    planes = random_fp8(shape, seed=shape[0])
    data = pack_planes(ROW_SCALE, FP8, shape, planes)
    back = unpack_planes(ROW_SCALE, FP8, shape, memory_reader(data))
    assert_planes_equal(back, planes)
    assert pack_planes(ROW_SCALE, FP8, shape, back) == data
    e4m3 = planes.codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    scale = planes.scales.view(ml_dtypes.bfloat16).astype(np.float32)
    with np.errstate(over="ignore"):  # 448 x a huge bf16 scale is +-inf in binary32
        expected = e4m3 * scale[:, None]
    assert np.array_equal(dequantize(back), expected)


def test_e4m3_decode_hand_values():
    planes = Fp8RowPlanes(
        np.array([[0x00, 0x80, 0x01, 0x07, 0x08, 0x38, 0x7E, 0xFE, 0x3C]], np.uint8),
        np.array([0x3F80], np.uint16),
    )
    got = dequantize(planes)[0]
    assert got.tolist() == [0, 0, 2.0**-9, 7 * 2.0**-9, 2.0**-6, 1.0, 448.0, -448.0, 1.5]
    assert np.signbit(got[1])


@pytest.mark.parametrize("fmt", ["q5_g64_fp16", "q6_g64_fp16", "q4_g64_fp16", "q8_g32_fp16"])
def test_row_split_slice_reads_three_spans(fmt):
    shape = (300, 1000)
    planes = random_grouped(fmt, shape, seed=7)
    data = pack_planes(ROW_SPLIT, fmt, shape, planes)
    geo = formats.geometry(ROW_SPLIT, fmt, shape)
    read = CountingReader(data)
    r0, r1 = 100, 103
    part = unpack_planes(ROW_SPLIT, fmt, shape, read, rows=(r0, r1))
    spans = [(r0 * geo.base_row_bytes, 3 * geo.base_row_bytes)]
    if geo.high_row_bytes:
        spans.append((geo.high_offset + r0 * geo.high_row_bytes, 3 * geo.high_row_bytes))
    spans.append((geo.scale_offset + r0 * geo.scale_row_bytes, 3 * geo.scale_row_bytes))
    assert read.calls == spans
    assert read.total * 50 < len(data)
    assert np.array_equal(part.codes, planes.codes[r0:r1])
    assert np.array_equal(part.scales, planes.scales[r0:r1])
    full = decode_tensor(fmt, ROW_SPLIT, shape, memory_reader(data))
    sliced = decode_tensor(fmt, ROW_SPLIT, shape, memory_reader(data), rows=(r0, r1))
    assert np.array_equal(sliced, full[r0:r1])


def test_fp8_slice_reads_two_spans():
    shape = (50, 37)
    data = pack_planes(ROW_SCALE, FP8, shape, random_fp8(shape, seed=2))
    geo = formats.geometry(ROW_SCALE, FP8, shape)
    full = decode_tensor(FP8, ROW_SCALE, shape, memory_reader(data))
    for r0, r1 in [(0, 1), (10, 20), (49, 50), (0, 50), (5, 5)]:
        read = CountingReader(data)
        got = decode_tensor(FP8, ROW_SCALE, shape, read, rows=(r0, r1))
        assert np.array_equal(got, full[r0:r1])
        expected = [(r0 * 37, (r1 - r0) * 37), (geo.scale_offset + 2 * r0, 2 * (r1 - r0))]
        assert read.calls == [c for c in expected if c[1]]


@pytest.mark.parametrize("rows", [(0, 128), (128, 384), (0, 512), (5, 6), (100, 300), (383, 512)])
def test_nvfp4_row_slices(rows):
    shape = (512, 128)
    data = pack_planes(BLOCK, "nvfp4", shape, random_nvfp4(shape, seed=9))
    full = unpack_planes(BLOCK, "nvfp4", shape, memory_reader(data))
    read = CountingReader(data)
    part = unpack_planes(BLOCK, "nvfp4", shape, read, rows=rows)
    r0, r1 = rows
    assert np.array_equal(part.codes, full.codes[r0:r1])
    assert np.array_equal(part.scales, full.scales[r0:r1])
    assert part.divisor == full.divisor
    tiles = -(-r1 // 128) - r0 // 128
    assert read.total == (r1 - r0) * 64 + tiles * 128 * 8 + 4
    assert np.array_equal(dequantize(part), dequantize(full)[r0:r1])


def test_bad_row_range():
    shape = (3, 100)
    data = pack_planes(ROW_SPLIT, "q4_g64_fp16", shape, random_grouped("q4_g64_fp16", shape))
    for rows in [(2, 4), (-1, 2), (2, 1)]:
        with pytest.raises(ArtifactError) as e:
            unpack_planes(ROW_SPLIT, "q4_g64_fp16", shape, memory_reader(data), rows=rows)
        assert e.value.rule == "row_range"


def test_layout_shape_rules_come_from_registry():
    with pytest.raises(ArtifactError) as e:
        unpack_planes(BLOCK, "nvfp4", (100, 64), memory_reader(b""))
    assert e.value.rule == "layout_shape"
    with pytest.raises(ArtifactError) as e:
        pack_planes(ROW_SCALE, "q4_g64_fp16", (1, 1), random_grouped("q4_g64_fp16", (1, 1)))
    assert e.value.rule == "format_layout"


# ------------------------------------------------------------------------------------------
# Validation: one negative test per rule
# ------------------------------------------------------------------------------------------


def _expect(rule: str, data: bytes, layout: str, fmt: str, shape, **kw) -> None:
    with pytest.raises(ArtifactError) as e:
        unpack_planes(layout, fmt, shape, memory_reader(data), obj="blk.0.w", **kw)
    assert e.value.rule == rule
    assert e.value.obj == "blk.0.w"
    assert "blk.0.w" in str(e.value)


def _patch(data: bytes, offset: int, raw: bytes) -> bytes:
    return data[:offset] + raw + data[offset + len(raw) :]


def _grouped_bytes(fmt: str, shape=(2, 100)) -> tuple[bytes, formats.RowSplitGeometry]:
    planes = random_grouped(fmt, shape, seed=11)
    planes.scales[:, 0] = 0x3C00  # group 0 of each row has a real scale
    return pack_planes(ROW_SPLIT, fmt, shape, planes), formats.geometry(ROW_SPLIT, fmt, shape)


def test_q8_code_0x80_rejected():
    data, _ = _grouped_bytes("q8_g32_fp16")
    _expect("invalid_code", _patch(data, 3, b"\x80"), ROW_SPLIT, "q8_g32_fp16", (2, 100))
    _expect(
        "invalid_code", _patch(data, 3, b"\x80"), ROW_SPLIT, "q8_g32_fp16", (2, 100), rows=(0, 1)
    )
    planes = random_grouped("q8_g32_fp16", (1, 4))
    planes.codes[0, 0] = -128
    with pytest.raises(ArtifactError) as e:
        pack_planes(ROW_SPLIT, "q8_g32_fp16", (1, 4), planes)
    assert e.value.rule == "invalid_code"


@pytest.mark.parametrize("word", [0x8000, 0xBC00, 0x7C00, 0xFC00, 0x7E00, 0x7C01])
@pytest.mark.parametrize("fmt", GROUPED)
def test_grouped_bad_scale_rejected(fmt, word):
    data, geo = _grouped_bytes(fmt)
    bad = _patch(data, geo.scale_offset + geo.scale_row_bytes, struct.pack("<H", word))
    _expect("invalid_scale", bad, ROW_SPLIT, fmt, (2, 100))
    planes = unpack_planes(ROW_SPLIT, fmt, (2, 100), memory_reader(data))
    planes.scales[1, 0] = word
    with pytest.raises(ArtifactError) as e:
        pack_planes(ROW_SPLIT, fmt, (2, 100), planes)
    assert e.value.rule == "invalid_scale"


def test_grouped_subnormal_scale_accepted():
    planes = GroupedPlanes("q4_g64_fp16", np.array([[3]], np.int8), np.array([[1, 0]], np.uint16))
    data = pack_planes(ROW_SPLIT, "q4_g64_fp16", (1, 1), planes)
    assert (
        dequantize(unpack_planes(ROW_SPLIT, "q4_g64_fp16", (1, 1), memory_reader(data)))
        == 3 * 2.0**-24
    )


@pytest.mark.parametrize("fmt", GROUPED)
def test_grouped_zero_scale_requires_zero_codes(fmt):
    shape = (1, 100)
    planes = GroupedPlanes(
        fmt,
        np.zeros(shape, np.int8),
        np.zeros((1, formats.geometry(ROW_SPLIT, fmt, shape).groups_per_row), np.uint16),
    )
    data = pack_planes(ROW_SPLIT, fmt, shape, planes)  # all zero is fine
    assert not dequantize(unpack_planes(ROW_SPLIT, fmt, shape, memory_reader(data))).any()
    _expect("invalid_code", _patch(data, 5, b"\x10"), ROW_SPLIT, fmt, shape)
    planes.codes[0, 10] = 1
    with pytest.raises(ArtifactError) as e:
        pack_planes(ROW_SPLIT, fmt, shape, planes)
    assert e.value.rule == "invalid_code"


@pytest.mark.parametrize("fmt", GROUPED)
def test_grouped_padding_lane_rejected(fmt):
    data, geo = _grouped_bytes(fmt, shape=(2, 100))
    info = formats.FORMATS[fmt]
    lane = 100  # first padding lane of row 0, inside the partial (q4-q6) or a padding (q8) group
    if info.bits == 8:
        bad = _patch(data, lane, b"\x01")
    else:
        bad = _patch(data, lane // 2, bytes([data[lane // 2] | 0x01]))
    _expect("padding", bad, ROW_SPLIT, fmt, (2, 100))
    if info.bits in (5, 6):  # a padding lane's high bits alone
        hb = info.bits - 4
        offset, bit = geo.high_offset + lane * hb // 8, (lane * hb) % 8
        bad = _patch(data, offset, bytes([data[offset] | (1 << bit)]))
        _expect("padding", bad, ROW_SPLIT, fmt, (2, 100))


@pytest.mark.parametrize("fmt", GROUPED)
def test_grouped_padding_group_scale_rejected(fmt):
    shape = (2, 10)
    data = pack_planes(ROW_SPLIT, fmt, shape, random_grouped(fmt, shape))
    geo = formats.geometry(ROW_SPLIT, fmt, shape)
    last = geo.scale_offset + 2 * (geo.groups_per_row - 1)
    _expect("padding", _patch(data, last, b"\x00\x3c"), ROW_SPLIT, fmt, shape)
    planes = unpack_planes(ROW_SPLIT, fmt, shape, memory_reader(data))
    planes.scales[0, -1] = 0x3C00
    with pytest.raises(ArtifactError) as e:
        pack_planes(ROW_SPLIT, fmt, shape, planes)
    assert e.value.rule == "padding"


def test_gap_bytes_must_be_zero():
    data, geo = _grouped_bytes("q5_g64_fp16", shape=(1, 100))
    assert geo.base_bytes < geo.high_offset
    _expect("padding", _patch(data, geo.base_bytes, b"\x01"), ROW_SPLIT, "q5_g64_fp16", (1, 100))
    fp8 = pack_planes(ROW_SCALE, FP8, (3, 100), random_fp8((3, 100)))
    _expect("padding", _patch(fp8, 300, b"\x01"), ROW_SCALE, FP8, (3, 100))


@pytest.mark.parametrize("word", [0x7F, 0x80, 0xFF, 0xB8])
def test_nvfp4_bad_scale_rejected(word):
    shape = (128, 64)
    data = pack_planes(BLOCK, "nvfp4", shape, random_nvfp4(shape))
    geo = formats.geometry(BLOCK, "nvfp4", shape)
    _expect(
        "invalid_scale", _patch(data, geo.scale_offset + 17, bytes([word])), BLOCK, "nvfp4", shape
    )
    planes = random_nvfp4(shape)
    planes.scales[3, 2] = word
    with pytest.raises(ArtifactError) as e:
        pack_planes(BLOCK, "nvfp4", shape, planes)
    assert e.value.rule == "invalid_scale"


@pytest.mark.parametrize(
    "word", [0x00000000, 0x80000000, 0xBF800000, 0x7F800000, 0x7FC00000, 0xFF800001]
)
def test_nvfp4_bad_divisor_rejected(word):
    shape = (128, 64)
    data = pack_planes(BLOCK, "nvfp4", shape, random_nvfp4(shape))
    _expect("invalid_divisor", data[:-4] + struct.pack("<I", word), BLOCK, "nvfp4", shape)
    planes = random_nvfp4(shape)
    planes.divisor = np.array(word, np.uint32)
    with pytest.raises(ArtifactError) as e:
        pack_planes(BLOCK, "nvfp4", shape, planes)
    assert e.value.rule == "invalid_divisor"


def test_nvfp4_extreme_divisors_accepted():
    shape = (128, 64)
    for word in (0x00000001, 0x7F7FFFFF):
        planes = random_nvfp4(shape)
        planes.divisor = np.array(word, np.uint32)
        data = pack_planes(BLOCK, "nvfp4", shape, planes)
        assert unpack_planes(BLOCK, "nvfp4", shape, memory_reader(data)).divisor == word


@pytest.mark.parametrize("code", [0x7F, 0xFF])
def test_fp8_nan_code_rejected(code):
    shape = (3, 100)
    data = pack_planes(ROW_SCALE, FP8, shape, random_fp8(shape))
    _expect("invalid_code", _patch(data, 150, bytes([code])), ROW_SCALE, FP8, shape)
    planes = random_fp8(shape)
    planes.codes[1, 2] = code
    with pytest.raises(ArtifactError) as e:
        pack_planes(ROW_SCALE, FP8, shape, planes)
    assert e.value.rule == "invalid_code"


@pytest.mark.parametrize("word", [0x8000, 0xBF80, 0x7F80, 0xFF80, 0x7FC0, 0x8001])
def test_fp8_bad_scale_rejected(word):
    shape = (3, 100)
    data = pack_planes(ROW_SCALE, FP8, shape, random_fp8(shape))
    _expect("invalid_scale", _patch(data, 512 + 2, struct.pack("<H", word)), ROW_SCALE, FP8, shape)
    planes = random_fp8(shape)
    planes.scales[2] = word
    with pytest.raises(ArtifactError) as e:
        pack_planes(ROW_SCALE, FP8, shape, planes)
    assert e.value.rule == "invalid_scale"


def test_fp8_zero_scale_row_codes():
    shape = (2, 4)
    codes = np.array([[0x00, 0x80, 0x80, 0x00], [0x01, 0x02, 0x03, 0x04]], np.uint8)
    ok = Fp8RowPlanes(codes, np.array([0x0000, 0x0001], np.uint16))  # +0 and subnormal scales
    data = pack_planes(ROW_SCALE, FP8, shape, ok)
    got = decode_tensor(FP8, ROW_SCALE, shape, memory_reader(data))
    assert got[0].tolist() == [0, 0, 0, 0] and got[1, 0] == np.float32(2.0**-9) * np.float32(
        2.0**-133
    )
    _expect("invalid_code", _patch(data, 2, b"\x01"), ROW_SCALE, FP8, shape)
    bad = Fp8RowPlanes(codes.copy(), np.array([0x0000, 0x0000], np.uint16))
    with pytest.raises(ArtifactError) as e:
        pack_planes(ROW_SCALE, FP8, shape, bad)
    assert e.value.rule == "invalid_code"


@pytest.mark.parametrize(
    "layout,fmt,shape,planes",
    [
        (ROW_SPLIT, "q6_g64_fp16", (3, 300), random_grouped("q6_g64_fp16", (3, 300))),
        (BLOCK, "nvfp4", (128, 64), random_nvfp4((128, 64))),
        (ROW_SCALE, FP8, (3, 100), random_fp8((3, 100))),
    ],
)
def test_short_read_rejected(layout, fmt, shape, planes):
    data = pack_planes(layout, fmt, shape, planes)

    def short(offset: int, length: int) -> bytes:
        return data[offset : offset + length][:-1]

    with pytest.raises(ArtifactError) as e:
        unpack_planes(layout, fmt, shape, short, obj="x")
    assert e.value.rule == "short_read" and e.value.obj == "x"
    _expect("short_read", data[:-1], layout, fmt, shape)


def test_direct_short_read_rejected():
    with pytest.raises(ArtifactError) as e:
        decode_tensor("fp32", CONTIG, [4], memory_reader(b"\x00" * 15), obj="b")
    assert e.value.rule == "short_read"


def test_pack_rejects_wrong_plane_shapes_and_types():
    planes = random_grouped("q4_g64_fp16", (3, 100))
    with pytest.raises(ArtifactError) as e:
        pack_planes(ROW_SPLIT, "q4_g64_fp16", (3, 101), planes)
    assert e.value.rule == "plane_shape"
    with pytest.raises(ArtifactError) as e:
        pack_planes(ROW_SPLIT, "q5_g64_fp16", (3, 100), planes)
    assert e.value.rule == "plane_dtype"
    planes.codes[0, 0] = 8  # q4 range is -8..7
    with pytest.raises(ArtifactError) as e:
        pack_planes(ROW_SPLIT, "q4_g64_fp16", (3, 100), planes)
    assert e.value.rule == "invalid_code"
    nv = random_nvfp4((128, 64))
    nv.codes[0, 0] = 16
    with pytest.raises(ArtifactError) as e:
        pack_planes(BLOCK, "nvfp4", (128, 64), nv)
    assert e.value.rule == "invalid_code"


def test_pack_range_check_happens_before_narrowing():
    planes = random_grouped("q8_g32_fp16", (1, 4))
    planes.codes = planes.codes.astype(np.int64)
    planes.codes[0, 1] = 256 + 3  # would wrap to a legal code if narrowed first
    with pytest.raises(ArtifactError) as e:
        pack_planes(ROW_SPLIT, "q8_g32_fp16", (1, 4), planes)
    assert e.value.rule == "invalid_code"
