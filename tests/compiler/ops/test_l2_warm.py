"""Warming L2 with the next projection's weights (`ops/l2_warm.py`): which pieces each program asks
for (Triton's interpreter, the issue step replaced by a recorder), the prefetch instruction in the
window kernels' SASS only where asked, and a launcher taking two or three planes built for h200."""

from __future__ import annotations

import pytest

from ..conftest import h200_library

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")
tl = triton.language

from ninfer_compiler.ops.l2_warm import PIECE, warm_range  # noqa: E402 (after the skips)


@triton.jit
def _record(p, off, size, ok):
    """Counts each piece and adds its size: slot 2 i, 2 i + 1 for piece i."""
    i = off // PIECE
    tl.atomic_add(p + 2 * i, ok.to(tl.int32), mask=ok)
    tl.atomic_add(p + 2 * i + 1, size.to(tl.int32), mask=ok)


@triton.jit
def _recorder(buf, n, BLOCK: tl.constexpr):
    warm_range(buf, n, tl.program_id(0), tl.num_programs(0), BLOCK, PIECE, _record)


@pytest.mark.parametrize(("n", "parts", "block"), [(0, 3, 64), (16, 1, 32), (20_600_000, 40, 64),
                                                   (3 * 16384, 5, 64), (7 * 16384 + 1000, 2, 2),
                                                   (1_000_000 + 8, 28, 128)])
def test_every_piece_is_asked_for_once(n, parts, block):
    from ninfer_compiler.ops.triton_aot import interpreted

    pieces = -(-n // PIECE)
    buf = torch.zeros(2 * pieces + 2, dtype=torch.int32)
    interpreted(_recorder)[(parts,)](buf, n, BLOCK=block)
    counts, sizes = buf.numpy()[0::2], buf.numpy()[1::2]
    assert (counts[:pieces] == 1).all() and (counts[pieces:] == 0).all()
    # every whole 16-byte unit of the range, nothing past it
    assert sizes.sum() == n // 16 * 16 and (sizes[: max(pieces - 1, 0)] == PIECE).all()


def sass_of(cubin: bytes, tmp_path) -> str:  # noqa: ANN001
    import subprocess

    from .test_qgemv_v4 import _cuobjdump

    path = tmp_path / "k.cubin"
    path.write_bytes(cubin)
    return subprocess.run([str(_cuobjdump()), "-sass", str(path)], capture_output=True, text=True, check=True).stdout


def test_prefetch_only_in_the_warm_kernels(tmp_path):
    from ninfer_compiler.ops import attention_prologue, conv1d_decode

    for arch in ("sm_90a", "sm_120a"):
        warm = sass_of(conv1d_decode.image(10240, 4, "bfloat16", arch, warm=True).cubin, tmp_path)
        plain = sass_of(conv1d_decode.image(10240, 4, "bfloat16", arch).cubin, tmp_path)
        assert warm.count("UBLKPF.L2") == 3 and "UBLKPF" not in plain  # one per plane
    img = attention_prologue.image(24, 4, 256, 16, 64, (11, 11, 10), "bfloat16", "bfloat16", "sm_90a", warm=True)
    assert sass_of(img.cubin, tmp_path).count("UBLKPF.L2") == 3


@pytest.mark.parametrize("planes", [2, 3])
def test_h200_launcher_takes_the_planes(tmp_path, planes):
    from ninfer_compiler.ops.conv1d import causal_conv1d_with_state
    from ninfer_compiler.ops.l2_warm import WarmPlanes

    c, k = 512, 4

    def main(x, w, state, slots, lens, base, high, scales):
        warm = WarmPlanes((base, high, scales)[:planes])
        return causal_conv1d_with_state(x, w, state, slots, lens, 1, warm)

    inputs = {"x": (["b", 1, c], "bfloat16"), "w": ([k, c], "bfloat16"), "state": ([2, "s", k - 1, c], "bfloat16"),
              "slots": (["b"], "int32"), "lens": (["b"], "int32"), "base": ([256, 256], "uint8"),
              "high": ([256, 64], "uint8"), "scales": ([256, 8], "float16")}
    text, lib = h200_library(main, inputs, tmp_path / "model.so")
    assert f"ninfer_conv1d_decode_c{c}_k{k}_bf16_warm{planes}" in text
    assert f"ninfer_conv1d_decode_c{c}_k{k}_bf16_warm{planes}".encode() in lib.read_bytes()
