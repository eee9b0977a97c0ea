"""The SwiGLU output's int8 quantization kernel (`ops/xq_quantize.py`): Triton's interpreter against
the decode norm's `norm_xq8` bytes (tests/compiler/ops/test_qgemv_i8.py replays it), the launcher
built for h200, and bad input named."""

from __future__ import annotations

import numpy as np
import pytest

from ..conftest import h200_library

torch = pytest.importorskip("torch")
pytest.importorskip("triton")


def _codes(xq: np.ndarray, k: int, rows: int) -> np.ndarray:
    """[rows, k] exact codes 254 hi + lo of the xq layout (ops/xq_triton.py `xq_store`)."""
    out = np.zeros((rows, k), np.int64)
    b = xq[:k * 8].view(np.int8).astype(np.int64)
    for r in range(rows):
        for kk in range(k):
            w, e = kk % 64, kk % 8
            off = ((kk // 64) * 32 + (w // 16) * 8 + 2 * r) * 16 + ((w % 16) // 8) * 8 + (e % 2) * 4 + e // 2
            out[r, kk] = 254 * b[off] + b[off + 16]
    return out


@pytest.mark.parametrize("rows", [1, 3, 4])
def test_interpreter_writes_the_norms_bytes(rows):
    from ninfer_compiler.ops.triton_aot import interpreted
    from ninfer_compiler.ops.xq_quantize import WIDTH, xq_quantize_kernel

    from .test_qgemv_i8 import _norm_xq

    k = 3 * WIDTH  # three programs a row
    rng = np.random.default_rng(rows)
    y = rng.standard_normal((rows, k)) * rng.uniform(0.01, 30, size=(rows, k // 64)).repeat(64, axis=1)
    y[0, 64:128] = 0.0  # an all-zero group: scale 1, codes 0
    yb = torch.tensor(y, dtype=torch.float32).bfloat16()
    xq = torch.full((k * 8 + k // 256 * 64,), 0x5A, dtype=torch.uint8)
    interpreted(xq_quantize_kernel)[(k // WIDTH, rows)](yb, xq.view(torch.int8), xq[k * 8:].view(torch.float32),
                                                       K=k, W=WIDTH)
    want = _norm_xq(yb.float().numpy().astype(np.float64))
    got = xq.numpy()
    # each element as its exact code 254 hi + lo: the two roundings agree but at exact ties (half
    # up here, half to even in `norm_xq8`), where a tie of hi gives the same code and one of lo
    # differs by one unit (1 / 254 of the group's step)
    code_got, code_want = _codes(got, k, rows), _codes(want, k, rows)
    assert np.abs(code_got - code_want).max() <= 1 and (code_got == code_want).mean() > 0.99
    assert (np.abs(code_got) <= 254 * 127 + 127).all()
    # rows past `rows` keep the poison: only the rows given are written
    chunks = got[:k * 8].reshape(-1, 4, 2, 16)  # [group * 4 + c][row][hi, lo][16 bytes]
    assert (chunks[:, rows:] == 0x5A).all() and not (chunks[:, :rows] == 0x5A).all()
    sg, sw = got[k * 8:].view(np.float32).reshape(-1, 4, 4), want[k * 8:].view(np.float32).reshape(-1, 4, 4)
    np.testing.assert_allclose(sg[:, :rows], sw[:, :rows], rtol=3e-7)


def test_handover_rows_match_the_launcher():
    """The rows the MLP's quantize kernel writes (qgemv.XQ_HANDOVER_ROWS) are those at which the
    down projection's handover entry reads them (qgemv_host.cc NINFER_XQ_HANDOVER_ROWS)."""
    import re

    from ninfer_compiler.ops import qgemv

    host = (qgemv.DEVICE_SOURCE.parent / "qgemv_host.cc").read_text()
    assert int(re.search(r"#define NINFER_XQ_HANDOVER_ROWS (\d+)", host).group(1)) == qgemv.XQ_HANDOVER_ROWS


def test_h200_library_calls_it_in_place(tmp_path):
    from ninfer_compiler.ops.xq_quantize import xq_quantize

    text, lib = h200_library(xq_quantize, {"y": (["b", 1, 512], "bfloat16")}, tmp_path / "model.so")
    assert 'call_inplace_packed("ninfer_xq_quantize_k512_r4"' in text
    assert b"ninfer_xq_quantize_k512_r4" in lib.read_bytes()


def test_rejects_rows_it_cannot_split():
    from tvm.relax.frontend import nn

    from ninfer_compiler.ops.xq_quantize import supported, xq_quantize

    assert supported(nn.Tensor.placeholder([2, 1, 512], "bfloat16"))
    for shape, dtype in (([2, 1, 320], "bfloat16"), ([2, 1, 512], "float32"), ([2, 3, 512], "bfloat16")):
        y = nn.Tensor.placeholder(shape, dtype)
        assert not supported(y)
        with pytest.raises(ValueError, match="xq_quantize: needs bf16"):
            xq_quantize(y)
    with pytest.raises(ValueError, match="max_rows must be 1..4"):
        xq_quantize(nn.Tensor.placeholder([2, 1, 512], "bfloat16"), max_rows=5)
