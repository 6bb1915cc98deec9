"""A compact FlashAttention-2 forward in Triton: the book's own Triton reference for chapter 9.

The same algorithm as chapter 7, written at the level Triton offers: one program per (64 or 128
query rows, head); it walks the key blocks, S = Q K^T with `tl.dot` (fp16 in, fp32 accumulate),
an online softmax in base 2 (log2 e folded into the scale, as Triton's own tutorial does), and
O += P V with P rounded to fp16. Masks make any L work (rows and keys past L) and give the causal
mask; causal programs stop at their diagonal block. D = 64 and 128. The output is O / l in fp16.

Triton is imported when this module is, and this module only when a caller asks for it
(attnlab.gpu.bench imports it inside a GPU run): CPU machines without Triton never import it.
`available()` says whether it can run here, and why not. With TRITON_INTERPRET=1 Triton runs the
kernel on the CPU (numpy), which is how tests/test_triton_ref.py checks it where Triton is installed.
"""
from __future__ import annotations

import math
import os

try:
    import triton
    import triton.language as tl
except ImportError as exc:  # no Triton on this machine (the CPU machines have none)
    triton = None
    tl = None
    _IMPORT_ERROR = f"{type(exc).__name__}: {exc}"
else:
    _IMPORT_ERROR = None

HEAD_DIMS = (64, 128)
# (BLOCK_M, BLOCK_N, num_warps, num_stages) per head dim: FlashAttention-2's hdim-64 and hdim-128
# tiles for sm8x, fixed (no autotuning, so a run times one kernel, not a search).
TILES = {64: (128, 64, 4, 3), 128: (128, 32, 4, 2)}


def interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def available() -> str | None:
    """None if the Triton reference can run here; otherwise the reason it cannot."""
    if triton is None:
        return f"triton is not installed ({_IMPORT_ERROR})"
    if interpreted():
        return None
    try:
        import torch

        if not torch.cuda.is_available():
            return "no CUDA GPU (torch.cuda.is_available() is False)"
    except Exception as exc:  # noqa: BLE001 - any failure here means "cannot run"
        return f"torch: {exc}"
    return None


if triton is not None:

    @triton.jit
    def _attn_fwd(Q, K, V, O, L, qk_scale,
                  CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        pid_m = tl.program_id(0)
        head = tl.program_id(1).to(tl.int64) * L * HEAD_DIM  # [B*H, L, D], contiguous
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tl.arange(0, BLOCK_N)
        dims = tl.arange(0, HEAD_DIM)
        q = tl.load(Q + head + rows[:, None] * HEAD_DIM + dims[None, :], mask=rows[:, None] < L, other=0.0)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running max of the scaled scores (base 2)
        l_i = tl.zeros([BLOCK_M], tl.float32)                # running sum
        acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
        if CAUSAL:
            hi = tl.minimum(L, (pid_m + 1) * BLOCK_M)  # key blocks above the diagonal are skipped
        else:
            hi = L
        for start in range(0, hi, BLOCK_N):
            keys = start + cols
            k = tl.load(K + head + keys[None, :] * HEAD_DIM + dims[:, None], mask=keys[None, :] < L, other=0.0)
            s = tl.dot(q, k) * qk_scale                  # fp32: scores times scale * log2(e)
            visible = keys[None, :] < L
            if CAUSAL:
                visible = visible & (keys[None, :] <= rows[:, None])
            s = tl.where(visible, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no key yet: exp2(-inf) = 0
            alpha = tl.math.exp2(m_i - m_use)
            p = tl.math.exp2(s - m_use[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(V + head + keys[:, None] * HEAD_DIM + dims[None, :], mask=keys[:, None] < L, other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16), v)
            m_i = m_new
        acc = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(O + head + rows[:, None] * HEAD_DIM + dims[None, :], acc.to(tl.float16), mask=rows[:, None] < L)


def attention(q, k, v, causal: bool = False, scale: float | None = None, out=None):
    """softmax(q k^T * scale [+ causal mask]) v for [B, H, L, D] fp16 tensors, D in 64/128."""
    import torch

    if q.dtype != torch.float16 or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError("q, k, v must be torch.float16")
    if q.dim() != 4 or k.shape != q.shape or v.shape != q.shape:
        raise ValueError(f"q, k, v must be [B, H, L, D] of one shape; got {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}")
    B, H, L, D = q.shape
    if D not in HEAD_DIMS or L < 1 or B * H < 1:
        raise ValueError(f"the Triton reference takes D in {HEAD_DIMS} and L >= 1; got {tuple(q.shape)}")
    reason = available()  # after validation: bad input gets its own error on every machine
    if reason is not None:
        raise RuntimeError(f"the Triton reference cannot run here: {reason}")
    q, k, v = (t.contiguous() for t in (q, k, v))
    out = torch.empty_like(q) if out is None else out
    block_m, block_n, warps, stages = TILES[D]
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    grid = (triton.cdiv(L, block_m), B * H)
    _attn_fwd[grid](q, k, v, out, L, scale * 1.4426950408889634, CAUSAL=bool(causal), HEAD_DIM=D,
                    BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps, num_stages=stages)
    return out
