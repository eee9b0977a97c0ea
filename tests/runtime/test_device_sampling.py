"""Sampling requests drawn on the device (`ModelRunner.decode_drawn`, the package's `sample`
function): the engine sends plain draws there and takes the tokens back, the rows that need their
logits on the host (penalties, alternatives, constraints) still get them, and the tokens are those
of the host's draw. The tiny package here is a CPU one, which has no `sample` function: the runner
is given one that runs the Triton kernels in Triton's interpreter, launched as the CUDA package's
launcher launches them (tests/compiler/ops/test_device_sampling.py)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tvm

from ninfer_runtime.engine import GenerationParams
from ninfer_runtime.package import PackageError
from ninfer_runtime.sampling import DEVICE_FILLER, SELECT_KEPT, SamplingParams

from .engine_helpers import GREEDY, alone, prompts, staggered, tokens_of

pytest.importorskip("triton")


class _VM:
    """The runner's VM with a `sample` function added (the kernels in Triton's interpreter)."""

    def __init__(self, vm, calls: list) -> None:
        self._vm, self.calls, self.selections = vm, calls, []

    def __getitem__(self, name: str):
        if name != "sample":
            return self._vm[name]

        def sample(logits: tvm.runtime.Tensor, params: tvm.runtime.Tensor, selections: tvm.runtime.ShapeTuple):
            from tests.compiler.ops.test_device_sampling import device_choice

            # the package's function takes its int input as a one-value shape (a bare int is refused)
            assert isinstance(selections, tvm.runtime.ShapeTuple) and len(selections) == 1, selections
            selections = int(selections[0])
            x, p = logits.numpy(), params.numpy()
            self.calls.append(p.copy())
            self.selections.append(selections)
            token, logprob = device_choice(np.ascontiguousarray(x), p, selections)
            return tvm.runtime.tensor(token), tvm.runtime.tensor(logprob)

        return sample


def drawing(runner) -> list:
    """Give `runner` a device `sample` function; the list of its calls' params."""
    calls: list = []
    runner.vm = _VM(runner.vm, calls)
    runner.manifest.raw["functions"]["sample"] = {"outputs": ["sample_token", "sample_logprob"]}
    return calls


def sampled(seed: int, **fields) -> GenerationParams:
    """A seeded draw that reports the chosen token's log-probability (logprobs 0: no alternatives)."""
    return GenerationParams(max_tokens=4, ignore_eos=True,
                            sampling=SamplingParams(temperature=0.8, seed=seed, logprobs=0, **fields))


def test_plain_draws_are_drawn_on_the_device_with_the_hosts_tokens(make_engine, make_runner):
    """Two seeded draws batched: queued steps, the tokens and log-probabilities of the host's draws."""
    host = make_engine()
    a, b = prompts((11, 7), seed=21)
    requests = [(a, sampled(5, top_p=0.9)), (b, sampled(9, top_k=20, min_p=0.05))]
    reference = [alone(host, p, q) for p, q in requests]
    runner = make_runner()
    calls = drawing(runner)
    engine = make_engine(runner)
    asked = []
    rows = runner.decode_rows
    runner.decode_rows = lambda seqs, toks, want, **kw: asked.append(list(want)) or rows(seqs, toks, want, **kw)
    queued, real = [], runner.decode_greedy_async

    def spy(seqs, toks, **kw):
        queued.append((sorted(kw.get("draws") or {}), kw.get("feed") is not None))
        return real(seqs, toks, **kw)

    runner.decode_greedy_async = spy
    handles, peak = staggered(engine, requests, (0, 0))
    assert peak == 2
    assert [h.output_ids for h in handles] == [tokens_of(r) for r in reference]
    for h, ref in zip(handles, reference, strict=True):
        got = [e.logprob for e in h.events() if e.token is not None]
        np.testing.assert_allclose(got, [e.logprob for e in ref if e.token is not None], rtol=1e-5, atol=1e-5)
    assert asked == []  # no logits row came to the host after the prompts
    # the steps were queued as greedy ones are, the next one fed on the device by the draw before it
    assert ([0, 1], True) in queued and all(draws for draws, _ in queued)
    rows = np.concatenate(calls)
    assert len(rows) == 6 and any(len(c) == 2 for c in calls)  # tokens 2..4 of both, together where batched
    assert {tuple(r[:4]) for r in rows} == {(0.8, 0, 0.9, 0), (0.8, 20, 1.0, 0.05)}
    # no row has both top-k and top-p: the top-k cut's passes are never launched
    assert runner.vm.selections == [SELECT_KEPT] * len(calls)


def test_rows_that_need_their_logits_still_get_them(make_engine, make_runner):
    """A batch of a greedy row, a plain draw and a draw with a penalty: only the last one's logits
    come to the host, the draw goes to the device, every row's tokens are its tokens alone."""
    host = make_engine()
    a, b, c = prompts((9, 12, 6), seed=4)
    greedy = GenerationParams(max_tokens=4, sampling=GREEDY, ignore_eos=True)
    penalized = dataclasses.replace(sampled(3), sampling=SamplingParams(temperature=0.9, seed=3,
                                                                        presence_penalty=0.5))
    requests = [(a, greedy), (b, sampled(8, top_k=5)), (c, penalized)]
    reference = [tokens_of(alone(host, p, q)) for p, q in requests]
    runner = make_runner()
    calls = drawing(runner)
    asked = []
    drawn = runner.decode_drawn

    def spy(seqs, toks, draws, want=(), **kw):
        asked.append((sorted(draws), list(want)))
        return drawn(seqs, toks, draws, want, **kw)

    runner.decode_drawn = spy
    handles, _ = staggered(make_engine(runner), requests, (0, 0, 0))
    assert [h.output_ids for h in handles] == reference
    # tokens 2..4 of the draw on the device (in the synchronous steps beside the penalized request,
    # queued without it), every other row of a `sample` call a filler without cuts; beside the draws
    # at most the penalized request's logits came to the host
    rows = [list(r[:4]) for call in calls for r in call]
    assert rows.count([0.8, 5, 1.0, 0.0]) == 3
    assert all(r in ([0.8, 5, 1.0, 0.0], DEVICE_FILLER[:4]) for r in rows)
    assert DEVICE_FILLER[:4] in rows and set(runner.vm.selections) == {SELECT_KEPT}
    assert asked and all(len(d) == 1 and len(w) <= 1 and not set(w) & set(d) for d, w in asked)
    assert any(w for _, w in asked)


def test_decode_drawn_needs_the_function_and_valid_rows(make_runner):
    runner = make_runner()
    seq = runner.pool.acquire()
    try:
        runner.prefill(seq, [3, 4, 5])
        with pytest.raises(PackageError, match="does not draw sampled tokens on the device"):
            runner.decode_drawn([seq], [6], {0: [0.8, 0, 1.0, 0.0, 0.5]})
        drawing(runner)
        for rows, match in (({1: [0.8, 0, 1.0, 0.0, 0.5]}, "outside the batch"),
                            ({0: [0.0, 0, 1.0, 0.0, 0.5]}, "temperature > 0"),
                            ({0: [0.8, 0, 1.0, 0.0, 1.0]}, "u in \\[0, 1\\)")):
            with pytest.raises(ValueError, match=match):
                runner.decode_drawn([seq], [6], rows)
        ids, _, logits, drawn = runner.decode_drawn([seq], [6], {0: [0.8, 0, 1.0, 0.0, 0.25]})
        assert logits.shape[0] == 0 and set(drawn) == {0} and 0 <= drawn[0][0] < runner.manifest.raw["model"]["vocab_size"]
    finally:
        runner.pool.release(seq)


def test_bench_times_steps_drawn_on_the_device(make_runner):
    from ninfer_runtime.bench import run_bench

    runner = make_runner()
    calls = drawing(runner)
    report = run_bench(runner, prompt_len=20, decode_tokens=2, concurrency=[2], repeats=1, warmup=0,
                       copy_bytes=1 << 20, decode_context=30)
    (row,) = report.decode
    assert row.drawn_step_ms is not None and row.drawn_step_ms > 0
    assert len(calls) == 2 and all(c.shape == (2, 5) for c in calls)
    assert "drawn ms" in report.table()


def test_an_int_input_reaches_the_packed_function_as_the_runner_passes_it():
    """`sample`'s `selections` is an int input (`spec.Int`) handed to a packed function through
    `dps_call`, as the package builds it: a CPU module of the same shape, called with `int_input`."""
    import tvm_ffi
    from tvm import relax
    from tvm.relax.frontend import nn
    from tvm.relax.frontend.nn import spec

    from ninfer_compiler.ops.cuda_extern import dps_call
    from ninfer_runtime.runner import int_input

    seen = []

    @tvm_ffi.register_global_func("ninfer_test.scaled", override=True)
    def scaled(x, k, out) -> None:  # noqa: ANN001
        seen.append(k)
        out.copyfrom(x.numpy() * k)

    class Scaled(nn.Module):
        def f(self, x: nn.Tensor, k) -> nn.Tensor:  # noqa: ANN001
            return dps_call("ninfer_test.scaled", [x, k], [nn.Tensor.placeholder([3], "float32")])

    mod, _ = Scaled().export_tvm(spec={"f": {"x": spec.Tensor([3], "float32"), "k": spec.Int(),
                                             "$": {"param_mode": "none", "effect_mode": "none"}}})
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    out = vm["f"](tvm.runtime.tensor(np.arange(3, dtype=np.float32)), int_input(3))
    assert seen == [3] and out.numpy().tolist() == [0.0, 3.0, 6.0]
    with pytest.raises(TypeError):  # a bare int is refused by the function's signature check
        vm["f"](tvm.runtime.tensor(np.arange(3, dtype=np.float32)), 3)
