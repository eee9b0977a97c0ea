#!/usr/bin/env python3
"""The GDN decode step with the short convolution inside (`gdn_step_conv`) against the convolution
kernel followed by the step, on one GPU, step after step.

    .venv/bin/python tests/gpu/check_gdn_conv.py prepare    # build machine: sm_90a cubins (Triton 3.9)
    python3 tests/gpu/check_gdn_conv.py run --out $OUT      # GPU machine: carry .cache/ninfer/gdn-conv

`prepare` compiles, as a 27B package embeds them (16 key / 48 value heads, dk = dv = 128, 10,240
convolution channels, gates folded from a 5,120-wide input, int8 activations out), the convolution
kernel and, for each launch shape of the step (`SHAPES`: the whole slice at one row, chunks of 64
loaded ahead at 2-4 rows, plain chunks of 64 above), the step without and with the convolution.
`run` launches them through cupy (the convolution form in thread block clusters of HV / HK programs
along the heads, through cuLaunchKernelEx, as `ninfer_cuda::launch` does) at 1, 3 and 8 rows on
permuted slots with one fresh row, `STEPS` decode steps walking `LAYERS` layers, each step a new
row: the two paths' outputs, int8 activations, recurrent state and convolution history must be the
same bytes after every step (the convolved values are the same operations in the same order; a q / k
history written before another program of its key head read it would show as a difference). Prints
a table last; everything goes to $OUT/gdn_conv.json.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
STAGE = ROOT / ".cache" / "ninfer" / "gdn-conv"
HK, HV, DK, DV, GATE_K = 16, 48, 128, 128, 5120
C = 2 * HK * DK + HV * DV
LAYERS, SLOTS, STEPS = 4, 8, 12
# rows -> (BV, warps, gate columns per step, prefetch): gdn_decode_fused.SHAPES at 1, <= 4 and more rows
SHAPES = {1: (0, 8, 0, False), 3: (64, 4, 0, True), 8: (64, 4, 1024, False)}
DEVICE = "cuda"


# ---------------------------------------------------------------- build machine
def prepare() -> None:
    from ninfer_compiler.ops import conv1d_decode
    from ninfer_compiler.ops import gdn_decode_fused as fused

    STAGE.mkdir(parents=True, exist_ok=True)
    for old in STAGE.glob("*.cubin"):
        old.unlink()
    images = {"conv1d": conv1d_decode.image(C, 4, "bfloat16", "sm_90a")}
    for rows, (bv, warps, gate_bk, prefetch) in SHAPES.items():
        for conv in (None, "bfloat16"):
            images[f"step{rows}{'_conv' if conv else ''}"] = fused.image(
                HK, HV, DK, DV, "bfloat16", "float32", "sm_90a", GATE_K, True, bv, warps, gate_bk=gate_bk,
                prefetch=prefetch, conv_dtype=conv)
    index = {}
    for name, img in images.items():
        (STAGE / f"{name}.cubin").write_bytes(img.cubin)
        index[name] = {"file": f"{name}.cubin", "name": img.name, "shared": img.shared, "threads": img.threads}
        print(f"{name}: shared {img.shared}, threads {img.threads}", flush=True)
    index["conv1d"]["channels_per_program"] = conv1d_decode.BLOCK  # (its grid: C / BLOCK programs a row)
    (STAGE / "index.json").write_text(json.dumps(index, indent=1))
    print(f"wrote {len(index)} images to {STAGE}")


# ---------------------------------------------------------------- GPU machine
class _Attr(ctypes.Structure):  # CUlaunchAttribute
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_uint * 16)]


class _Config(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("shared", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(_Attr)), ("num_attrs", ctypes.c_uint)]


def launch_ex(fn, grid: tuple, threads: int, shared: int, args: list, cluster_y: int = 1) -> None:  # noqa: ANN001
    """cuLaunchKernelEx on cupy's current stream, in clusters of (1, cluster_y, 1) when cluster_y > 1;
    `args` numpy scalars (uint64 pointers, int32, float32), as cupy's launches take them."""
    import cupy as cp
    import numpy as np

    lib = ctypes.CDLL("libcuda.so.1")
    kinds = {np.uint64: ctypes.c_uint64, np.int32: ctypes.c_int32, np.float32: ctypes.c_float}
    values = [kinds[type(a)](a.item()) for a in args]
    ptrs = (ctypes.c_void_p * len(values))(*[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in values])
    attr = _Attr()
    attr.id = 4  # CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    attr.value[0], attr.value[1], attr.value[2] = 1, cluster_y, 1
    cfg = _Config((ctypes.c_uint * 3)(*grid), (ctypes.c_uint * 3)(threads, 1, 1), shared,
                  ctypes.c_void_p(cp.cuda.get_current_stream().ptr), ctypes.pointer(attr), 1 if cluster_y > 1 else 0)
    rc = lib.cuLaunchKernelEx(ctypes.byref(cfg), ctypes.c_void_p(fn.ptr), ptrs, None)
    if rc != 0:
        raise RuntimeError(f"cuLaunchKernelEx failed with {rc}")


def run(out_dir: Path) -> int:
    import cupy as cp
    import torch

    sys.path.insert(0, str(ROOT / "tests" / "gpu"))
    from cupy_bench import run_log

    out_dir.mkdir(parents=True, exist_ok=True)
    say, t0 = run_log(out_dir / "check_gdn_conv.log"), time.time()
    say(f"{torch.cuda.get_device_name()} torch {torch.__version__} cupy {cp.__version__}")
    index = json.loads((STAGE / "index.json").read_text())
    fns = {n: cp.RawModule(path=str(STAGE / m["file"])).get_function(m["name"]) for n, m in index.items()}
    say("registers / local bytes: " + ", ".join(f"{n} {f.num_regs}/{f.local_size_bytes}" for n, f in fns.items()))

    import numpy as np

    def ptr(t, offset: int = 0) -> np.uint64:  # noqa: ANN001
        return np.uint64(t.data_ptr() + offset)

    i32, f32 = np.int32, np.float32
    null = np.uint64(0)
    results, failed = {}, 0
    for rows in SHAPES:
        gen = torch.Generator(device=DEVICE).manual_seed(rows)

        def randn(*shape, scale=1.0, dtype=torch.bfloat16, gen=gen):  # noqa: ANN001, ANN202
            return (torch.randn(*shape, generator=gen, device=DEVICE) * scale).to(dtype)

        conv_w = randn(4, C, scale=0.5)
        wa, wb = randn(LAYERS, HV, GATE_K, scale=GATE_K**-0.5), randn(LAYERS, HV, GATE_K, scale=GATE_K**-0.5)
        a_log, dt_bias = torch.linspace(-3.0, 1.5, HV, device=DEVICE), randn(HV, dtype=torch.float32)
        norm_w = (1.0 + randn(DV, scale=0.1, dtype=torch.float32)).bfloat16()
        slots = torch.randperm(SLOTS, generator=gen, device=DEVICE)[:rows].to(torch.int32)
        state0 = randn(LAYERS, SLOTS, HV, DK, DV, scale=0.1, dtype=torch.float32)
        hist0 = randn(LAYERS, SLOTS, 3, C)
        paths = {name: {"state": state0.clone(), "hist": hist0.clone(),  # each path its own copies
                        "out": torch.empty(rows, HV * DV, dtype=torch.bfloat16, device=DEVICE),
                        "xq": torch.zeros(HV * DV * 8 + HV * DV // 256 * 64, dtype=torch.uint8, device=DEVICE)}
                 for name in ("ref", "conv")}
        y = torch.empty(rows, C, dtype=torch.bfloat16, device=DEVICE)
        width = HV * DV
        worst = {"out": 0, "xq": 0, "state": 0, "hist": 0}
        step_name = f"step{rows}"
        for step in range(STEPS):
            layer = step % LAYERS
            lens = torch.tensor([0 if (i == rows // 2 and step < LAYERS) else 5 + step for i in range(rows)],
                                dtype=torch.int32, device=DEVICE)  # one row fresh in its first pass over the layers
            raw, h, z = randn(rows, C), randn(rows, GATE_K), randn(rows, HV * DV, scale=2.0)
            ref, new = paths["ref"], paths["conv"]
            per = index["conv1d"]["channels_per_program"]
            fns["conv1d"](((C + per - 1) // per, rows, 1), (index["conv1d"]["threads"], 1, 1),
                          (ptr(raw), ptr(conv_w), ptr(ref["hist"]), ptr(slots), ptr(lens), ptr(y), i32(layer),
                           i32(SLOTS), null, null), shared_mem=index["conv1d"]["shared"])
            common = [ptr(wa[layer]), ptr(wb[layer]), ptr(h), ptr(a_log), ptr(dt_bias), ptr(z), ptr(norm_w)]
            fns[step_name]((rows, HV, 1), (index[step_name]["threads"], 1, 1),
                           (ptr(y), *common, ptr(ref["state"]), ptr(slots), ptr(lens), ptr(ref["out"]), i32(layer),
                            i32(SLOTS), f32(1e-5), ptr(ref["xq"]), ptr(ref["xq"], width * 8),
                            null, null, i32(0), null, null), shared_mem=index[step_name]["shared"])
            launch_ex(fns[step_name + "_conv"], (rows, HV, 1), index[step_name + "_conv"]["threads"],
                      index[step_name + "_conv"]["shared"],
                      [ptr(raw), *common, ptr(new["state"]), ptr(slots), ptr(lens), ptr(new["out"]), i32(layer),
                       i32(SLOTS), f32(1e-5), ptr(new["xq"]), ptr(new["xq"], width * 8),
                       ptr(conv_w), ptr(new["hist"]), i32(SLOTS), null, null], cluster_y=HV // HK)
            torch.cuda.synchronize()
            for key in worst:
                a, b = ref[key], new[key]
                worst[key] = max(worst[key], int((a.view(torch.uint8) != b.view(torch.uint8)).sum()))
        ok = all(v == 0 for v in worst.values()) and bool(torch.isfinite(paths["conv"]["out"].float()).all())
        failed += not ok
        results[str(rows)] = {**worst, "ok": ok}
        say(f"{rows} row(s), {STEPS} steps: bytes differing at worst: out {worst['out']}, int8 {worst['xq']}, "
            f"state {worst['state']}, history {worst['hist']} {'ok' if ok else 'FAIL'}")
    (out_dir / "gdn_conv.json").write_text(json.dumps(results, indent=1))
    say(f"== the convolution in the GDN step against the convolution kernel and the step ({time.time() - t0:.0f} s)")
    say("rows | out | int8 | state | history | ok")
    for rows, r in results.items():
        say(f"{rows} | {r['out']} | {r['xq']} | {r['state']} | {r['hist']} | {r['ok']}")
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["prepare", "run"])
    parser.add_argument("--out", type=Path, default=Path("/tmp/gdn-conv-out"))
    args = parser.parse_args()
    if args.action == "prepare":
        prepare()
        return 0
    return run(args.out)


if __name__ == "__main__":
    sys.exit(main())
