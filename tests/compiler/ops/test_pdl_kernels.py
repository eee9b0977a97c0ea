"""Programmatic Dependent Launch of the Triton decode kernels, checked without a GPU.

A kernel that `ninfer_cuda::launch` starts with PDL may run while the previous kernel of the stream
still runs, so its SASS must wait for it (`ACQBULK`, from Triton's `gdc_wait`) before its first
memory access, and the launchers must ask for PDL exactly for such images. The exceptions
(`EARLY_READS`) read before the wait only what no kernel of the decode step writes (their own
recurrent state, last written in the previous step, parameters and the step's slot table), and
never write before it: with the kernel feature `pdl_early` the trigger (`PREEXIT`) comes before the
wait, so a kernel may start while kernels earlier than its predecessor still run."""

from __future__ import annotations

import re
import subprocess

import pytest

from ..codegen.conftest import require_tool
from .test_qgemv_v4 import _cuobjdump

pytest.importorskip("triton")

MEMORY = re.compile(r"\b(LDG|STG|LD|ST|ATOM|ATOMG|RED|LDGSTS|UBLKCP|UTMALDG)\b")


def _images(arch: str) -> dict[str, object]:
    from ninfer_compiler.ops import (
        attention_decode,
        attention_prologue,
        conv1d_decode,
        gdn_decode_fused,
        greedy,
    )

    split, combine = attention_decode.images(arch, 24, 4, 256, 16)
    partial, choose = greedy.images(arch)
    return {
        "attention split": split,
        "attention split, early": attention_decode.images(arch, 24, 4, 256, 16, early=True)[0],
        "attention combine": combine,
        "attention combine, gated": attention_decode.images(arch, 24, 4, 256, 16, gated=True)[1],
        "attention prologue": attention_prologue.image(24, 4, 256, 16, 64, (11, 11, 10), "bfloat16", "bfloat16", arch),
        "gdn decode": gdn_decode_fused.image(16, 48, 128, 128, "bfloat16", "float32", arch),
        "gdn decode, folded gates": gdn_decode_fused.image(16, 48, 128, 128, "bfloat16", "float32", arch, 5120),
        "gdn decode, chunks loaded ahead": gdn_decode_fused.image(16, 48, 128, 128, "bfloat16", "float32", arch, 5120,
                                                                  True, 64, 4, gate_bk=0, prefetch=True),
        "gdn decode, chunks": gdn_decode_fused.image(16, 48, 128, 128, "bfloat16", "float32", arch, 5120, True, 64, 4),
        "gdn decode, convolution": gdn_decode_fused.image(16, 48, 128, 128, "bfloat16", "float32", arch, 5120, True,
                                                          gate_bk=0, conv_dtype="bfloat16"),
        "gdn decode, convolution in chunks": gdn_decode_fused.image(16, 48, 128, 128, "bfloat16", "float32", arch,
                                                                    5120, True, 64, 4, conv_dtype="bfloat16"),
        "conv1d decode": conv1d_decode.image(10240, 4, "bfloat16", arch),
        "greedy partial": partial,
        "greedy combine": choose,
    }


# kernel -> the arguments it may read before the wait, and the pointers into its own state it reads there
# (alias -> the state argument it is made from)
EARLY_READS = {
    "gdn decode": ("gdn_decode_kernel", {"state", "slots", "lens", "a_log", "dt_bias", "norm_w", "a_in", "b_in",
                                           "s_ptr", "conv_w", "hist"}, {"s_ptr": "state", "hist": "conv_hist"}),
    "conv1d decode": ("conv1d_decode_kernel", {"state", "slots", "lens", "w", "hist"}, {"hist": "state"}),
}


def test_early_reads_touch_only_step_constant_data():
    """The source before `gdc_wait()` of each EARLY_READS kernel: loads only from the listed
    arguments (`a_in`/`b_in` only as the GATE_K > 0 weights), no store."""
    import inspect

    from ninfer_compiler.ops import conv1d_decode, gdn_decode_fused

    kernels = {"gdn_decode_kernel": gdn_decode_fused.gdn_decode_kernel,
               "conv1d_decode_kernel": conv1d_decode.conv1d_decode_kernel}
    for fn_name, allowed, aliases in EARLY_READS.values():
        source = inspect.getsource(kernels[fn_name].fn)
        early = source[source.index('"""', source.index('"""') + 3):source.index("pdl_enter(PDL)")]
        loads = set(re.findall(r"tl\.load\(\s*(\w+)", early))
        assert loads and loads <= allowed, (fn_name, loads - allowed)
        assert "tl.store" not in early and "atomic" not in early, fn_name
        for alias, base in aliases.items():  # pointers into the kernel's own state
            assert re.search(rf"{alias} = {base} \+", early), (fn_name, alias)
    gdn = inspect.getsource(gdn_decode_fused.gdn_decode_kernel.fn)
    early = gdn[:gdn.index("pdl_enter(PDL)")]
    gated = early[early.index("if GATE_K > 0:"):]  # the gate weights are read early only when they are weights
    assert "tl.load(a_in" not in early.replace(gated, "") and "tl.load(a_in" in gated


WRITE = re.compile(r"\b(STG|ST|ATOM|ATOMG|RED)\b")
# images that also load before the wait, by a form of the kernel the test of its op checks at the source
# (tests/compiler/ops/test_attention_decode.py `test_early_tile_reads_the_new_token_after_the_wait`)
EARLY_LOADS = {"attention split, early"}


@pytest.mark.parametrize("early", [False, True], ids=["wait-first", "trigger-first"])
def test_pdl_images_wait_before_touching_memory(tmp_path, monkeypatch, early):
    """Every image waits before its first memory access (EARLY_READS: its first write), and triggers
    the next launch after the wait by default, before it with the kernel feature `pdl_early`."""
    require_tool("nvcc", "Triton's ptxas builds the images")
    monkeypatch.setenv("NINFER_KERNELS", "+pdl_early" if early else "-pdl_early")
    for name, img in _images("sm_90a").items():
        cubin = tmp_path / "k.cubin"
        cubin.write_bytes(img.cubin)
        sass = subprocess.run([str(_cuobjdump()), "-sass", str(cubin)], capture_output=True, text=True,
                              check=True).stdout
        ops = [m.group(1).strip() for m in re.finditer(r"/\*[0-9a-f]{4,}\*/\s+([^;]*);", sass)]
        wait = next((i for i, op in enumerate(ops) if op.startswith("ACQBULK")), None)
        # EARLY_READS kernels may load first (see above), never write; the others touch nothing first
        touch = WRITE if name.split(",")[0] in EARLY_READS or name in EARLY_LOADS else MEMORY
        first = next((i for i, op in enumerate(ops) if touch.search(op)), len(ops))
        assert wait is not None and wait < first, (name, ops[: first + 1])
        # (a kernel that may stall before its wait triggers once more at its start: the first one counts)
        trigger = [i for i, op in enumerate(ops) if op.startswith("PREEXIT")]
        assert trigger and (trigger[0] < wait if early else min(trigger) > wait), (name, ops[: wait + 2])


def test_launchers_ask_for_pdl_for_every_triton_decode_kernel():
    from ninfer_compiler.ops import (
        attention_decode,
        attention_prologue,
        conv1d_decode,
        gdn_decode_fused,
        greedy,
    )

    for source in (attention_decode.HOST_SOURCE, attention_prologue.LAUNCHER, conv1d_decode.LAUNCHER,
                   gdn_decode_fused.LAUNCHER, greedy.LAUNCHER):
        calls = re.findall(r"ninfer_cuda::launch\((.*?)\);", source, re.S)
        assert calls and all(re.search(r",\s*(/\*pdl=\*/)?true(,\s*/\*cluster_y=\*/@\w+@)?$", call.strip())
                             for call in calls), calls


# image -> the runs of global loads its SASS has after the PDL wait (a run ends at a barrier, which
# no later load is issued across): each run is one L2 round trip on the step's critical path, so the
# step's inputs are loaded together (the GDN step keeps its gate input after the l2 norms: registers)
POST_WAIT_LOAD_RUNS = {"attention prologue": 1, "attention combine, gated": 1, "gdn decode, folded gates": 2,
                       "gdn decode, convolution": 2}


def test_post_wait_loads_are_issued_together(tmp_path):
    require_tool("nvcc", "Triton's ptxas builds the images")
    images = _images("sm_90a")
    for name, expected in POST_WAIT_LOAD_RUNS.items():
        cubin = tmp_path / "k.cubin"
        cubin.write_bytes(images[name].cubin)
        sass = subprocess.run([str(_cuobjdump()), "-sass", str(cubin)], capture_output=True, text=True,
                              check=True).stdout
        ops = [re.sub(r"^@!?U?P\w+\s+", "", m.group(1).strip())
               for m in re.finditer(r"/\*[0-9a-f]{4,}\*/\s+([^;]*);", sass)]
        wait = next(i for i, op in enumerate(ops) if op.startswith("ACQBULK"))
        runs, in_run = 0, False
        for op in ops[wait + 1:]:
            if op.startswith("LDG.") and ".CONSTANT" not in op.split()[0]:  # (the math library's tables)
                runs += not in_run
                in_run = True
            elif op.startswith("BAR"):
                in_run = False
        assert runs == expected, (name, runs)
