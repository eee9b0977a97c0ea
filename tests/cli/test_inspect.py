"""`ninfer inspect`: summary, JSON, verification and export, on a small written artifact."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from click.testing import CliRunner

from ninfer_cli.main import cli
from ninfer_runtime.artifact import ArtifactWriter
from ninfer_runtime.artifact.quantize import quantize_grouped


@pytest.fixture
def artifact(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "m.ninfer"
    attn = rng.standard_normal((12, 70)).astype(np.float32)
    with ArtifactWriter(path, metadata={"name": "tiny"}, shard_limit=3 * 4096) as w:
        w.add_resource("resource/text/tokenizer.json", b"{}")
        w.add_tensor("w.attn", "q8_g32_fp16", "row_split_k128_v1", attn.shape, quantize_grouped(attn, "q8_g32_fp16"))
        w.add_tensor("w.norm", "fp32", "contiguous_le_v1", (70,), np.linspace(-1, 1, 70, dtype=np.float32))
        w.add_tensor("w.embed", "bf16", "contiguous_le_v1", (80, 70), rng.standard_normal((80, 70)).astype(np.float32))
        w.add_component("text", {"architectures": ["Qwen3_5ForCausalLM"], "hidden_size": 70, "rope_parameters": {}},
                        resources={"tokenizer.json": "resource/text/tokenizer.json"})
        w.bind_rows("text/layers/0/attention/query", "w.attn", 0, 8)
        w.bind_rows("text/layers/0/attention/key", "w.attn", 8, 12)
        w.bind("text/final_norm", "w.norm")
        w.bind("text/token_embedding", "w.embed")
    return path, attn


def run(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_summary(artifact):
    path, _ = artifact
    result = run("inspect", str(path))
    assert result.exit_code == 0, result.output
    assert "Qwen3_5ForCausalLM" in result.output
    assert "q8_g32_fp16/row_split_k128_v1" in result.output
    assert "resource tokenizer.json" in result.output
    assert "m.ninfer.part-0001" in result.output


def test_json_and_verify(artifact):
    path, _ = artifact
    result = run("inspect", str(path), "--json", "--verify")
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    assert info["tensors"] == 3 and info["bindings"] == 4
    assert info["by_format"]["bf16/contiguous_le_v1"]["objects"] == 1
    assert info["verify"] == {"ok": True, "tensors": 3, "elements": 12 * 70 + 70 + 80 * 70, "nonfinite": {}, "errors": {}}
    assert info["components"]["text"]["bindings"] == 4


def test_verify_reports_nonfinite(tmp_path):
    path = tmp_path / "bad.ninfer"
    values = np.ones(8, np.float32)
    values[3] = np.inf
    values[5] = np.nan
    with ArtifactWriter(path) as w:
        w.add_tensor("w", "fp32", "contiguous_le_v1", (8,), values)
        w.add_component("text", {})
    result = run("inspect", str(path), "--verify")
    assert result.exit_code == 1
    assert "non-finite values: w: 2" in result.output


def test_verify_reports_damaged_tensor(artifact):
    path, _ = artifact
    # corrupt one q8 code byte to the illegal 0x80 inside the entry's payload
    raw = bytearray(path.read_bytes())
    json_bytes = struct.unpack("<Q", raw[8:16])[0]
    start = -(-(32 + json_bytes) // 4096) * 4096
    raw[start + 256 + 5] = 0x80  # w.attn follows the 2-byte resource at offset 256
    path.write_bytes(bytes(raw))
    result = run("inspect", str(path), "--verify")
    assert result.exit_code == 1
    assert "damaged: w.attn" in result.output and "invalid_code" in result.output


def test_export_binding_and_object(artifact, tmp_path):
    path, attn = artifact
    out = tmp_path / "q.npy"
    result = run("inspect", str(path), "--export", "text/layers/0/attention/key", "-o", str(out))
    assert result.exit_code == 0, result.output
    key = np.load(out)
    assert key.shape == (4, 70) and key.dtype == np.float32
    np.testing.assert_allclose(key, attn[8:], atol=np.abs(attn).max() / 127)
    run("inspect", str(path), "--export", "w.norm", "-o", str(out))
    np.testing.assert_array_equal(np.load(out), np.linspace(-1, 1, 70, dtype=np.float32))


def test_export_unknown_name(artifact, tmp_path):
    path, _ = artifact
    result = CliRunner().invoke(cli, ["inspect", str(path), "--export", "nope", "-o", str(tmp_path / "x.npy")])
    assert result.exit_code == 2 and "neither a binding nor an object id" in result.output


def test_bad_file_gives_clear_error(tmp_path):
    path = tmp_path / "junk.ninfer"
    path.write_bytes(b"hello world, not an artifact at all")
    result = CliRunner().invoke(cli, ["inspect", str(path)])
    assert result.exit_code == 2
    assert "error:" in result.output and "[magic]" in result.output


def test_export_needs_output(artifact):
    path, _ = artifact
    result = CliRunner().invoke(cli, ["inspect", str(path), "--export", "w.norm"])
    assert result.exit_code == 2 and "--output" in result.output
