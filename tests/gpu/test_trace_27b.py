"""The decode-step timeline's bookkeeping (`trace_27b.py`), on made-up kernel records (no GPU)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import trace_27b  # noqa: E402


def _k(name: str, ts: float, dur: float, grid: list[int] | None = None) -> dict:
    return {"name": name, "ts": ts, "dur": dur, "args": {"grid": grid} if grid else {}}


def test_advances_add_up_to_the_span_and_charge_overlap_to_nobody() -> None:
    step = [
        _k("ninfer_qgemv4e_q5_add", 0.0, 10.0, [320, 1, 1]),
        _k("ninfer_rms_norm_wbf16", 8.0, 4.0),          # starts 2 us early (PDL), ends 2 us later
        _k("ninfer_qgemv4e_q5_add", 11.0, 10.0, [320, 1, 1]),
        _k("gdn_decode_kernel", 25.0, 5.0),             # 4 us of idle GPU before it
    ]
    out = trace_27b.analyse(step)
    assert out["span_us"] == pytest.approx(30.0)
    kinds = out["kinds"]
    assert sum(r["advance"] for r in kinds.values()) == pytest.approx(out["span_us"])
    add = kinds["ninfer_qgemv4e_q5_add [320]"]
    assert add["n"] == 2 and add["dur"] == pytest.approx(20.0)
    assert add["advance"] == pytest.approx(10.0 + 9.0) and add["lead"] == pytest.approx(1.0)
    norm = kinds["ninfer_rms_norm_wbf16"]
    assert norm["advance"] == pytest.approx(2.0) and norm["lead"] == pytest.approx(2.0)
    gdn = kinds["gdn_decode"]
    assert gdn["advance"] == pytest.approx(9.0) and gdn["gap"] == pytest.approx(4.0)


def test_a_kernel_inside_another_one_advances_nothing() -> None:
    out = trace_27b.analyse([_k("a", 0.0, 20.0), _k("b", 2.0, 5.0), _k("c", 21.0, 1.0)])
    assert out["kinds"]["b"]["advance"] == 0.0
    assert out["kinds"]["c"]["advance"] == pytest.approx(2.0)  # from 20 to 22: the idle us count too


def test_steps_are_split_at_gaps_and_kinds_drop_tvm_suffixes() -> None:
    records = [_k("a", 0.0, 5.0), _k("b", 6.0, 5.0), _k("a", 11.0 + trace_27b.GAP_US + 1, 5.0)]
    steps = trace_27b.split_steps(list(reversed(records)))  # any order in the trace file
    assert [len(s) for s in steps] == [2, 1]
    assert trace_27b.kind("fused_split_kernel(float*)") == "fused_split"
    assert trace_27b.kind("ninfer_qgemv4e_q45_multi", [640, 1, 1]) == "ninfer_qgemv4e_q45_multi [640]"
    assert trace_27b.kind("ninfer_rms_norm_wbf16") == "ninfer_rms_norm_wbf16"


def test_the_prefill_table_gives_the_span_as_tokens_per_second() -> None:
    kernels = [_k("qgemm_kernel", 0.0, 600.0), _k("attention_prefill_kernel", 650.0, 350.0)]
    entry = {"prompt_len": 7680, "spans_us": [1000.0], "median": trace_27b.analyse(kernels), "kernels_per_step": 2}
    text = trace_27b.table("pkg", "prefill", entry)
    assert "prefill of 7680 tokens: span 1.000 ms" in text and "7,680,000 tok/s" in text
    qgemm = next(line for line in text.splitlines() if line.startswith("qgemm "))
    assert "60.0%" in qgemm  # its advance against the span
    attn = next(line for line in text.splitlines() if line.startswith("attention_prefill "))
    assert attn.split()[-1] == "50.00"  # the idle microseconds before it


def test_rounds_alternate_the_package_order() -> None:
    order = trace_27b.round_order(["pkg", "pkg-var-a", "pkg-var-b"], 3)
    assert order == [(0, "pkg"), (0, "pkg-var-a"), (0, "pkg-var-b"), (1, "pkg-var-b"), (1, "pkg-var-a"),
                     (1, "pkg"), (2, "pkg"), (2, "pkg-var-a"), (2, "pkg-var-b")]
    assert trace_27b.round_order(["pkg"], 1) == [(0, "pkg")]


def test_the_rounds_table_gives_each_round_and_the_median() -> None:
    text = trace_27b.rounds_table({"pkg": {"1": [7206.0, 7190.0, 7230.0], "8": [8678.0, 8690.0, 8700.0]},
                                   "pkg-var-x": {"1": [7162.0, 7180.0, 7170.0], "8": [8761.0, 8700.0, 8690.0]}})
    lines = text.splitlines()
    assert lines[0].endswith("1 request(s); 8 request(s)")
    assert lines[1].startswith("pkg ") and "7.206 7.190 7.230 (median 7.206)" in lines[1]
    assert "8.678 8.690 8.700 (median 8.690)" in lines[1]
    assert lines[2].startswith("pkg-var-x") and "7.162 7.180 7.170 (median 7.170)" in lines[2]


def test_the_timeline_lists_each_launch_with_the_advances_of_the_kind_table() -> None:
    step = [
        _k("ninfer_rms_norm_wbf16", 108.0, 4.0),
        _k("ninfer_qgemv4e_q5_add", 100.0, 10.0, [320, 1, 1]),
        _k("ninfer_qgemv4e_q5_add", 111.0, 10.0, [320, 1, 1]),
    ]
    rows = trace_27b.timeline(step)
    assert [r["kind"] for r in rows] == ["ninfer_qgemv4e_q5_add [320]", "ninfer_rms_norm_wbf16",
                                         "ninfer_qgemv4e_q5_add [320]"]
    assert [r["start_us"] for r in rows] == [0.0, 8.0, 11.0] and rows[0]["grid"] == "320x1x1"
    assert [r["advance_us"] for r in rows] == [10.0, 2.0, 9.0] and [r["lead_us"] for r in rows] == [0.0, 2.0, 1.0]
    kinds = trace_27b.analyse(step)["kinds"]
    assert sum(r["advance_us"] for r in rows if r["kind"].startswith("ninfer_qgemv")) == pytest.approx(
        kinds["ninfer_qgemv4e_q5_add [320]"]["advance"])
    csv = trace_27b.timeline_csv(rows).splitlines()
    assert csv[0] == "kind,grid,start_us,dur_us,advance_us,lead_us,gap_us"
    assert csv[2] == "ninfer_rms_norm_wbf16,,8.00,4.00,2.00,2.00,0.00"


def test_projections_are_told_apart_by_the_kernel_before_them() -> None:
    rows = trace_27b.timeline([
        _k("gdn_decode_kernel", 0.0, 5.0),
        _k("ninfer_qgemv4e_q5_add_i8", 1.0, 16.0, [320, 1, 1]),   # advance 12
        _k("_combine_kernel", 20.0, 3.0),
        _k("ninfer_qgemv4e_q5_add_i8", 21.0, 11.0, [320, 1, 1]),  # advance 9
        _k("gdn_decode_kernel", 40.0, 5.0),
        _k("ninfer_qgemv4e_q5_add_i8", 41.0, 13.0, [320, 1, 1]),  # advance 9
    ])
    out = trace_27b.by_predecessor(rows)
    assert out.keys() == {"ninfer_qgemv4e_q5_add_i8 [320] after gdn_decode",
                          "ninfer_qgemv4e_q5_add_i8 [320] after _combine"}
    gdn = out["ninfer_qgemv4e_q5_add_i8 [320] after gdn_decode"]
    assert gdn["n"] == 2 and gdn["advance"] == pytest.approx(12.0 + 9.0) and gdn["dur"] == pytest.approx(29.0)
    assert out["ninfer_qgemv4e_q5_add_i8 [320] after _combine"]["advance"] == pytest.approx(9.0)
    entry = {"median": {"span_us": 54.0, "kinds": {}}, "spans_us": [54.0],
             "kernels_per_step": 6, "host": {"wall_us": 60.0, "queued_us": 5.0, "write_us": 1.0, "call_us": 2.0},
             "projections": out}
    text = trace_27b.table("pkg", "1", entry)
    assert "after the kernel launched before it" in text
    assert text.splitlines()[-2].startswith("ninfer_qgemv4e_q5_add_i8 [320] after gdn_decode")


def test_budget_stops_before_a_trace_that_would_end_past_it() -> None:
    assert trace_27b.fits(100.0, 50.0, None)  # no budget
    assert trace_27b.fits(100.0, 0.0, 100.0)  # nothing traced yet: the first always starts
    assert trace_27b.fits(100.0, 40.0, 140.0)
    assert not trace_27b.fits(100.0, 40.1, 140.0)
