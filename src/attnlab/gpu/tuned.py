"""The launcher with chapter 8's results: run a registered kernel built with the best
configuration a fresh search record holds for this GPU and shape, or with the chapter's own
constants when there is none.

The lookup table is derived from the records themselves (attnlab.gpu.search.best_configs), never kept
in a second file that could go stale: a search record counts only while its kernel's source still
hashes to what was searched, exactly like a bench record. A configuration is used for the exact
(GPU, kernel, B, H, L, D, causal) it was searched at; otherwise, for the same GPU, kernel, D and
causal flag, the one searched at the nearest sequence length (by ratio) is used, and the choice
says so.

    from attnlab.gpu import tuned
    out = tuned.attention("07_mma", q, k, v, causal=True)   # default constants until a search exists
    spec, why = tuned.spec_for("07_mma", Shape(1, 8, 512, 64), causal=False, gpu="NVIDIA L4")
"""
from __future__ import annotations

import math
from pathlib import Path

from ..kernels import registry
from ..kernels.registry import KernelSpec
from ..shapes import Shape


def spec_for(kernel_id: str, shape: Shape, causal: bool = False, gpu: str | None = None,
             root: Path | None = None) -> tuple[KernelSpec, str]:
    """The spec to launch at this shape on `gpu` (default: this machine's GPU, if any), and a
    sentence saying where its configuration comes from."""
    from .search import best_configs

    spec = registry.get(kernel_id)
    shape = Shape(*shape)
    if gpu is None:
        from ..env import device_name

        gpu = device_name()
    if spec.tuning is None:
        return spec, f"{kernel_id}: the chapter's constants (the kernel has no knobs)"
    if gpu is None:
        return spec, f"{kernel_id}: the chapter's constants (no GPU here to look a search up for)"
    table = {k: v for k, v in best_configs(root).items() if k[0] == gpu and k[1] == kernel_id and k[3] == causal}
    exact = table.get((gpu, kernel_id, tuple(shape), causal))
    if exact is not None:
        return spec.with_config(exact["config"]), (f"{kernel_id}: searched at {shape.label()} on {gpu} "
                                                   f"({exact['recorded_utc'][:10]})")
    near = [(abs(math.log(k[2][2] / shape.L)), k) for k in table if k[2][3] == shape.D]
    if near:
        _, key = min(near)
        entry = table[key]
        return spec.with_config(entry["config"]), (f"{kernel_id}: searched at {Shape(*key[2]).label()} on {gpu} "
                                                   f"({entry['recorded_utc'][:10]}), the nearest length searched")
    return spec, f"{kernel_id}: the chapter's constants (no fresh search record for {gpu} at D={shape.D})"


def attention(kernel_id: str, q, k, v, causal: bool = False, scale: float | None = None, out=None):
    """attnlab.attention with the tuned configuration of spec_for (same checks, same launch)."""
    import torch

    from ..kernels.contract import validate
    from .launch import launch

    shape = validate(registry.get(kernel_id), q, k, v, causal, scale, out)
    spec, _ = spec_for(kernel_id, shape, causal)
    validate(spec, q, k, v, causal, scale, out)
    scale = 1.0 / math.sqrt(shape.D) if scale is None else float(scale)
    if out is None:
        out = torch.empty_like(q)
    launch(spec, shape, q, k, v, out, causal, scale)
    return out
