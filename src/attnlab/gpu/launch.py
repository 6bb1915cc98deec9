"""Run a registered kernel on torch tensors: validate first, then launch zero-copy on torch's
current stream (so CUDA-graph capture and torch's ordering both see the launch).

CuPy performs no argument checking at all (a Python int goes as a 64-bit integer, views are
ignored), so everything is checked first (attnlab.kernels.contract), before any launch, and
scalars are wrapped in the exact C types of the kernel signature. Tensors go as their raw device pointers
(np.uint64): cupy.asarray would query the pointer's attributes on every launch, and the kernels
take `T*`.
"""
from __future__ import annotations

import importlib
import math

import numpy as np

from ..kernels.contract import AttentionInputError, validate
from ..kernels.registry import DEFAULT_SMEM_LIMIT, KernelSpec, get
from ..kernels.split_ctas import COMBINE_ENTRY, combine_args, combine_config, partial_args, scratch_shapes
from ..pass_rule import make_inputs
from ..shapes import Shape


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
    from ..kernels.compile import load_function

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


def run_split_ctas(spec: KernelSpec, shape: Shape, q, k, v, out, causal: bool, scale: float) -> None:
    """softmax(q k^T * scale [+ causal mask]) v into `out` by the split across CTAs: the partial
    kernel, then the combine, on torch's current stream. The inputs are already validated."""
    import torch

    from ..kernels.compile import load_function

    cfg = spec.launch_config(shape)
    splits = cfg["kv_split"]
    if splits == 1:  # the unsplit kernel, straight into out
        return launch_fused(spec, shape, q, k, v, out, causal, scale, cfg)
    fn = load_function(spec, cfg["entry"], q.device)
    combine = load_function(spec, COMBINE_ENTRY, q.device)  # both loaded before any work is queued
    o_shape, ml_shape = scratch_shapes(shape, splits)
    o_part = torch.empty(o_shape, dtype=torch.float32, device=q.device)
    ml = torch.empty(ml_shape, dtype=torch.float32, device=q.device)
    run_on_torch_stream(fn, cfg, partial_args(shape, *map(pointer, (q, k, v, o_part, ml)), causal, scale), q.device)
    run_on_torch_stream(combine, combine_config(shape),
                        combine_args(shape, pointer(o_part), pointer(ml), pointer(out), splits, scale), q.device)


def exercise(kernel_id: str, shapes) -> None:
    """Launch a kernel at each of `shapes` it supports, causal and not, on the check's inputs, and
    wait: the workload that compute-sanitizer and Nsight Compute watch from outside the process."""
    import torch

    spec = get(kernel_id)
    runnable = [shape for shape in shapes if spec.supports_head_dim(shape.D)]
    if not runnable:
        raise AttentionInputError(f"{kernel_id} takes none of these shapes: {[s.label() for s in shapes]}")
    for shape in runnable:
        q, k, v = make_inputs(shape, seed=0)
        for causal in ((False, True) if spec.causal else (False,)):
            attention(kernel_id, q, k, v, causal=causal)
    torch.cuda.synchronize()
