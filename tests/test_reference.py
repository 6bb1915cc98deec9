import numpy as np
import pytest
import torch

from attnlab.pass_rule import make_inputs
from attnlab.reference import naive_fp16, reference_attention, sdpa
from attnlab.shapes import Shape


def numpy_attention(q, k, v, causal, scale):
    """Textbook attention in float64 NumPy, row by row: the independent yardstick."""
    q, k, v = (np.asarray(t, dtype=np.float64) for t in (q, k, v))
    B, H, L, D = q.shape
    out = np.zeros_like(q)
    for b in range(B):
        for h in range(H):
            s = q[b, h] @ k[b, h].T * scale
            if causal:
                s = np.where(np.tril(np.ones((L, L), bool)), s, -np.inf)
            p = np.exp(s - s.max(axis=1, keepdims=True))
            out[b, h] = (p / p.sum(axis=1, keepdims=True)) @ v[b, h]
    return out


@pytest.mark.parametrize("shape", [Shape(1, 2, 1, 64), Shape(2, 3, 17, 40), Shape(1, 2, 65, 128)],
                         ids=lambda s: s.label())
@pytest.mark.parametrize("causal", [False, True])
def test_reference_matches_numpy(shape, causal):
    q, k, v = make_inputs(shape, seed=3, device="cpu")
    got = reference_attention(q, k, v, causal).numpy()
    want = numpy_attention(q.float(), k.float(), v.float(), causal, 1 / np.sqrt(shape.D))
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_reference_honours_scale():
    q, k, v = make_inputs(Shape(1, 1, 9, 16), seed=1, device="cpu")
    got = reference_attention(q, k, v, scale=0.3).numpy()
    np.testing.assert_allclose(got, numpy_attention(q.float(), k.float(), v.float(), False, 0.3), atol=1e-12)


def test_causal_first_row_is_first_value():
    q, k, v = make_inputs(Shape(1, 1, 5, 8), seed=2, device="cpu")
    out = reference_attention(q, k, v, causal=True)
    torch.testing.assert_close(out[0, 0, 0], v[0, 0, 0].double(), rtol=0, atol=0)


def test_naive_fp16_is_close_but_not_exact():
    q, k, v = make_inputs(Shape(1, 2, 64, 64), seed=0, device="cpu")
    ref = reference_attention(q, k, v)
    err = float((naive_fp16(q, k, v).double() - ref).abs().max())
    assert 0 < err < 2e-2


def test_sdpa_math_backend_on_cpu_agrees():
    q, k, v = make_inputs(Shape(1, 2, 33, 64), seed=0, device="cpu")
    q32, k32, v32 = (t.float() for t in (q, k, v))
    for causal in (False, True):
        got = sdpa(q32, k32, v32, causal, backend="math").double()
        torch.testing.assert_close(got, reference_attention(q, k, v, causal), rtol=1e-4, atol=1e-5)
