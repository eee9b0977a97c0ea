"""A small, strict reader of safetensors checkpoints that needs neither torch nor the library.

Files are memory-mapped; tensors are returned as numpy arrays in their stored dtype (bfloat16 via
ml_dtypes), so bf16 weights pass into the artifact bit for bit.
"""

from __future__ import annotations

import json
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes
import numpy as np

from .errors import ConversionError

DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype("<f8"), "F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype(ml_dtypes.bfloat16),
    "I64": np.dtype("<i8"), "I32": np.dtype("<i4"), "I16": np.dtype("<i2"), "I8": np.dtype("i1"), "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"), "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn), "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    file: Path
    begin: int  # absolute byte offsets in the file
    end: int


class SafetensorsCheckpoint:
    """All tensors of a checkpoint directory (single file or sharded with an index)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        index = directory / "model.safetensors.index.json"
        if index.exists():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (ValueError, KeyError, TypeError) as exc:
                raise ConversionError(f"{index}: not a valid safetensors index ({exc})") from None
            files = sorted({directory / f for f in weight_map.values()})
        else:
            files = sorted(directory.glob("*.safetensors"))
        if not files:
            raise ConversionError(f"{directory}: no *.safetensors weight files")
        self.tensors: dict[str, TensorInfo] = {}
        self._maps: dict[Path, mmap.mmap] = {}
        for f in files:
            for info in self._read_header(f):
                if info.name in self.tensors:
                    raise ConversionError(f"{f}: tensor {info.name!r} also appears in {self.tensors[info.name].file.name}")
                self.tensors[info.name] = info

    def _read_header(self, path: Path) -> list[TensorInfo]:
        if not path.exists():
            raise ConversionError(f"{path}: weight file listed in the index does not exist")
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise ConversionError(f"{path}: too short for a safetensors file")
            (n,) = struct.unpack("<Q", head)
            if n > size - 8:
                raise ConversionError(f"{path}: header length {n} exceeds the file")
            try:
                header = json.loads(f.read(n))
            except ValueError as exc:
                raise ConversionError(f"{path}: unreadable safetensors header ({exc})") from None
        base = 8 + n
        out = []
        for name, meta in header.items():
            if name == "__metadata__":
                continue
            try:
                dtype, shape, (b, e) = meta["dtype"], tuple(meta["shape"]), meta["data_offsets"]
            except (KeyError, TypeError, ValueError):
                raise ConversionError(f"{path}: malformed header entry for {name!r}") from None
            if dtype not in DTYPES:
                raise ConversionError(f"{path}: tensor {name!r} has unsupported dtype {dtype}")
            want = int(np.prod(shape, dtype=np.int64)) * DTYPES[dtype].itemsize
            if e - b != want or base + e > size or b < 0:
                raise ConversionError(f"{path}: tensor {name!r} data range does not match its shape {list(shape)}")
            out.append(TensorInfo(name, dtype, shape, path, base + b, base + e))
        return out

    def names(self) -> list[str]:
        return list(self.tensors)

    def load(self, name: str) -> np.ndarray:
        info = self.tensors.get(name)
        if info is None:
            raise ConversionError(f"{self.directory}: missing tensor {name!r} in the checkpoint")
        m = self._maps.get(info.file)
        if m is None:
            with open(info.file, "rb") as f:
                m = self._maps[info.file] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        data = np.frombuffer(m, dtype=DTYPES[info.dtype], count=int(np.prod(info.shape, dtype=np.int64)), offset=info.begin)
        return data.reshape(info.shape).copy()

    def close(self) -> None:
        for m in self._maps.values():
            m.close()
        self._maps.clear()
