"""The correctness suite on a GPU: the pass rule (attnlab.pass_rule) on poisoned outputs over
awkward shapes. The output is filled with NaN before every launch, so an element the kernel forgot
to write fails the case.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Iterable

from ..kernels.registry import KernelSpec
from ..pass_rule import judge, make_inputs
from ..shapes import CHECK_SEEDS, CHECK_SHAPES, ODD_HEAD_DIM_SHAPES, Shape
from .launch import attention


@dataclass
class CaseResult:
    kernel: str
    shape: tuple
    causal: bool
    seed: int
    passed: bool
    max_err: float
    fp16_err: float
    tolerance: float
    sdpa_err: float | None
    reason: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def cases_for(spec: KernelSpec, shapes: Iterable[Shape] | None = None, seeds=CHECK_SEEDS):
    """Every (shape, causal, seed) the suite runs for a kernel, within its declared limits."""
    shapes = list(shapes) if shapes is not None else list(CHECK_SHAPES) + (
        list(ODD_HEAD_DIM_SHAPES) if spec.head_dims is None else [])
    out = []
    for shape in shapes:
        if not spec.supports_head_dim(shape.D) or (spec.max_len and shape.L > spec.max_len):
            continue
        for causal in ((False, True) if spec.causal else (False,)):
            for seed in seeds:
                out.append((shape, causal, seed))
    return out


def check_case(spec: KernelSpec, shape: Shape, causal: bool, seed: int) -> CaseResult:
    import torch

    from ..reference import naive_fp16, reference_attention, sdpa

    q, k, v = make_inputs(shape, seed)
    ref = reference_attention(q, k, v, causal)
    fp16_err = float((naive_fp16(q, k, v, causal).double() - ref).abs().max())
    sdpa_err = float((sdpa(q, k, v, causal).double() - ref).abs().max())
    out = torch.full_like(q, float("nan"))  # poison: unwritten elements stay NaN
    attention(spec.id, q, k, v, causal=causal, out=out)
    torch.cuda.synchronize()
    verdict = judge(out, ref, fp16_err)
    return CaseResult(spec.id, tuple(shape), causal, seed, verdict.passed, verdict.max_err,
                      fp16_err, verdict.tolerance, sdpa_err, verdict.reason)


def run_suite(specs: list[KernelSpec], shapes=None, seeds=CHECK_SEEDS, progress: bool = True) -> list[CaseResult]:
    from tqdm.auto import tqdm

    from ..env import require_gpu

    require_gpu("the correctness suite")
    work = [(spec, *case) for spec in specs for case in cases_for(spec, shapes, seeds)]
    results = []
    for spec, shape, causal, seed in tqdm(work, desc="check", unit="case", disable=not progress):
        try:
            results.append(check_case(spec, shape, causal, seed))
        except Exception as exc:  # a launch or build failure is a failed case, reported, not a crash
            results.append(CaseResult(spec.id, tuple(shape), causal, seed, False, float("nan"),
                                      float("nan"), float("nan"), None, f"{type(exc).__name__}: {exc}"))
    return results


def summarize(results: list[CaseResult]) -> list[dict]:
    """One row per kernel, shape and causal flag: seeds passed, worst error, its tolerance."""
    rows: dict[tuple, dict] = {}
    for r in results:
        key = (r.kernel, tuple(r.shape), r.causal)
        row = rows.setdefault(key, {"kernel": r.kernel, "shape": tuple(r.shape), "causal": r.causal,
                                    "passed": 0, "cases": 0, "max_err": 0.0, "tolerance": float("inf"),
                                    "reason": ""})
        row["cases"] += 1
        row["passed"] += int(r.passed)
        if r.max_err == r.max_err:  # not NaN
            row["max_err"] = max(row["max_err"], r.max_err)
        else:
            row["max_err"] = float("nan")
        row["tolerance"] = min(row["tolerance"], r.tolerance) if r.tolerance == r.tolerance else row["tolerance"]
        if not r.passed and not row["reason"]:
            row["reason"] = r.reason
    return list(rows.values())


def format_table(results: list[CaseResult]) -> str:
    lines = [f"{'kernel':<14} {'shape':<22} {'causal':<6} {'pass':>5} {'max err':>9} {'tol':>9}  note"]
    for row in summarize(results):
        lines.append(f"{row['kernel']:<14} {str(row['shape']):<22} {str(row['causal']):<6} "
                     f"{row['passed']}/{row['cases']:<3} {row['max_err']:>9.2e} {row['tolerance']:>9.2e}  {row['reason']}")
    total = sum(r.passed for r in results)
    lines.append(f"{total}/{len(results)} cases passed")
    return "\n".join(lines)
