"""Split-KV decode attention (`ops/attention_decode.py`): Triton's CPU interpreter against float64.

bf16 `tl.dot` is wrong in the interpreter (Triton 3.9), so the kernels, which are generic in the
element type, run here with fp16 and fp32 tensors; bf16 is checked on the GPU
(tests/gpu/check_attention_decode.py) and compiled ahead of time below.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from ninfer_compiler.ops import attention_decode as ad  # noqa: E402

HQ, HKV, D, PS = 6, 2, 32, 16


def _case(lengths: list[int], dtype, seed: int = 0, width: int | None = None):
    """Pool for 2 layers with pages shuffled, page table `[B, P]`, `seq_lens = length - 1`, q."""
    gen = torch.Generator().manual_seed(seed)
    pages = [-(-n // PS) for n in lengths]
    total = sum(pages) + 3
    pool = torch.randn((2, total, 2, HKV, PS, D), generator=gen).to(dtype)
    perm = torch.randperm(total, generator=gen).to(torch.int32)
    table = torch.full((len(lengths), width or max(pages)), total - 1, dtype=torch.int32)
    at = 0
    for b, n in enumerate(pages):
        table[b, :n] = perm[at:at + n]
        at += n
    lens = torch.tensor([n - 1 for n in lengths], dtype=torch.int32)
    q = torch.randn((len(lengths), 1, HQ, D), generator=gen).to(dtype)
    return pool, table, lens, q


def _reference(kv, table, lens, q, scale):
    """Token `b` over positions `0..seq_lens[b]` (the CPU op's causal range), float64."""
    out = torch.empty(q.shape, dtype=torch.float64)
    g = HQ // HKV
    for b in range(q.shape[0]):
        n = int(lens[b]) + 1
        j = torch.arange(n)
        rows = kv[table[b, j // PS].long(), :, :, j % PS].double()  # [n, 2, Hkv, D]
        s = torch.einsum("hgd,nhd->hgn", q[b, 0].double().view(HKV, g, D), rows[:, 0]) * scale
        out[b, 0] = torch.einsum("hgn,nhd->hgd", torch.softmax(s, -1), rows[:, 1]).reshape(HQ, D)
    return out


@pytest.mark.parametrize(
    ("lengths", "splits", "target", "block_n"),
    [
        ([1, 40, 150], 16, 1056, 32),  # one split each (the batch is small), a page table wider than needed
        ([600], 64, 4096, 16),  # 38 splits of one tile: the combine loops over 3 chunks
        ([300], 4, 4096, 16),  # capped at 4 splits of 5 tiles each
        ([17, 1, 33, 64], 8, 8, 32),  # split size set by the whole batch's tiles
    ],
)
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_matches_dense_reference(lengths, splits, target, block_n, dtype):
    dt = getattr(torch, dtype)
    pool, table, lens, q = _case(lengths, dt, width=max(-(-n // PS) for n in lengths) + 2)
    scale = 1.0 / math.sqrt(D)
    ws = torch.full((len(lengths), ad.workspace_width(HQ, D, splits)), float("nan"))
    o = torch.full_like(q, float("nan"))
    ad.launch_torch(q, pool[1], table, lens, scale, ws, o, splits=splits, target=target, block_n=block_n,
                    interpret=True)
    ref = _reference(pool[1], table, lens, q, scale)
    tol = 2e-3 if dtype == "float16" else 2e-5
    assert torch.isfinite(o).all()
    assert (o.double() - ref).abs().max().item() <= tol * ref.abs().max().item()


@pytest.mark.parametrize(
    ("lengths", "splits", "target", "block_n"),
    [
        ([1, 40, 150], 16, 1056, 32),  # one split each: the new token in the first tile (1) or a later one
        ([600], 64, 4096, 16),  # 38 splits of one tile: the new token alone in the last split's only tile
        ([300], 4, 4096, 16),  # 4 splits of 5 tiles: the first tile early, the rest in the loop
        ([17, 1, 33, 64], 8, 8, 32),  # unused splits return; the new token on a tile's first row (17, 33)
    ],
)
def test_early_tile_gives_the_same_bits(lengths, splits, target, block_n):
    """EARLY (the first tile but the new token's row read before the PDL wait) computes the same
    operations in the same order: the workspace and the output are bit for bit those of the plain form."""
    pool, table, lens, q = _case(lengths, torch.float32, seed=11, width=max(-(-n // PS) for n in lengths) + 2)
    runs = []
    for early in (False, True):
        ws = torch.full((len(lengths), ad.workspace_width(HQ, D, splits)), float("nan"))
        o = torch.full_like(q, float("nan"))
        ad.launch_torch(q, pool[1], table, lens, 0.17, ws, o, splits=splits, target=target, block_n=block_n,
                        interpret=True, early=early)
        runs.append((o, ws))
    assert torch.isfinite(runs[1][0]).all()
    assert torch.equal(runs[0][0], runs[1][0])
    assert torch.equal(torch.nan_to_num(runs[0][1], nan=7.0), torch.nan_to_num(runs[1][1], nan=7.0))


def test_early_tile_reads_the_new_token_after_the_wait():
    """The EARLY form's loads before `pdl_enter`: the page table and the pool (and the lengths, through
    the split plan), the pool's masked off the new token's position (keys - 1)."""
    import inspect
    import re

    source = inspect.getsource(ad._split_kernel.fn)
    early = source[source.index("if EARLY:  # the first tile"):]
    early = early[:early.index("pdl_enter(PDL)")]
    assert set(re.findall(r"tl\.load\(\s*(\w+)", early)) == {"pages_ptr", "kv_ptr"}
    assert "old = j < tl.where(split < used, tl.minimum(first_end, keys - 1), 0)" in early
    assert all("mask=old[:, None]" in line for line in early.splitlines() if "tl.load(kv_ptr" in line)
    assert "tl.store" not in early


def test_another_layer_is_not_read():
    """Layer 0 filled with NaN: the kernels read only the layer they are given."""
    pool, table, lens, q = _case([70, 5], torch.float32, seed=3)
    pool[0] = float("nan")
    o, _ = ad.launch_torch(q, pool[1], table, lens, 0.125, interpret=True, splits=8)
    assert torch.isfinite(o).all()


def test_split_plan_matches_kernels():
    """Unused splits write nothing: a workspace poisoned with NaN still gives finite outputs."""
    pool, table, lens, q = _case([1], torch.float32, seed=5)
    ws = torch.full((1, ad.workspace_width(HQ, D, 16)), float("nan"))
    o, ws = ad.launch_torch(q, pool[1], table, lens, 0.2, ws, splits=16, interpret=True)
    assert torch.isfinite(o).all()
    assert torch.isnan(ws[0, HQ * 16 * D + 1 : HQ * 16 * D + 16]).all()  # head 0, splits 1.. untouched


def test_gated_combine_multiplies_by_the_sigmoid_of_the_gate():
    """GATED: the combine's output is the (bf16-rounded) attention times sigmoid(gate), per element."""
    pool, table, lens, q = _case([70, 5, 130], torch.float32, seed=7)
    gate = torch.randn((3, 1, HQ * D), generator=torch.Generator().manual_seed(8)) * 3
    plain, _ = ad.launch_torch(q, pool[1], table, lens, 0.125, interpret=True, splits=8)
    gated = torch.full((3, 1, HQ * D), float("nan"))
    ad.launch_torch(q, pool[1], table, lens, 0.125, o=gated, interpret=True, splits=8, gate=gate)
    want = plain.reshape(3, 1, HQ * D).double() * torch.sigmoid(gate.double())
    assert torch.isfinite(gated).all()
    # the attention output is rounded to bf16 before the gate (as the unfused bf16 graph stores it)
    assert (gated.double() - want).abs().max().item() <= 8e-3 * want.abs().max().item()
    assert (gated.double() - want).abs().max().item() > 0  # the rounding happened: not the fp32 product


def test_gated_combine_writes_int8_activations():
    """XQ: a batch of 4 rows' gated output also as the decode GEMVs' int8 activations, byte for byte
    what the decode norm's `norm_xq8` writes for the same bf16 values (tests/compiler/ops/test_qgemv_i8.py);
    at 5 rows nothing (the GEMV reads the output there); the output as without XQ."""
    import numpy as np

    from .test_qgemv_i8 import _norm_xq

    hq, hkv, d, b = 4, 2, 64, 5  # 256 outputs: four groups, one per head
    assert ad.xq_supported(hq, d) and not ad.xq_supported(hq, 32)
    gen = torch.Generator().manual_seed(9)
    pool = torch.randn((2, 12, 2, hkv, PS, d), generator=gen)
    table = torch.arange(10, dtype=torch.int32).reshape(5, 2)
    lens = torch.tensor([3, 20, 31, 0, 17], dtype=torch.int32)
    q = torch.randn((b, 1, hq, d), generator=gen)
    gate = torch.randn((b, 1, hq * d), generator=gen) * 3
    outs = {}
    for rows in (4, b):
        for with_xq in (False, True):
            o = torch.zeros((rows, 1, hq * d), dtype=torch.bfloat16)
            xq = torch.full((hq * d * 8 + hq * d // 256 * 64,), 0x5A, dtype=torch.uint8) if with_xq else None
            ad.launch_torch(q[:rows], pool[1], table[:rows], lens[:rows], 0.125, o=o, interpret=True, splits=8,
                            gate=gate[:rows], xq=xq)
            outs[rows, with_xq] = (o, xq)
        assert torch.equal(outs[rows, False][0], outs[rows, True][0])
    assert torch.isfinite(outs[4, True][0].float()).all() and (outs[b, True][1] == 0x5A).all()
    want = _norm_xq(outs[4, True][0].float().numpy().reshape(4, hq * d).astype(np.float64))
    got = outs[4, True][1].numpy()
    width = hq * d
    np.testing.assert_array_equal(got[:width * 8], want[:width * 8])
    np.testing.assert_allclose(got[width * 8:].view(np.float32), want[width * 8:].view(np.float32), rtol=3e-7)
