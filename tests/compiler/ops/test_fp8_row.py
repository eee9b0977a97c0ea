"""fp8_e4m3fn_row_bf16 weights (`ops/fp8_row.py`, `runtime/weights.py`): exact decode of every word, the
CPU TE ops against float64, row views of packed parents bound as stored, and the routing of an h200
library (tuned kernels vs the reference TE op)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from ninfer_runtime.artifact import Artifact, ArtifactError, ArtifactWriter
from ninfer_runtime.artifact.codecs import (
    E4M3FN_VALUES,
    Fp8RowPlanes,
    bf16_words_to_f32,
    pack_planes,
)
from ninfer_runtime.artifact.formats import ROW_SCALE

from ..codegen.conftest import require_tool
from ..conftest import _op_module

FMT = "fp8_e4m3fn_row_bf16"
VALID = np.array([w for w in range(256) if w & 0x7F != 0x7F], dtype=np.uint8)  # 254 words


def e4m3fn64(words: np.ndarray) -> np.ndarray:
    """E4M3FN words as float64 from the spec 3.3 table (NaN for 0x7F / 0xFF)."""
    w = words.astype(np.int64)
    e, m = (w >> 3) & 15, w & 7
    mag = np.where(e == 0, m * 2.0**-9, (1 + m / 8.0) * 2.0 ** (e - 7))
    mag = np.where((w & 0x7F) == 0x7F, np.nan, mag)
    return np.where(w & 0x80, -mag, mag)


def random_planes(rng: np.random.Generator, n: int, k: int, spread: int = 6) -> tuple[np.ndarray, np.ndarray]:
    """Valid codes (every non-NaN word) and bf16 scale words over 2^-spread .. 2^spread (a zero row)."""
    codes = rng.choice(VALID, size=(n, k))
    scales = (rng.uniform(0.5, 1.0, n) * 2.0 ** rng.integers(-spread, spread + 1, n)).astype(np.float32)
    words = scales.astype(ml_dtypes.bfloat16).view(np.uint16)
    if n > 2:
        words[1], codes[1] = 0, rng.choice(np.array([0x00, 0x80], np.uint8), size=k)  # +0 scale: zero codes
    return codes, words


def reference(x: np.ndarray, codes: np.ndarray, words: np.ndarray) -> np.ndarray:
    w = e4m3fn64(codes) * bf16_words_to_f32(words).astype(np.float64)[:, None]
    return x.astype(np.float64) @ w.T


def test_plane_shapes():
    from ninfer_compiler.ops.fp8_row import plane_shapes

    assert plane_shapes(384, 37) == {"codes": ((384, 37), "uint8"), "row_scales": ((384,), "bfloat16")}
    with pytest.raises(ValueError, match="positive"):
        plane_shapes(0, 16)


def test_every_word_decodes_exactly(op_compiler):
    """All 256 words through the TE gather and matmul: the spec table exactly, NaN for 0x7F / 0xFF,
    times the row scale (products exact in fp32), bit for bit like the codec's decode."""
    from ninfer_compiler.ops.fp8_row import fp8_row_embedding, fp8_row_matmul

    codes = np.tile(np.arange(256, dtype=np.uint8), (4, 1))
    scales = np.array([1.0, 2.0**-10, 3.0, 2.0**100], np.float32).astype(ml_dtypes.bfloat16)
    want = E4M3FN_VALUES[codes] * scales.astype(np.float32)[:, None]  # the codec's fp32 decode
    np.testing.assert_array_equal(E4M3FN_VALUES, e4m3fn64(np.arange(256)).astype(np.float32))
    inputs = {"ids": ([1, 4], "int32"), "c": ([4, 256], "uint8"), "s": ([4], "bfloat16")}
    run = op_compiler(lambda ids, c, s: fp8_row_embedding(ids, c, s, 256, "float32"), inputs)
    (rows,), _ = run(np.arange(4, dtype=np.int32)[None], codes, scales)
    assert rows.dtype == np.float32
    np.testing.assert_array_equal(rows[0], want)  # assert_array_equal matches NaN with NaN
    # matmul: an identity x reads W^T back (NaN columns stay NaN, nothing else is touched)
    inputs = {"x": ([1, 256, 256], "float32"), "c": ([4, 256], "uint8"), "s": ([4], "bfloat16")}
    run = op_compiler(lambda x, c, s: fp8_row_matmul(x, c, s, 256), inputs)
    valid = np.where((codes & 0x7F) == 0x7F, 0, codes).astype(np.uint8)
    (y,), _ = run(np.eye(256, dtype=np.float32)[None], valid, scales)
    np.testing.assert_array_equal(y[0], (E4M3FN_VALUES[valid] * scales.astype(np.float32)[:, None]).T)


@pytest.mark.parametrize("n,k", [(7, 37), (130, 64)])
def test_te_matmul_matches_float64(op_compiler, n, k):
    from ninfer_compiler.ops.fp8_row import fp8_row_matmul, plane_shapes

    rng = np.random.default_rng(n * k)
    codes, words = random_planes(rng, n, k)
    inputs = {"x": (["b", "t", k], "float32")}
    inputs |= {name: (list(shape), dtype) for name, (shape, dtype) in plane_shapes(n, k).items()}
    run = op_compiler(lambda x, c, s: fp8_row_matmul(x, c, s, k), inputs)
    for b, t in ((1, 1), (3, 5)):
        x = rng.standard_normal((b, t, k)).astype(np.float32)
        (y,), _ = run(x, codes, words.view(ml_dtypes.bfloat16))
        ref = reference(x.reshape(-1, k), codes, words).reshape(b, t, n)
        assert float(np.abs(y - ref).max() / np.abs(ref).max()) < 1e-6


# ---- planes bound from the artifact -----------------------------------------------------------------

def _artifact(path, codes: np.ndarray, words: np.ndarray, raw: bytes | None = None) -> None:
    """One [N, K] fp8-row parent with row views: whole, a row block, interleaved blocks, a bad range."""
    n, k = codes.shape
    with ArtifactWriter(path) as w:
        data = raw if raw is not None else pack_planes(ROW_SCALE, FMT, (n, k), Fp8RowPlanes(codes, words))
        w.add_tensor("parent", FMT, ROW_SCALE, (n, k), data)
        w.bind("whole", "parent")
        w.bind_rows("block", "parent", 3, 7)
        w.bind_parts("mixed", [("parent", 8 * k, 10 * k), ("parent", 0, 2 * k)])
        w.bind_parts("ragged", [("parent", 5, 5 + 2 * k)])
        w.add_component("text", {"architectures": ["Test"]})


def _load(art: Artifact, binding: str, rows: int, k: int) -> dict[str, np.ndarray]:
    from ninfer_runtime.weights import ParamEntry, load_param

    return {plane: load_param(art, ParamEntry(f"p.{plane}", binding, plane, shape, dtype))
            for plane, shape, dtype in (("codes", (rows, k), "uint8"), ("row_scales", (rows,), "bfloat16"))}


def test_row_views_are_the_stored_words(tmp_path):
    """Codes and scale words of row ranges and reordered parts are the parent's bytes, and decode to
    the artifact's own values of the binding."""
    rng = np.random.default_rng(3)
    n, k = 10, 37
    codes, words = random_planes(rng, n, k)
    _artifact(tmp_path / "a.ninfer", codes, words)
    rows = {"whole": np.arange(10), "block": np.arange(3, 7), "mixed": np.r_[8, 9, 0, 1]}
    with Artifact(tmp_path / "a.ninfer") as art:
        for name, idx in rows.items():
            planes = _load(art, name, len(idx), k)
            np.testing.assert_array_equal(planes["codes"], codes[idx])
            assert planes["row_scales"].dtype == ml_dtypes.bfloat16
            np.testing.assert_array_equal(planes["row_scales"].view(np.uint16), words[idx])
            decoded = E4M3FN_VALUES[planes["codes"]] * planes["row_scales"].astype(np.float32)[:, None]
            np.testing.assert_array_equal(decoded, art.parameter(name, (len(idx), k)))
        with pytest.raises(ArtifactError, match="not whole rows"):
            _load(art, "ragged", 2, k)


def test_invalid_words_are_refused_at_load(tmp_path):
    """NaN code words and negative scales are invalid (spec 3.4): the loader names them."""
    rng = np.random.default_rng(4)
    codes, words = random_planes(rng, 10, 37)
    good = bytearray(pack_planes(ROW_SCALE, FMT, (10, 37), Fp8RowPlanes(codes, words)))
    nan = bytearray(good)
    nan[4 * 37 + 5] = 0xFF  # row 4 (inside `block`)
    _artifact(tmp_path / "nan.ninfer", codes, words, bytes(nan))
    with Artifact(tmp_path / "nan.ninfer") as art:
        with pytest.raises(ArtifactError, match="NaN code 0xFF at row 4"):
            _load(art, "block", 4, 37)
    neg = bytearray(good)
    offset = 512 + 2 * 8  # scale plane at align_up(370, 256); row 8 (inside `mixed`)
    neg[offset : offset + 2] = np.array([0xBF80], np.uint16).tobytes()  # -1.0
    _artifact(tmp_path / "neg.ninfer", codes, words, bytes(neg))
    with Artifact(tmp_path / "neg.ninfer") as art:
        with pytest.raises(ArtifactError, match="0xBF80 of row 8"):
            _load(art, "mixed", 4, 37)


# ---- CUDA routing -----------------------------------------------------------------------------------

def _h200_export(k: int, n: int):
    from ninfer_compiler.build import export_module
    from ninfer_compiler.codegen.targets import tvm_target
    from ninfer_compiler.ops import fp8_row
    from ninfer_runtime import targets

    ttarget = tvm_target(targets.load("h200"))

    def main(xd, xp, c, s):
        return fp8_row.fp8_row_matmul(xd, c, s, k), fp8_row.fp8_row_matmul(xp, c, s, k)

    inputs = {"xd": (["b", 1, k], "bfloat16"), "xp": ([1, "t", k], "bfloat16")}
    inputs |= {name: (list(shape), dtype) for name, (shape, dtype) in fp8_row.plane_shapes(n, k).items()}
    with ttarget:
        mod, _ = export_module(_op_module(main, inputs), {})
    return ttarget, mod


def test_h200_reference_path_without_the_features(monkeypatch):
    """The tuned fp8 kernels are kernel features (on by default since their H200 check): switched
    off, an h200 export keeps the TE op (no extern)."""
    from ninfer_compiler.ops import fp8_row

    monkeypatch.delenv("NINFER_KERNELS", raising=False)
    assert fp8_row.common.kernel_features()[fp8_row.TRITON_FEATURE]
    assert fp8_row.common.kernel_features()[fp8_row.TC_FEATURE]
    monkeypatch.setenv("NINFER_KERNELS", f"-{fp8_row.TRITON_FEATURE},-{fp8_row.TC_FEATURE}")
    _, mod = _h200_export(256, 128)
    text = mod.script()
    assert "fp8_row_matmul_bf16" in text and "ninfer_fp8_row" not in text


def test_h200_library_carries_the_kernels(monkeypatch, tmp_path):
    """With the features on: decode (N % 16, K % 128) -> the CUDA GEMV, prefill -> the Triton GEMM;
    a K % 128 != 0 decode -> the Triton GEMV and its TVM sum; SASS for sm_90a only."""
    from ninfer_compiler.build import compile_module
    from ninfer_compiler.codegen.export import export_library
    from ninfer_compiler.codegen.fatbin import extract_fatbins, inspect_library
    from ninfer_compiler.codegen.toolchain import cuda_build
    from ninfer_compiler.ops import fp8_row
    from ninfer_runtime import targets

    require_tool("nvcc", "the CUDA toolkit builds device code")
    monkeypatch.setenv("NINFER_KERNELS", f"+{fp8_row.TRITON_FEATURE},+{fp8_row.TC_FEATURE}")
    ttarget, mod = _h200_export(256, 128)
    text = mod.script()
    assert f'"{fp8_row.TC_SYMBOL}"' in text and f'"{fp8_row.GEMM_SYMBOL}"' in text
    assert f'"{fp8_row.GEMV_SYMBOL}"' not in text and "fp8_row_matmul" not in text
    _, ragged = _h200_export(80, 128)  # K % 128 != 0: the Triton GEMV for decode
    assert f'"{fp8_row.GEMV_SYMBOL}"' in ragged.script() and f'"{fp8_row.TC_SYMBOL}"' not in ragged.script()
    with cuda_build(ttarget):
        exe = compile_module(mod, ttarget)
    lib = export_library(exe, tmp_path / "model.so", targets.load("h200"))
    code = inspect_library(lib)
    assert code.problems("sm_90a") == [] and code.sass_archs == {"sm_90a"}
    fatbins = extract_fatbins(lib)
    for kernel in (b"fp8_row_gemm_kernel", b"ninfer_fp8_row_gemv_ybf16"):
        assert any(kernel in fb for fb in fatbins), f"{kernel.decode()} is not in the library"
    data = lib.read_bytes()
    assert fp8_row.TC_SYMBOL.encode() in data and fp8_row.GEMM_SYMBOL.encode() in data


@pytest.mark.parametrize("arch", ["sm_90a", "sm_120a", "sm_121a"])
def test_kernels_build_for_every_cuda_arch(arch):
    """The Triton GEMM and GEMV ahead of time, and the CUDA GEMV's fatbin, for each target arch."""
    from ninfer_compiler.ops import fp8_row
    from ninfer_compiler.ops.triton_aot import cubin_arch

    require_tool("nvcc", "the CUDA toolkit builds device code")
    images = fp8_row._images(arch)  # noqa: SLF001 (the images a package embeds)
    wide = {"fp8_row_gemm_wide"} if arch == "sm_90a" else set()  # Hopper's 256-token tile
    assert set(images) == {"fp8_row_gemm", "fp8_row_gemv", *wide}
    for key, image in images.items():
        assert cubin_arch(image.cubin) == int(arch[3:-1]) and image.threads == 256
        assert image.name == ("fp8_row_gemv_kernel" if key == "fp8_row_gemv" else "fp8_row_gemm_kernel")
        assert 0 < image.shared <= (232_448 if arch == "sm_90a" else 101_376)
    fatbin = fp8_row.tc_fatbin(arch)
    assert b"ninfer_fp8_row_gemv_ybf16" in fatbin and b"ninfer_fp8_row_gemv_yf32" in fatbin
