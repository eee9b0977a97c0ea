"""Grouped-int planes: byte layout per spec, and the dequant-fused matmul against numpy."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("tvm")

from ninfer_compiler.ops.dequant_matmul import dequant_embedding, dequant_matmul  # noqa: E402
from ninfer_compiler.ops.row_split import (  # noqa: E402
    decode_row_split,
    encode_row_split,
    object_from_planes,
    pack_planes,
    plane_shapes,
    planes_from_object,
)

FORMATS = ["q4_g64_fp16", "q5_g64_fp16", "q6_g64_fp16", "q8_g32_fp16"]


@pytest.mark.parametrize(
    ("fmt", "lanes", "base", "high"),
    [
        ("q4_g64_fp16", [-8, 7, -3, 1], [0x78, 0x1D], None),
        ("q5_g64_fp16", [-16, 15, -1, 0, 1, 2, 3, 4], [0xF0, 0x0F, 0x21, 0x43], 0x05),
        ("q6_g64_fp16", [-32, 31, -1, 5], [0xF0, 0x5F], 0x36),
    ],
)
def test_packing_matches_spec_examples(fmt, lanes, base, high):
    codes = np.zeros((1, 128), np.int32)
    codes[0, : len(lanes)] = lanes
    planes = pack_planes(codes, np.ones((1, 2), np.float16), fmt)
    assert list(planes["base"][0, : len(base)]) == base
    if high is not None:
        assert planes["high"][0, 0] == high


def test_object_layout_matches_spec_example():
    # q4 [1,1], code -3, scale 1.0 -> 260 bytes: 0x0D, zeros, scale 00 3C, padding scale 00 00
    planes = pack_planes(np.array([[-3] + [0] * 127], np.int32), np.array([[1.0, 0.0]], np.float16),
                         "q4_g64_fp16")  # fmt: skip
    data = object_from_planes(planes, "q4_g64_fp16", 1, 1)
    assert len(data) == 260 and data[0] == 0x0D and not any(data[1:256])
    assert data[256:] == bytes([0x00, 0x3C, 0x00, 0x00])
    back = planes_from_object(data, "q4_g64_fp16", 1, 1)
    assert all(np.array_equal(back[k], planes[k]) for k in planes)


@pytest.mark.parametrize("fmt", FORMATS)
def test_encoder_round_trip_and_shapes(fmt):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((5, 200)).astype(np.float32)
    planes = encode_row_split(w, fmt)
    for name, (shape, dtype) in plane_shapes(fmt, 5, 200).items():
        assert planes[name].shape == shape and planes[name].dtype == dtype
    data = object_from_planes(planes, fmt, 5, 200)
    again = planes_from_object(data, fmt, 5, 200)
    assert all(np.array_equal(again[k], planes[k]) for k in planes)
    qmax = {"q4": 7, "q5": 15, "q6": 31, "q8": 127}[fmt[:2]]
    step = np.abs(w).max() / qmax
    assert np.abs(decode_row_split(planes, fmt, 200) - w).max() <= step / 2 * 1.01


def random_planes(rng, fmt, rows, cols):
    """Arbitrary plane bytes (every code pattern) and positive fp16 scales."""
    out = {}
    for name, (shape, dtype) in plane_shapes(fmt, rows, cols).items():
        if dtype == "uint8":
            out[name] = rng.integers(0, 256, size=shape, dtype=np.uint8)
        else:
            out[name] = rng.uniform(1e-3, 0.1, size=shape).astype(np.float16)
    return out


@pytest.mark.parametrize("source", ["encoded", "random"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_dequant_matmul_matches_numpy(op_compiler, fmt, source):
    rng = np.random.default_rng(1)
    N, K = 24, 130  # K_pad = 256: a partial group, then all-padding groups
    if source == "encoded":
        planes = encode_row_split(rng.standard_normal((N, K)).astype(np.float32), fmt)
    else:
        planes = random_planes(rng, fmt, N, K)
    shapes = plane_shapes(fmt, N, K)
    has_high = "high" in shapes

    def fn(x, base, *rest):
        high, scales = (rest[0], rest[1]) if has_high else (None, rest[0])
        return dequant_matmul(x, base, high, scales, fmt, K)

    inputs = {"x": (["b", "t", K], "float32")}
    inputs |= {name: (list(shape), dtype) for name, (shape, dtype) in shapes.items()}
    run = op_compiler(fn, inputs)
    w = decode_row_split(planes, fmt, K)
    for b, t in ((1, 1), (3, 5)):
        x = rng.standard_normal((b, t, K)).astype(np.float32)
        (y,), _ = run(x, *[planes[p] for p in shapes])
        ref = x.astype(np.float64) @ w.T.astype(np.float64)
        np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


def test_dequant_embedding_rows(op_compiler):
    fmt, V, H = "q6_g64_fp16", 10, 70
    planes = encode_row_split(np.random.default_rng(2).standard_normal((V, H)), fmt)

    run = op_compiler(
        lambda ids, base, high, scales: dequant_embedding(ids, base, high, scales, fmt, H, "float32"),
        {"ids": (["n"], "int32")} | {k: (list(s), d) for k, (s, d) in plane_shapes(fmt, V, H).items()},
    )
    ids = np.array([3, 0, 9, 3], np.int32)
    (rows,), _ = run(ids, planes["base"], planes["high"], planes["scales"])
    np.testing.assert_array_equal(rows, decode_row_split(planes, fmt, H)[ids])
