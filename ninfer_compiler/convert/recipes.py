"""Per-role numeric formats of the conversion recipes (models.md section 8.3).

A role names what a stored object is for (`attention.query_key`, `mlp.down`, `vision.qkv`, ...).
Roles not listed in a recipe (norms, biases, GDN a/b, routers, position tables) stay bf16. When a
shape cannot take the recipe's format (nvfp4 needs N % 128 == 0 and K % 64 == 0), the converter
falls back to q8 and records it.
"""

from __future__ import annotations

from .errors import ConversionError

RECIPES = ("bf16", "groupwise-int", "nvfp4")

Q4, Q5, Q6, Q8, NVFP4, BF16 = "q4_g64_fp16", "q5_g64_fp16", "q6_g64_fp16", "q8_g32_fp16", "nvfp4", "bf16"

VISION = {"vision.patch": Q6, "vision.qkv": Q4, "vision.fc1": Q4, "vision.output": Q5, "vision.fc2": Q5, "vision.merger": Q8}

# Qwen3.6-27B groupwise column (Q4 [query;key] + Q5 [gate;value] parents)
DENSE_GROUPWISE = {
    "embedding": Q6, "output_head": Q6, "proposal.head": Q4,
    "attention.query_key": Q4, "attention.gate_value": Q5, "attention.output": Q5,
    "gdn.query_key": Q4, "gdn.value_z": Q5, "gdn.output": Q5,
    "mlp.gate_up": Q4, "mlp.down": Q5, "mtp.projection": Q8, **VISION,
}

# Qwen3.6-35B-A3B groupwise column
MOE_GROUPWISE = {
    "embedding": Q8, "output_head": Q6, "proposal.head": Q4,
    "attention.query_key_gate_value": Q8, "attention.output": Q8,
    "gdn.query_key_value_z": Q8, "gdn.output": Q8,
    "moe.experts.gate_up": Q4, "moe.experts.down": Q5, "moe.shared": Q8,
    "mlp.gate_up": Q8, "mlp.down": Q8, "mtp.projection": Q8, **VISION,
}

# Qwen3.6-27B nvfp4 column (with its bf16 exceptions by layer, see `format_for`)
DENSE_NVFP4 = {
    "embedding": Q8, "output_head": Q8, "proposal.head": Q4,
    "attention.query_key_gate_value": NVFP4, "attention.output": NVFP4,
    "gdn.query_key_value_z": NVFP4, "gdn.output": NVFP4,
    "mlp.gate_up": NVFP4, "mlp.down": NVFP4, "mtp.projection": Q8, **VISION,
}

# the converter's 35B-A3B nvfp4 recipe: routed and shared experts nvfp4, the rest groupwise
MOE_NVFP4 = {**MOE_GROUPWISE, "moe.experts.gate_up": NVFP4, "moe.experts.down": NVFP4, "moe.shared": NVFP4}

# Qwen4Exp (family "qwen4_exp") and GLM5Next (family "glm"): no official recipe exists for either
# (official recipes exist only for Qwen3.5; the only Qwen3.8-Flash-Next artifact uses fork-only
# formats, models.md 8.4, and GLM5Next has no NInfer artifact at all, 8.5). Both are sparse MoE
# models, so their columns are derived from the Qwen3.6-35B-A3B one: routed experts q4 (gate/up)
# / q5 (down), shared expert and every other large projection q8, embedding q8, head q6, MTP q8,
# vision as in every official column; the nvfp4 recipe makes routed and shared experts nvfp4 like
# MOE_NVFP4. Unlike the "moe" family they carry no per-layer exceptions (those are the 35B-A3B's).
# Roles absent here stay bf16, following the Flash-Next fork where it has a choice (hyper-
# connections, QSA/DSA indexers, PLE projections, KDA low-rank gates, routers).

# Qwen4Exp: the MoE column plus the hashed n-gram PLE table, a gathered (host-mapped) embedding;
# q4 is the nearest upstream format to the fork's 4-bit u4z8_g16 (nvfp4 does not apply to gathers).
QWEN4_EXP_GROUPWISE = {**MOE_GROUPWISE, "ple.table": Q4}
QWEN4_EXP_NVFP4 = {**QWEN4_EXP_GROUPWISE, "moe.experts.gate_up": NVFP4, "moe.experts.down": NVFP4, "moe.shared": NVFP4}

# GLM5Next: KDA and MLA projections take the attention/GDN q8 slot; the GLM vision tower maps onto
# the Qwen vision roles (gate/up = fc1, down = fc2; the 2x2 downsample conv joins the merger).
GLM_GROUPWISE = {
    "embedding": Q8, "output_head": Q6,
    "kda.query_key_value": Q8, "kda.output": Q8,
    "mla.query_a_kv_a": Q8, "mla.query_b": Q8, "mla.kv_b": Q8, "mla.output": Q8,
    "moe.experts.gate_up": Q4, "moe.experts.down": Q5, "moe.shared": Q8,
    "mlp.gate_up": Q8, "mlp.down": Q8, "mtp.projection": Q8, **VISION,
}
GLM_NVFP4 = {**GLM_GROUPWISE, "moe.experts.gate_up": NVFP4, "moe.experts.down": NVFP4, "moe.shared": NVFP4}

TABLES = {
    ("dense", "groupwise-int"): DENSE_GROUPWISE,
    ("dense", "nvfp4"): DENSE_NVFP4,
    ("moe", "groupwise-int"): MOE_GROUPWISE,
    ("moe", "nvfp4"): MOE_NVFP4,
    ("qwen4_exp", "groupwise-int"): QWEN4_EXP_GROUPWISE,
    ("qwen4_exp", "nvfp4"): QWEN4_EXP_NVFP4,
    ("glm", "groupwise-int"): GLM_GROUPWISE,
    ("glm", "nvfp4"): GLM_NVFP4,
}


def check_recipe(recipe: str) -> None:
    if recipe not in RECIPES:
        raise ConversionError(f"unknown recipe {recipe!r}; choose one of {', '.join(RECIPES)}")


def format_for(recipe: str, family: str, role: str, layer: int | None) -> str:
    """The numeric format of a stored weight object under `recipe` for a model `family`."""
    check_recipe(recipe)
    if recipe == "bf16":
        return BF16
    table = TABLES[(family, recipe)]
    fmt = table.get(role, BF16)
    if recipe == "nvfp4" and family == "dense" and layer is not None:
        if role == "attention.query_key_gate_value" and layer < 24:
            return BF16
        if role == "attention.output" and layer in (3, 7):
            return BF16
        if role == "gdn.output" and layer == 4:
            return BF16
    if family == "moe" and recipe == "groupwise-int" and role == "moe.experts.down" and layer in (34, 38, 39):
        return Q6
    return fmt


def fits(fmt: str, shape: tuple[int, ...]) -> bool:
    """Whether a stored shape satisfies the format's layout constraints."""
    if fmt in (BF16, "fp32", "int32"):
        return True
    if len(shape) != 2:
        return False
    if fmt == NVFP4:
        return shape[0] % 128 == 0 and shape[1] % 64 == 0
    return True


def layout_for(fmt: str) -> str:
    return {
        BF16: "contiguous_le_v1", "fp32": "contiguous_le_v1", "int32": "contiguous_le_v1",
        Q4: "row_split_k128_v1", Q5: "row_split_k128_v1", Q6: "row_split_k128_v1", Q8: "row_split_k128_v1",
        NVFP4: "block_scale_k16_m128x4_v1", "fp8_e4m3fn_row_bf16": "row_scale_v1",
    }[fmt]


def activation_policy(fmt: str) -> str:
    return {NVFP4: "AllowA4", "fp8_e4m3fn_row_bf16": "AllowA8"}.get(fmt, "A16Only")
