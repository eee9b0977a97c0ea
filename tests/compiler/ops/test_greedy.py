"""The device's greedy choice (`ops/greedy.py`): Triton's interpreter and the TE op against numpy
(lowest id among equal maxima, log-probability of the chosen token), and the AOT build."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")


def reference(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x = x.astype(np.float64)
    token = np.argmax(x, axis=-1)
    top = x.max(axis=-1)
    lse = top + np.log(np.exp(x - top[:, None]).sum(axis=-1))
    return token, x[np.arange(x.shape[0]), token] - lse


def logits_rows(vocab: int) -> np.ndarray:
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((4, vocab)) * 3).astype(np.float32)
    x[1, [7, vocab - 3, vocab // 2]] = 40.0  # a tie across slices: the lowest id wins
    x[2, : vocab // 2] = -np.inf  # masked-out ids (a constrained row)
    x[3, :] = 1.5  # every id equal
    return x


def triton_choice(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The two Triton kernels in Triton's interpreter (workspaces poisoned with NaN / -1)."""
    from ninfer_compiler.ops.greedy import BLOCK, SPLITS, combine_kernel, partial_kernel
    from ninfer_compiler.ops.triton_aot import interpreted

    rows, vocab = x.shape
    ws_max = torch.full((rows, SPLITS), float("nan"))
    ws_idx = torch.full((rows, SPLITS), -1, dtype=torch.int32)
    ws_sum = torch.full((rows, SPLITS), float("nan"))
    token = torch.full((rows,), -1, dtype=torch.int32)
    logprob = torch.full((rows,), float("nan"))
    interpreted(partial_kernel)[(rows, SPLITS)](torch.tensor(x), ws_max, ws_idx, ws_sum, vocab,
                                                SPLITS=SPLITS, BLOCK=BLOCK)
    interpreted(combine_kernel)[(rows,)](ws_max, ws_idx, ws_sum, token, logprob, SPLITS=SPLITS)
    return token.numpy(), logprob.numpy()


def tvm_choice(x: np.ndarray, form: str) -> tuple[np.ndarray, np.ndarray]:
    """The TE op (`te`: CPU packages) or the thread-bound TIR form (`gpu-tir-serial`: reference-kernel
    CUDA packages; its serial form computes what the GPU does), built for llvm and run."""
    import contextlib

    import tvm
    from tvm.relax.frontend import nn

    from ninfer_compiler.build import compile_module, load_vm
    from ninfer_compiler.ops.common import serial_gpu_kernels
    from ninfer_compiler.ops.greedy import greedy_choice

    class Choice(nn.Module):
        def forward(self, x: nn.Tensor):
            return greedy_choice(x)

    with serial_gpu_kernels() if form != "te" else contextlib.nullcontext():
        mod, _ = Choice().export_tvm({"forward": {"x": nn.spec.Tensor(list(x.shape), "float32")}})
    if form != "te":
        assert "greedy_choice_gpu" in mod.script()
    token, logprob = load_vm(compile_module(mod, "llvm"))["forward"](tvm.runtime.tensor(x))
    return token.numpy(), logprob.numpy()


@pytest.mark.parametrize("vocab", [1000, 70001])
def test_interpreter_matches_numpy(vocab):
    x = logits_rows(vocab)
    token, logprob = triton_choice(x)
    ref_token, ref_lp = reference(x)
    np.testing.assert_array_equal(token, ref_token)
    assert token[1] == 7 and token[3] == 0
    np.testing.assert_allclose(logprob, ref_lp, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("form", ["te", "gpu-tir-serial"])
def test_te_op_and_tir_gpu_form_match_numpy(form):
    x = logits_rows(1000)
    token, logprob = tvm_choice(x, form)
    ref_token, ref_lp = reference(x)
    np.testing.assert_array_equal(token, ref_token)
    np.testing.assert_allclose(logprob, ref_lp, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("form", ["triton", "te", "gpu-tir-serial"])
def test_nan_logits_choose_token_zero_and_a_nan_logprob(form):
    """A row of NaN logits (a broken model) must not become an id past the vocabulary, which a
    decode step queued behind this one would look up in the embedding: token 0 and a NaN
    log-probability, which the engine turns into an error for that request. Other rows unchanged."""
    x = logits_rows(1000)
    x[2, :] = np.nan
    token, logprob = triton_choice(x) if form == "triton" else tvm_choice(x, form)
    ref_token, ref_lp = reference(x)
    assert token[2] == 0 and np.isnan(logprob[2])
    keep = [0, 1, 3]
    np.testing.assert_array_equal(token[keep], ref_token[keep])
    np.testing.assert_allclose(logprob[keep], ref_lp[keep], rtol=1e-5, atol=1e-5)


def test_builds_for_every_cuda_arch():
    from ninfer_compiler.ops.greedy import images

    for arch in ("sm_90a", "sm_120a", "sm_121a"):
        partial, combine = images(arch)
        assert partial.fatbin and combine.fatbin


def test_tir_gpu_form_builds_for_cuda():
    import shutil

    import tvm

    from ninfer_compiler.codegen.targets import tvm_target
    from ninfer_compiler.codegen.toolchain import cuda_build
    from ninfer_compiler.ops.greedy import greedy_gpu_func
    from ninfer_runtime import targets

    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not on PATH")
    target = tvm_target(targets.load("h200"))
    func = greedy_gpu_func(248320, True).with_attr("global_symbol", "greedy_gpu")
    with cuda_build(target):
        tvm.tirx.build(tvm.IRModule({"greedy_gpu": func}), target=target)
