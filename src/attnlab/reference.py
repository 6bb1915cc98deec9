"""What every kernel is compared with: attention in fp64, a plain fp16 PyTorch implementation,
and PyTorch's scaled_dot_product_attention with each backend selected explicitly."""
from __future__ import annotations

import math
from contextlib import nullcontext

# SDPA's backends by the names the book uses, in the order tables list them.
SDPA_BACKENDS = ("flash", "efficient", "cudnn", "math")


def _scale(q, scale):
    return 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)


def _causal_mask(L: int, device):
    import torch
    return torch.ones(L, L, dtype=torch.bool, device=device).tril()


def reference_attention(q, k, v, causal: bool = False, scale: float | None = None, dtype=None):
    """softmax(q k^T * scale) v computed in fp64 (default) from the given fp16 inputs.

    Works head by head so the L x L scores of one head are the largest temporary.
    """
    import torch

    dtype = dtype or torch.float64
    s = _scale(q, scale)
    B, H, L, D = q.shape
    out = torch.empty(q.shape, dtype=dtype, device=q.device)
    mask = _causal_mask(L, q.device) if causal else None
    for b in range(B):
        for h in range(H):
            qh, kh, vh = (t[b, h].to(dtype) for t in (q, k, v))
            scores = (qh @ kh.transpose(0, 1)) * s
            if mask is not None:
                scores = scores.masked_fill(~mask, float("-inf"))
            out[b, h] = torch.softmax(scores, dim=-1) @ vh
    return out


def naive_fp16(q, k, v, causal: bool = False, scale: float | None = None):
    """The plain fp16 PyTorch attention the pass rule measures kernels against:
    fp16 matmuls, fp16 scores and probabilities, one op at a time."""
    import torch

    scores = (q @ k.transpose(-2, -1)) * _scale(q, scale)
    if causal:
        scores = scores.masked_fill(~_causal_mask(q.shape[-2], q.device), float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def _backend_enum(name: str):
    from torch.nn.attention import SDPBackend
    return {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
            "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}[name]


def sdpa(q, k, v, causal: bool = False, scale: float | None = None, backend: str | None = None):
    """torch's SDPA; with `backend` set, only that backend may run (or it raises)."""
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel

    ctx = sdpa_kernel([_backend_enum(backend)]) if backend else nullcontext()
    with ctx:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)


def sdpa_availability(q, k, v, causal: bool = False) -> dict[str, str | None]:
    """For each backend: None if it runs on these inputs, else the reason it does not."""
    import warnings

    status = {}
    for name in SDPA_BACKENDS:
        try:
            with warnings.catch_warnings():  # torch explains refusals as warnings; keep the reason
                warnings.simplefilter("ignore")
                sdpa(q, k, v, causal, backend=name)
            status[name] = None
        except (RuntimeError, ValueError) as exc:
            status[name] = str(exc).splitlines()[0][:200] or type(exc).__name__
    return status
