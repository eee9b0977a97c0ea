"""The next projection's weights asked of L2 by the latency-bound kernel in front of it.

Why: at one request a decode step spends ~0.75 ms of the H200's ~5.8 in small kernels between the
projections (the short convolution and the GDN step; the attention prologue, split-KV decode and
combine), during which HBM reads little beyond the next GEMV's ring prologue. The weights of the
projection after such a window depend on no activation, so the window's first kernel asks L2 for
them right after its own PDL wait (the projection before it has finished streaming then), and the
projection reads them from L2. A prefetch changes no value, only where the bytes come from.

Mechanism: `cp.async.bulk.prefetch.L2` of 16 KiB pieces (the copy engine fetches them; the thread
only issues), spread over every thread of the kernel's grid. The planes (a grouped-int weight's
base, high and scale tensors) reach the launcher as arguments; `WarmPlanes` carries them from the
frontend, `launcher_parts` writes the C++ that turns them into addresses and sizes.
"""

from __future__ import annotations

from dataclasses import dataclass

import triton
import triton.language as tl
from tvm.relax.frontend import nn

from .common import kernel_feature
from .linear_weight import LinearWeight

PIECE = 16384  # bytes per bulk prefetch
MAX_PLANES = 3


@triton.jit
def warm_pieces(start, n, BLOCK: tl.constexpr, PIECE: tl.constexpr):
    """Pieces `start .. start + BLOCK` of a range of `n` bytes: byte offset, size (whole 16-byte
    units, the instruction's size unit) and whether the piece exists."""
    off = (start + tl.arange(0, BLOCK)).to(tl.int64) * PIECE
    size = tl.minimum(n - off, PIECE) // 16 * 16
    return off, size, size > 0


@triton.jit
def bulk_prefetch(p, off, size, ok):
    """Asks L2 for `[p + off, p + off + size)` where `ok` (the copy engine fetches; the thread only issues)."""
    tl.inline_asm_elementwise(
        "{ .reg .pred q; setp.ne.s32 q, $3, 0; @q cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
        "=r,l,r,r", [p + tl.where(ok, off, 0), tl.where(ok, size, 16).to(tl.int32), ok.to(tl.int32)],
        dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def warm_range(p, n, part, parts, BLOCK: tl.constexpr, PIECE: tl.constexpr, ISSUE: tl.constexpr):
    """Program `part` of `parts`: `ISSUE(p, off, size, ok)` for its pieces of `[p, p + n)`, BLOCK a
    round (piece i goes to program i // BLOCK % parts)."""
    pieces = (n + PIECE - 1) // PIECE
    for start in tl.range(part * BLOCK, pieces, parts * BLOCK):
        off, size, ok = warm_pieces(start, n, BLOCK, PIECE)
        ISSUE(p, off, size, ok)


@triton.jit
def l2_warm(w0, n0, w1, n1, w2, n2, part, parts, BLOCK: tl.constexpr, PIECE: tl.constexpr = 16384):
    """Program `part` of `parts` (BLOCK: its thread count, one piece per thread and round) asks L2
    for its share of the byte ranges `[w, w + n)`; a range with `n` = 0 is skipped."""
    warm_range(w0, n0, part, parts, BLOCK, PIECE, bulk_prefetch)
    warm_range(w1, n1, part, parts, BLOCK, PIECE, bulk_prefetch)
    warm_range(w2, n2, part, parts, BLOCK, PIECE, bulk_prefetch)


@dataclass(frozen=True)
class WarmPlanes:
    """The weight planes (one to three tensors) a window's first kernel asks L2 for."""

    planes: tuple[nn.Tensor, ...]

    @staticmethod
    def of(weight: LinearWeight | None) -> WarmPlanes | None:
        """The planes of `weight` where the kernel feature `l2_warm` is on, else None."""
        if weight is None or not kernel_feature("l2_warm"):
            return None
        return WarmPlanes(tuple(t for t in (weight.base, weight.high, weight.scales) if t is not None))

    @property
    def tag(self) -> str:
        """Part of a launcher's symbol: the launcher's parameter list depends on the plane count."""
        return f"_warm{len(self.planes)}"


# The kernels' parameters for the ranges (pointers typed as bytes, sizes in bytes)
SIGNATURE = {"w0": "*i8", "n0": "i64", "w1": "*i8", "n1": "i64", "w2": "*i8", "n2": "i64"}


def launcher_parts(warm: WarmPlanes | None) -> dict[str, str]:
    """C++ for a launcher template: `WARM_PARAMS` (the planes as its first parameters after the
    template's own leading ones), `WARM_SETUP` (addresses, checked for 16-byte alignment, and byte
    sizes into `warm_p` / `warm_n`, zeros where there is no plane) and `WARM_ARGS` (the six kernel arguments)."""
    count = len(warm.planes) if warm else 0
    params = "".join(f"TensorView warm{i}, " for i in range(count))
    setup = ["uint64_t warm_p[3] = {0, 0, 0};", "int64_t warm_n[3] = {0, 0, 0};"]
    for i in range(count):
        setup.append(f'warm_p[{i}] = ninfer_cuda::pointer(warm{i}, "weight plane {i}");')
        setup.append(f"warm_n[{i}] = warm{i}.numel() * ((warm{i}.dtype().bits * warm{i}.dtype().lanes + 7) / 8);")
    args = "&warm_p[0], &warm_n[0], &warm_p[1], &warm_n[1], &warm_p[2], &warm_n[2], "
    return {"WARM_PARAMS": params, "WARM_SETUP": "\n  ".join(setup), "WARM_ARGS": args}


def call_args(warm: WarmPlanes | None) -> list[nn.Tensor]:
    """The planes as call arguments, in `launcher_parts`' parameter order."""
    return list(warm.planes) if warm else []
