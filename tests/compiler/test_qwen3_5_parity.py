"""Logits parity of the compiled tiny Qwen3.5 Dense with transformers (fp32, CPU).

Acceptance: relative error <= 1e-4 and identical greedy continuations for one-shot
prefill, chunked prefill and prefill + token-by-token decode; batched decode of three
sequences of different lengths equals each decoded alone.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from tests.compiler.qwen3_5_harness import Driver, compile_tiny, rel_err  # noqa: E402

pytestmark = pytest.mark.slow

PROMPT_LEN = 75  # > 64, so HF's chunked GDN has a second chunk
NEW_TOKENS = 32
TOL = 1e-4


@pytest.fixture(scope="module")
def setup():
    hf, cfg, compiled, params = compile_tiny()
    print(f"\ntiny qwen3_5: export {compiled.export_seconds:.2f} s, compile {compiled.compile_seconds:.2f} s")
    prompt = np.random.default_rng(0).integers(2, 400, size=PROMPT_LEN)
    with torch.no_grad():
        out = hf.generate(
            torch.tensor(prompt[None]), max_new_tokens=NEW_TOKENS, do_sample=False,
            eos_token_id=None, pad_token_id=0,
        )  # fmt: skip
        full = out[0].numpy()
        ref_logits = hf(torch.tensor(full[None])).logits[0].numpy()
    return {
        "hf": hf, "cfg": cfg, "compiled": compiled, "params": params, "prompt": prompt,
        "continuation": full[PROMPT_LEN:], "ref_logits": ref_logits,
    }  # fmt: skip


def driver(s) -> Driver:
    from ninfer_compiler.frontend.options import ModelOptions

    return Driver(s["compiled"], s["params"], s["cfg"], ModelOptions())


def greedy_continue(d: Driver, seq, first_logits: np.ndarray, s) -> tuple[list[int], float]:
    """Greedy decode NEW_TOKENS tokens; returns the tokens and the worst logits error."""
    tokens, worst, logits = [], 0.0, first_logits
    ref = s["ref_logits"]
    for i in range(NEW_TOKENS):
        worst = max(worst, rel_err(logits, ref[PROMPT_LEN - 1 + i]))
        tok = int(np.argmax(logits))
        tokens.append(tok)
        if i + 1 < NEW_TOKENS:
            logits = d.decode([seq], np.array([tok]))[0]
    return tokens, worst


def test_one_shot_prefill(setup):
    d = driver(setup)
    seq = d.new_sequence()
    logits = d.prefill(seq, setup["prompt"], all_logits=True)
    err = rel_err(logits, setup["ref_logits"][:PROMPT_LEN])
    tokens, worst = greedy_continue(d, seq, logits[-1], setup)
    print(f"one-shot prefill: prompt rel err {err:.2e}, decode rel err {worst:.2e}")
    assert err <= TOL and worst <= TOL
    assert tokens == list(setup["continuation"])


def test_chunked_prefill(setup):
    d = driver(setup)
    seq = d.new_sequence()
    prompt, parts = setup["prompt"], []
    for lo, hi in ((0, 17), (17, 50), (50, PROMPT_LEN)):
        parts.append(d.prefill(seq, prompt[lo:hi], all_logits=True))
    logits = np.concatenate(parts)
    err = rel_err(logits, setup["ref_logits"][:PROMPT_LEN])
    tokens, worst = greedy_continue(d, seq, logits[-1], setup)
    print(f"chunked prefill 17+33+25: prompt rel err {err:.2e}, decode rel err {worst:.2e}")
    assert err <= TOL and worst <= TOL
    assert tokens == list(setup["continuation"])


def test_last_token_prefill_matches_all_logits(setup):
    d = driver(setup)
    seq = d.new_sequence()
    last = d.prefill(seq, setup["prompt"])
    assert last.shape == (1, setup["cfg"].vocab_size)
    assert rel_err(last[0], setup["ref_logits"][PROMPT_LEN - 1]) <= TOL


def test_prefill_then_token_by_token_decode(setup):
    d = driver(setup)
    seq = d.new_sequence()
    prompt, split = setup["prompt"], 5
    rows = [d.prefill(seq, prompt[:split], all_logits=True)]
    for tok in prompt[split:]:
        rows.append(d.decode([seq], np.array([tok])))
    logits = np.concatenate(rows)
    err = rel_err(logits, setup["ref_logits"][:PROMPT_LEN])
    tokens, worst = greedy_continue(d, seq, logits[-1], setup)
    print(f"prefill 5 + decode 70: prompt rel err {err:.2e}, decode rel err {worst:.2e}")
    assert err <= TOL and worst <= TOL
    assert tokens == list(setup["continuation"])


def test_batched_decode_equals_single(setup):
    d = driver(setup)
    rng = np.random.default_rng(3)
    seqs = [d.new_sequence() for _ in range(3)]
    for seq, n in zip(seqs, (70, 23, 41), strict=True):
        d.prefill(seq, rng.integers(2, 400, size=n))
    ids = np.array([11, 222, 333])
    before = d.snapshot()
    lengths = [s.length for s in seqs]
    batched = d.decode(seqs, ids)
    after_batched = d.snapshot()
    for i, seq in enumerate(seqs):
        d.restore(before)
        seq.length = lengths[i]
        alone = d.decode([seq], ids[i : i + 1])
        np.testing.assert_allclose(batched[i], alone[0], rtol=1e-6, atol=1e-6)
        # the batched step wrote this sequence's state exactly as the single step did
        _, gdn, conv = d.snapshot()
        np.testing.assert_allclose(after_batched[1][:, seq.slot], gdn[:, seq.slot], atol=1e-6)
        np.testing.assert_allclose(after_batched[2][:, seq.slot], conv[:, seq.slot], atol=1e-6)


def test_exported_library_runs_in_runtime_vm(setup, tmp_path):
    """The .so path the runtime uses: export, load, `tvm.runtime.vm.VirtualMachine`."""
    import tvm
    from tvm.runtime.vm import VirtualMachine

    path = tmp_path / "tiny_qwen3_5.so"
    setup["compiled"].executable.export_library(str(path))
    d = driver(setup)
    d.vm = VirtualMachine(tvm.runtime.load_module(str(path)), tvm.cpu())
    seq = d.new_sequence()
    logits = d.prefill(seq, setup["prompt"][:20], all_logits=True)
    assert rel_err(logits, setup["ref_logits"][:20]) <= TOL
