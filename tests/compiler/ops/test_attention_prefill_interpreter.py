"""Prefill attention kernel (`ops/attention_prefill.py`) under Triton's CPU interpreter.

tests/conftest.py chooses the interpreter before Triton is imported (`TRITON_INTERPRET=1`); run as
a script with that variable set, the file runs the same cases. Tiny shapes with scattered pages, a
nonzero context, token counts that are not a multiple of the tile and several sequences, against
a float64 causal attention.
"""

from __future__ import annotations

import sys

import pytest

HQ, HKV, D, PS = 6, 2, 32, 4
# (context lengths per sequence, new tokens, (BLOCK_M, BLOCK_N, num_warps, num_stages))
CASES = [
    ([5, 0, 23], 13, (16, 8, 4, 1)),  # several sequences, T not a multiple of BLOCK_M
    ([9], 21, (8, 16, 4, 1)),  # BLOCK_N > BLOCK_M: a masked block spans several query blocks
    ([0], 16, (16, 8, 4, 1)),  # no context, T a multiple of the tile
    ([37], 6, (16, 16, 4, 1)),  # a short chunk after a long context: mostly unmasked blocks
]


def _case(torch, seed: int, lens: list[int], t: int, layers: int = 2):
    """Random bf16 q and pool with each sequence's pages scattered over the pool."""
    gen = torch.Generator().manual_seed(seed)
    b = len(lens)
    pages_per_seq = -(-(max(lens) + t) // PS)
    num_pages = b * pages_per_seq + 5
    table = torch.randperm(num_pages, generator=gen)[: b * pages_per_seq].view(b, pages_per_seq)
    pool = torch.randn(layers, num_pages, 2, HKV, PS, D, generator=gen).to(torch.bfloat16)
    q = torch.randn(b, t, HQ, D, generator=gen).to(torch.bfloat16)
    return q, pool, table.to(torch.int32).contiguous(), torch.tensor(lens, dtype=torch.int32)


def _reference(torch, q, kv_layer, table, lens, scale):
    """float64 causal attention: token t of sequence b sees positions 0..lens[b] + t."""
    b, t, hq, d = q.shape
    out = torch.zeros(b, t, hq, d, dtype=torch.float64)
    for s in range(b):
        n = int(lens[s]) + t
        pos = torch.arange(n)
        page = table[s, pos // PS].long()
        k = kv_layer[page, 0, :, pos % PS].double()  # [n, HKV, D]
        v = kv_layer[page, 1, :, pos % PS].double()
        visible = pos[None, :] <= (int(lens[s]) + torch.arange(t))[:, None]
        for h in range(hq):
            scores = (q[s, :, h].double() @ k[:, h // (hq // HKV)].T) * scale
            scores = scores.masked_fill(~visible, float("-inf"))
            out[s, :, h] = torch.softmax(scores, -1) @ v[:, h // (hq // HKV)]
    return out


def main() -> int:
    """Run every case; print the worst error of each and return nonzero on a failure."""
    import torch

    from ninfer_compiler.ops import attention_prefill as ap

    failed = 0
    for i, (lens, t, block) in enumerate(CASES):
        q, pool, table, seq_lens = _case(torch, i + 1, lens, t)
        out = torch.full_like(q, float("nan"))
        ap.run_torch(q, pool[1], table, seq_lens, out=out, block=block, f32_dot=True)
        ref = _reference(torch, q, pool[1], table, seq_lens, D**-0.5)
        diff = (out.double() - ref).abs()
        err = diff.max().item()
        # one bf16 ulp of the output (the interpreter truncates to bf16) plus fp32 summation order
        ok = bool(torch.isfinite(out).all()) and bool((diff <= ref.abs() / 128 + 2e-3).all())
        failed += not ok
        print(f"case {i}: lens={lens} T={t} block={block} max|err|={err:.2e} {'ok' if ok else 'FAIL'}")
    return 1 if failed else 0


def test_interpreter_matches_float64_reference(capsys):
    """In-process: tests/conftest.py sets TRITON_INTERPRET=1 before Triton is imported."""
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    failed = main()
    out = capsys.readouterr().out
    assert failed == 0, out
    assert out.count(" ok") == len(CASES), out


if __name__ == "__main__":
    sys.exit(main())
