"""The fused GDN decode step (`ops/gdn_decode_fused.py`): Triton's interpreter against a numpy
float64 composition of the unfused ops, and an h200 library whose decode graph captures it."""

from __future__ import annotations

import re

import numpy as np
import pytest

from ..conftest import build_launcher, h200_library

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

HK, HV, DK, DV = 2, 4, 16, 32
C = 2 * HK * DK + HV * DV
EPS = 1e-6


def bf16(x: np.ndarray) -> np.ndarray:
    return torch.tensor(x, dtype=torch.float32).bfloat16().float().numpy().astype(np.float64)


def reference(mixed, a, b, a_log, dt_bias, z, w, state, slots, lens, layer):
    state = state.copy()
    out = np.zeros((mixed.shape[0], HV * DV))
    for s in range(mixed.shape[0]):
        row = mixed[s]
        for j in range(HV):
            kh = j // (HV // HK)
            q = row[kh * DK:(kh + 1) * DK]
            k = row[HK * DK + kh * DK:HK * DK + (kh + 1) * DK]
            v = row[2 * HK * DK + j * DV:2 * HK * DK + (j + 1) * DV]
            q = q / np.sqrt((q * q).sum() + EPS) * DK**-0.5
            k = k / np.sqrt((k * k).sum() + EPS)
            x = a[s, j] + dt_bias[j]
            g = -np.exp(a_log[j]) * (x if x > 20 else np.log1p(np.exp(x)))
            beta = bf16(np.array(1 / (1 + np.exp(-b[s, j]))))
            st = state[layer, slots[s], j] if lens[s] > 0 else np.zeros((DK, DV))
            st = st * np.exp(g)
            u = beta * (v - st.T @ k)
            st = st + np.outer(k, u)
            o = bf16(st.T @ q)
            state[layer, slots[s], j] = st
            normed = bf16(o / np.sqrt((o * o).mean() + 1e-5))
            zz = z[s, j * DV:(j + 1) * DV]
            out[s, j * DV:(j + 1) * DV] = normed * w * zz / (1 + np.exp(-zz))
    return out, state


def _t(x, dt=None):  # noqa: ANN001, ANN202
    return torch.tensor(np.asarray(x), dtype=dt or torch.bfloat16)


def _step_inputs(rng, B: int, L: int, S: int) -> tuple:  # noqa: ANN001
    """The step's inputs but the row: gate pre-activations a, b; a_log, dt_bias, z, the norm weight,
    the state of L layers x S slots, three rows' slots and lengths (the third starts fresh)."""
    f32 = torch.float32
    return (_t(rng.standard_normal((B, HV))), _t(rng.standard_normal((B, HV))),
            _t(rng.standard_normal(HV) * 0.5, f32), _t(rng.standard_normal(HV), f32),
            _t(rng.standard_normal((B, HV * DV))), _t(rng.standard_normal(DV), f32),
            _t(rng.standard_normal((L, S, HV, DK, DV)), f32), _t([4, 0, 2][:B], torch.int32),
            _t([7, 3, 0][:B], torch.int32))


@pytest.mark.parametrize("bv", [0, 8])
def test_interpreter_matches_the_unfused_math(bv):
    """The whole-slice form (BV = 0) and the column-chunked one (BV = 8: four chunks of DV = 32)."""
    from ninfer_compiler.ops.gdn_decode_fused import L2_EPS, gdn_decode_kernel
    from ninfer_compiler.ops.gdn_gates import SOFTPLUS_THRESHOLD
    from ninfer_compiler.ops.triton_aot import interpreted

    rng = np.random.default_rng(1)
    B, L, S = 3, 2, 5

    mixed = _t(rng.standard_normal((B, C)))
    a, b, a_log, dt_bias, z, w, state, slots, lens = _step_inputs(rng, B, L, S)
    out = torch.full((B, HV * DV), float("nan"), dtype=torch.float32)  # fp32: the interpreter truncates bf16
    st = state.clone()
    unused = torch.zeros(1, dtype=torch.int8)
    interpreted(gdn_decode_kernel)[(B, HV)](
        mixed, a, b, a, a_log, dt_bias, z, w, st, slots, lens, out, 1, S, 1e-5, unused, unused.float(), mixed, mixed, 0,
        HK=HK, HV=HV, DK=DK, DV=DV, Q_SCALE=DK**-0.5, L2_EPS=L2_EPS, SOFTPLUS_T=SOFTPLUS_THRESHOLD, BV=bv)

    def f64(x):
        return x.double().numpy()

    ref_out, ref_state = reference(f64(mixed), f64(a), f64(b), f64(a_log), f64(dt_bias), f64(z), f64(w),
                                   f64(state), slots.numpy(), lens.numpy(), 1)
    np.testing.assert_allclose(st.double().numpy(), ref_state, rtol=1e-4, atol=1e-5)
    # bf16 roundings inside (o, normed) can flip one ulp between float32 and float64 paths
    np.testing.assert_allclose(out.double().numpy(), ref_out, rtol=2e-2, atol=2e-2)
    np.testing.assert_array_equal(st[0].numpy(), state[0].numpy())  # other layers untouched


@pytest.mark.parametrize("bv", [0, 8])
def test_interpreter_applies_the_convolution(bv):
    """CONV: the step fed the row before the convolution matches the step fed the convolution kernel's
    output (ops/conv1d_decode.py, its fp32 output rounded to bf16 as its store does), and shifts the
    history as that kernel does: every channel of the rows' slots, zeros for the fresh sequence, the
    other slots and layers untouched (the interpreter runs a key head's programs in order, so its last
    program's q / k history write comes after the others' reads, which a cluster barrier orders on a GPU)."""
    from ninfer_compiler.ops.conv1d_decode import conv1d_decode_kernel
    from ninfer_compiler.ops.gdn_decode_fused import L2_EPS, gdn_decode_kernel
    from ninfer_compiler.ops.gdn_gates import SOFTPLUS_THRESHOLD
    from ninfer_compiler.ops.triton_aot import interpreted

    rng = np.random.default_rng(3)
    B, L, S, layer = 3, 2, 5, 1

    raw = _t(rng.standard_normal((B, C)))
    conv_w = _t(rng.standard_normal((4, C)) * 0.5)
    hist0 = _t(rng.standard_normal((L, S, 3, C)))
    a, b, a_log, dt_bias, z, w, state, slots, lens = _step_inputs(rng, B, L, S)
    consts = dict(HK=HK, HV=HV, DK=DK, DV=DV, Q_SCALE=DK**-0.5, L2_EPS=L2_EPS, SOFTPLUS_T=SOFTPLUS_THRESHOLD, BV=bv)
    unused = torch.zeros(1, dtype=torch.int8)

    # the reference: the convolution kernel (fp32 output, rounded to bf16 here), then the step
    y32 = torch.full((B, C), float("nan"), dtype=torch.float32)
    hist_ref = hist0.clone()
    interpreted(conv1d_decode_kernel)[(triton_cdiv(C, 64), B)](raw, conv_w, hist_ref, slots, lens, y32, layer, S,
                                                                  C=C, K=4, BLOCK=64)
    out_ref = torch.full((B, HV * DV), float("nan"), dtype=torch.float32)
    st_ref = state.clone()
    interpreted(gdn_decode_kernel)[(B, HV)](
        y32.bfloat16(), a, b, a, a_log, dt_bias, z, w, st_ref, slots, lens, out_ref, layer, S, 1e-5, unused,
        unused.float(), raw, raw, 0, **consts)

    out = torch.full((B, HV * DV), float("nan"), dtype=torch.float32)
    st = state.clone()
    hist = hist0.clone()
    interpreted(gdn_decode_kernel)[(B, HV)](
        raw, a, b, a, a_log, dt_bias, z, w, st, slots, lens, out, layer, S, 1e-5, unused, unused.float(),
        conv_w, hist, S, **consts, CONV=True)
    assert torch.isfinite(out).all()
    np.testing.assert_allclose(out.numpy(), out_ref.numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(st.numpy(), st_ref.numpy(), rtol=1e-6, atol=1e-6)
    assert torch.equal(hist, hist_ref)
    assert not torch.equal(hist[layer, 4], hist0[layer, 4])  # (the rows' slots did change)
    assert torch.equal(hist[layer, 2, :2], torch.zeros_like(hist[layer, 2, :2]))  # fresh: zeros, then x
    assert torch.equal(hist[layer, 2, 2], raw[2])


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


@pytest.mark.parametrize("bv", [0, 16])
def test_interpreter_folds_the_gate_projections(bv):
    """GATE_K > 0: a, b computed in the kernel from h and the [HV, K] bf16 weights (K not a power
    of two), against the same kernel fed the projections as the dense GEMV rounds them; the chunked
    form (BV > 0) dots them 32 columns at a time (three chunks, the last one partial)."""
    from ninfer_compiler.ops.gdn_decode_fused import L2_EPS, gdn_decode_kernel
    from ninfer_compiler.ops.gdn_gates import SOFTPLUS_THRESHOLD
    from ninfer_compiler.ops.triton_aot import interpreted

    rng = np.random.default_rng(2)
    B, L, S, K = 2, 1, 3, 80

    def t(x, dt=torch.bfloat16):
        return torch.tensor(np.asarray(x), dtype=dt)

    mixed = t(rng.standard_normal((B, C)))
    h = t(rng.standard_normal((B, K)))
    wa, wb = t(rng.standard_normal((HV, K)) * 0.1), t(rng.standard_normal((HV, K)) * 0.1)
    a_log, dt_bias = t(rng.standard_normal(HV) * 0.5, torch.float32), t(rng.standard_normal(HV), torch.float32)
    z = t(rng.standard_normal((B, HV * DV)))
    w = t(rng.standard_normal(DV), torch.float32)
    state = t(rng.standard_normal((L, S, HV, DK, DV)), torch.float32)
    slots, lens = t([2, 0], torch.int32), t([5, 1], torch.int32)
    consts = dict(HK=HK, HV=HV, DK=DK, DV=DV, Q_SCALE=DK**-0.5, L2_EPS=L2_EPS, SOFTPLUS_T=SOFTPLUS_THRESHOLD,
                  BV=bv, GATE_BK=32)
    a = (h.float() @ wa.float().T).bfloat16()  # the dense projections: fp32 sums, one bf16 rounding
    b = (h.float() @ wb.float().T).bfloat16()
    outs, states = [], []
    for args, extra in (((a, b, a), {}), ((wa, wb, h), {"GATE_K": K, "GATE_KP": 128})):
        out = torch.full((B, HV * DV), float("nan"), dtype=torch.float32)
        st = state.clone()
        interpreted(gdn_decode_kernel)[(B, HV)](mixed, *args, a_log, dt_bias, z, w, st, slots, lens, out, 0, S, 1e-5,
                                                torch.zeros(1, dtype=torch.int8), torch.zeros(1), mixed, mixed, 0,
                                                **consts, **extra)
        outs.append(out)
        states.append(st)
    assert torch.isfinite(outs[1]).all()
    np.testing.assert_allclose(states[1].numpy(), states[0].numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(outs[1].numpy(), outs[0].numpy(), rtol=1e-5, atol=1e-6)


def test_h200_library_and_decode_graph(tmp_path):
    from ninfer_compiler.ops import gdn_decode_fused as fused

    def main(mixed, a, b, a_log, dt_bias, z, w, state, slots, lens):
        assert fused.supported(mixed, state, DK, DV)
        out, state = fused.gdn_decode_fused(mixed, a, b, a_log, dt_bias, z, w, state, slots, lens, 1, 1e-5,
                                            HK, HV, DK, DV)
        return out, state

    inputs = {"mixed": (["b", 1, C], "bfloat16"), "a": (["b", 1, HV], "bfloat16"), "b": (["b", 1, HV], "bfloat16"),
              "a_log": ([HV], "float32"), "dt_bias": ([HV], "float32"), "z": (["b", 1, HV * DV], "bfloat16"),
              "w": ([DV], "float32"), "state": ([2, "s", HV, DK, DV], "float32"), "slots": (["b"], "int32"),
              "lens": (["b"], "int32")}
    text, lib = h200_library(main, inputs, tmp_path / "model.so")
    assert "call_inplace_packed" in text and "ninfer_gdn_decode" in text
    assert b"ninfer_gdn_decode" in lib.read_bytes()


def test_h200_library_with_folded_gates(tmp_path):
    from ninfer_compiler.ops import gdn_decode_fused as fused

    K = 96

    def main(mixed, h, wa, wb, a_log, dt_bias, z, w, state, slots, lens):
        assert fused.gates_foldable(h, wa, wb, HV) and not fused.gates_foldable(h, wa, None, HV)
        out, state = fused.gdn_decode_fused(mixed, wa, wb, a_log, dt_bias, z, w, state, slots, lens, 1, 1e-5,
                                            HK, HV, DK, DV, h=h)
        return out, state

    inputs = {"mixed": (["b", 1, C], "bfloat16"), "h": (["b", 1, K], "bfloat16"), "wa": ([HV, K], "bfloat16"),
              "wb": ([HV, K], "bfloat16"), "a_log": ([HV], "float32"), "dt_bias": ([HV], "float32"),
              "z": (["b", 1, HV * DV], "bfloat16"), "w": ([DV], "float32"), "state": ([2, "s", HV, DK, DV], "float32"),
              "slots": (["b"], "int32"), "lens": (["b"], "int32")}
    text, lib = h200_library(main, inputs, tmp_path / "model.so")
    assert f"ninfer_gdn_decode_{HK}_{HV}_{DK}_{DV}_g{K}" in text
    assert f"ninfer_gdn_decode_{HK}_{HV}_{DK}_{DV}_g{K}".encode() in lib.read_bytes()


def test_h200_library_with_the_convolution(tmp_path, monkeypatch):
    """`conv`: the call takes the convolution weight and returns the history it updates in place; the
    launcher (built warning-free) checks the convolution's shapes and launches clusters of HV / HK."""
    from ninfer_compiler.ops import gdn_decode_fused as fused

    monkeypatch.setenv("NINFER_KERNELS", "+gdn_step_conv")

    def main(mixed, a, b, a_log, dt_bias, z, w, state, slots, lens, conv_w, conv_state):
        assert fused.conv_supported(conv_w, conv_state, HK, HV)
        out, state, conv_state = fused.gdn_decode_fused(mixed, a, b, a_log, dt_bias, z, w, state, slots, lens, 1,
                                                        1e-5, HK, HV, DK, DV, conv=(conv_w, conv_state))
        return out, state, conv_state

    inputs = {"mixed": (["b", 1, C], "bfloat16"), "a": (["b", 1, HV], "bfloat16"), "b": (["b", 1, HV], "bfloat16"),
              "a_log": ([HV], "float32"), "dt_bias": ([HV], "float32"), "z": (["b", 1, HV * DV], "bfloat16"),
              "w": ([DV], "float32"), "state": ([2, "s", HV, DK, DV], "float32"), "slots": (["b"], "int32"),
              "lens": (["b"], "int32"), "conv_w": ([4, C], "bfloat16"), "conv_state": ([2, "s", 3, C], "bfloat16")}
    text, lib = h200_library(main, inputs, tmp_path / "model.so")
    assert f"ninfer_gdn_decode_{HK}_{HV}_{DK}_{DV}_convbf16" in text
    values = fused.launcher_values(HV, DK, DV, 0, {"k": None}, "sym", False, conv_channels=C, cluster=HV // HK)
    assert values["CLUSTER_Y"] == HV // HK and "conv_state.shape()[3] == " + str(C) in values["CONV_ADDRESSES"]
    assert values["RETURNED"] == "out, state, conv_state"


class _Shaped:
    """The shape and dtype `conv_supported` reads."""

    def __init__(self, rows: int, dtype: str) -> None:
        self.shape, self.dtype = (rows, C), dtype


def test_convolution_needs_four_taps_a_bf16_history_and_small_clusters(monkeypatch):
    import tvm

    from ninfer_compiler.ops import gdn_decode_fused as fused

    weight, history = _Shaped(4, "bfloat16"), _Shaped(3, "bfloat16")
    with tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}):
        monkeypatch.setenv("NINFER_KERNELS", "+gdn_step_conv")
        assert fused.conv_supported(weight, history, HK, HV)
        assert not fused.conv_supported(_Shaped(3, "bfloat16"), _Shaped(2, "bfloat16"), HK, HV)  # 3 taps
        assert not fused.conv_supported(weight, _Shaped(3, "float32"), HK, HV)
        assert not fused.conv_supported(weight, history, 1, 16)  # 16 programs a cluster
        monkeypatch.setenv("NINFER_KERNELS", "-gdn_step_conv")
        assert not fused.conv_supported(weight, history, HK, HV)
    monkeypatch.setenv("NINFER_KERNELS", "+gdn_step_conv")
    assert not fused.conv_supported(weight, history, HK, HV)  # not a CUDA target


@pytest.mark.parametrize("bv", [0, 32])
def test_interpreter_writes_int8_activations(bv):
    """XQ: a batch of 4 rows' output also as the decode GEMVs' int8 activations, byte for byte what
    the decode norm's `norm_xq8` writes for the same bf16 values (tests/compiler/ops/test_qgemv_i8.py
    replays it); at 5 rows nothing (the GEMV reads the output there); the output and state as
    without XQ."""
    from ninfer_compiler.ops.gdn_decode_fused import L2_EPS, gdn_decode_kernel, xq_supported
    from ninfer_compiler.ops.gdn_gates import SOFTPLUS_THRESHOLD
    from ninfer_compiler.ops.triton_aot import interpreted

    from .test_qgemv_i8 import _norm_xq

    hk, hv, dk, dv = 2, 4, 16, 128  # 512 outputs: two stages of the int8 layout, two groups per head
    assert xq_supported(hv, dv) and not xq_supported(hv, 32)
    c, width = 2 * hk * dk + hv * dv, hv * dv
    rng = np.random.default_rng(3)
    B, L, S = 5, 1, 6

    def t(x, dt=torch.bfloat16):
        return torch.tensor(np.asarray(x), dtype=dt)

    mixed, z = t(rng.standard_normal((B, c))), t(rng.standard_normal((B, width)) * 3)
    a, b = t(rng.standard_normal((B, hv))), t(rng.standard_normal((B, hv)))
    a_log, dt_bias = t(rng.standard_normal(hv) * 0.5, torch.float32), t(rng.standard_normal(hv), torch.float32)
    w = t(rng.standard_normal(dv), torch.float32)
    state = t(rng.standard_normal((L, S, hv, dk, dv)), torch.float32)
    slots, lens = t([0, 1, 2, 3, 4], torch.int32), t([1, 0, 2, 5, 3], torch.int32)
    consts = dict(HK=hk, HV=hv, DK=dk, DV=dv, Q_SCALE=dk**-0.5, L2_EPS=L2_EPS, SOFTPLUS_T=SOFTPLUS_THRESHOLD, BV=bv)
    runs = {}
    for rows in (4, B):
        for xq_on in (False, True):
            out = torch.zeros((rows, width), dtype=torch.bfloat16)
            st = state.clone()
            xq = torch.full((width * 8 + width // 256 * 64,), 0x5A, dtype=torch.uint8)
            interpreted(gdn_decode_kernel)[(rows, hv)](
                mixed[:rows], a[:rows], b[:rows], a, a_log, dt_bias, z[:rows], w, st, slots, lens, out, 0, S, 1e-5,
                xq.view(torch.int8), xq[width * 8:].view(torch.float32), mixed, mixed, 0, **consts, XQ=xq_on)
            runs[rows, xq_on] = (out, st, xq)
        assert torch.equal(runs[rows, False][0], runs[rows, True][0])
        assert torch.equal(runs[rows, False][1], runs[rows, True][1])
        assert (runs[rows, False][2] == 0x5A).all()  # without XQ nothing is written
    assert (runs[B, True][2] == 0x5A).all()  # ... nor above 4 rows
    y = runs[4, True][0].float().numpy().astype(np.float64)
    want = _norm_xq(y)
    got = runs[4, True][2].numpy()
    np.testing.assert_array_equal(got[:width * 8], want[:width * 8])
    # the scales s / (254 x 16): the same to rounding (the GPU's division may differ in the last bit)
    np.testing.assert_allclose(got[width * 8:].view(np.float32), want[width * 8:].view(np.float32), rtol=3e-7)


@pytest.mark.parametrize("gate_k", [0, 5120])
def test_launcher_builds_warning_free(tmp_path, gate_k):
    """Both launcher forms as the package links them (a kernel per batch range), under -Wall -Werror (a
    check macro inside an unbraced if / else is the kind of bug only the warning shows)."""
    from ninfer_compiler.ops import cuda_extern
    from ninfer_compiler.ops import gdn_decode_fused as fused

    for xq in (False, True):
        images = {f"k{rows}": (rows, fused.image(16, 48, 128, 128, "bfloat16", "float32", "sm_90a", gate_k, xq,
                                                  sh.bv, sh.warps, gate_bk=sh.gate_bk, prefetch=sh.prefetch))
                  for rows, sh in ((r, fused.shape_for(r, 128)) for r in fused.SHAPES)}
        launcher = cuda_extern.fill_launcher(fused.LAUNCHER, fused.launcher_values(
            48, 128, 128, gate_k, {k: rows for k, (rows, _) in images.items()}, "ninfer_gdn_decode_t", xq))
        assert 'batch <= 1 ? "k1" : batch <= 4 ? "k4" : "kNone"' in launcher
        (tmp_path / str(xq)).mkdir()
        symbols = build_launcher(cuda_extern.host_source(launcher, {k: img for k, (_, img) in images.items()}),
                                 tmp_path / str(xq))
        assert re.search(r"\bT __tvm_ffi_ninfer_gdn_decode_t\b", symbols)


def test_shapes_fit_any_head_width():
    """Every batch range's shape tiles DV: chunks narrowed to a smaller DV, the whole slice where a
    chunk would not divide it."""
    from ninfer_compiler.ops import gdn_decode_fused as fused

    assert fused.SHAPES[1].bv == 0 and None in fused.SHAPES
    for dv in (16, 32, 64, 128, 256):
        for rows in fused.SHAPES:
            sh = fused.shape_for(rows, dv)
            assert sh.bv == 0 or (dv % sh.bv == 0 and sh.bv <= dv), (rows, dv, sh)
    assert fused.shape_for(None, 32).bv == 32 and fused.shape_for(None, 128).bv == fused.SHAPES[None].bv


def test_launch_shapes_follow_the_kernel_features(monkeypatch):
    import tvm

    from ninfer_compiler.ops import gdn_decode_fused as fused

    with tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}):
        monkeypatch.setenv("NINFER_KERNELS", "+gdn_step_by_batch,-gdn_step_one_row_chunked")
        assert fused.launch_shapes(128) == {rows: fused.shape_for(rows, 128) for rows in fused.SHAPES}
        assert fused.launch_shapes(128)[1].bv == 0  # the whole slice at one row
        monkeypatch.setenv("NINFER_KERNELS", "+gdn_step_by_batch,+gdn_step_one_row_chunked")
        assert fused.launch_shapes(128)[1] == fused.shape_for(4, 128) and fused.shape_for(4, 128).bv == 64
        monkeypatch.setenv("NINFER_KERNELS", "-gdn_step_by_batch")
        assert fused.launch_shapes(128) == {None: fused.shape_for(1, 128)}
