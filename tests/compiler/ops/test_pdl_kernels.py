"""Programmatic Dependent Launch of the Triton decode kernels, checked without a GPU.

A kernel that `ninfer_cuda::launch` starts with PDL may run while the previous kernel of the stream
still runs, so its SASS must wait for it (`ACQBULK`, from Triton's `gdc_wait`) before its first
memory access, and the launchers must ask for PDL exactly for such images."""

from __future__ import annotations

import re
import subprocess

import pytest

from ..codegen.conftest import require_tool
from .test_qgemv_v4 import _cuobjdump

pytest.importorskip("triton")

MEMORY = re.compile(r"\b(LDG|STG|LD|ST|ATOM|ATOMG|RED|LDGSTS|UBLKCP|UTMALDG)\b")


def _images(arch: str) -> dict[str, object]:
    from ninfer_compiler.ops import (
        attention_decode,
        attention_prologue,
        conv1d_decode,
        gdn_decode_fused,
        greedy,
    )

    split, combine = attention_decode.images(arch, 24, 4, 256, 16)
    partial, choose = greedy.images(arch)
    return {
        "attention split": split,
        "attention combine": combine,
        "attention combine, gated": attention_decode.images(arch, 24, 4, 256, 16, gated=True)[1],
        "attention prologue": attention_prologue.image(24, 4, 256, 16, 64, (11, 11, 10), "bfloat16", "bfloat16", arch),
        "gdn decode": gdn_decode_fused.image(16, 48, 128, 128, "bfloat16", "float32", arch),
        "conv1d decode": conv1d_decode.image(10240, 4, "bfloat16", arch),
        "greedy partial": partial,
        "greedy combine": choose,
    }


def test_pdl_images_wait_before_touching_memory(tmp_path):
    require_tool("nvcc", "Triton's ptxas builds the images")
    for name, img in _images("sm_90a").items():
        cubin = tmp_path / "k.cubin"
        cubin.write_bytes(img.cubin)
        sass = subprocess.run([str(_cuobjdump()), "-sass", str(cubin)], capture_output=True, text=True,
                              check=True).stdout
        ops = [m.group(1).strip() for m in re.finditer(r"/\*[0-9a-f]{4,}\*/\s+([^;]*);", sass)]
        wait = next((i for i, op in enumerate(ops) if op.startswith("ACQBULK")), None)
        first_memory = next((i for i, op in enumerate(ops) if MEMORY.search(op)), len(ops))
        assert wait is not None and wait < first_memory, (name, ops[: first_memory + 1])


def test_launchers_ask_for_pdl_for_every_triton_decode_kernel():
    from ninfer_compiler.ops import (
        attention_decode,
        attention_prologue,
        conv1d_decode,
        gdn_decode_fused,
        greedy,
    )

    for source in (attention_decode.HOST_SOURCE, attention_prologue.LAUNCHER, conv1d_decode.LAUNCHER,
                   gdn_decode_fused.LAUNCHER, greedy.LAUNCHER):
        calls = re.findall(r"ninfer_cuda::launch\((.*?)\);", source, re.S)
        assert calls and all(re.search(r",\s*(/\*pdl=\*/)?true$", call.strip()) for call in calls), calls
