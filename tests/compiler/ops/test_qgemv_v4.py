"""Decode GEMV v4 (`ops/qgemv_cuda.cu`, cp.async ring): its shared-memory layout, checked without a GPU.

v4 computes exactly what v3 computes (same fragments, `v3_pair` etc., emulated bit for bit in
`test_qgemv_v3.py`); only the way the bytes reach a thread changes: `v4_issue` copies 16-byte pieces
of a stage into a swizzled ring slot and `v4_stage` reads each thread's words back from it. Here
both index formulas are replayed in numpy: every thread must read back exactly the bytes v3 loads
from global memory for the same (row, group, lane), every byte of a slot must be written once, and
the fragment loads of a warp must be free of shared-memory bank conflicts. Also: the kernels compile
for the three CUDA archs without spills, and the launcher's stage counts match the kernel's.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from ninfer_compiler.ops import qgemv

from ..codegen.conftest import require_tool

HB = {4: 0, 5: 8, 6: 16}


def stage_bytes(bits: int) -> tuple[int, int, int]:
    """(base, high, total) bytes of one stage (16 rows x 4 groups), as `V4<BITS>`."""
    base, high = 16 * 128, 16 * 4 * HB[bits]
    return base, high, base + high + 16 * 8


def issue(bits: int, base: np.ndarray, high: np.ndarray, scales: np.ndarray, row0: int, u: int) -> np.ndarray:
    """One ring slot as `v4_copy` fills it from `v4_lane`'s per-lane sources and destinations
    (byte copies of the planes at the kernel's offsets, unit `u` = `u` advances of the sources)."""
    nb, nh, total = stage_bytes(bits)
    slot = np.full(total, -1, dtype=np.int32)  # -1: never written
    sbytes = scales.view(np.uint8)
    groups = scales.shape[1]

    def put(dst: int, src: np.ndarray) -> None:
        assert (slot[dst : dst + src.size] == -1).all(), "a slot byte is written twice"
        slot[dst : dst + src.size] = src

    for lane in range(32):
        rb, pb = lane >> 3, lane & 7  # base: rows rb + 4j, piece pb
        dbase = rb * 128 + ((pb ^ (rb << 1)) << 4)
        for j in range(4):
            put(dbase + j * 512, base[row0 + rb + 4 * j, u * 128 + pb * 16 :][:16])
        if bits == 5:
            r, p = lane >> 1, lane & 1
            put(nb + r * 32 + ((p ^ ((r >> 2) & 1)) << 4), high[row0 + r, u * 32 + p * 16 :][:16])
        if bits == 6:
            r, p = lane >> 2, lane & 3  # rows r + 8j
            dhigh = nb + r * 64 + ((p ^ (lane >> 3)) << 4)
            for j in range(2):
                put(dhigh + j * 512, high[row0 + r + 8 * j, u * 64 + p * 16 :][:16])
        put(nb + nh + lane * 4, sbytes[row0 + (lane >> 1), (4 * u + 2 * (lane & 1)) * 2 :][:4])
    assert groups >= 4 * u + 4
    assert (slot >= 0).all(), "a slot byte is never written"
    return slot


def reads(bits: int, g: int, c: int, q: int) -> dict[str, tuple[int, int]]:
    """Shared-memory (offset, size) of what thread (g, c) reads for group q of a stage (`v4_stage`)."""
    nb, nh, _ = stage_bytes(bits)
    boff = (((2 * q + (c >> 1)) ^ ((g & 3) << 1)) << 4) + (c & 1) * 8
    out = {"wa": (g * 128 + boff, 8), "wb": ((g + 8) * 128 + boff, 8)}
    if bits == 5:  # the two bytes of 8 lanes each, loaded one by one
        hoff = nb + (((q >> 1) ^ ((g >> 2) & 1)) << 4) + (q & 1) * 8 + c * 2
        out |= {"ha": (hoff + g * 32, 2), "hb": (hoff + (g + 8) * 32, 2)}
    if bits == 6:
        hoff = nb + ((q ^ ((g >> 1) & 3)) << 4) + c * 4
        out |= {"ha": (hoff + g * 64, 4), "hb": (hoff + (g + 8) * 64, 4)}
    # one half2 per two groups: q // 2 (and the kernel picks the half by q % 2)
    out |= {"sa": (nb + nh + g * 8 + (q >> 1) * 4, 4), "sb": (nb + nh + (g + 8) * 8 + (q >> 1) * 4, 4)}
    return out


def v3_global(bits: int, base, high, scales, row0: int, g: int, c: int, gi: int) -> dict[str, np.ndarray]:
    """The same words as v3 loads them from global memory (`v3_body`)."""
    ra, rb = row0 + g, row0 + g + 8
    hb = HB[bits]
    out = {"wa": base[ra, gi * 32 + c * 8 :][:8], "wb": base[rb, gi * 32 + c * 8 :][:8]}
    if hb:
        n = 2 if bits == 5 else 4
        out |= {"ha": high[ra, gi * hb + c * (hb // 4) :][:n], "hb": high[rb, gi * hb + c * (hb // 4) :][:n]}
    s = scales.view(np.uint8)
    ch = gi // 2
    out |= {"sa": s[ra, 4 * ch :][:4], "sb": s[rb, 4 * ch :][:4]}
    return out


@pytest.mark.parametrize("bits", [4, 5, 6])
def test_v4_ring_reads_back_v3_words(bits):
    rng = np.random.default_rng(bits)
    n, k = 32, 768
    groups = k // 64
    base = rng.integers(0, 256, size=(n, k // 2), dtype=np.uint8)
    high = rng.integers(0, 256, size=(n, groups * HB[bits]), dtype=np.uint8) if HB[bits] else base
    scales = rng.standard_normal((n, groups)).astype(np.float16)
    for row0 in (0, 16):
        for u in range(k // 256):
            slot = issue(bits, base, high, scales, row0, u)
            for g in range(8):
                for c in range(4):
                    for q in range(4):
                        want = v3_global(bits, base, high, scales, row0, g, c, 4 * u + q)
                        for name, (off, size) in reads(bits, g, c, q).items():
                            got = slot[off : off + size]
                            assert (got == want[name]).all(), (bits, row0, u, g, c, q, name)


@pytest.mark.parametrize("bits", [4, 5, 6])
def test_v4_fragment_loads_have_no_bank_conflicts(bits):
    """Per load instruction: lanes of one phase (a half-warp for 8-byte loads, the warp otherwise)
    touch each 4-byte bank at one word address only (same word: broadcast)."""
    for q in range(4):
        for name in reads(bits, 0, 0, q):
            size = reads(bits, 0, 0, q)[name][1]
            phases = [range(0, 16), range(16, 32)] if size == 8 else [range(32)]
            for phase in phases:
                words: dict[int, set[int]] = {}
                for lane in phase:
                    off, sz = reads(bits, lane >> 2, lane & 3, q)[name]
                    for w in range(off // 4, (off + sz - 1) // 4 + 1):
                        words.setdefault(w % 32, set()).add(w)
                assert all(len(v) == 1 for v in words.values()), (bits, q, name, words)


def test_v4_stage_counts_match_launcher():
    """The launcher sizes dynamic shared memory from its own copy of the stage counts."""
    cu = qgemv.DEVICE_SOURCE.read_text()
    cc = qgemv.HOST_SOURCE.read_text()
    for bits in (4, 5, 6):
        dev = re.search(rf"#define NINFER_V4_STAGES_Q{bits} (\d+)", cu)
        host = re.search(rf"#define NINFER_V4_STAGES_Q{bits} (\d+)", cc)
        assert dev and host and dev.group(1) == host.group(1), bits
        assert int(dev.group(1)) == qgemv.V4_STAGES[bits]
        # 8 warps of a block must fit the smallest opt-in maximum of the three archs (99 KB)
        assert 8 * qgemv.V4_STAGES[bits] * stage_bytes(bits)[2] <= 101376


def test_bench_variants_set_kernel_and_launcher_ring_depths(monkeypatch):
    """`bench_27b.py prepare --variant` changes a ring depth in the kernel's defines and the
    launcher's source together (a depth changed in one alone sizes shared memory wrongly), and
    refuses a depth define the launcher does not spell."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "gpu"))
    import bench_27b

    monkeypatch.setattr(qgemv, "fatbin", lambda arch, dense=False: b"\x01")  # no nvcc here
    _, host = bench_27b.variant_hooks(["NINFER_V4_STAGES_Q5=4", "NINFER_V4_DIAG=3"])
    text = host("sm_90a")
    assert "#define NINFER_V4_STAGES_Q5 4" in text and "#define NINFER_V4_STAGES_Q5 2" not in text
    assert "#define NINFER_V4_STAGES_Q4 2" in text and "#define NINFER_V4_STAGES_Q6 2" in text
    with pytest.raises(ValueError, match="NINFER_V4_STAGES_Q7"):
        bench_27b.variant_hooks(["NINFER_V4_STAGES_Q7=3"])[1]("sm_90a")
    # the launcher-only knob of the q5 K split at few rows (8: no cap, the default)
    assert "#define NINFER_V4_Q5_KS_FEW_ROWS 8" in qgemv.host_source("sm_90a")
    text = bench_27b.variant_hooks(["NINFER_V4_Q5_KS_FEW_ROWS=4"])[1]("sm_90a")
    assert "#define NINFER_V4_Q5_KS_FEW_ROWS 4" in text and "ks > NINFER_V4_Q5_KS_FEW_ROWS" in text
    # ... and those of the q5 K split over K <= 8,192 (8 and 4 by default), for `run` and the multi launches
    assert "#define NINFER_V4_Q5_KS_CAP 8\n#define NINFER_V4_Q5_KS_CAP_MULTI 4" in qgemv.host_source("sm_90a")
    text = bench_27b.variant_hooks(["NINFER_V4_Q5_KS_CAP=4"])[1]("sm_90a")
    assert "#define NINFER_V4_Q5_KS_CAP 4" in text and "#define NINFER_V4_Q5_KS_CAP_MULTI 4" in text
    assert "uint32_t q5_cap = NINFER_V4_Q5_KS_CAP)" in text and text.count(", NINFER_V4_Q5_KS_CAP_MULTI)") == 2
    # the variant's fatbin keeps the package's own switches (a kernel feature's too) and adds its own
    seen = []
    monkeypatch.setattr("ninfer_compiler.codegen.toolchain.nvcc_fatbin",
                        lambda source, arch, defines=(), tag=None: seen.append(defines) or b"\x02")
    monkeypatch.setenv("NINFER_KERNELS", "+pdl_early")
    assert bench_27b.variant_hooks(["NINFER_V4_DIAG=3"])[0]("sm_90a") == b"\x02"
    assert seen == [(*qgemv.fatbin_defines(), "NINFER_V4_DIAG=3")] and "NINFER_PDL_EARLY=1" in seen[0]
    assert bench_27b.parse_variant("rings=NINFER_V4_STAGES_Q4=3,NINFER_V4_DIAG") == (
        "rings", ["NINFER_V4_STAGES_Q4=3", "NINFER_V4_DIAG"])
    for bad in ("rings", "rings=", "=NINFER_V4_DIAG=1", "a/b=X=1", "rings=X=1,", "rings=-DX"):
        with pytest.raises(ValueError, match="--variant"):
            bench_27b.parse_variant(bad)


def _cuobjdump() -> Path:
    """The cuobjdump that ships with the pinned triton wheel (the CUDA toolkit here has none)."""
    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    assert tool.exists(), tool
    return tool


def loop_local_accesses(sass: str) -> dict[str, list[str]]:
    """Per function of a `cuobjdump -sass` listing: its local-memory instructions (LDL / STL) that
    lie inside a natural loop (blocks that reach a back edge's source without passing its header,
    a back edge being a branch to a block that dominates it). Out-of-line blocks that branch back
    to the main path (divergence fallbacks, barrier retries) are no loops by this definition."""
    out = {}
    parts = re.split(r"\n\s+Function : (\w+)\n", sass)
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        ins = [(int(m.group(1), 16), m.group(2).strip()) for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", body)]
        index = {off: i for i, (off, _) in enumerate(ins)}
        targets = {}
        for i, (_, text) in enumerate(ins):
            t = re.search(r"\bBRA(?:\.[\w.]+)?\s+(?:\w+,\s*)?(?:`\()?0x([0-9a-f]+)", text)
            if t and int(t.group(1), 16) in index:
                targets[i] = index[int(t.group(1), 16)]
        starts = sorted({0, *targets.values(), *(i + 1 for i in targets if i + 1 < len(ins)),
                         *(i + 1 for i, (_, t) in enumerate(ins) if re.match(r"(EXIT|RET)\b", t) and i + 1 < len(ins))})
        block_of = {}
        for b, first in enumerate(starts):
            last = starts[b + 1] if b + 1 < len(starts) else len(ins)
            for i in range(first, last):
                block_of[i] = b
        succ: dict[int, set[int]] = {b: set() for b in range(len(starts))}
        for b in range(len(starts)):
            last = (starts[b + 1] if b + 1 < len(starts) else len(ins)) - 1
            text = ins[last][1]
            unconditional = not text.startswith("@") or text.startswith("@PT ")
            if last in targets:
                succ[b].add(block_of[targets[last]])
            ends = unconditional and re.match(r"(?:@PT )?(BRA(?!\.DIV)|EXIT|RET)\b", text)
            if not ends and b + 1 < len(starts):
                succ[b].add(b + 1)
        pred: dict[int, set[int]] = {b: set() for b in succ}
        for b, ss in succ.items():
            for t in ss:
                pred[t].add(b)
        every = set(succ)
        dom = {b: ({0} if b == 0 else set(every)) for b in succ}
        changed = True
        while changed:
            changed = False
            for b in range(1, len(starts)):
                new = {b} | (set.intersection(*(dom[p] for p in pred[b])) if pred[b] else set())
                if new != dom[b]:
                    dom[b], changed = new, True
        in_loop: set[int] = set()
        for b, ss in succ.items():
            for h in ss:
                if h in dom[b]:  # back edge b -> h
                    body, stack = {h, b}, ([b] if b != h else [])
                    while stack:
                        for p in pred[stack.pop()]:
                            if p not in body:
                                body.add(p)
                                stack.append(p)
                    in_loop |= body
        out[name] = [text for i, (_, text) in enumerate(ins)
                     if re.search(r"\b(LDL|STL)\b", text) and block_of[i] in in_loop]
    return out


def pdl_order(sass: str) -> dict[str, str]:
    """Per function of a `cuobjdump -sass` listing that uses PDL: whether its first PDL wait
    (`ACQBULK`) comes before its trigger of the next launch (`PREEXIT`) or after it."""
    out = {}
    parts = re.split(r"\n\s+Function : (\w+)\n", sass)
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        ops = [m.group(1).strip() for m in re.finditer(r"/\*[0-9a-f]{4,}\*/\s+([^;]*);", body)]
        wait = next((i for i, op in enumerate(ops) if op.startswith("ACQBULK")), None)
        trigger = next((i for i, op in enumerate(ops) if op.startswith("PREEXIT")), None)
        if wait is not None or trigger is not None:
            out[name] = "missing" if None in (wait, trigger) else ("wait first" if wait < trigger else "trigger first")
    return out


def test_pdl_early_build_triggers_before_waiting(tmp_path):
    """NINFER_PDL_EARLY=1 (kernel feature `pdl_early`): every kernel of the source that uses PDL lets
    the next launch start before its wait (the default build's order is checked above)."""
    require_tool("nvcc", "the CUDA toolkit builds device code")
    from ninfer_compiler.codegen.toolchain import nvcc_path

    cubin = tmp_path / "k.cubin"
    proc = subprocess.run(
        [nvcc_path(), "-cubin", "-O3", "-std=c++17", "-DNINFER_GEMV_SKIP_V2", "-DNINFER_PDL_EARLY=1",
         "-gencode=arch=compute_90a,code=sm_90a", str(qgemv.DEVICE_SOURCE), "-o", str(cubin)],
        capture_output=True, text=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    sass = subprocess.run([str(_cuobjdump()), "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
    order = pdl_order(sass)
    assert {"ninfer_rms_norm_wbf16", "ninfer_qgemv4e_q5_add", "ninfer_qgemv4e_q4_swiglu"} <= set(order)
    assert set(order.values()) == {"trigger first"}, order


def test_pdl_early_feature_sets_the_cuda_switch(monkeypatch):
    from ninfer_compiler.ops import pdl

    monkeypatch.setenv("NINFER_KERNELS", "+pdl_early")
    assert pdl.cuda_defines() == ("NINFER_PDL_EARLY=1",) and pdl.pdl_mode() == pdl.TRIGGER_FIRST
    monkeypatch.setenv("NINFER_KERNELS", "-pdl_early")
    assert pdl.cuda_defines() == () and pdl.pdl_mode() == pdl.WAIT_FIRST


@pytest.mark.parametrize("arch", ["sm_90a", "sm_120a", "sm_121a"])
def test_v4_compiles_without_spills_in_loops(arch, tmp_path):
    """Under the register cap (NINFER_V4_MAXREG) ptxas may keep a few loop-invariant values in local
    memory; it must never store to it inside a loop, reload at most 2 words per loop (L1 hits,
    against ~330-480 instructions per stage), and spill at most 32 bytes. The norm kernels: none."""
    require_tool("nvcc", "the CUDA toolkit builds device code")
    from ninfer_compiler.codegen.toolchain import nvcc_path

    cubin = tmp_path / "k.cubin"
    proc = subprocess.run(
        [nvcc_path(), "-cubin", "-O3", "-std=c++17", "-DNINFER_GEMV_SKIP_V2", "-Xptxas", "-v",
         f"-gencode=arch={arch.replace('sm_', 'compute_')},code={arch}", str(qgemv.DEVICE_SOURCE), "-o", str(cubin)],
        capture_output=True, text=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    spills = dict(re.findall(r"Function properties for (\w+)\n\s+\d+ bytes stack frame, (\d+) bytes spill stores",
                             proc.stderr))
    v4 = {f"ninfer_qgemv4_q{b}_y{t}" for b in (4, 5, 6) for t in ("bf16", "f32")}
    v4 |= {f"ninfer_qgemv4e_q{b}_{m}" for b in (4, 5, 6) for m in ("plain", "add", "swiglu", "multi")}
    v4 |= {"ninfer_qgemv4e_q4_swiglu_i8n", "ninfer_qgemv4e_q45_multi_i8n"}  # (the norm in the prologue)
    norms = {"ninfer_rms_norm_wf32", "ninfer_rms_norm_wbf16"}
    assert v4 | norms <= set(spills)
    assert {name: int(spills[name]) for name in norms if int(spills[name])} == {}
    assert {name: int(spills[name]) for name in v4 if int(spills[name]) > 32} == {}
    sass = subprocess.run([str(_cuobjdump()), "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
    if arch == "sm_90a":  # PDL: without NINFER_PDL_EARLY every kernel waits, then lets the next launch start
        assert pdl_order(sass) and set(pdl_order(sass).values()) == {"wait first"}
    local = loop_local_accesses(sass)
    assert v4 | norms <= set(local)
    assert {name: ops for name, ops in local.items() if any(op.startswith("STL") for op in ops)} == {}
    assert {name: ops for name, ops in local.items() if len(ops) > 2} == {}


def test_loop_local_accesses_finds_a_reload_in_a_loop():
    sass = """
        Function : k
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   STL [R1], R5 ;
        /*0020*/                   LDL R5, [R1] ;
        /*0030*/                   IADD3 R2, R2, 0x1, RZ ;
        /*0040*/              @P0 BRA 0x20 ;
        /*0050*/                   LDL R6, [R1] ;
        /*0060*/                   EXIT ;
"""
    assert loop_local_accesses(sass) == {"k": ["LDL R5, [R1]"]}
    # an out-of-line retry that branches back to the main path is no loop; the store before it is outside
    sass = """
        Function : k
        /*0000*/                   STL [R1], R5 ;
        /*0010*/              @!P0 BRA 0x40 ;
        /*0020*/                   LDL R6, [R1] ;
        /*0030*/                   EXIT ;
        /*0040*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R2], R3 ;
        /*0050*/              @!P0 BRA 0x40 ;
        /*0060*/                   BRA 0x20 ;
"""
    assert loop_local_accesses(sass) == {"k": []}


def test_launcher_kernel_names_exist():
    """Every kernel the launcher looks up by name (`kernel_name` in qgemv_host.cc) is defined by
    qgemv_cuda.cu's entry macros, and the launcher's V4Epi mirrors the kernel's field by field."""
    cu = qgemv.DEVICE_SOURCE.read_text()
    cc = qgemv.HOST_SOURCE.read_text()
    assert re.search(r"constexpr int kKernels = 32 \+ 3 \+ 12 \+ 1 \+ 5 \+ 1 \+ 2 \+ 2;", cc)
    assert re.search(r"constexpr int kKernels = 4 \+ 4;", cc)
    # the int8 entries after it (in this order, the mixed multi, then the self-quantizing q5 add), and
    # the norms that write their activations
    assert re.search(r"constexpr int kI8Index = 48;", cc) and re.search(r"constexpr int kMulti45I8Index = 52;", cc)
    assert re.search(r"constexpr int kSelfI8Index = 53;", cc) and re.search(r"constexpr int kNormXqIndex = 54;", cc)
    assert re.search(r"constexpr int kSwigluI8nIndex = 56;", cc) and re.search(r"constexpr int kMulti45I8nIndex = 57;", cc)
    i8 = [(4, "V4_PLAIN", "plain"), (4, "V4_SWIGLU", "swiglu"), (4, "V4_ADD", "add"), (5, "V4_ADD", "add")]
    listed = re.search(r'const char\* names\[10\] = \{("ninfer_qgemv4e_[^}]*)\}', cc).group(1)
    assert re.findall(r'"(\w+)"', listed) == [f"ninfer_qgemv4e_q{b}_{t}_i8" for b, _, t in i8] + [
        "ninfer_qgemv4e_q45_multi_i8", "ninfer_qgemv4e_q5_add_i8s", "ninfer_rms_norm_xq_wf32",
        "ninfer_rms_norm_xq_wbf16", "ninfer_qgemv4e_q4_swiglu_i8n", "ninfer_qgemv4e_q45_multi_i8n"]
    # the entries computing the decode norm in their prologue (XQN)
    assert re.search(r'extern "C" __global__ void NINFER_V4_BOUNDS_I8 ninfer_qgemv4e_q4_swiglu_i8n\(', cu)
    assert re.search(r'extern "C" __global__ void NINFER_V4_BOUNDS_I8 ninfer_qgemv4e_q45_multi_i8n\(', cu)
    assert "v4_multi45<true, true>(" in cu and "v4_body<4, __nv_bfloat16, true, V4_SWIGLU, true, false, true>(" in cu
    assert re.search(r"constexpr uint32_t V4_XQN_UNIT = (\d+);", cu).group(1) == re.search(
        r"constexpr uint32_t kXqnUnitBytes = (\d+);", cc).group(1) == "528"
    assert re.search(r'extern "C" __global__ void NINFER_V4_BOUNDS_I8 ninfer_qgemv4e_q5_add_i8s\(', cu)
    assert re.search(r'extern "C" __global__ void NINFER_V4_BOUNDS_I8 ninfer_qgemv4e_q45_multi_i8\(', cu)
    assert "v4_multi45<true>(" in cu and "v4_multi45<false>(" in cu
    for b, mode, tag in i8:
        assert f"NINFER_QGEMV4E_I8({b}, {mode}, {tag})" in cu
    assert "ninfer_qgemv4e_q##BITS##_##TAG##_i8(" in cu
    # ... all under the int8 entries' own register cap
    assert re.search(r"void NINFER_V4_BOUNDS_I8\s+\\\s+ninfer_qgemv4e_q##BITS##_##TAG##_i8\(", cu)
    for name in ("ninfer_rms_norm_xq_wf32", "ninfer_rms_norm_xq_wbf16"):
        assert f'"{name}"' in cc and re.search(rf"__global__ void __launch_bounds__\(NORM_THREADS\)\s+{name}\(", cu)
    # the mixed q4 + q5 multi entry, after the per-format ones
    assert re.search(r"constexpr int kMulti45Index = 47;", cc) and '"ninfer_qgemv4e_q45_multi"' in cc
    assert re.search(r'extern "C" __global__ void NINFER_V4_BOUNDS ninfer_qgemv4e_q45_multi\(', cu)
    names = [f"ninfer_qgemv_q{b}_b{n}_{t}" for t in ("bf16", "f32") for b in (4, 5, 6, 8) for n in (1, 2, 4, 8)]
    names += [f"ninfer_qgemv3_q{b}_ybf16" for b in (4, 5, 6)]
    names += [f"ninfer_qgemv4e_q{b}_{m}" for b in (4, 5, 6) for m in ("plain", "add", "swiglu", "multi")]
    assert "ninfer_rms_norm_wf32" in cu and "ninfer_rms_norm_wbf16" in cu
    for name in names:
        stem, _, tail = name.rpartition("_")
        if name.startswith("ninfer_qgemv4e_"):
            assert re.search(r"NINFER_QGEMV4E\(BITS, V4_\w+, " + tail, cu), name
        elif name.startswith("ninfer_qgemv3_"):
            assert "ninfer_qgemv3_q##BITS##_y##TAG" in cu
        else:
            assert "ninfer_qgemv_q##BITS##_b##B##_##TAG" in cu
    fields = lambda src: re.findall(r"^\s+(?:const )?\w+\*? (\w+);", re.search(r"struct V4Epi \{(.*?)\};", src, re.S).group(1), re.M)  # noqa: E731
    assert fields(cu) == fields(cc) == ["up_base", "up_high", "up_scales", "residual", "y_stride", "x_scales",
                                        "xq_out", "norm_w", "norm_y", "norm_xq", "norm_eps",
                                        "norm_offset", "norm_wbf16"]
    arrays = lambda src: re.findall(r"^\s+(?:const )?\w+\*? (\w+)\[V4_SEGS\];", re.search(r"struct V4Epi \{(.*?)\};", src, re.S).group(1), re.M)  # noqa: E731
    assert arrays(cu) == arrays(cc) == ["seg_end", "seg_stride", "seg_base", "seg_high", "seg_scales", "seg_y"]
    # the modes' numbering is the launcher's index arithmetic (35 + 4 * (bits - 4) + mode)
    for mode, value in (("V4_PLAIN", 0), ("V4_ADD", 1), ("V4_SWIGLU", 2), ("V4_MULTI", 3)):
        assert re.search(rf"{mode} = {value}\b", cu) and re.search(rf"{mode} = {value}\b", cc)



def test_v4_launcher_builds_warning_free(tmp_path):
    """The grouped-int launcher as the package links it (fatbin inlined, TVM FFI exports), under
    -Wall -Werror; it exports every entry the decode graph calls."""
    from ninfer_compiler.ops import cuda_extern

    from ..conftest import build_launcher

    require_tool("nvcc", "the CUDA toolkit builds device code")
    symbols = build_launcher(cuda_extern.host_source(qgemv.host_source("sm_90a"), []), tmp_path)
    for name in ("ninfer_qgemv", "ninfer_qgemv_add", "ninfer_qgemv_swiglu", "ninfer_qgemv_multi",
                 "ninfer_qgemv_norm_multi_i8", "ninfer_qgemv_norm_swiglu_i8x"):
        assert re.search(rf"\bT __tvm_ffi_{name}\b", symbols), name


def _cluster_barriers(sass: str) -> dict[str, int]:
    """Per function of a `cuobjdump -sass` listing: its cluster barrier instructions (arrive + wait)."""
    counts: dict[str, int] = {}
    name = None
    for line in sass.splitlines():
        found = re.search(r"Function : (\S+)", line)
        if found:
            name = found.group(1)
        elif name and re.search(r"\bUCGABAR_(ARV|WAIT)\b", line):
            counts[name] = counts.get(name, 0) + 1
    return counts


@pytest.mark.parametrize("arch", ["sm_90a", "sm_120a"])
def test_swiglu_cluster_handover_builds(arch, tmp_path):
    """NINFER_V4_XQ_CLUSTER=1 (the SwiGLU's int8 handover inside thread block clusters): only the
    int8 SwiGLU entry gains cluster barrier instructions (every block arrives, the leader waits),
    with no spill; the default build has none. The launcher with the switch builds under
    -Wall -Werror."""
    require_tool("nvcc", "the CUDA toolkit builds device code")
    from ninfer_compiler.codegen.toolchain import nvcc_path
    from ninfer_compiler.ops import cuda_extern

    from ..conftest import build_launcher

    sass = {}
    for tag, extra in (("default", []), ("cluster", ["-DNINFER_V4_XQ_CLUSTER=1"])):
        cubin = tmp_path / f"{tag}.cubin"
        proc = subprocess.run(
            [nvcc_path(), "-cubin", "-O3", "-std=c++17", "-DNINFER_GEMV_SKIP_V2", "-DNINFER_PDL_EARLY=1", *extra,
             "-Xptxas", "-v", f"-gencode=arch={arch.replace('sm_', 'compute_')},code={arch}",
             str(qgemv.DEVICE_SOURCE), "-o", str(cubin)],
            capture_output=True, text=True,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        spills = dict(re.findall(r"Function properties for (\w+)\n\s+\d+ bytes stack frame, (\d+) bytes spill stores",
                                 proc.stderr))
        assert int(spills["ninfer_qgemv4e_q4_swiglu_i8"]) == 0
        sass[tag] = subprocess.run([str(_cuobjdump()), "-sass", str(cubin)], capture_output=True, text=True,
                                   check=True).stdout
    assert _cluster_barriers(sass["default"]) == {}
    assert _cluster_barriers(sass["cluster"]) == {"ninfer_qgemv4e_q4_swiglu_i8": 2}
    if arch == "sm_90a":
        source = "#define NINFER_V4_XQ_CLUSTER 1\n" + qgemv.host_source("sm_90a")
        symbols = build_launcher(cuda_extern.host_source(source, []), tmp_path)
        assert re.search(r"\bT __tvm_ffi_ninfer_qgemv_swiglu_i8x\b", symbols)


def kernel_wait(stages: int, staged_x: bool, i: int, order: int) -> int:
    """The N of the kernel's `cp.async.wait_group N` before stage i in loop order `order`
    (NINFER_V4_ISSUE_AHEAD): 0 waits first, 1 after committing stage i + stages - 1
    (`v4_wait_ahead`), 2 waits first with the whole ring copied in the prologue."""
    if order == 1:
        if stages <= 2 or not staged_x or i >= stages - 2:
            return stages - 1
        return 1 if i == 0 else 0
    if order == 2:
        return 0 if staged_x and i + 1 < stages else stages - 1
    if staged_x and (i == 0 if stages <= 3 else i < stages - 2):
        return 0
    return stages - 2


def ring_schedule(stages: int, n_units: int, staged_x: bool, order: int, wait=kernel_wait) -> list[int]:  # noqa: ANN001
    """Replays one warp's copy groups through `v4_body`'s loop (`cp.async.commit_group` /
    `wait_group N`, the newest N groups taken as still pending) and returns, per stage, how many
    stages were in flight at its wait. Asserts that every group holding a byte of stage i has
    landed before stage i is computed, and that no slot is refilled before its stage is computed.
    `wait`: the N of each wait (the kernel's by default)."""
    groups: list[set[tuple[str, int]]] = []  # per committed group: ("w" | "x", stage) pieces
    computed: set[int] = set()

    def issue(stage: int) -> None:
        g: set = set()
        if stage < n_units:
            assert stage < stages or stage - stages in computed, f"slot of stage {stage - stages} refilled early"
            g |= {("w", stage)} | ({("x", stage)} if staged_x else set())
        groups.append(g)

    prologue = stages if order == 2 else stages - 1
    for j in range(prologue):  # one weight group per stage, then (xst) one activation group
        groups.append({("w", j)} if j < n_units else set())
    if staged_x:
        groups.append({("x", j) for j in range(min(prologue, n_units))})
    in_flight = []
    for i in range(n_units):
        if order == 1:
            issue(i + stages - 1)
        pending = wait(stages, staged_x, i, order)
        issued = {s for grp in groups for _, s in grp}
        in_flight.append(len({s for s in issued if s >= i}))
        landed = {p for grp in groups[: len(groups) - pending] for p in grp}
        need = {("w", i)} | ({("x", i)} if staged_x else set())
        assert need <= landed, f"stage {i} computed before {sorted(need - landed)} landed"
        if order == 0:
            issue(i + stages - 1)
        computed.add(i)
        if order == 2:
            issue(i + stages)
    return in_flight


@pytest.mark.parametrize("stages", [2, 3, 4, 5])
@pytest.mark.parametrize("staged_x", [False, True])
def test_ring_schedule_waits_for_every_stage(stages, staged_x):
    """Every loop order computes each stage only after all of its copies have landed, for every
    stage count a warp can have; issuing ahead (orders 1 and 2) keeps one stage more in flight while
    a warp waits (two at the default depth of 2, where the wait-first order keeps one)."""
    for n_units in range(1, 12):
        first = ring_schedule(stages, n_units, staged_x, 0)
        assert first[stages - 1:] == [min(stages - 1, n_units - i) for i in range(stages - 1, n_units)]
        for order in (1, 2):
            assert ring_schedule(stages, n_units, staged_x, order) == [min(stages, n_units - i) for i in range(n_units)]


def test_ring_schedule_catches_an_early_wait():
    """The replay fails a wait that lets a stage run before its staged activations: the wait-first
    order at depth 4 waiting for everything at stage 0 only, as the kernel did before."""
    def first_stage_only(stages: int, staged_x: bool, i: int, order: int) -> int:
        return 0 if staged_x and i == 0 else stages - 2

    assert ring_schedule(3, 6, True, 0, first_stage_only) == ring_schedule(3, 6, True, 0)
    with pytest.raises(AssertionError, match="stage 1 computed before"):
        ring_schedule(4, 6, True, 0, first_stage_only)


def test_ring_schedule_matches_the_kernel():
    """The waits and copies replayed above are the kernel's (its source, so that the two cannot drift)."""
    src = qgemv.DEVICE_SOURCE.read_text()
    wait = src[src.index("__device__ __forceinline__ void v4_wait_ahead"):]
    wait = wait[: wait.index("\n}\n")]
    assert re.search(r"if constexpr \(S <= 2u\) \{\s*cp_async_wait<S - 1>\(\);", wait)
    assert re.search(r"\} else if \(!xst \|\| i >= S - 2u\) \{\s*cp_async_wait<S - 1>\(\);", wait)
    assert re.search(r"\} else if \(i == 0u\) \{\s*cp_async_wait<1>\(\);\s*\} else \{\s*cp_async_wait<0>\(\);", wait)
    body = src[src.index("constexpr uint32_t ORDER = XQS ? 0u : XQN ? NINFER_V4_XQN_ORDER : NINFER_V4_ISSUE_AHEAD, "
                         "EXTRA = ORDER == 2u ? 1u : 0u;"):]
    prologue = body[: body.index("pdl_enter();")]
    assert "for (uint32_t i = 0; i + 1u < STAGES + EXTRA; ++i) {\n      if (i < n_units) v4_copy<BITS>" in prologue
    assert "for (uint32_t j = 0; j + 1u < STAGES + EXTRA; ++j) {" in body[: body.index("#pragma unroll 1")]
    loop = body[body.index("#pragma unroll 1"):]
    loop = loop[: loop.index("    cp_async_wait<0>();\n  }")]
    order2, rest = loop.split("} else if (ORDER == 1u) {", 1)
    order1, order0 = rest.split("} else {", 1)
    assert "if (xst && i + 1u < STAGES)\n          cp_async_wait<0>();" in order2
    assert "else\n          cp_async_wait<STAGES - 1>();" in order2
    assert order1.index("v4_copy<BITS>") < order1.index("cp_async_commit();") < order1.index("v4_wait_ahead<STAGES>(xst, i);")
    assert "if (xst && !XQS && (STAGES <= 3u ? i == 0u : i < STAGES - 2u))\n          cp_async_wait<0>();" in order0
    assert order0.index("cp_async_wait<STAGES - 2>();") < order0.index("v4_copy<BITS>")
    tail = order0[order0.index("v4_stage<BITS, PDL>"):]  # order 2 refills stage i's slot after computing it
    assert re.search(r"if \(ORDER == 2u\) \{\s*__syncwarp\(\);[^\n]*\n\s*if \(i \+ STAGES < n_units\) \{\s*"
                     r"v4_copy<BITS>\(ring_s \+ use, lp\);", tail)


def stage_loop_order(sass: str) -> dict[str, str]:
    """Per function of a `cuobjdump -sass` listing: the order, in its innermost loop with an MMA
    (the stage loop), of the first ring copy (LDGSTS), the first wait for copies (DEPBAR) and the
    first MMA, e.g. "wait, copy, mma"."""
    out = {}
    parts = re.split(r"\n\s+Function : (\w+)\n", sass)
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        ins = [(int(m.group(1), 16), m.group(2).strip()) for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", body)]
        index = {off: i for i, (off, _) in enumerate(ins)}
        best: list[str] | None = None
        for i, (off, text) in enumerate(ins):
            t = re.search(r"\bBRA(?:\.[\w.]+)?\s+(?:\w+,\s*)?(?:`\()?0x([0-9a-f]+)", text)
            if t and int(t.group(1), 16) < off and int(t.group(1), 16) in index:
                loop = [x for _, x in ins[index[int(t.group(1), 16)]: i + 1]]
                if any(re.match(r"(@\S+ )?[IH]MMA", x) for x in loop) and (best is None or len(loop) < len(best)):
                    best = loop
        if best:
            first = {what: next((k for k, x in enumerate(best) if re.match(rf"(@\S+ )?{op}", x)), len(best))
                     for what, op in (("copy", "LDGSTS"), ("wait", "DEPBAR"), ("mma", "[IH]MMA"))}
            out[name] = ", ".join(sorted(first, key=first.get))
    return out


@pytest.mark.parametrize("arch", ["sm_90a", "sm_120a"])
def test_issue_ahead_builds(arch, tmp_path):
    """NINFER_V4_ISSUE_AHEAD: every v4 stage loop of the default build waits, copies the next stage,
    then computes; order 1 copies before it waits, order 2 after its MMAs (the self-quantizing entry
    keeps the default order in both); none spills inside a loop (but one entry of order 2, below)."""
    require_tool("nvcc", "the CUDA toolkit builds device code")
    from ninfer_compiler.codegen.toolchain import nvcc_path

    order = {}
    for tag in (0, 1, 2):
        cubin = tmp_path / f"order{tag}.cubin"
        proc = subprocess.run(
            [nvcc_path(), "-cubin", "-O3", "-std=c++17", "-DNINFER_GEMV_SKIP_V2", "-DNINFER_PDL_EARLY=1",
             f"-DNINFER_V4_ISSUE_AHEAD={tag}", "-Xptxas", "-v",
             f"-gencode=arch={arch.replace('sm_', 'compute_')},code={arch}", str(qgemv.DEVICE_SOURCE), "-o", str(cubin)],
            capture_output=True, text=True,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        spills = dict(re.findall(r"Function properties for (\w+)\n\s+\d+ bytes stack frame, (\d+) bytes spill stores",
                                 proc.stderr))
        assert {n: int(s) for n, s in spills.items() if n.startswith("ninfer_qgemv4") and int(s) > 32} == {}
        sass = subprocess.run([str(_cuobjdump()), "-sass", str(cubin)], capture_output=True, text=True,
                              check=True).stdout
        local = loop_local_accesses(sass)
        spilling = {n for n, ops in local.items() if any(op.startswith("STL") for op in ops) or len(ops) > 2}
        # (order 2 on sm_120a: the bf16 q5 SwiGLU, which no groupwise-int model runs, stores in its loop)
        assert spilling == ({"ninfer_qgemv4e_q5_swiglu"} if (tag, arch) == (2, "sm_120a") else set())
        order[tag] = {n: o for n, o in stage_loop_order(sass).items() if n.startswith("ninfer_qgemv4")}
    assert len(order[0]) >= 20 and set(order[0].values()) == {"wait, copy, mma"}
    # (the self-quantizing and the norm-in-the-prologue entries keep the first order)
    kept = {n: "wait, copy, mma" for n in ("ninfer_qgemv4e_q5_add_i8s", "ninfer_qgemv4e_q4_swiglu_i8n",
                                           "ninfer_qgemv4e_q45_multi_i8n")}
    assert order[1] == {n: "copy, wait, mma" for n in order[0]} | kept
    assert order[2] == {n: "wait, mma, copy" for n in order[0]} | kept
