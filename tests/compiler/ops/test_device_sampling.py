"""The draw of sampling requests on the device (`ops/device_sampling.py`) in Triton's interpreter,
launched as the package's launcher launches it, against the host's draw (`runtime/sampling.sample`):
the same token for every row (temperature, top-k, top-p, min-p and their combinations; ties
across slices; masked ids; +inf; u at both ends), the same log-probability, bad rows refused.
And the AOT build for every CUDA arch, without spills."""

from __future__ import annotations

import numpy as np
import pytest

from ninfer_runtime.sampling import (
    SELECT_KEPT,
    SELECT_TOPK,
    SamplingParams,
    device_selections,
    sample,
)

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

TEST_SLICES = 4  # programs per row here (64 in packages): the interpreter runs programs one by one


def device_choice(x: np.ndarray, params: np.ndarray, selections: int | None = None,
                  slices: int = TEST_SLICES) -> tuple[np.ndarray, np.ndarray]:
    """The kernels in the launcher's order (`LAUNCHER`), scratch poisoned; `selections` as the
    runtime passes it (`device_selections` of the rows unless given)."""
    from ninfer_compiler.ops import device_sampling as ds
    from ninfer_compiler.ops.triton_aot import interpreted

    rows, vocab = x.shape
    npass, bits, nb = ds.passes(vocab), ds.index_bits(vocab), 1 << ds.DIGIT
    logits, prm = torch.tensor(x), torch.tensor(params, dtype=torch.float64)
    part_f = torch.full((rows, slices, 4), float("nan"), dtype=torch.float64)
    part_i = torch.full((rows, slices, 4), -7, dtype=torch.int64)
    sf = torch.full((rows, ds.STATE), float("nan"), dtype=torch.float64)
    si = torch.full((rows, ds.STATE), -5, dtype=torch.int64)
    hist_m = torch.full((rows, slices, nb), float("nan"), dtype=torch.float64)
    hist_c = torch.full((rows, slices, nb), -3, dtype=torch.int64)
    hist_k = torch.full((rows, slices, nb), -3, dtype=torch.int64)
    token = torch.full((rows,), -1, dtype=torch.int32)
    logprob = torch.full((rows,), 7.0)
    interpreted(ds.stats_kernel)[(rows, slices)](logits, prm, part_f, part_i, vocab, SLICES=slices, BLOCK=ds.BLOCK)
    interpreted(ds.stats_combine_kernel)[(rows,)](prm, part_f, part_i, sf, si, token, logprob, SLICES=slices)
    shape = {"NPASS": npass, "IDX_BITS": bits, "SLICES": slices, "DIGIT": ds.DIGIT}
    if selections is None:
        selections = device_selections(params)
    for stage in (ds.TOPK, ds.KEPT, ds.DRAW):
        if stage != ds.DRAW and not selections >> stage & 1:
            continue
        for step in range(npass):
            interpreted(ds.pass_kernel)[(rows, slices)](logits, prm, sf, si, hist_m, hist_c, hist_k, vocab, step,
                                                         STAGE=stage, BLOCK=ds.BLOCK, **shape)
            interpreted(ds.combine_kernel)[(rows,)](logits, prm, sf, si, hist_m, hist_c, hist_k, token, logprob,
                                                    vocab, step, STAGE=stage, **shape)
    return token.numpy(), logprob.numpy()


def params_row(p: SamplingParams, u: float) -> list[float]:
    return [p.temperature, p.top_k, p.top_p, p.min_p, u]


def host_choice(x: np.ndarray, ps: list[SamplingParams], us: list[float]) -> tuple[np.ndarray, np.ndarray]:
    """`sample` with each row's u (the host draws u from (seed, position); here it is given)."""
    import ninfer_runtime.sampling as host

    tokens, logprobs = [], []
    for row, p, u in zip(x, ps, us, strict=True):
        real = host.uniform_draw
        host.uniform_draw = lambda seed, position, u=u: u  # noqa: ARG005
        try:
            c = sample(row, p, position=0)
        finally:
            host.uniform_draw = real
        tokens.append(c.token)
        logprobs.append(c.logprob)
    return np.array(tokens), np.array(logprobs)


def check(x: np.ndarray, ps: list[SamplingParams], us: list[float], selections: int | None = None) -> np.ndarray:
    params = np.array([params_row(p, u) for p, u in zip(ps, us, strict=True)])
    token, logprob = device_choice(x, params, selections)
    ref_token, ref_lp = host_choice(x, ps, us)
    np.testing.assert_array_equal(token, ref_token)
    np.testing.assert_allclose(logprob, ref_lp, rtol=1e-5, atol=1e-5)
    return token


def test_random_rows_and_parameters_draw_the_hosts_tokens():
    """18 rows of 2,500 ids, flat to peaked, each with its own parameters and a fresh u."""
    rng = np.random.default_rng(7)
    vocab, rows = 2500, 18
    scales = rng.choice([0.2, 0.5, 1.0, 2.0, 4.0], rows)
    x = (rng.standard_normal((rows, vocab)) * scales[:, None]).astype(np.float32)
    ps = []
    for _ in range(rows):
        kind = len(ps) % 6  # 0 temperature alone, 1 top-k, 2 top-p, 3 both, 4 min-p, 5 all three
        ps.append(SamplingParams(
            temperature=float(rng.choice([0.3, 0.7, 1.0, 1.6])),
            top_k=int(rng.choice([1, 5, 40, 700])) if kind in (1, 3, 5) else 0,
            top_p=float(rng.choice([0.1, 0.5, 0.9, 0.99])) if kind in (2, 3, 5) else 1.0,
            min_p=float(rng.choice([0.01, 0.1, 0.5])) if kind in (4, 5) else 0.0))
    us = rng.random(rows).tolist()
    check(x, ps, us)
    # by kind, each call launching only the cuts its rows have: none, the kept head, both
    for kinds, launched in (((0,), 0), ((1, 2, 4), SELECT_KEPT), ((3, 5), SELECT_TOPK | SELECT_KEPT)):
        rows_of = [i for i in range(rows) if i % 6 in kinds]
        assert device_selections([params_row(ps[i], 0.5) for i in rows_of]) == launched
        check(x[rows_of], [ps[i] for i in rows_of], [us[i] for i in rows_of])


def test_the_cuts_a_call_launches():
    """The runtime's `selections` bits are the kernels' STAGE bits; a cut left out changes draws."""
    from ninfer_compiler.ops import device_sampling as ds

    assert (ds.SELECT_TOPK, ds.SELECT_KEPT) == (SELECT_TOPK, SELECT_KEPT)
    row = lambda k, p, m: [1.0, k, p, m, 0.5]  # noqa: E731
    assert device_selections([row(0, 1.0, 0.0), row(0, 1.0, 0.0)]) == 0
    assert device_selections([row(5, 1.0, 0.0)]) == device_selections([row(0, 0.9, 0.0)]) == SELECT_KEPT
    assert device_selections([row(0, 1.0, 0.05)]) == SELECT_KEPT
    assert device_selections([row(5, 0.9, 0.0), row(0, 1.0, 0.0)]) == SELECT_TOPK | SELECT_KEPT
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((6, 1500)) * 0.5).astype(np.float32)
    ps = [SamplingParams(temperature=1.0, top_k=40, top_p=0.5)] * 6
    us = rng.random(6).tolist()
    with pytest.raises(AssertionError):  # without the kept head the draw runs over the whole row
        check(x, ps, us, selections=SELECT_TOPK)


def test_edge_rows():
    """Ties across slices (lowest id first), masked ids, +inf, a constant row, u at 0 and near 1,
    top-k past the live ids, a top-p below the largest probability, min-p 1."""
    vocab = 1800
    rng = np.random.default_rng(3)
    x = rng.standard_normal((8, vocab)).astype(np.float32)
    x[0, [5, 900, 1700]] = 6.0  # three maxima in different slices
    x[1, :] = 0.25  # every id equal: the draw walks ids in order
    x[2, : vocab - 30] = -np.inf  # 30 live ids
    x[3, 77] = np.inf  # the host clips it to the largest float32: always chosen
    x[4, ::2] = x[4, 1::2]  # pairs of equal values
    x[5, 10] = -0.0
    x[5, 11] = 0.0
    ps = [SamplingParams(temperature=1.0, top_k=2), SamplingParams(temperature=1.0),
          SamplingParams(temperature=0.8, top_k=100, top_p=0.9), SamplingParams(temperature=1.0, top_p=0.5),
          SamplingParams(temperature=0.9, top_p=0.7), SamplingParams(temperature=1.2, top_k=3, top_p=0.999),
          SamplingParams(temperature=1.0, top_p=0.001), SamplingParams(temperature=1.0, min_p=1.0)]
    us = [0.6, 0.4321, 0.999999, 0.3, 0.0, 0.75, 0.9, 0.5]
    token = check(x, ps, us)
    assert token[0] == 900  # the second of the tied maxima in id order
    assert token[1] == int(0.4321 * vocab)  # equal probabilities: the u-th share of the ids
    assert token[2] >= vocab - 30 and token[3] == 77


def test_nan_rows_and_rows_with_nothing_finite_are_refused():
    x = np.random.default_rng(1).standard_normal((3, 1000)).astype(np.float32)
    x[0, 17] = np.nan
    x[2, :] = -np.inf
    params = np.array([[1.0, 0, 1.0, 0.0, 0.5]] * 3)
    token, logprob = device_choice(x, params)
    assert token[0] == 0 and np.isnan(logprob[0])
    assert token[2] == 0 and np.isnan(logprob[2])
    p = SamplingParams(temperature=1.0)
    ref_token, ref_lp = host_choice(x[1:2], [p], [0.5])
    assert token[1] == ref_token[0] and abs(logprob[1] - ref_lp[0]) < 1e-5


def test_the_vocabulary_sets_the_key_layout():
    from ninfer_compiler.ops import device_sampling as ds

    assert ds.index_bits(248320) == 18 and ds.passes(248320) == 13
    assert ds.index_bits(2) == 1 and ds.passes(151552) == 13
    with pytest.raises(ValueError, match="2\\^28"):
        ds.images("sm_90a", (1 << 28) + 5)


def test_builds_for_every_cuda_arch_without_spills():
    import subprocess
    import tempfile

    from ninfer_compiler.ops.device_sampling import images

    from .test_qgemv_v4 import _cuobjdump

    tool = _cuobjdump()  # (the wheel's: present wherever the kernels build)
    checked = 0
    for arch in ("sm_90a", "sm_120a", "sm_121a"):
        kernels = images(arch, 248320)
        assert sorted(kernels) == sorted(["stats", "stats_combine", *(f"{k}{s}" for k in ("pass", "combine")
                                                                       for s in range(3))])
        for name, image in kernels.items():
            with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
                f.write(image.cubin)
                f.flush()
                usage = subprocess.run([str(tool), "--dump-resource-usage", f.name], capture_output=True,
                                       text=True, check=True).stdout
            assert "STACK:0" in usage and "LOCAL:0" in usage, f"{arch} {name} spills: {usage}"
            checked += 1
    assert checked == 3 * 8
