"""The inputs every check draws and the rule a kernel's output must pass, on a GPU or on the CPU
executor alike.

Pass rule (FlashAttention's): a kernel's max-abs error against the fp64 reference may be at most
twice that of a plain fp16 PyTorch implementation against the same reference, plus a small
absolute floor. NaN or Inf never passes.

Inputs are unit-variance normals plus an offset: with `randn * 0.1` the scores are ~0.01, the
softmax is nearly uniform and a kernel that merely averages V would pass.
"""
from __future__ import annotations

from dataclasses import dataclass

from .shapes import Shape

ATOL_FLOOR = 1e-4   # covers exact-output cases (L = 1) where the fp16 path has zero error
INPUT_OFFSET = 0.5


def make_inputs(shape: Shape, seed: int, device="cuda", offset: float = INPUT_OFFSET):
    """q, k, v ~ N(0, 1) + offset in fp16, from a generator seeded on the CPU (same on every machine)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    return tuple((torch.randn(tuple(shape), generator=gen) + offset).to(torch.float16).to(device)
                 for _ in range(3))


@dataclass
class Verdict:
    passed: bool
    max_err: float
    tolerance: float
    reason: str = ""


def judge(out, ref, fp16_err: float, floor: float = ATOL_FLOOR) -> Verdict:
    """Apply the pass rule to one output against the reference."""
    import torch

    tol = 2.0 * fp16_err + floor
    nan = int(torch.isnan(out).sum())
    inf = int(torch.isinf(out).sum())
    if nan or inf:
        return Verdict(False, float("nan"), tol,
                       f"{nan} NaN (unwritten or invalid) and {inf} Inf of {out.numel()} elements")
    err = float((out.double() - ref.double()).abs().max())
    if err > tol:
        return Verdict(False, err, tol, f"max error {err:.3g} > {tol:.3g}")
    return Verdict(True, err, tol)
