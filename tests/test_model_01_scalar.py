"""A CPU model of kernels/01_scalar.cu: the same chunked online softmax, in fp32, in the same
order of operations. It shows the algorithm meets the pass rule before any GPU runs it, including
the edge cases the kernel handles (L = 1, L not a multiple of the chunk, causal rows)."""
import re

import numpy as np
import pytest
import torch

from attnlab.kernels import registry
from attnlab.pass_rule import judge, make_inputs
from attnlab.reference import naive_fp16, reference_attention
from attnlab.shapes import Shape

KEY_CHUNK = int(re.search(r"KEY_CHUNK = (\d+);", registry.get("01_scalar").path.read_text()).group(1))


def scalar_kernel_model(q, k, v, causal, scale):
    q, k, v = (t.float().numpy() for t in (q, k, v))
    B, H, L, D = q.shape
    out = np.empty((B, H, L, D), np.float16)
    f32 = np.float32
    for b in range(B):
        for h in range(H):
            for row in range(L):               # one thread per row
                acc = np.zeros(D, f32)
                m, l = f32(-np.inf), f32(0)
                n_keys = row + 1 if causal else L
                for j0 in range(0, n_keys, KEY_CHUNK):
                    j1 = min(j0 + KEY_CHUNK, n_keys)
                    s = (k[b, h, j0:j1] @ q[b, h, row]).astype(f32) * f32(scale)
                    m_new = max(m, s.max())
                    corr = f32(0) if m == -np.inf else np.exp(m - m_new, dtype=f32)
                    p = np.exp(s - m_new, dtype=f32)
                    l = l * corr + p.sum(dtype=f32)
                    acc = acc * corr + (p[:, None] * v[b, h, j0:j1]).sum(0, dtype=f32)
                    m = m_new
                out[b, h, row] = (acc * (f32(1) / l)).astype(np.float16)
    return torch.from_numpy(out)


@pytest.mark.parametrize("shape", [Shape(1, 2, 1, 64), Shape(1, 2, 17, 64), Shape(1, 1, 133, 40),
                                   Shape(1, 1, 64, 128)], ids=lambda s: s.label())
@pytest.mark.parametrize("causal", [False, True])
def test_model_meets_pass_rule(shape, causal):
    q, k, v = make_inputs(shape, seed=0, device="cpu")
    ref = reference_attention(q, k, v, causal)
    fp16_err = float((naive_fp16(q, k, v, causal).double() - ref).abs().max())
    verdict = judge(scalar_kernel_model(q, k, v, causal, shape.D ** -0.5), ref, fp16_err)
    assert verdict.passed, verdict.reason
