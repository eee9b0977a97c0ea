"""Decode GEMV v5 launcher (`ops/qgemv5_host.cc`): the launch plan and the stream-K split, on the CPU.

The launcher's plan and the split functions of `qgemv5_plan.h` (the same code the kernel runs) are
built here into a small library with the C API (`NINFER_GEMV5_CAPI`, no TVM, no CUDA) and checked
for the 27B decode launches and small odd ones: every unit belongs to exactly one block, each block
gets at least one unit and an equal share of the bytes (within one unit), the blocks the kernel
reduces a split strip from are exactly those owning its units, the workspace slots and counters the
kernel derives are distinct, outputs are laid out in order, and the ring fits beside a second
launch on the SM where that leaves >= 3 stages.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess

import pytest

from ninfer_compiler.ops import qgemv

Q4, Q5, Q6, BF16 = 4, 5, 6, 16
PLAIN, SWIGLU, ADD = 0, 1, 2
ROW_BYTES = {Q4: 68, Q5: 84, Q6: 100, BF16: 256}
# (name, mode, K, [(fmt, rows, output)])
CASES = [
    ("gdn multi", PLAIN, 5120, [(Q4, 2048, 0), (Q4, 2048, 0), (Q5, 6144, 0), (Q5, 6144, 1), (BF16, 48, 2), (BF16, 48, 3)]),
    ("attn multi", PLAIN, 5120, [(Q4, 6144, 0), (Q5, 6144, 1), (Q4, 1024, 2), (Q5, 1024, 3)]),
    ("mlp swiglu", SWIGLU, 5120, [(Q4, 17408, 0), (Q4, 17408, 0)]),
    ("mlp down add", ADD, 17408, [(Q5, 5120, 0)]),
    ("gdn out add", ADD, 6144, [(Q5, 5120, 0)]),
    ("head", PLAIN, 5120, [(Q6, 248320, 0)]),
    ("q4 qk", PLAIN, 5120, [(Q4, 2048, 0)]),
    ("tiny", PLAIN, 128, [(Q4, 16, 0)]),
    ("odd tiles", PLAIN, 384, [(Q5, 48, 0), (BF16, 8, 0), (Q6, 272, 1)]),
    ("swiglu small", SWIGLU, 256, [(Q6, 48, 0), (Q6, 48, 0)]),
]
MAX_BLOCKS = 344  # NINFER_V5_MAX_BLOCKS
X_SHARED = 4 * 2048  # the staged-activation ring (NINFER_V5_XSLOTS x NINFER_V5_XSLOT)
DEVICES = {"h200": (132, 233472, 232448), "rtx5090": (170, 102400, 101376), "dgx-spark": (48, 102400, 101376)}


class Segment(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p * 2), ("high", ctypes.c_void_p * 2), ("scales", ctypes.c_void_p * 2),
                ("cost0", ctypes.c_uint64), *((f, ctypes.c_uint32) for f in (
                    "fmt", "rows", "items", "strip0", "strips", "full_cost", "last_cost", "out", "out_row0", "pad"))]


class Params(ctypes.Structure):
    _fields_ = [("x", ctypes.c_void_p), ("residual", ctypes.c_void_p), ("y", ctypes.c_void_p * 8),
                ("ws", ctypes.c_void_p), ("cnt", ctypes.c_void_p), ("total_cost", ctypes.c_uint64),
                ("y_rows", ctypes.c_uint32 * 8),
                *((f, ctypes.c_uint32) for f in ("k", "ksteps", "batch", "nblk", "nseg", "mode", "stages",
                                                 "slot_bytes", "units", "y_f32")),
                ("seg", Segment * 8), ("blk_u0", ctypes.c_uint32 * (MAX_BLOCKS + 1))]


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    cxx = shutil.which("g++")
    if cxx is None:
        pytest.skip("g++ is not on PATH")
    out = tmp_path_factory.mktemp("qgemv5") / "plan.so"
    subprocess.run([cxx, "-std=c++17", "-O1", "-shared", "-fPIC", "-Wall", "-Werror", "-DNINFER_GEMV5_NO_TVM",
                    "-DNINFER_GEMV5_CAPI", str(qgemv.V5_HOST_SOURCE), "-o", str(out), "-ldl"], check=True)
    so = ctypes.CDLL(str(out))
    so.ninfer_gemv5_prefix.restype = ctypes.c_uint64
    so.ninfer_gemv5_owner.restype = ctypes.c_uint32
    so.ninfer_gemv5_first_unit.restype = ctypes.c_uint32
    so.ninfer_gemv5_owner_of.restype = ctypes.c_uint32
    return so


def plan(lib, mode: int, k: int, weights: list, batch: int = 1, device: str = "h200", stages: int = 0):
    n = len(weights)
    u32 = ctypes.c_uint32 * n
    ptrs = ctypes.c_void_p * n
    fake = ptrs(*[0x100000 * (i + 1) for i in range(n)])
    p, grid, smem = Params(), ctypes.c_uint32(), ctypes.c_uint32()
    err = ctypes.create_string_buffer(256)
    nout = max(o for _, _, o in weights) + 1
    rc = lib.ninfer_gemv5_plan(mode, batch, k, n, u32(*[f for f, _, _ in weights]), u32(*[r for _, r, _ in weights]),
                               fake, fake, fake, u32(*[o for _, _, o in weights]), nout, *DEVICES[device], stages,
                               ctypes.byref(p), ctypes.byref(grid), ctypes.byref(smem), err, 256)
    return rc, p, grid.value, smem.value, err.value.decode()


def test_params_layout_matches(lib):
    assert lib.ninfer_gemv5_params_size() == ctypes.sizeof(Params) <= 4096


@pytest.mark.parametrize(("name", "mode", "k", "weights"), CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("device", list(DEVICES))
def test_split_covers_every_unit_once(lib, name, mode, k, weights, device):
    rc, p, grid, smem, err = plan(lib, mode, k, weights, device=device)
    assert rc == 0, err
    nblk, units, ref = p.nblk, p.units, ctypes.byref(p)
    assert grid == nblk <= DEVICES[device][0] and p.ksteps == k // 128
    assert nblk == 1 or units // nblk >= 3  # tiny launches: at least 3 units per block
    first = [lib.ninfer_gemv5_first_unit(ref, b) for b in range(nblk + 1)]
    assert first[0] == 0 and first[-1] == units
    assert list(p.blk_u0[: nblk + 1]) == first  # the table the kernel reads
    assert all(a < b for a, b in zip(first, first[1:], strict=False)), "a block without units"
    unit_cost = [lib.ninfer_gemv5_prefix(ref, u + 1) - lib.ninfer_gemv5_prefix(ref, u) for u in range(units)]
    assert sum(unit_cost) == p.total_cost and lib.ninfer_gemv5_prefix(ref, 0) == 0
    costs = []
    for b in range(nblk):
        owners = {lib.ninfer_gemv5_owner(ref, u) for u in range(first[b], first[b + 1])}
        owners |= {lib.ninfer_gemv5_owner_of(ref, u) for u in range(first[b], first[b + 1])}
        assert owners == {b}
        costs.append(sum(unit_cost[first[b] : first[b + 1]]))
    share = p.total_cost / nblk
    assert all(abs(c - share) < max(unit_cost) for c in costs), "a block's bytes differ from its share by a unit"
    # split strips as the kernel finalizes them: reducer blocks, counter index, workspace sides
    counters, slots = set(), set()
    for strip in range(units // p.ksteps):
        sbeg, send = strip * p.ksteps, (strip + 1) * p.ksteps
        bfirst, blast = lib.ninfer_gemv5_owner(ref, sbeg), lib.ninfer_gemv5_owner(ref, send - 1)
        owners = {lib.ninfer_gemv5_owner(ref, u) for u in range(sbeg, send)}
        assert owners == set(range(bfirst, blast + 1))
        if bfirst == blast:
            continue
        assert bfirst not in counters
        counters.add(bfirst)
        for b in range(bfirst, blast + 1):
            side = 0 if first[b] // p.ksteps == strip else 1
            assert (b, side) not in slots
            slots.add((b, side))
    # segments and outputs
    rows_by_out: dict[int, int] = {}
    for i in range(p.nseg):
        s = p.seg[i]
        fmt, rows, out = weights[i][0], weights[i][1], weights[i][2]
        assert s.fmt == fmt and s.rows == rows and s.out == out and s.out_row0 == rows_by_out.get(out, 0)
        rows_by_out[out] = rows_by_out.get(out, 0) + rows
        per_item = 8 if fmt == BF16 else 16 if mode == SWIGLU else 32
        assert s.items == -(-rows // per_item) and s.strips == -(-s.items // 8)
        total = rows * ROW_BYTES[fmt] * (2 if mode == SWIGLU else 1)
        assert (s.strips - 1) * s.full_cost + s.last_cost == total
    if mode != SWIGLU:
        assert [p.y_rows[o] for o in range(len(rows_by_out))] == [rows_by_out[o] for o in sorted(rows_by_out)]
    # ring: fits the SM, two launches per SM where that leaves >= 3 stages and the launch is short
    n_sm, per_sm, optin = DEVICES[device]
    assert 2 <= p.stages <= 16 and smem == X_SHARED + 8 * p.stages * p.slot_bytes <= optin - 128
    pair_fits = 2 * (smem + 128 + 1024) <= per_sm
    if p.total_cost < 128 << 20 and (per_sm // 2 - 1024 - 128 - X_SHARED) // (8 * p.slot_bytes) >= 3:
        assert pair_fits
    if name == "head" and device == "h200":
        assert not pair_fits and p.stages >= 8


def test_batches_and_stage_override(lib):
    for b in range(1, 9):
        rc, p, *_ = plan(lib, PLAIN, 5120, [(Q5, 6144, 0)], batch=b)
        assert rc == 0 and p.batch == b
    rc, p, _, smem, _ = plan(lib, PLAIN, 5120, [(Q5, 6144, 0)], stages=3)
    assert rc == 0 and p.stages == 3 and smem == X_SHARED + 8 * 3 * 2688


@pytest.mark.parametrize(("mode", "k", "weights", "batch", "message"), [
    (PLAIN, 5120, [(Q4, 2048, 0)], 9, "batch"),
    (PLAIN, 5000, [(Q4, 2048, 0)], 1, "multiple of 128"),
    (PLAIN, 5120, [(Q4, 2040, 0)], 1, "multiple of 16"),
    (PLAIN, 5120, [(BF16, 44, 0)], 1, "multiple of 16"),
    (PLAIN, 5120, [(8, 2048, 0)], 1, "format"),
    (PLAIN, 5120, [(Q4, 16, 1), (Q4, 16, 0)], 1, "output order"),
    (PLAIN, 5120, [(Q4, 16, 0)] * 9, 1, "weights"),
    (SWIGLU, 5120, [(Q4, 2048, 0), (Q5, 2048, 0)], 1, "swiglu"),
    (SWIGLU, 5120, [(BF16, 2048, 0), (BF16, 2048, 0)], 1, "swiglu"),
    (ADD, 5120, [(Q4, 16, 0), (Q4, 16, 0)], 1, "one weight"),
])
def test_plan_refuses(lib, mode, k, weights, batch, message):
    rc, *_, err = plan(lib, mode, k, weights, batch=batch)
    assert rc != 0 and message in err, err


@pytest.mark.parametrize(("name", "mode", "k", "weights"), CASES, ids=[c[0] for c in CASES])
def test_block_loop_reduces_every_strip_once(lib, name, mode, k, weights):
    """The kernel's loop (`v5_body`) replayed per block: accumulate units, finalize at each strip end
    (direct epilogue, or workspace piece + counter, the last arriving block summing in block order),
    with blocks finishing in random orders: every strip gets the sum of its units, written once, and
    the counters end at zero."""
    import random

    rc, p, *_ = plan(lib, mode, k, weights)
    assert rc == 0
    ref, ks = ctypes.byref(p), p.ksteps
    value = [(u * 7919) % 1009 + 1 for u in range(p.units)]  # exact in floating point: integers
    want = [sum(value[s * ks : (s + 1) * ks]) for s in range(p.units // ks)]
    for seed in range(3):
        order = list(range(p.nblk))
        random.Random(seed).shuffle(order)
        ws, cnt, out, written = {}, {}, {}, {}
        for blk in order:
            u0, u1 = p.blk_u0[blk], p.blk_u0[blk + 1]
            acc = 0
            for u in range(u0, u1):
                acc += value[u]
                if not (u % ks == ks - 1 or u + 1 == u1):
                    continue
                strip = u // ks
                sbeg, send = strip * ks, (strip + 1) * ks
                bfirst = blk if sbeg >= u0 else lib.ninfer_gemv5_owner_of(ref, sbeg)
                blast = blk if send <= u1 else lib.ninfer_gemv5_owner_of(ref, send - 1)
                if bfirst == blast:
                    out[strip], written[strip] = acc, written.get(strip, 0) + 1
                else:
                    side = 0 if u0 // ks == strip else 1
                    assert (blk, side) not in ws
                    ws[(blk, side)] = acc
                    old = cnt.get(bfirst, 0)
                    cnt[bfirst] = old + 1
                    if old == blast - bfirst:
                        side_first = side if bfirst == blk else (0 if p.blk_u0[bfirst] >= sbeg else 1)
                        out[strip] = sum(ws[(bb, side_first if bb == bfirst else 0)] for bb in range(bfirst, blast + 1))
                        written[strip] = written.get(strip, 0) + 1
                        cnt[bfirst] = 0
                acc = 0
        assert [out.get(s) for s in range(len(want))] == want
        assert all(v == 1 for v in written.values()) and len(written) == len(want)
        assert all(v == 0 for v in cnt.values())
