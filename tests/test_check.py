import pytest
import torch

from attnlab.kernels import registry
from attnlab.gpu.check import cases_for, summarize, CaseResult, format_table
from attnlab.pass_rule import ATOL_FLOOR, judge, make_inputs
from attnlab.reference import naive_fp16, reference_attention
from attnlab.shapes import CHECK_SHAPES, Shape


def _ref_and_err(shape, causal=False, seed=0, **kw):
    q, k, v = make_inputs(shape, seed, device="cpu", **kw)
    ref = reference_attention(q, k, v, causal)
    err = float((naive_fp16(q, k, v, causal).double() - ref).abs().max())
    return (q, k, v), ref, err


def test_inputs_are_deterministic_and_offset():
    a = make_inputs(Shape(1, 2, 64, 64), seed=5, device="cpu")
    b = make_inputs(Shape(1, 2, 64, 64), seed=5, device="cpu")
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    q = a[0].float()
    assert abs(q.mean().item() - 0.5) < 0.05 and abs(q.std().item() - 1.0) < 0.05


def test_exact_output_passes_and_nan_or_inf_fail():
    (_, _, _), ref, err = _ref_and_err(Shape(1, 2, 33, 64))
    out = ref.to(torch.float16)
    assert judge(out, ref, err).passed
    poisoned = out.clone()
    poisoned[0, 1, 32, 63] = float("nan")  # one element the kernel never wrote
    v = judge(poisoned, ref, err)
    assert not v.passed and "1 NaN" in v.reason
    poisoned[0, 1, 32, 63] = float("inf")
    assert not judge(poisoned, ref, err).passed


def test_tolerance_is_twice_the_fp16_error_plus_floor():
    (_, _, _), ref, err = _ref_and_err(Shape(1, 2, 33, 64))
    tol = 2 * err + ATOL_FLOOR
    out = ref.clone()
    out[0, 0, 0, 0] += tol * 0.99
    assert judge(out, ref, err).passed
    out[0, 0, 0, 0] += tol * 0.02
    assert not judge(out, ref, err).passed


@pytest.mark.parametrize("causal", [False, True])
def test_a_kernel_that_averages_v_fails(causal):
    """The earlier study's trap: with randn*0.1 the softmax is nearly uniform. Our inputs are
    unit-variance plus an offset, so the mean of V is far from the answer."""
    (q, k, v), ref, err = _ref_and_err(Shape(1, 2, 128, 64), causal)
    if causal:
        L = v.shape[2]
        averaged = v.double().cumsum(2) / torch.arange(1, L + 1, dtype=torch.float64).view(1, 1, L, 1)
    else:
        averaged = v.double().mean(dim=2, keepdim=True).expand_as(ref)
    assert not judge(averaged, ref, err).passed


def test_small_inputs_would_let_averaging_pass():
    """The same averaging kernel against randn*0.1 inputs: the old harness's rule (abs <= 5e-3)
    passes it. This is why attnlab never draws inputs that way."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 512, 64, generator=gen) * 0.1 for _ in range(3))
    q, k, v = (t.half() for t in (q, k, v))
    ref = reference_attention(q, k, v)
    averaged = v.double().mean(dim=2, keepdim=True).expand_as(ref)
    assert float((averaged - ref).abs().max()) <= 5e-3


def test_cases_cover_causal_seeds_and_limits():
    spec = registry.get("01_scalar")
    cases = cases_for(spec)
    shapes = {c[0] for c in cases}
    assert set(CHECK_SHAPES) <= shapes
    assert {c[1] for c in cases} == {False, True}
    assert {1, 17, 333, 1000} <= {s.L for s in shapes}
    assert {64, 128} <= {s.D for s in shapes}
    import dataclasses
    only64 = dataclasses.replace(spec, head_dims=frozenset({64}))
    assert all(c[0].D == 64 for c in cases_for(only64))


def test_summary_table():
    rows = [CaseResult("01_scalar", (1, 2, 17, 64), False, s, s != 2, 1e-4, 1e-3, 2.1e-3, 1e-4,
                       "" if s != 2 else "max error") for s in range(3)]
    (row,) = summarize(rows)
    assert row["passed"] == 2 and row["cases"] == 3
    assert "2/3 cases passed" in format_table(rows)
