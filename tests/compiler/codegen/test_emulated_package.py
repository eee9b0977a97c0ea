"""The GPU kernels end to end on the CPU: the tiny model in bf16 with the serial forms of the GPU
kernels, through the same checks the H200 run applies (tests/gpu/check_h200_tiny.py).

This keeps the GPU check script working and the GPU kernels' arithmetic right between GPU runs;
what only a GPU shows (thread binding, barriers, CUDA graphs) is the H200 run's part.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ninfer_compiler.compile import CompileOptions, compile_artifact
from ninfer_compiler.ops.common import serial_gpu_kernels
from ninfer_compiler.testmodel.factory import create_model
from ninfer_runtime.runner import ModelRunner, RunnerOptions
from tests.gpu import check_h200_tiny as check

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def reference() -> dict:
    model, _ = create_model("qwen3_5")
    prompt = check.PROMPT
    with torch.no_grad():
        greedy = model.generate(torch.tensor([prompt]), max_new_tokens=check.STEPS, do_sample=False,
                                eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
        logits = model(input_ids=torch.tensor([prompt + greedy])).logits[0].float().numpy()
    return {"prompt": np.array(prompt), "greedy": np.array(greedy), "logits": logits}


@pytest.mark.parametrize(("dtype", "tol"), [("float32", 1e-4), ("bfloat16", check.RUN["pkg-h200"][1])])
def test_gpu_kernels_serial_end_to_end(tiny_artifact, tmp_path, reference, dtype, tol):
    with serial_gpu_kernels():
        compile_artifact(tiny_artifact, tmp_path / "pkg",
                         CompileOptions(activation_dtype=dtype, max_context=1024, prefill_chunk=128, max_batch=4))
    runner = ModelRunner(tmp_path / "pkg", options=RunnerOptions(max_active=4, context_bytes=64 << 20))
    r = check._exercise(runner, reference)
    assert max(r["prefill_rel"], r["pieces_rel"], r["decode_rel"]) <= tol, r
    assert r["teacher_ok"] and r["batched_rel"] <= 1e-6
    if dtype == "float32":
        assert r["greedy"] == reference["greedy"].tolist()
