"""HF checkpoint -> `ninfer convert` -> `ninfer compile --target cpu` -> runtime, against HF itself.

The tiny Qwen3.5 Dense model (models.md section 9, weights bf16-representable) is the oracle:
logits of a 75-token prompt (two GDN chunks) through one-shot prefill, chunked prefill and
prefill + token-by-token decode, greedy continuations, batched decode, and the `ninfer run`
command against `generate` through the chat template. For the groupwise-int and nvfp4 artifacts HF
runs on the dequantized weights read back from the artifact.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from ninfer_cli.main import cli
from ninfer_compiler.compile import CompileError, CompileOptions, compile_artifact
from ninfer_compiler.convert.driver import convert
from ninfer_compiler.testmodel.factory import cached_hf_model, create_model
from ninfer_runtime.artifact import Artifact
from ninfer_runtime.package import PackageError
from ninfer_runtime.runner import ModelRunner

pytestmark = pytest.mark.slow
PROMPT = np.random.default_rng(0).integers(2, 400, size=75).tolist()
RECIPES = ("bf16", "groupwise-int", "nvfp4")


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("e2e")
    out = {}
    for recipe in RECIPES:
        art = root / f"{recipe}.ninfer"
        convert(cached_hf_model("qwen3_5"), art, recipe)
        compile_artifact(art, root / f"pkg-{recipe}", CompileOptions(max_context=1024, prefill_chunk=32))
        out[recipe] = art
        out[f"pkg-{recipe}"] = root / f"pkg-{recipe}"
    return out


def _hf_from_artifact(art_path: Path):
    """The HF model with every text weight replaced by the artifact's decoded values."""
    model, _ = create_model("qwen3_5")
    lm = model.model.language_model
    cfg = model.config.text_config
    with Artifact(art_path) as art, torch.no_grad():
        def put(param: torch.nn.Parameter, values: np.ndarray) -> None:
            param.copy_(torch.from_numpy(np.ascontiguousarray(values)).reshape(param.shape))

        put(lm.embed_tokens.weight, art.parameter("text/token_embedding", (cfg.vocab_size, cfg.hidden_size)))
        put(model.lm_head.weight, art.parameter("text/output_head", (cfg.vocab_size, cfg.hidden_size)))
        put(lm.norm.weight, art.parameter("text/final_norm"))
        for i, layer in enumerate(lm.layers):
            p = f"text/layers/{i}/"
            put(layer.input_layernorm.weight, art.parameter(p + "input_norm"))
            put(layer.post_attention_layernorm.weight, art.parameter(p + "post_attention_norm"))
            for ours, theirs in (("gate", layer.mlp.gate_proj), ("up", layer.mlp.up_proj), ("down", layer.mlp.down_proj)):
                put(theirs.weight, art.parameter(p + "mlp/" + ours, tuple(theirs.weight.shape)))
            if cfg.layer_types[i] == "full_attention":
                a, heads, d = layer.self_attn, cfg.num_attention_heads, cfg.head_dim
                q = art.parameter(p + "attention/query").reshape(heads, d, -1)
                g = art.parameter(p + "attention/gate").reshape(heads, d, -1)
                put(a.q_proj.weight, np.stack([q, g], axis=1).reshape(heads * 2 * d, -1))
                for ours, theirs in (("key", a.k_proj), ("value", a.v_proj), ("output", a.o_proj)):
                    put(theirs.weight, art.parameter(p + "attention/" + ours, tuple(theirs.weight.shape)))
                put(a.q_norm.weight, art.parameter(p + "attention/query_norm"))
                put(a.k_norm.weight, art.parameter(p + "attention/key_norm"))
            else:
                g = layer.linear_attn
                qkv = [art.parameter(p + f"gdn/{n}").reshape(-1, cfg.hidden_size) for n in ("query", "key", "value")]
                put(g.in_proj_qkv.weight, np.concatenate(qkv))
                for ours, theirs in (("z", g.in_proj_z), ("a_projection", g.in_proj_a), ("b_projection", g.in_proj_b),
                                     ("output", g.out_proj)):
                    put(theirs.weight, art.parameter(p + "gdn/" + ours, tuple(theirs.weight.shape)))
                put(g.A_log, art.parameter(p + "gdn/a_log"))
                put(g.dt_bias, art.parameter(p + "gdn/dt_bias"))
                put(g.norm.weight, art.parameter(p + "gdn/norm"))
                put(g.conv1d.weight, art.parameter(p + "gdn/convolution").T)
    return model


@pytest.fixture(scope="module")
def oracles(built) -> dict[str, tuple]:
    out = {}
    for recipe in RECIPES:
        model = _hf_from_artifact(built[recipe])
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([PROMPT])).logits[0].numpy()
            greedy = model.generate(torch.tensor([PROMPT]), max_new_tokens=32, do_sample=False,
                                    eos_token_id=None, pad_token_id=0)[0, len(PROMPT):].tolist()
        out[recipe] = (model, logits, greedy)
    return out


def test_bf16_artifact_is_the_hf_model(oracles):
    """The factory's weights are bf16-exact, so the bf16 artifact changes nothing."""
    model, _ = create_model("qwen3_5")
    reloaded = oracles["bf16"][0]
    for (name, a), b in zip(model.state_dict().items(), reloaded.state_dict().values(), strict=True):
        if "visual" not in name:
            assert torch.equal(a, b), name


def _greedy_continuation(runner: ModelRunner, first_logits: np.ndarray, steps: int) -> list[int]:
    seq = runner.pool.acquire()
    runner.prefill(seq, PROMPT)
    tokens = [int(np.argmax(first_logits))]
    for _ in range(steps - 1):
        tokens.append(int(np.argmax(runner.decode([seq], [tokens[-1]])[0])))
    runner.pool.release(seq)
    return tokens


@pytest.mark.parametrize("recipe", RECIPES)
def test_logits_parity(built, oracles, recipe):
    _, ref, greedy = oracles[recipe]
    runner = ModelRunner(built[f"pkg-{recipe}"])
    # (a) one-shot: the package's prefill chunk is 32, so call the chunk-sized pieces explicitly below;
    # here a single runner.prefill call covers the whole prompt (it chunks internally by 32)
    seq = runner.pool.acquire()
    oneshot = runner.prefill(seq, PROMPT, all_logits=True)
    runner.pool.release(seq)
    assert rel_err(oneshot, ref) <= 1e-4
    # (b) uneven chunks across GDN chunk boundaries
    seq = runner.pool.acquire()
    pieces = [runner.prefill(seq, PROMPT[a:b], all_logits=True) for a, b in ((0, 17), (17, 50), (50, 75))]
    runner.pool.release(seq)
    assert rel_err(np.concatenate(pieces), ref) <= 1e-4
    # (c) prefill then one token at a time
    seq = runner.pool.acquire()
    head = runner.prefill(seq, PROMPT[:40], all_logits=True)
    tail = [runner.decode([seq], [t])[0] for t in PROMPT[40:]]
    runner.pool.release(seq)
    assert rel_err(np.concatenate([head, np.stack(tail)]), ref) <= 1e-4
    # greedy 32-token continuation identical to HF generate
    assert _greedy_continuation(runner, oneshot[-1], 32) == greedy
    runner.pool.check_all_free()


def test_batched_decode_matches_single(built):
    runner = ModelRunner(built["pkg-bf16"])
    prompts = [PROMPT[:20], PROMPT[:41], PROMPT[5:75]]
    alone = []
    for p in prompts:
        seq = runner.pool.acquire()
        logits = runner.prefill(seq, p)
        alone.append([logits] + [runner.decode([seq], [t])[0] for t in (7, 9, 11)])
        runner.pool.release(seq)
    seqs = [runner.pool.acquire() for _ in prompts]
    batched = [[runner.prefill(s, p)] for s, p in zip(seqs, prompts, strict=True)]
    for t in (7, 9, 11):
        step = runner.decode(seqs, [t] * len(seqs))
        for row, b in zip(step, batched, strict=True):
            b.append(row)
    for s in seqs:
        runner.pool.release(s)
    for a, b in zip(alone, batched, strict=True):
        assert rel_err(np.stack(b), np.stack(a)) <= 1e-6
    runner.pool.check_all_free()


def test_ninfer_run_matches_hf_generate(built, tmp_path):
    """`ninfer run --greedy` prints the same token ids HF `generate` picks for the templated prompt."""
    from transformers import AutoTokenizer

    hf_dir = cached_hf_model("qwen3_5")
    tok = AutoTokenizer.from_pretrained(hf_dir)
    messages = [{"role": "user", "content": "Write one sentence about rivers."}]
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, enable_thinking=False, tokenize=True,
                                  return_dict=False)
    model, _ = create_model("qwen3_5")
    with torch.no_grad():
        ref = model.generate(torch.tensor([ids]), max_new_tokens=20, do_sample=False)[0, len(ids):].tolist()
    result = CliRunner().invoke(cli, ["run", str(built["pkg-bf16"]), "--prompt", "Write one sentence about rivers.",
                                      "--greedy", "--no-thinking", "--max-tokens", "20", "--print-token-ids"])
    assert result.exit_code == 0, result.output
    line = re.search(r"token_ids: ([0-9 ]+)", result.stderr).group(1)
    assert [int(t) for t in line.split()] == ref
    assert "summary     prompt tokens             " + str(len(ids)) in result.stderr
    assert "finish reason" in result.stderr


def test_package_refuses_other_artifact(built, tmp_path):
    other = tmp_path / "other.ninfer"
    convert(cached_hf_model("qwen3_5"), other, "bf16")  # same weights, fresh artifact_id
    with pytest.raises(PackageError, match="artifact_id"):
        ModelRunner(built["pkg-bf16"], artifact=other)


def test_nvfp4_binds_row_ranges_of_packed_parents(built):
    """The GDN `[query; key; value; z]` parent is one nvfp4 object; `key` starts at row 64, inside a
    128-row scale tile. Its loaded planes decode to exactly the artifact's values."""
    from ninfer_runtime.artifact.codecs import E2M1_VALUES, E4M3FN_VALUES
    from ninfer_runtime.weights import ParamEntry, load_param

    with Artifact(built["nvfp4"]) as art:
        binding = "text/layers/0/gdn/key"
        (part,) = art.binding(binding).parts
        assert art.tensor_object(part.object).format == "nvfp4" and part.begin == 64 * 64
        planes = {p: load_param(art, ParamEntry(f"layers.0.gdn.key.{p}", binding, p, shape, dtype))
                  for p, shape, dtype in (("codes", (64, 32), "uint8"), ("block_scales", (64, 4), "uint8"),
                                          ("divisor", (1,), "float32"))}
        want = art.parameter(binding, (64, 64))
    codes = np.stack([planes["codes"] & 0xF, planes["codes"] >> 4], axis=-1).reshape(64, 64)
    scales = np.repeat(E4M3FN_VALUES[planes["block_scales"]], 16, axis=1)
    np.testing.assert_array_equal((E2M1_VALUES[codes] * scales) / planes["divisor"][0], want)


def test_unsupported_format_is_refused(built, tmp_path):
    with pytest.raises(CompileError, match="nvfp4, which is not supported on target rtx5090"):
        compile_artifact(built["nvfp4"], tmp_path / "pkg", CompileOptions(target="rtx5090", max_context=256))
    assert not (tmp_path / "pkg").exists()


def test_cli_errors(built, tmp_path):
    runner = CliRunner()
    r = runner.invoke(cli, ["run", str(built["pkg-bf16"])])
    assert r.exit_code == 1 and "exactly one of --prompt and --messages" in r.stderr
    r = runner.invoke(cli, ["run", str(built["bf16"]), "--prompt", "x"])
    assert r.exit_code == 1 and "compile it first" in r.stderr
    r = runner.invoke(cli, ["run", str(tmp_path), "--prompt", "x"])
    assert r.exit_code == 1 and "not a ninfer package" in r.stderr
    bad = tmp_path / "m.json"
    bad.write_text('[{"role": "user", "content": "hi", "name": "x"}]')
    r = runner.invoke(cli, ["run", str(built["pkg-bf16"]), "--messages", str(bad)])
    assert r.exit_code == 1 and "unsupported field: name" in r.stderr
    r = runner.invoke(cli, ["compile", str(built["bf16"]), "-o", str(built["pkg-bf16"])])
    assert r.exit_code == 2 and "not empty" in r.stderr


def test_run_with_cpu_tiny_config(built, tmp_path, monkeypatch):
    """`ninfer run --config examples/configs/cpu-tiny.toml` on the embedded default's package layout."""
    config = Path(__file__).resolve().parents[2] / "examples" / "configs" / "cpu-tiny.toml"
    (tmp_path / "out" / "tiny").mkdir(parents=True)
    (tmp_path / "out" / "tiny" / "pkg").symlink_to(built["pkg-groupwise-int"])
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["run", "--config", str(config), "--prompt", "Hello", "--print-token-ids"])
    assert result.exit_code == 0, result.output
    assert "summary     sampling                  greedy (temperature 0)" in result.stderr  # from the file
    assert "summary     max context               1024" in result.stderr  # the package's limit (< the file's 2048)
    ids = re.search(r"token_ids: ([0-9 ]+)", result.stderr).group(1).split()
    assert 1 <= len(ids) <= 64  # sampling.max_tokens = 64 in the file


@pytest.mark.parametrize("recipe", RECIPES)
def test_embed_returns_the_artifact_rows(built, recipe):
    """`embed` gives exactly the decoded embedding rows (bf16 words, or dequantized q6/q8 codes)."""
    runner = ModelRunner(built[f"pkg-{recipe}"])
    ids = [5, 0, 511, 5, 300] + list(range(40, 80))  # repeats and both ends; more than one 32-token chunk
    with Artifact(built[recipe]) as art:
        table = art.parameter("text/token_embedding", (512, 64))
    np.testing.assert_array_equal(runner.embed(ids), table[ids])
    with pytest.raises(ValueError, match="at least one token"):
        runner.embed([])
