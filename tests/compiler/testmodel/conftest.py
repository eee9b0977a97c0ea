"""Fixtures for the test-model factory tests: each architecture is built once per session."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from ninfer_compiler.testmodel.factory import build_hf_model


@pytest.fixture(scope="session")
def hf_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """`hf_model_dir(arch)` -> directory of the seed-0 model of `arch`, built on first use."""
    built: dict[str, Path] = {}

    def get(arch: str) -> Path:
        if arch not in built:
            built[arch] = build_hf_model(arch, tmp_path_factory.mktemp(arch))
        return built[arch]

    return get
