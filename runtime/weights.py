"""Parameters of a compiled package, read from the artifact exactly as its kernels consume them.

A package's manifest lists each parameter as (binding, plane, shape, dtype). Dense parameters are
decoded from their binding (bf16 words stay bf16 bit for bit); grouped-int parameters are the
artifact's own planes (`base`, `high`, `scales`) cut into per-row spans of the binding's parent
rows (spec 4.3.7), so no weight is repacked or expanded at load time. nvfp4 parameters are the
code plane's rows as stored, the E4M3FN block scales of those rows in natural `[rows, K/16]` order
(the 128x4 tile swizzle of spec 4.4 undone, so a binding may start at any row of its parent) and
the matrix divisor. fp8_e4m3fn_row_bf16 parameters are the code rows as stored (`codes`, one
E4M3FN byte per weight) and those rows' bf16 scale words (`row_scales`): a row view of a
`row_scale_v1` object is two spans (spec 4.5), read without copying through a float.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

from .artifact import Artifact, ArtifactError
from .artifact.formats import (
    BLOCK_SCALE,
    ROW_SCALE,
    ROW_SPLIT,
    BlockScaleGeometry,
    GroupedIntFormat,
    RowScaleGeometry,
    RowSplitGeometry,
    geometry,
)

GROUPED_PLANES = ("base", "high", "scales")
NVFP4_PLANES = ("codes", "block_scales", "divisor")
FP8_ROW_PLANES = ("codes", "row_scales")  # `codes` is told from nvfp4's by the binding's format
FP8_ROW = "fp8_e4m3fn_row_bf16"
NUMPY_DTYPES = {
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "int32": np.dtype(np.int32),
    "uint8": np.dtype(np.uint8),
}


@dataclass(frozen=True)
class ParamEntry:
    """One input parameter of the compiled functions (manifest `params[i]`)."""

    name: str  # module path, e.g. layers.3.attention.query.base
    binding: str  # artifact binding, e.g. text/layers/3/attention/query
    plane: str  # "value" (dense), "base" / "high" / "scales" (grouped int), "codes" / "block_scales" / "divisor"
    # (nvfp4), "codes" / "row_scales" (fp8 row)
    shape: tuple[int, ...]
    dtype: str

    @classmethod
    def from_json(cls, raw: dict) -> ParamEntry:
        return cls(raw["name"], raw["binding"], raw["plane"], tuple(raw["shape"]), raw["dtype"])

    def to_json(self) -> dict:
        return {"name": self.name, "binding": self.binding, "plane": self.plane, "shape": list(self.shape), "dtype": self.dtype}


def load_param(art: Artifact, entry: ParamEntry) -> np.ndarray:
    """The array for one parameter; errors name the parameter and what does not match."""
    if entry.dtype not in NUMPY_DTYPES:
        raise ArtifactError("param_dtype", f"parameter {entry.name}: unsupported dtype {entry.dtype}")
    if entry.plane in GROUPED_PLANES:
        value = _grouped_plane(art, entry)
    elif entry.plane == "row_scales" or (entry.plane == "codes" and _is_fp8_row(art, entry)):
        value = _fp8_row_plane(art, entry)
    elif entry.plane in NVFP4_PLANES:
        value = _nvfp4_plane(art, entry)
    elif entry.plane == "value":
        value = _dense(art, entry)
    else:
        raise ArtifactError("param_plane", f"parameter {entry.name}: unknown plane {entry.plane!r}")
    if tuple(value.shape) != entry.shape:
        raise ArtifactError(
            "param_shape", f"parameter {entry.name} ({entry.binding}) has shape {list(value.shape)} in the artifact, "
            f"the package expects {list(entry.shape)}",
        )
    return np.ascontiguousarray(value)


def _dense(art: Artifact, entry: ParamEntry) -> np.ndarray:
    binding = art.binding(entry.binding)
    want = NUMPY_DTYPES[entry.dtype]
    formats = {art.tensor_object(p.object).format for p in binding.parts}
    if len(formats) != 1:
        raise ArtifactError("param_format", f"parameter {entry.name}: binding {entry.binding} mixes formats {sorted(formats)}")
    fmt = formats.pop()
    if fmt == "bf16" and want == NUMPY_DTYPES["bfloat16"]:
        pieces = [_elements(art, p.object, p.begin, p.end, "bfloat16") for p in binding.parts]
        value = np.concatenate(pieces) if len(pieces) > 1 else pieces[0]
        return value.reshape(entry.shape)
    if fmt not in ("bf16", "fp32", "int32") and want != NUMPY_DTYPES["float32"]:
        raise ArtifactError(
            "param_format", f"parameter {entry.name}: {fmt} weights cannot be loaded as dense {entry.dtype} "
            "(the package was compiled for another format)",
        )
    value = art.parameter(entry.binding, entry.shape)
    if fmt == "int32" and want != NUMPY_DTYPES["int32"]:
        raise ArtifactError("param_format", f"parameter {entry.name}: int32 data, package expects {entry.dtype}")
    return value.astype(want, copy=False)


def _elements(art: Artifact, object_id: str, begin: int, end: int, dtype: str) -> np.ndarray:
    obj = art.tensor_object(object_id)
    if not obj.shape:
        return art.decode(object_id, dtype=dtype).reshape(-1)[begin:end]
    row = obj.elements // obj.shape[0]
    r0, r1 = begin // row, -(-end // row)
    flat = art.decode(object_id, rows=(r0, r1), dtype=dtype).reshape(-1)
    return flat[begin - r0 * row : end - r0 * row]


def _grouped_plane(art: Artifact, entry: ParamEntry) -> np.ndarray:
    binding = art.binding(entry.binding)
    spans = []
    fmt_seen = None
    for part in binding.parts:
        obj = art.tensor_object(part.object)
        if obj.layout != ROW_SPLIT:
            raise ArtifactError(
                "param_format", f"parameter {entry.name}: binding {entry.binding} is {obj.format}, the package expects "
                "grouped-int planes (compiled for another format)", obj=obj.id,
            )
        if fmt_seen not in (None, obj.format):
            raise ArtifactError("param_format", f"parameter {entry.name}: binding mixes {fmt_seen} and {obj.format}")
        fmt_seen = obj.format
        geo = geometry(obj.layout, obj.format, obj.shape, obj.id)
        assert isinstance(geo, RowSplitGeometry) and isinstance(geo.fmt, GroupedIntFormat)
        k = obj.shape[1]
        if part.begin % k or part.end % k:
            raise ArtifactError(
                "param_rows", f"parameter {entry.name}: binding range [{part.begin}, {part.end}) is not whole rows of "
                f"{obj.id}; grouped-int weights are bound by rows", obj=obj.id,
            )
        r0, r1 = part.begin // k, part.end // k
        spans.append(_plane_rows(art, obj, geo, entry.plane, r0, r1))
    value = np.concatenate(spans) if len(spans) > 1 else spans[0]
    return value.view(np.float16) if entry.plane == "scales" else value


def _plane_rows(art: Artifact, obj, geo: RowSplitGeometry, plane: str, r0: int, r1: int) -> np.ndarray:
    """Rows [r0, r1) of one plane as raw bytes `[rows, row_bytes]` (spec 4.3.7)."""
    row_bytes, offset = {
        "base": (geo.base_row_bytes, 0),
        "high": (geo.high_row_bytes, geo.high_offset),
        "scales": (geo.scale_row_bytes, geo.scale_offset),
    }[plane]
    if row_bytes == 0:
        raise ArtifactError("param_plane", f"{obj.format} has no {plane} plane", obj=obj.id)
    data = art.read(obj.offset + offset + r0 * row_bytes, (r1 - r0) * row_bytes)
    return np.frombuffer(data, dtype=np.uint8).reshape(r1 - r0, row_bytes).copy()


def _nvfp4_plane(art: Artifact, entry: ParamEntry) -> np.ndarray:
    """One nvfp4 plane of a binding's rows: codes `[rows, K/2]`, scales `[rows, K/16]`, divisor `[1]`."""
    binding = art.binding(entry.binding)
    spans, divisors = [], set()
    for part in binding.parts:
        obj = art.tensor_object(part.object)
        if obj.layout != BLOCK_SCALE or obj.format != "nvfp4":
            raise ArtifactError(
                "param_format", f"parameter {entry.name}: binding {entry.binding} is {obj.format}, the package expects "
                "nvfp4 planes (compiled for another format)", obj=obj.id,
            )
        geo = geometry(obj.layout, obj.format, obj.shape, obj.id)
        assert isinstance(geo, BlockScaleGeometry)
        k = geo.cols
        if part.begin % k or part.end % k:
            raise ArtifactError(
                "param_rows", f"parameter {entry.name}: binding range [{part.begin}, {part.end}) is not whole rows of "
                f"{obj.id}; nvfp4 weights are bound by rows", obj=obj.id,
            )
        word = int(np.frombuffer(art.read(obj.offset + geo.divisor_offset, 4), dtype="<u4")[0])
        if not 0 < word <= 0x7F7FFFFF:
            raise ArtifactError("invalid_divisor", f"weight divisor word 0x{word:08X} is not finite and > 0", obj=obj.id)
        divisors.add(word)
        r0, r1 = part.begin // k, part.end // k
        if entry.plane == "codes":
            data = art.read(obj.offset + r0 * (k // 2), (r1 - r0) * (k // 2))
            spans.append(np.frombuffer(data, dtype=np.uint8).reshape(r1 - r0, k // 2).copy())
        elif entry.plane == "block_scales":
            spans.append(_natural_scales(art, obj, geo, r0, r1))
    if entry.plane == "divisor":
        if len(divisors) != 1:
            raise ArtifactError(
                "param_format", f"parameter {entry.name}: binding {entry.binding} spans nvfp4 objects with different "
                "divisors; one matrix has one divisor",
            )
        return np.array([divisors.pop()], dtype=np.uint32).view(np.float32)
    return np.concatenate(spans) if len(spans) > 1 else spans[0]


def _natural_scales(art: Artifact, obj, geo: BlockScaleGeometry, r0: int, r1: int) -> np.ndarray:
    """E4M3FN scale words of rows [r0, r1) as `[rows, K/16]`: the 128-row tiles covering them, un-swizzled.

    A tile's 512-byte blocks hold `[32 rows, 4 row quarters, 4 groups]` (spec 4.4: the natural matrix
    reshaped to `[N/128, 4, 32, K/64, 4]` and permuted to `(0, 3, 2, 1, 4)`); the inverse permutation is
    the same one.
    """
    groups = geo.cols // 16
    t0, t1 = r0 // 128, -(-r1 // 128)
    data = art.read(obj.offset + geo.scale_offset + t0 * 128 * groups, (t1 - t0) * 128 * groups)
    tiles = np.frombuffer(data, dtype=np.uint8).reshape(t1 - t0, groups // 4, 32, 4, 4)
    natural = tiles.transpose(0, 3, 2, 1, 4).reshape((t1 - t0) * 128, groups)[r0 - t0 * 128 : r1 - t0 * 128]
    bad = natural > 0x7E
    if bad.any():
        r, g = (int(v[0]) for v in np.nonzero(bad))
        raise ArtifactError(
            "invalid_scale", f"E4M3FN block scale 0x{int(natural[r, g]):02X} of row {r0 + r} group {g} is negative or NaN",
            obj=obj.id,
        )
    return np.ascontiguousarray(natural)


def _is_fp8_row(art: Artifact, entry: ParamEntry) -> bool:
    binding = art.binding(entry.binding)
    return art.tensor_object(binding.parts[0].object).format == FP8_ROW


def _fp8_row_plane(art: Artifact, entry: ParamEntry) -> np.ndarray:
    """One fp8-row plane of a binding's rows: codes uint8 `[rows, K]` or row scales bf16 `[rows]`.

    Each part must be whole rows of a `row_scale_v1` object; its code rows and scale words are read
    as two spans and validated (NaN code words, and negative / -0 / Inf / NaN scales, are invalid:
    spec 3.4), so the kernels only ever see valid words.
    """
    binding = art.binding(entry.binding)
    spans = []
    for part in binding.parts:
        obj = art.tensor_object(part.object)
        if obj.layout != ROW_SCALE or obj.format != FP8_ROW:
            raise ArtifactError(
                "param_format", f"parameter {entry.name}: binding {entry.binding} is {obj.format}, the package expects "
                "fp8 row planes (compiled for another format)", obj=obj.id,
            )
        geo = geometry(obj.layout, obj.format, obj.shape, obj.id)
        assert isinstance(geo, RowScaleGeometry)
        k = geo.cols
        if part.begin % k or part.end % k:
            raise ArtifactError(
                "param_rows", f"parameter {entry.name}: binding range [{part.begin}, {part.end}) is not whole rows of "
                f"{obj.id}; fp8 row weights are bound by rows", obj=obj.id,
            )
        r0, r1 = part.begin // k, part.end // k
        if entry.plane == "codes":
            spans.append(art.planes(obj.id, rows=(r0, r1)).codes)  # codes and scales checked together
        else:
            spans.append(_row_scale_words(art, obj, geo, r0, r1))
    value = np.concatenate(spans) if len(spans) > 1 else spans[0]
    return value.view(ml_dtypes.bfloat16) if entry.plane == "row_scales" else value


def _row_scale_words(art: Artifact, obj, geo: RowScaleGeometry, r0: int, r1: int) -> np.ndarray:
    """The bf16 scale words of rows [r0, r1) as uint16 (spec 4.5), each a valid multiplier."""
    data = art.read(obj.offset + geo.scale_offset + 2 * r0, 2 * (r1 - r0))
    words = np.frombuffer(data, dtype="<u2").astype(np.uint16)
    bad = ((words & 0x8000) != 0) | ((words & 0x7F80) == 0x7F80)
    if bad.any():
        r = int(np.argmax(bad))
        raise ArtifactError(
            "invalid_scale", f"bf16 row scale 0x{int(words[r]):04X} of row {r0 + r} is negative, -0, Inf or NaN",
            obj=obj.id,
        )
    return words
