"""Fixtures for the CUDA code generation tests (CPU only: nothing here needs a GPU).

The tools a GPU build needs are the CUDA toolkit's nvcc and, for the DGX Spark's AArch64 host
code, Debian's `aarch64-linux-gnu-g++` (installed by `scripts/setup.sh` when run as root, so
`.ci/run` has it). Where one is missing the dependent tests skip and say which tool, except
under CI (`CI` set), where a missing tool is a failure: CI must always check these packages.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

pytest.importorskip("tvm")


def require_tool(tool: str, hint: str) -> None:
    if shutil.which(tool) is not None:
        return
    message = f"{tool} is not on PATH ({hint})"
    if os.environ.get("CI"):
        pytest.fail(message + "; CI must build the GPU packages")
    pytest.skip(message)


@pytest.fixture
def nvcc() -> None:
    require_tool("nvcc", "the CUDA toolkit builds device code")


@pytest.fixture(scope="session")
def tiny_artifact(tmp_path_factory) -> Path:
    """The tiny random Qwen3.5 Dense model converted to a bf16 artifact."""
    from ninfer_compiler.convert.driver import convert
    from ninfer_compiler.testmodel.factory import cached_hf_model

    art = tmp_path_factory.mktemp("codegen") / "model.ninfer"
    convert(cached_hf_model("qwen3_5"), art, "bf16")
    return art
