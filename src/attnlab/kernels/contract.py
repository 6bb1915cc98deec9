"""The kernel contract, checked before any launch on a GPU or on the CPU executor: q, k, v (and out)
are fp16 torch tensors of one shape [B, H, L, D], contiguous, aligned to what the kernel loads at a
time, on the device that runs it, and within the kernel's own limits (head dims, causal mode, L,
the grid). A problem is one AttentionInputError naming what is wrong and how to mend it.
"""
from __future__ import annotations

import math

from ..env import NoGpuError, has_gpu
from ..shapes import Shape
from .registry import KernelSpec

MAX_GRID_Y = 65535  # B*H rides on gridDim.y


class AttentionInputError(ValueError):
    """The inputs break the kernel contract; raised before anything reaches the GPU."""


def shape_problem(spec: KernelSpec, shape: Shape, causal: bool = False) -> str | None:
    """Why `spec` cannot run `shape` (with the causal mask when `causal`), or None: the kernel's
    limits, the part of the contract the command line checks on a --shape before any build."""
    if not spec.supports_head_dim(shape.D):
        return f"{spec.id} supports head dim D in {spec.head_dim_text()}; got D={shape.D}"
    if causal and not spec.causal:
        return f"{spec.id} has no causal mode"
    if spec.max_len is not None and shape.L > spec.max_len:
        return f"{spec.id} supports L <= {spec.max_len}; got L={shape.L}"
    if shape.heads > MAX_GRID_Y:
        return f"B*H = {shape.heads} exceeds {MAX_GRID_Y}, the grid's y limit"
    return None


def validate(spec: KernelSpec, q, k, v, causal: bool = False, scale: float | None = None,
             out=None, device: str = "cuda") -> Shape:
    """Check q, k, v (and out) against the contract and the kernel's limits; return the shape.
    `device` is where the kernel runs: "cuda", or "cpu" for the CPU executor (attnlab.executor.cpu)."""
    import torch

    names = ("q", "k", "v") + (("out",) if out is not None else ())
    tensors = (q, k, v) + ((out,) if out is not None else ())
    for name, t in zip(names, tensors):
        if not isinstance(t, torch.Tensor):
            raise AttentionInputError(f"{name} must be a torch.Tensor, not {type(t).__name__}")
    for name, t in zip(names, tensors):
        if t.dim() != 4:
            raise AttentionInputError(f"{name} must be 4-D [B, H, L, D]; got shape {tuple(t.shape)}")
    for name, t in zip(names, tensors):
        if t.dtype != torch.float16:
            raise AttentionInputError(f"{name} must be torch.float16; got {t.dtype}")
    for name, t in zip(names, tensors):
        if t.numel() == 0:
            raise AttentionInputError(f"{name} is empty (shape {tuple(t.shape)}): every dimension must be >= 1")
    for name, t in zip(names[1:], tensors[1:]):
        if t.shape != q.shape:
            raise AttentionInputError(f"{name} has shape {tuple(t.shape)} but q has {tuple(q.shape)}: "
                                      "attnlab kernels take q, k, v and out of one shape [B, H, L, D]")
    for name, t in zip(names, tensors):
        if not t.is_contiguous():
            raise AttentionInputError(f"{name} is not contiguous (strides {t.stride()}); "
                                      "the kernels index [B, H, L, D] row-major: pass .contiguous()")
    for name, t in zip(names, tensors):
        if t.data_ptr() % spec.alignment:
            raise AttentionInputError(f"{name} does not start on a {spec.alignment}-byte boundary (a view with a "
                                      f"storage offset?); {spec.id} loads {spec.alignment} bytes at a time: pass .clone()")
    shape = Shape(*q.shape)
    problem = shape_problem(spec, shape, causal)
    if problem is not None:
        raise AttentionInputError(problem)
    if scale is not None and not (isinstance(scale, (int, float)) and math.isfinite(scale)):
        raise AttentionInputError(f"scale must be a finite number; got {scale!r}")
    for name, t in zip(names, tensors):
        if device == "cpu":
            if t.device.type != "cpu":
                raise AttentionInputError(f"{name} is on {t.device}; the CPU executor takes CPU tensors (.cpu())")
            continue
        if t.device.type != "cuda":
            if not has_gpu():
                raise NoGpuError(f"{spec.id} runs on a CUDA GPU and torch sees none on this machine; "
                                 f"{name} is on {t.device}")
            raise AttentionInputError(f"{name} is on {t.device}; move q, k, v to the GPU (.cuda())")
    if len({t.device for t in tensors}) != 1:
        raise AttentionInputError(f"q, k, v (and out) must be on one device; got {[str(t.device) for t in tensors]}")
    if out is not None and any(out.data_ptr() == t.data_ptr() for t in (q, k, v)):
        raise AttentionInputError("out must not alias q, k or v")
    return shape
