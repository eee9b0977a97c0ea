"""The package A/B numerics probe's comparison (`bench_27b.py compare_logits`), on made-up logits (no GPU)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_27b  # noqa: E402


def test_compare_logits_reports_relative_difference_and_greedy_agreement() -> None:
    rng = np.random.default_rng(0)
    ref = {1: rng.standard_normal((4, 1, 50)).astype(np.float32), 3: rng.standard_normal((4, 3, 50)).astype(np.float32)}
    got = {b: v.copy() for b, v in ref.items()}
    got[3][2, 1] = 0.0
    got[3][2, 1, 7] = 100.0  # one row's greedy token moved, and its logits far off
    cmp = bench_27b.compare_logits(ref, got)
    assert cmp["1"] == {"max_rel": 0.0, "greedy_same": 4, "greedy_of": 4}
    assert cmp["3"]["greedy_same"] == 11 and cmp["3"]["greedy_of"] == 12
    assert cmp["3"]["max_rel"] == np.abs(got[3] - ref[3]).max() / np.abs(ref[3]).max() > 10


def test_variants_take_defines_and_kernel_features() -> None:
    assert bench_27b.parse_variant("mlp=+gemv_int8_mlp,NINFER_V4_STAGES_Q5=4") == (
        "mlp", ["+gemv_int8_mlp", "NINFER_V4_STAGES_Q5=4"])
    assert bench_27b.parse_variant("off=-gemv_int8_gdn_out") == ("off", ["-gemv_int8_gdn_out"])
    for bad in ("x", "x=", "x=+", "x=1BAD", "x=A B", "bad name=A"):
        try:
            bench_27b.parse_variant(bad)
        except ValueError:
            continue
        raise AssertionError(bad)


def test_pack_and_unpack_restore_the_staged_folder(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    stage = tmp_path / "perf-27b"
    (stage / "pkg").mkdir(parents=True)
    (stage / "pkg" / "model.so").write_bytes(bytes(range(256)) * 64)
    (stage / "resources.json").write_text("{}")
    monkeypatch.setattr(bench_27b, "STAGE", stage)
    monkeypatch.setattr(bench_27b, "ARCHIVE", tmp_path / "perf-27b.tar.xz")
    bench_27b.pack()
    (stage / "pkg" / "model.so").write_bytes(b"changed after packing")
    (stage / "stale").mkdir()
    bench_27b.unpack()
    assert sorted(p.name for p in stage.iterdir()) == ["pkg", "resources.json"]
    assert (stage / "pkg" / "model.so").read_bytes() == bytes(range(256)) * 64


def test_unpack_without_an_archive_says_what_is_missing(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setattr(bench_27b, "ARCHIVE", tmp_path / "perf-27b.tar.xz")
    try:
        bench_27b.unpack()
    except SystemExit as exc:
        assert "perf-27b.tar.xz" in str(exc)
    else:
        raise AssertionError("unpack without an archive returned")
