"""A tiny compiled cpu package shared by the runtime tests (built once per session, ~5 s), and
engines over it that check, when the test ends, that every KV page and state slot came back."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_package(tmp_path_factory) -> Path:
    """The tiny random Qwen3.5 Dense model, bf16, compiled for cpu (max_context 1024, chunk 32)."""
    from ninfer_compiler.compile import CompileOptions, compile_artifact
    from ninfer_compiler.convert.driver import convert
    from ninfer_compiler.testmodel.factory import cached_hf_model

    root = tmp_path_factory.mktemp("tiny-package")
    art = root / "model.ninfer"
    convert(cached_hf_model("qwen3_5"), art, "bf16")
    compile_artifact(art, root / "pkg", CompileOptions(max_context=1024, prefill_chunk=32))
    return root / "pkg"


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_package):
    from ninfer_runtime.package import load_tokenizer

    return load_tokenizer(tiny_package)


@pytest.fixture
def make_runner(tiny_package) -> Iterator[Callable]:
    """`make_runner(**RunnerOptions fields)`; every runner's pool must be empty at teardown."""
    from ninfer_runtime.runner import ModelRunner, RunnerOptions

    runners = []

    def make(**options):
        runner = ModelRunner(tiny_package, options=RunnerOptions(**options))
        runners.append(runner)
        return runner

    yield make
    for runner in runners:
        runner.pool.check_all_free()


@pytest.fixture
def make_engine(make_runner, tiny_tokenizer) -> Iterator[Callable]:
    """`make_engine(runner=None, **Engine kwargs)`; background threads are stopped at teardown."""
    from ninfer_runtime.engine import Engine

    engines = []

    def make(runner=None, **kwargs):
        engine = Engine(runner or make_runner(), tiny_tokenizer, **kwargs)
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.stop()
