"""Run a registered kernel on torch tensors: validate first, then launch zero-copy on torch's
current stream (so CUDA-graph capture and torch's ordering both see the launch).

CuPy performs no argument checking at all (a Python int goes as a 64-bit integer, views are
ignored), so everything is checked here, before any launch, and scalars are wrapped in the
exact C types of the kernel signature. Tensors go as their raw device pointers (np.uint64):
cupy.asarray would query the pointer's attributes on every launch, and the kernels take `T*`.
"""
from __future__ import annotations

import importlib
import math

import numpy as np

from .env import NoGpuError, has_gpu
from .registry import DEFAULT_SMEM_LIMIT, KernelSpec, get
from .shapes import Shape

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
    `device` is where the kernel runs: "cuda", or "cpu" for the CPU executor (attnlab.cpu)."""
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


class _TorchStream:
    """The CUDA stream protocol over a raw handle, for cupy.cuda.Stream.from_external."""

    def __init__(self, handle: int):
        self.handle = handle

    def __cuda_stream__(self):
        return (0, self.handle)


_streams: dict[int, object] = {}


def _cupy_stream(torch_stream):
    import cupy
    handle = torch_stream.cuda_stream
    if handle not in _streams:
        _streams[handle] = cupy.cuda.Stream.from_external(_TorchStream(handle))
    return _streams[handle]


def pointer(t) -> np.uint64:
    """A tensor's device address as a `T*` kernel argument: CuPy passes a np.uint64 as 8 bytes."""
    return np.uint64(t.data_ptr())


def launch(spec: KernelSpec, shape: Shape, q, k, v, out, causal: bool, scale: float) -> None:
    """Launch an already validated problem. Callers outside attnlab use `attention()`."""
    if spec.runner is not None:  # the kernel is one step of a larger computation (chapters 4 and 7)
        module, _, function = spec.runner.partition(":")
        return getattr(importlib.import_module(module), function)(spec, shape, q, k, v, out, causal, scale)
    launch_fused(spec, shape, q, k, v, out, causal, scale, spec.launch_config(shape))


def launch_fused(spec: KernelSpec, shape: Shape, q, k, v, out, causal: bool, scale: float, cfg: dict) -> None:
    """The fused (q, k, v, o, L, D, scale, causal) launch of `cfg` (the entry, grid and shared
    memory of the split taken here), straight into `out`."""
    from .compile import load_function

    fn = load_function(spec, cfg["entry"], q.device)
    args = (pointer(q), pointer(k), pointer(v), pointer(out),
            np.int32(shape.L), np.int32(shape.D), np.float32(scale), np.int32(bool(causal)))
    run_on_torch_stream(fn, cfg, args, q.device)


# (id(function), device index) -> (function, bytes): the largest dynamic shared memory each
# function has been opted in to. Holding the function keeps its id from being reused.
_smem_opt_in: dict[tuple[int, int], tuple[object, int]] = {}


def _opt_in_smem(fn, smem: int, index: int) -> None:
    """Raise `fn`'s dynamic shared-memory limit to `smem` unless it is already that high: one
    cuFuncSetAttribute per function and size, not one per launch."""
    held = _smem_opt_in.get((id(fn), index))
    if held is not None and held[0] is fn and held[1] >= smem:
        return
    fn.max_dynamic_shared_size_bytes = smem
    _smem_opt_in[(id(fn), index)] = (fn, smem)


def run_on_torch_stream(fn, cfg: dict, args: tuple, device) -> None:
    """Launch a compiled kernel with a registry launch config on torch's current stream of
    `device`, opting in to more than 48 KB of dynamic shared memory when the config asks for it."""
    import cupy
    import torch

    smem = cfg["dynamic_smem"]
    with cupy.cuda.Device(device.index):  # the attribute belongs to this device's function
        if smem > DEFAULT_SMEM_LIMIT:  # the opt-in above 48 KB, per function
            _opt_in_smem(fn, smem, device.index)
        fn(cfg["grid"], cfg["block"], args, shared_mem=smem,
           stream=_cupy_stream(torch.cuda.current_stream(device)))


def attention(kernel_id: str, q, k, v, causal: bool = False, scale: float | None = None, out=None):
    """softmax(q k^T * scale [+ causal mask]) v with a registered kernel; returns out."""
    import torch

    spec = get(kernel_id)
    shape = validate(spec, q, k, v, causal, scale, out)
    scale = 1.0 / math.sqrt(shape.D) if scale is None else float(scale)
    if out is None:
        out = torch.empty_like(q)
    launch(spec, shape, q, k, v, out, causal, scale)
    return out


def exercise(kernel_id: str, shapes) -> None:
    """Launch a kernel at each of `shapes` it supports, causal and not, on the check's inputs, and
    wait: the workload that compute-sanitizer and Nsight Compute watch from outside the process."""
    import torch

    from .check import make_inputs

    spec = get(kernel_id)
    runnable = [shape for shape in shapes if spec.supports_head_dim(shape.D)]
    if not runnable:
        raise AttentionInputError(f"{kernel_id} takes none of these shapes: {[s.label() for s in shapes]}")
    for shape in runnable:
        q, k, v = make_inputs(shape, seed=0)
        for causal in ((False, True) if spec.causal else (False,)):
            attention(kernel_id, q, k, v, causal=causal)
    torch.cuda.synchronize()
