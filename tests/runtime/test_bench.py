"""`ninfer bench` on the tiny cpu package: a complete table and JSON, and clear errors."""

from __future__ import annotations

import json

from click.testing import CliRunner

from ninfer_cli.main import cli


def test_bench_table_and_json(tiny_package, tmp_path):
    out = tmp_path / "bench.json"
    result = CliRunner().invoke(cli, ["bench", str(tiny_package), "--prompt-len", "100", "--decode-tokens", "5",
                                      "--concurrency", "1,3", "--repeats", "2", "--decode-context", "200",
                                      "--json", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["prompt_len"] == 100 and report["prefill_tok_s"] > 0 and report["copy_gb_s"] > 0
    assert [r["concurrency"] for r in report["decode"]] == [1, 3]
    assert report["decode_loop"] == "queued" and report["decode_readback"] == "tokens"
    assert report["decode_context"] == 200 and "decode from 200 cached tokens" in result.stdout
    for row in report["decode"]:
        assert row["step_ms"] > 0 and row["sync_step_ms"] > 0
        assert abs(row["aggregate_tok_s"] - row["concurrency"] * row["per_request_tok_s"]) < 1e-6 * row["aggregate_tok_s"]
        assert 0 < row["roofline_fraction"] < row["all_bytes_fraction"]
        assert row["drawn_step_ms"] is None  # a cpu package draws sampled tokens on the host
    # the sequences' own bytes: KV pages at the decode context and the recurrent state, per sequence
    one, three = report["decode"]
    assert one["cache_bytes"] > 0 and three["cache_bytes"] == 3 * one["cache_bytes"]
    assert "all bytes" in result.stdout and "cache GB" in result.stdout
    assert "of roofline" in result.stdout and "prefill  100 tokens" in result.stdout and "sync ms" in result.stdout
    assert "drawn ms" in result.stdout


def test_bench_errors(tiny_package):
    result = CliRunner().invoke(cli, ["bench", str(tiny_package), "--prompt-len", "100000"])
    assert result.exit_code == 1 and "max_context" in result.stderr
    result = CliRunner().invoke(cli, ["bench", str(tiny_package), "--prompt-len", "100", "--decode-context", "1000"])
    assert result.exit_code == 1 and "--decode-context 1000" in result.stderr and "max_context 1024" in result.stderr
    result = CliRunner().invoke(cli, ["bench", str(tiny_package), "--concurrency", "1,x"])
    assert result.exit_code == 2 and "comma-separated" in result.output


def test_decode_cache_bytes_counts_the_pages_read_and_the_state_both_ways():
    from types import SimpleNamespace

    from ninfer_runtime.bench import decode_cache_bytes
    from ninfer_runtime.pools import PoolPlan

    plan = PoolPlan(num_pages=100, num_slots=4, page_size=16, bytes_per_page=1000, bytes_per_slot=7)
    runner = SimpleNamespace(pool=SimpleNamespace(plan=plan))
    assert decode_cache_bytes(runner, 33, 2) == 2 * (3 * 1000 + 2 * 7)  # 33 tokens: 3 pages of 16
    assert decode_cache_bytes(runner, 32, 1) == 2 * 1000 + 14
